"""Layer x layer similarity: what CKA and every other measure of how alike two layers are share.

`LayerMatrix` is an analysis whose result is one joint matrix over every stored layer of every model of the store
(rows and columns in store and forward order, `model` and `layer` naming each), and whose views cut it:
NAME:A is model A against itself, NAME:A:B model A's layers (rows) against model B's (columns). The view's shape is
Shape.LAYER_MATRIX, so the figures, `vitsee show` and the app draw it with no code of the analysis's own; its family
lets the app and the dossier find the other measures of the same pair.

`LayerPairMeasure` is a LayerMatrix computed pair by pair from the layers' features on a seeded subset of the
images: a measure module declares its name, title and parameters and gives `measure(a, b)` (and, optionally,
`prepare(x)`, e.g. a Gram matrix built once per layer). CKA (cka.py) is a LayerMatrix with its own minibatch
estimator and statistics.
"""
from __future__ import annotations

from abc import abstractmethod
from typing import ClassVar

import numpy as np

from ..errors import VitseeError
from ..store import Store
from .base import AnalyzeConfig, StepFn, emit, nonfinite_image_mask
from .contract import Analysis, Request, Result, Shape, View, bootstrap_words, streaming_reason

FAMILY = "layer similarity"


def matrix_block(result: Result, model_a: str, model_b: str | None = None,
                 key: str = "matrix") -> tuple[np.ndarray, list[str], list[str]]:
    """Returns (values, row layers, col layers) of model_a x model_b (model_b defaults to model_a) from a joint
    layer matrix result; key names another (L, L) array of it to cut the same block from (ci_low, p_value, ...)."""
    model_b = model_b or model_a
    models = result.params["models"]
    ia, ib = models.index(model_a), models.index(model_b)
    rows = np.flatnonzero(result["model"] == ia)
    cols = np.flatnonzero(result["model"] == ib)
    layers = [str(x) for x in result["layer"]]
    return result[key][np.ix_(rows, cols)], [layers[i] for i in rows], [layers[i] for i in cols]


class LayerMatrix(Analysis):
    """An analysis whose result is one value per pair of layers over all models (see the module's docstring)."""

    shape = Shape.LAYER_MATRIX
    family = FAMILY
    models = (1, 2)
    model_fields = ("model_a", "model_b")
    nonfinite_source = "activations"
    identity = ("models", "layers", "n_images")
    needs = frozenset({"activations"})
    value_name: ClassVar[str] = ""  # what a cell's value is, for legends and the status line (default: the label)
    value_range: ClassVar[tuple[float | None, float | None]] = (0.0, 1.0)  # the colour range (None: the data's)

    def not_applicable(self, store: Store, key: str) -> str | None:
        return None

    def requests(self, store: Store) -> list[Request]:
        models = store.models
        pairs = [Request(self.name, (a, b)) for i, a in enumerate(models) for b in models[i + 1:]]
        return [Request(self.name, (m,)) for m in models[:1]] + pairs + [Request(self.name, (m,)) for m in models[1:]]

    def jobs(self, store: Store) -> list[Request]:
        """Returns the one job that computes every pair of the store's layers at once."""
        return [Request(self.name, tuple(store.models[:1]), joint=True)] if store.models else []

    def view(self, result: Result, request: Request, info: dict) -> View:
        """Returns the A x B block of the joint matrix (A against itself for NAME:A), with its statistics."""
        a, b = request.keys[0], request.keys[-1]
        matrix, rows, cols = matrix_block(result, a, b)
        params = dict(result.params)
        params.pop("layers", None)
        block = {name: matrix_block(result, a, b, key=name)[0]
                 for name in ("ci_low", "ci_high", "p_value") if name in result}
        extra = {"n_batches": int(result["n_batches"])} if "n_batches" in result else {}
        title = f"{self.label} {a}" if a == b else f"{self.label} {a} (rows) x {b} (cols)"
        vmin, vmax = self.value_range
        return View(self.name, "", title, "", matrix, rows, cols, self.value_name or self.label, vmin, vmax,
                    params=params, extra=extra, models=[a, b], **block)

    def interval_words(self, view: View, level: str) -> str:
        return bootstrap_words(view, level)

    def batch_hsic(self, store: Store, result: Result, device: str = "auto",
                   progress: StepFn | None = None) -> tuple[np.ndarray, np.ndarray] | None:
        """Returns the per-batch terms a bootstrap over minibatches of images rebuilds `result`'s joint matrix from:
        (HSIC sums (K, L, L), each batch's HSIC terms (K, B, L, L)), K shuffles, the matrix being sums_ij /
        sqrt(sums_ii sums_jj) averaged over shuffles (the zoo's intervals of a pair's summary, engine/zoo.py);
        None when the measure has no such terms (the default)."""
        return None

    def nonfinite_images(self, view: View, store: Store) -> np.ndarray:
        """Returns per cell the images whose activations of either layer hold NaN/Inf."""
        bad, counts = view.nonfinite, np.full(view.matrix.shape, -1, dtype=np.int64)
        a, b = view.models[0], view.models[-1]
        rows = {layer: nonfinite_image_mask(store, a, layer) for layer in {view.rows[i] for i in np.flatnonzero(bad.any(axis=1))}}
        cols = {layer: nonfinite_image_mask(store, b, layer) for layer in {view.cols[j] for j in np.flatnonzero(bad.any(axis=0))}}
        for i, j in zip(*np.nonzero(bad)):
            r, c = rows[view.rows[i]], cols[view.cols[j]]
            if r is not None and c is not None and (r.any() or c.any()):
                counts[i, j] = int((r | c).sum())
        return counts


class LayerPairMeasure(LayerMatrix):
    """A layer x layer measure computed pair by pair on a seeded subset of at most `max_images` images.

    A subclass sets name, label, title and option_help, puts its own parameters in `measure_params` (they go into the
    cache key and the view's JSON `params`), and implements `measure(a, b)` on two layers' prepared features.
    `prepare(x)` turns one layer's (n, ...) features into what `measure` compares; by default the features
    flattened per image in fp64. A measure on Gram or distance matrices builds them there, once per layer (e.g.
    measures_grams.layer_grams), and may give every pair at once in `all_pairs` (measures_grams.pairwise_*).
    """

    max_images: ClassVar[int] = 1024  # the subset the measure runs on: it holds what `prepare` gives per layer
    measure_params: ClassVar[dict] = {}
    symmetric: ClassVar[bool] = True  # measure(a, b) == measure(b, a): each pair is measured once
    needs = frozenset({"activations"})

    def not_applicable(self, store: Store, key: str) -> str | None:
        if store.streaming:
            return streaming_reason(store, f"{self.title or self.name} cannot be computed")
        return None

    def prepare(self, x: np.ndarray) -> np.ndarray:
        """Returns one layer's features (n, ...) as what `measure` compares: (n, features) fp64 by default."""
        return np.asarray(x, dtype=np.float64).reshape(len(x), -1)

    @abstractmethod
    def measure(self, a: np.ndarray, b: np.ndarray) -> float:
        """Returns the measure of two layers from what `prepare` made of each (the same images, in order)."""

    def params(self, store: Store, request: Request, cfg: AnalyzeConfig) -> dict:
        models = store.models
        return {"models": models, "layers": {m: store.layers(m) for m in models}, "n_images": store.n_images,
                "max_images": min(self.max_images, store.n_images), "seed": cfg.seed, **self.measure_params}

    def images(self, params: dict) -> np.ndarray:
        """Returns the sorted indices of the images the measure runs on: all, or a subset seeded by params (the
        subset engine/measures_grams.py draws for the same seed)."""
        from ..measures_grams import choose_images

        return choose_images(params["n_images"], params["max_images"], params["seed"])[0]

    def all_pairs(self, prepared: list) -> np.ndarray:
        """Returns the (L, L) matrix of `measure` over every pair of the prepared layers; a measure with an
        all-pairs form (engine/measures_grams.py pairwise_*, one product for every pair) returns it here."""
        n = len(prepared)
        matrix = np.full((n, n), np.nan)
        for i in range(n):
            for j in range(i if self.symmetric else 0, n):
                matrix[i, j] = self.measure(prepared[i], prepared[j])
                if self.symmetric:
                    matrix[j, i] = matrix[i, j]
        return matrix

    def compute(self, store: Store, request: Request, params: dict, cfg: AnalyzeConfig,
                progress: StepFn | None = None) -> dict[str, np.ndarray]:
        """Returns the joint (L, L) matrix of the measure over every stored layer of every model."""
        for reason in (self.not_applicable(store, key) for key in params["models"]):
            if reason:
                raise VitseeError(reason)
        columns = [(m, layer) for m in params["models"] for layer in params["layers"][m]]
        rows = self.images(params)
        prepared = []
        for i, (model, layer) in enumerate(columns):
            prepared.append(self.prepare(store.activations(model, layer, rows)))
            emit(progress, f"{self.name} layers", i + 1, len(columns))
        matrix = self.all_pairs(prepared)
        emit(progress, f"{self.name} pairs", 1, 1)
        return {"matrix": matrix, "model": np.array([params["models"].index(m) for m, _ in columns]),
                "layer": np.array([layer for _, layer in columns]), "images": rows}
