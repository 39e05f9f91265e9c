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

`GramMeasure` is a LayerMatrix of a measure of vitsee.measures (RBF CKA, Procrustes, SVCCA, PWCCA, mknn, CKNNA,
RSA, and any other module of engine/measures/catalog/): each layer's LayerGrams is built once per driver run and
shared by every measure of it (base.SHARED), every pair comes from the measure's all-pairs form, and intervals and
p-values from engine/measures/resampling.py over the same Grams. There is one for every registered measure with a
view of its own, made here from the measure's declaration (`gram_measure_analyses`): no module of this package
names one.
"""

from __future__ import annotations

import hashlib
from abc import abstractmethod
from collections.abc import Iterator
from typing import ClassVar

import numpy as np

from vitsee import stats as stats_mod
from vitsee.measures.registry import REGISTRY as MEASURES
from vitsee.measures.registry import Measure, Parameter
from vitsee.errors import VitseeError
from vitsee.store import Store
from vitsee.analyses.base import SHARED, AnalyzeConfig, StepFn, emit, nonfinite_image_mask, resolve_device
from vitsee.analyses.contract import (
    REGISTRY,
    Analysis,
    AnalysisOption,
    Request,
    Result,
    Shape,
    View,
    analyses_of,
    bootstrap_words,
    streaming_reason,
)

FAMILY = "layer similarity"
# why a layer has no value under a measure: the codes a result keeps per layer ("undefined"), in words
UNDEFINED = {
    "constant": "{layer} does not vary across the images (no variance)",
    "flat": "{layer} has images whose features are all equal (one feature?): {label} correlates each image's "
    "features, which takes two that differ",
    "nonfinite": "{layer} holds NaN/Inf in its stored activations",
    "median": "{layer} has the same features in most pairs of images: {label}'s bandwidth, their median distance, is 0",
    "self_hsic": "{layer} does not vary across the images, or in too few of them for minibatch CKA (its unbiased "
    "HSIC with itself is not above 0)",
}


def matrix_block(
    result: Result, model_a: str, model_b: str | None = None, key: str = "matrix"
) -> tuple[np.ndarray, list[str], list[str]]:
    """Returns (values, row layers, col layers) of model_a x model_b (model_b defaults to model_a) from a joint
    layer matrix result; key names another (L, L) array of it to cut the same block from (ci_low, p_value, ...)."""
    model_b = model_b or model_a
    models = result.params["models"]
    ia, ib = models.index(model_a), models.index(model_b)
    rows = np.flatnonzero(result["model"] == ia)
    cols = np.flatnonzero(result["model"] == ib)
    layers = [str(x) for x in result["layer"]]
    return result[key][np.ix_(rows, cols)], [layers[i] for i in rows], [layers[i] for i in cols]


def pair_requests(name: str, models: list[str]) -> list[Request]:
    """Returns the views of a layer x layer analysis: the first model with itself, every pair, then the others."""
    pairs = [Request(name, (a, b)) for i, a in enumerate(models) for b in models[i + 1 :]]
    return [Request(name, (m,)) for m in models[:1]] + pairs + [Request(name, (m,)) for m in models[1:]]


def named_measure(cfg: AnalyzeConfig, option: str, default: str, candidates: list, what: str):
    """Returns the measure among `candidates` (analyses) that `--OPTION` names in cfg (`default` when not given); one
    that is not among them is a VitseeError naming the option, the value, what it must be and the choices."""
    name = str(cfg.options.get(option.replace("-", "_")) or default)
    found = next((m for m in candidates if m.name == name), None)
    if found is None:
        raise VitseeError(f"--{option} {name} is not {what}: choose from {', '.join(m.name for m in candidates)}")
    return found


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
    permutations_option: ClassVar[str] = "permutations"  # the `vitsee analyze` option that gives its p-values

    def not_applicable(self, store: Store, key: str) -> str | None:
        return None

    def requests(self, store: Store) -> list[Request]:
        return pair_requests(self.name, store.models)

    def jobs(self, store: Store) -> list[Request]:
        """Returns the one job that computes every pair of the store's layers at once."""
        return [Request(self.name, tuple(store.models[:1]), joint=True)] if store.models else []

    def view(self, result: Result, request: Request, info: dict) -> View:
        """Returns the A x B block of the joint matrix (A against itself for NAME:A), with its statistics."""
        a, b = request.keys[0], request.keys[-1]
        matrix, rows, cols = matrix_block(result, a, b)
        params = dict(result.params)
        params.pop("layers", None)
        block = {
            name: matrix_block(result, a, b, key=name)[0] for name in ("ci_low", "ci_high", "p_value") if name in result
        }
        extra = {"n_batches": int(result["n_batches"])} if "n_batches" in result else {}
        if "n_interval_images" in result:
            extra["n_interval_images"] = int(result["n_interval_images"])
        if "ci_note" in result:
            extra["ci_note"] = str(result["ci_note"][0])
        single = extra.get("n_batches") == 1 and stats_mod.interval_method(params.get("stats")) == "percentile"
        if single and "ci_low" in block:  # a result cached before: a bootstrap of one minibatch is a point
            del block["ci_low"], block["ci_high"]
            extra["ci_note"] = (
                "no interval: this result was cached with a bootstrap over minibatches, and one minibatch gives a "
                "point, not an interval; `vitsee analyze --cka --recompute` gives the jackknife interval over images"
            )
        title = f"{self.label}: {a}" if a == b else f"{self.label}: {a} x {b}"  # rows x columns, as the axes say
        vmin, vmax = self.value_range
        view = View.of(
            request,
            title=title,
            matrix=matrix,
            rows=rows,
            cols=cols,
            value_name=self.value_name or self.label,
            vmin=vmin,
            vmax=vmax,
            params=params,
            extra=extra,
            models=[a, b],
            **block,
        )
        view.reasons = self.reasons(result, a, b, rows, cols)
        return view

    def reasons(self, result: Result, a: str, b: str, rows: list[str], cols: list[str]) -> np.ndarray | None:
        """Returns per cell of the A x B block why it has no value, in words ('' where the result does not say);
        None for a result computed before results kept it (the per-layer codes "undefined", UNDEFINED)."""
        if "undefined" not in result:
            return None
        codes = [str(c) for c in np.asarray(result["undefined"]).tolist()]
        layers, owner, models = [str(x) for x in result["layer"]], np.asarray(result["model"]), result.params["models"]

        def words(model: str, names: list[str]) -> list[str]:
            at = {layers[i]: i for i in np.flatnonzero(owner == models.index(model))}
            return [UNDEFINED.get(codes[at[n]], "").format(layer=n, label=self.label) for n in names]

        row_words, col_words = words(a, rows), words(b, cols)
        out = np.empty((len(rows), len(cols)), dtype=object)
        for i, rw in enumerate(row_words):
            for j, cw in enumerate(col_words):
                out[i, j] = "; ".join(dict.fromkeys(w for w in (rw, cw) if w))  # both layers' when both have one
        return out

    def interval_words(self, view: View, level: str) -> str:
        return bootstrap_words(view, level)

    def batch_hsic(
        self, store: Store, result: Result, device: str = "auto", progress: StepFn | None = None
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """Returns the per-batch terms a bootstrap over minibatches of images rebuilds `result`'s joint matrix from:
        (HSIC sums (K, L, L), each batch's HSIC terms (K, B, L, L)), K shuffles, the matrix being sums_ij /
        sqrt(sums_ii sums_jj) averaged over shuffles (the zoo's intervals of a pair's summary, engine/zoo/summaries.py);
        None when the measure has no such terms (the default)."""
        return None

    def bootstrap_matrices(
        self, store: Store, result: Result, device: str = "auto", progress: StepFn | None = None
    ) -> tuple[Iterator[np.ndarray], str] | None:
        """Returns (the joint (L, L) matrix of `result` on each of its bootstrap resamples of the images, one at a
        time; how they were drawn, in words) for a measure whose result was computed with bootstrap resamples of
        whole images (the zoo's interval of a pair's summary, engine/zoo/summaries.py zoo_from_replicates); None when
        it has none (the default)."""
        return None

    def nonfinite_images(self, view: View, store: Store) -> np.ndarray:
        """Returns per cell the images whose activations of either layer hold NaN/Inf."""
        bad, counts = view.nonfinite, np.full(view.matrix.shape, -1, dtype=np.int64)
        a, b = view.models[0], view.models[-1]
        rows = {
            layer: nonfinite_image_mask(store, a, layer)
            for layer in {view.rows[i] for i in np.flatnonzero(bad.any(axis=1))}
        }
        cols = {
            layer: nonfinite_image_mask(store, b, layer)
            for layer in {view.cols[j] for j in np.flatnonzero(bad.any(axis=0))}
        }
        for i, j in zip(*np.nonzero(bad)):
            r, c = rows[view.rows[i]], cols[view.cols[j]]
            if r is not None and c is not None:  # 0: the store says neither layer holds NaN/Inf
                counts[i, j] = int((r | c).sum())
        return counts


class LayerPairMeasure(LayerMatrix):
    """A layer x layer measure computed pair by pair on a seeded subset of at most `max_images` images.

    A subclass sets name, label, title and option_help, puts its own parameters in `measure_params` (they go into the
    cache key and the view's JSON `params`), and implements `measure(a, b)` on two layers' prepared features.
    `prepare(x)` turns one layer's (n, ...) features into what `measure` compares; by default the features
    flattened per image in fp64, and may give every pair at once in `all_pairs`. It has no intervals or p-values:
    a measure that can be computed from each layer's Gram is a module of engine/measures/catalog/ instead, and gets
    them (a GramMeasure, below).
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
        return {
            "models": models,
            "layers": {m: store.layers(m) for m in models},
            "n_images": store.n_images,
            "max_images": min(self.max_images, store.n_images),
            "seed": cfg.seed,
            **self.measure_params,
        }

    def no_interval(self, view: View) -> str:
        return "no interval: --measure-bootstrap 200 gives one" if view.ci_low is None else ""

    def images(self, params: dict) -> np.ndarray:
        """Returns the sorted indices of the images the measure runs on: all, or a subset seeded by params (the
        subset engine/measures/grams.py draws for the same seed)."""
        from vitsee.measures.grams import choose_images

        return choose_images(params["n_images"], params["max_images"], params["seed"])[0]

    def all_pairs(self, prepared: list) -> np.ndarray:
        """Returns the (L, L) matrix of `measure` over every pair of the prepared layers; a measure with an
        all-pairs form (engine/measures/grams.py pairwise_*, one product for every pair) returns it here."""
        n = len(prepared)
        matrix = np.full((n, n), np.nan)
        for i in range(n):
            for j in range(i if self.symmetric else 0, n):
                matrix[i, j] = self.measure(prepared[i], prepared[j])
                if self.symmetric:
                    matrix[j, i] = matrix[i, j]
        return matrix

    def compute(
        self, store: Store, request: Request, params: dict, cfg: AnalyzeConfig, progress: StepFn | None = None
    ) -> dict[str, np.ndarray]:
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
        return {
            "matrix": matrix,
            "model": np.array([params["models"].index(m) for m, _ in columns]),
            "layer": np.array([layer for _, layer in columns]),
            "images": rows,
        }


def layer_measures() -> list[Analysis]:
    """Returns the registered layer x layer measures (CKA, RBF CKA, Procrustes, ...): the family's analyses whose
    view is a layer matrix, in registry order."""
    return [a for a in analyses_of(FAMILY) if a.shape is Shape.LAYER_MATRIX]


# --- the measures of engine/measures/catalog/ --------------------------------------------------------------------

GRAM_OPTIONS = (
    AnalysisOption(
        "max-images",
        int,
        "images the layer x layer measures other than CKA run on, a seeded subset of "
        "the store's (default: as many as keep the Grams of every layer within 2 GiB, at most 2048)",
    ),
    AnalysisOption(
        "measure-bootstrap",
        int,
        "intervals of those measures at the --ci level from N resamples: N groups of the images, each left out once "
        "(a jackknife: no image repeated, as a bootstrap would; each recomputes the measure; default 0, none; 20 is "
        "plenty)",
        param="stats.groups",
    ),
    AnalysisOption(
        "measure-permutations",
        int,
        "permutations behind each p-value of those measures (each recomputes the measure: default 0, none)",
        param="stats.permutations",
    ),
)


def parameter_option(parameter: Parameter) -> AnalysisOption:
    """Returns the `vitsee analyze` option that sets a measure's parameter: --OPTION, its help with its default."""
    # kept under the parameter's name in the params, so a cached result serves only a view asked with its value
    return AnalysisOption(parameter.option, parameter.type, parameter.option_help, param=parameter.name)


class GramMeasure(LayerMatrix):
    """A layer x layer measure of engine/measures/grams.py computed on one Gram per layer.

    Each stored layer's LayerGrams is built once on a seeded subset of at most `--max-images` images (default
    measures_grams.default_max_images: the Grams of every layer within GRAM_MEMORY) and kept for the rest of the
    driver's run (base.SHARED), so every measure of a `vitsee analyze` run reads the same Grams, and the parts they
    derive (spectra, kNN masks, RDM ranks) are built once too. Every pair comes from the measure's all-pairs form
    (measures_grams.pairwise), and, when asked for, the bootstrap interval and permutation p-value of
    measures_stats over the same Grams.

    A subclass sets `spec`, the registered Measure it computes (gram_measure_analyses makes one for each): its
    name, words, order, value range and direction become the analysis's, and each of its parameters that has an
    option becomes a `vitsee analyze` option, checked before any work.
    """

    spec: ClassVar[Measure]
    by_default = False  # seconds to minutes each where CKA takes one: `vitsee analyze --measures ...` asks for them
    permutations_option = "measure-permutations"
    tab = False  # in the CKA tab, where `m` cycles the measures cached for the models shown
    cost = 1

    def __init_subclass__(cls, **kwargs) -> None:
        spec = cls.__dict__.get("spec")
        if spec is not None:  # the analysis says of itself what the measure declares
            cls.name, cls.label = spec.name, spec.label or spec.name
            cls.title = spec.title or f"{cls.label} between layers"
            cls.option_help = spec.option_help or f"{cls.label} of every pair of layers"
            cls.order, cls.higher_is_better = spec.order, spec.higher_is_similar
            cls.value_name, cls.value_range = spec.value_name, spec.value_range
            cls.options = (*GRAM_OPTIONS, *(parameter_option(p) for p in spec.parameters if p.option))
        super().__init_subclass__(**kwargs)

    @property
    def key(self) -> str:
        """Returns the measure's name in the registry of vitsee.measures (the analysis's name)."""
        return self.spec.name

    def not_applicable(self, store: Store, key: str) -> str | None:
        if store.streaming:
            return streaming_reason(store, f"{self.label} cannot be computed")
        return None

    def jobs(self, store: Store) -> list[Request]:
        """Returns the one joint job, none where the store keeps no activations (the driver then says why)."""
        return [] if store.streaming else super().jobs(store)

    # --- parameters --------------------------------------------------------------------------------------------

    def measure_values(self, params: dict) -> dict:
        """Returns the measure's own parameters (threshold, alpha, keep, k, ...) from a result's params."""
        return {p: params[p] for p in self.spec.defaults}

    def params(self, store: Store, request: Request, cfg: AnalyzeConfig) -> dict:
        from vitsee.measures.grams import choose_images, default_max_images

        models = store.models
        layers = {m: store.layers(m) for m in models}
        asked = cfg.options.get("max_images")
        max_images = default_max_images(sum(map(len, layers.values()))) if asked is None else int(asked)
        _, subset = choose_images(store.n_images, max_images, cfg.seed)  # too few: the one-line error
        values = self.spec.analysis_defaults  # a store's (RBF CKA: the unbiased HSIC, as linear CKA's)
        for parameter in self.spec.parameters:  # given or default, checked now: before any work
            if not parameter.option:
                continue  # fixed at its default
            value = cfg.options.get(parameter_option(parameter).attr)
            value = parameter.analysis_default if value is None else value
            try:
                values[parameter.name] = parameter.checked(value, self.key, subset["n_images"])
            except VitseeError as exc:
                raise VitseeError(f"--{parameter.option} {value}: {exc}") from None
        params = {
            "models": models,
            "layers": layers,
            "n_images": store.n_images,
            "max_images": subset["n_images"],
            "seed": subset["seed"],
            **values,
        }
        settings = self.stats_settings(cfg)
        return params if settings is None else {**params, "stats": settings}

    @staticmethod
    def stats_settings(cfg: AnalyzeConfig) -> dict | None:
        """Returns the statistics a result records: the --ci level with --measure-bootstrap N, now N jackknife groups
        ("interval": "jackknife"; results cached before recorded "bootstrap": N, a percentile bootstrap, and keep it),
        and --measure-permutations; None when neither is asked for (the values alone)."""
        replicates = int(cfg.options.get("measure_bootstrap") or 0)
        permutations = int(cfg.options.get("measure_permutations") or 0)
        if replicates < 0 or permutations < 0:
            bad = "--measure-bootstrap" if replicates < 0 else "--measure-permutations"
            raise VitseeError(f"{bad} {min(replicates, permutations)} is negative: use 0 (none) or a count, e.g. 200")
        level = cfg.ci if replicates else 0.0
        if not level and not permutations:
            return None
        return {
            "ci": stats_mod.check_level(level) if level else 0.0,
            "interval": stats_mod.JACKKNIFE if level else "",
            "groups": replicates if level else 0,
            "permutations": permutations,
            "seed": int(cfg.seed),
        }

    def no_interval(self, view: View) -> str:
        return "no interval: --measure-bootstrap 200 gives one" if view.ci_low is None else ""

    def images(self, params: dict) -> np.ndarray:
        """Returns the sorted indices of the images the measure runs on (measures_grams.choose_images)."""
        from vitsee.measures.grams import choose_images

        return choose_images(params["n_images"], params["max_images"], params["seed"] or 0)[0]

    def estimate(self, store: Store, request: Request, cfg: AnalyzeConfig) -> tuple[float, int, int, int]:
        """Returns (seconds on one CPU core, images, layers, passes) of computing the measure's joint matrix over
        every stored layer (Measure.seconds, once per pass: the estimate and each resample)."""
        params = self.params(store, request, cfg)
        n, layers = params["max_images"], sum(map(len, params["layers"].values()))
        st = params.get("stats") or {}
        passes = 1 + min(st.get("bootstrap", 0) or st.get("groups", 0), n) + st.get("permutations", 0)
        return self.spec.seconds(n, layers, **self.measure_values(params)) * passes, n, layers, passes

    def warning(self, store: Store, request: Request, cfg: AnalyzeConfig) -> str | None:
        seconds, n, layers, passes = self.estimate(store, request, cfg)
        if seconds < 60:
            return None
        return (
            f"{self.label} of {layers} layers over {n} images"
            + (f", {passes - 1} resamples" if passes > 1 else "")
            + f": about {seconds / 60:.0f} min on one CPU core; {self.spec.faster} or --measure-bootstrap 0"
            " --measure-permutations 0 shorten it"
        )

    # --- running ------------------------------------------------------------------------------------------------

    def compute(
        self, store: Store, request: Request, params: dict, cfg: AnalyzeConfig, progress: StepFn | None = None
    ) -> dict[str, np.ndarray]:
        """Returns the joint (L, L) matrix of the measure over every stored layer of every model, with its
        bootstrap interval and permutation p-values when params ask for them."""
        from vitsee.measures import resampling as measures_stats
        from vitsee.measures.grams import pairwise, why_undefined

        for reason in (self.not_applicable(store, key) for key in params["models"]):
            if reason:
                raise VitseeError(reason)
        columns = [(m, layer) for m in params["models"] for layer in params["layers"][m]]
        rows = self.images(params)
        grams = shared_layer_grams(store, columns, rows, resolve_device(cfg.device), progress, self.name)
        ok = [i for i, g in enumerate(grams) if g is not None]  # the others hold NaN/Inf: NaN rows and columns
        good = [grams[i] for i in ok]
        values = self.measure_values(params)
        size = (len(columns), len(columns))
        arrays = {
            "matrix": np.full(size, np.nan),
            "model": np.array([params["models"].index(m) for m, _ in columns]),
            "layer": np.array([layer for _, layer in columns]),
            "images": rows,
        }
        cells = np.ix_(ok, ok)
        if good:
            arrays["matrix"][cells] = pairwise(good, None, self.key, **values)
        diagonal = np.diagonal(
            arrays["matrix"]
        )  # a layer without a value even with itself: say why (views put it in words)
        arrays["undefined"] = np.array(
            [why_undefined(g, self.key) if not np.isfinite(d) else "" for g, d in zip(grams, diagonal)]
        )
        emit(progress, f"{self.name} pairs", 1, 1)
        st = params.get("stats")
        if st and st.get("groups"):  # the delete-a-group jackknife (engine/measures/jackknife.py)
            from vitsee.measures import jackknife

            arrays["ci_low"], arrays["ci_high"] = np.full(size, np.nan), np.full(size, np.nan)
            note = stats_mod.no_interval_reason(len(rows))
            if note:
                arrays["ci_note"] = np.array([note])
            elif good:
                step = lambda done, total: emit(progress, f"{self.name} jackknife", done, total)  # noqa: E731
                low, high = jackknife.jackknife_interval(
                    good,
                    None,
                    self.key,
                    st["ci"],
                    st["groups"],
                    st["seed"],
                    estimate=arrays["matrix"][cells],
                    progress=step,
                    **values,
                )
                arrays["ci_low"][cells], arrays["ci_high"][cells] = low, high
                arrays["n_groups"] = np.array(min(int(st["groups"]), len(rows)))
        elif st and st.get("bootstrap"):  # a result cached before: its percentile bootstrap
            arrays["ci_low"], arrays["ci_high"] = np.full(size, np.nan), np.full(size, np.nan)
            if good:
                step = lambda done, total: emit(progress, f"{self.name} bootstrap", done, total)  # noqa: E731
                low, high = measures_stats.bootstrap_interval(
                    good, None, self.key, st["ci"], st["bootstrap"], st["seed"], progress=step, **values
                )
                arrays["ci_low"][cells], arrays["ci_high"][cells] = low, high
        if st and st["permutations"]:
            arrays["p_value"] = np.full(size, np.nan)
            if good:
                step = lambda done, total: emit(progress, f"{self.name} permutations", done, total)  # noqa: E731
                arrays["p_value"][cells] = measures_stats.permutation_p_value(
                    good,
                    None,
                    self.key,
                    st["permutations"],
                    st["seed"],
                    progress=step,
                    observed=arrays["matrix"][cells],
                    **values,
                )
        return arrays

    def bootstrap_matrices(
        self, store: Store, result: Result, device: str = "auto", progress: StepFn | None = None
    ) -> tuple[Iterator[np.ndarray], str] | None:
        """Returns the result's bootstrap replicates of the whole joint matrix (the resamples, seed and Grams of its
        per-cell interval, so the same draws), NaN rows and columns where a layer holds NaN/Inf; None for a result
        computed without --measure-bootstrap."""
        from vitsee.measures import resampling as measures_stats

        params = result.params
        st = params.get("stats") or {}
        if not st.get("bootstrap"):
            return None
        found = self._result_grams(store, result, device, progress)
        if found is None:
            return None
        columns, rows, grams, ok = found
        step = lambda done, total: emit(progress, f"{self.name} bootstrap", done, total)  # noqa: E731
        parts = measures_stats.iter_bootstrap_replicates(
            [grams[i] for i in ok], None, self.key, st["bootstrap"], st["seed"], step, **self.measure_values(params)
        )
        how = f"(the {self.label} result's own, {len(rows)} images, seed {st['seed']})"
        return _whole(parts, len(columns), ok), how

    def jackknife_matrices(
        self, store: Store, result: Result, device: str = "auto", progress: StepFn | None = None
    ) -> tuple[Iterator[np.ndarray], int, str] | None:
        """Returns (the joint (L, L) matrix with each of the result's jackknife groups of images left out in turn, the
        number of groups, how they were drawn in words) for a result with jackknife intervals (the same groups as its
        per-cell intervals); None otherwise or with too few images for an interval."""
        from vitsee.measures import jackknife

        params = result.params
        st = params.get("stats") or {}
        if not st.get("groups") or len(result["images"]) < stats_mod.MIN_INTERVAL_IMAGES:
            return None
        found = self._result_grams(store, result, device, progress)
        if found is None:
            return None
        columns, rows, grams, ok = found
        groups = min(int(st["groups"]), len(rows))
        step = lambda done, total: emit(progress, f"{self.name} jackknife", done, total)  # noqa: E731
        parts = jackknife.iter_jackknife_replicates(
            [grams[i] for i in ok], None, self.key, st["groups"], st["seed"], step, **self.measure_values(params)
        )
        how = f"{groups} groups of the {len(rows)} images, each left out once (seed {st['seed']})"
        return _whole(parts, len(columns), ok), groups, how

    def null_matrices(
        self,
        store: Store,
        result: Result,
        permutations: int,
        seed: int,
        device: str = "auto",
        progress: StepFn | None = None,
    ) -> Iterator[np.ndarray] | None:
        """Returns the result's joint (L, L) matrix with each model's images permuted by its own permutation (all its
        layers alike), `permutations` replicates one at a time (engine/measures/jackknife.py iter_null_replicates):
        the draws of the null of any summary of the cross-model blocks. None when no layer has finite Grams."""
        from vitsee.measures import jackknife

        found = self._result_grams(store, result, device, progress)
        if found is None:
            return None
        columns, _, grams, ok = found
        owners = [result.params["models"].index(columns[i][0]) for i in ok]
        step = lambda done, total: emit(progress, f"{self.name} null", done, total)  # noqa: E731
        parts = jackknife.iter_null_replicates(
            [grams[i] for i in ok], owners, self.key, permutations, seed, step, **self.measure_values(result.params)
        )
        return _whole(parts, len(columns), ok)

    def _result_grams(self, store: Store, result: Result, device, progress) -> tuple | None:
        """Returns (columns, image rows, each column's LayerGrams or None, the columns with Grams) of a result."""
        params = result.params
        columns = [(m, layer) for m in params["models"] for layer in params["layers"][m]]
        rows = np.asarray(result["images"], dtype=np.int64)
        grams = shared_layer_grams(store, columns, rows, resolve_device(device), progress, self.name)
        ok = [i for i, g in enumerate(grams) if g is not None]
        return (columns, rows, grams, ok) if ok else None

    # --- the view -----------------------------------------------------------------------------------------------

    def view(self, result: Result, request: Request, info: dict) -> View:
        view = super().view(result, request, info)
        used, n = int(result.params["max_images"]), int(result.params["n_images"])
        if used < n:
            view.title += f", {used} of {n} images"
        return view

    def interval_words(self, view: View, level: str) -> str:
        st = view.params.get("stats") or {}
        n = view.params.get("max_images")
        if st.get("groups"):
            groups = min(int(st["groups"]), int(n or st["groups"]))
            return (
                f"{level} jackknife interval: {groups} groups of the {n} images each left out once, estimate -/+ "
                f"t x sd; {self.spec.interval_holds}"
            )
        return f"{level} percentile bootstrap over {st.get('bootstrap')} resamples of the {n} images"

    def caption_notes(self, view: View) -> str:
        used, n, seed = view.params.get("max_images"), view.params.get("n_images"), view.params.get("seed")
        notes = [
            f"on all {n} images" if used == n else f"on {used} of the {n} images, drawn with seed {seed} (--max-images)"
        ]
        values = self.measure_values(view.params)
        if values:
            notes.append(
                ", ".join(
                    f"{name} {('yes' if value else 'no') if isinstance(value, bool) else value}"
                    for name, value in values.items()
                )
            )
        if view.p_value is not None:
            notes.append(f"small p: {self.spec.significance}")
        return "".join(f"; {note}" for note in notes)


def _whole(parts: Iterator[np.ndarray], n_columns: int, ok: list[int]) -> Iterator[np.ndarray]:
    """Yields each (len(ok), len(ok)) matrix of `parts` inside an (n_columns, n_columns) one, NaN elsewhere (the
    layers whose activations hold NaN/Inf)."""
    cells = np.ix_(ok, ok)
    for part in parts:
        whole = np.full((n_columns, n_columns), np.nan)
        whole[cells] = part
        yield whole


def shared_layer_grams(
    store: Store,
    columns: list[tuple[str, str]],
    rows: np.ndarray,
    device,
    progress: StepFn | None = None,
    label: str = "",
) -> list:
    """Returns each (model, layer)'s LayerGrams over the images `rows` on `device` (None for a layer whose
    activations there hold NaN/Inf), each built once in the driver's run and shared by every measure of it."""
    from vitsee.measures.grams import LayerGrams

    digest = hashlib.sha1(np.ascontiguousarray(rows, dtype=np.int64).tobytes()).hexdigest()

    def build(model: str, layer: str):
        x = store.activations(model, layer, rows)
        if not np.isfinite(x).all():
            return None
        return LayerGrams.from_features(x, f"{model} {layer}", device)

    out = []
    for i, (model, layer) in enumerate(columns):
        key = ("layer grams", str(store.path), model, layer, digest, str(device))
        out.append(SHARED.get(key, lambda m=model, lay=layer: build(m, lay)))
        emit(progress, f"{label} Grams", i + 1, len(columns))
    return out


def gram_measure_analyses() -> list[type[GramMeasure]]:
    """Returns a GramMeasure for every registered measure of vitsee.measures with a view of its own, made and
    registered now (each once): a measure's module in engine/measures/catalog/ is all it takes to be an analysis.
    Linear CKA has none of its own: its view is cka.py's minibatch estimate."""
    made = {a.key: type(a) for a in REGISTRY.values() if isinstance(a, GramMeasure)}
    for spec in MEASURES.values():
        if spec.own_view and spec.name not in made:
            doc = f"{spec.label or spec.name} of every pair of stored layers, within a model and across two."
            made[spec.name] = type(
                type(spec).__name__, (GramMeasure,), {"spec": spec, "__doc__": doc, "__module__": __name__}
            )
    return list(made.values())


gram_measure_analyses()
