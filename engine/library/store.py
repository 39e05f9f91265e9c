"""`vitsee.open(path)` and the `Store` it returns: what a store holds, and its views as `Result`s.

A `Store` keeps the path, not an open file: each call opens the store, reads and closes it, so a notebook never
holds a handle that the terminal app or a running `vitsee analyze` would trip over. A view that is not cached is
computed and cached exactly as `vitsee show` / `vitsee export` compute it (engine/analyses/views.py `load_view`).
"""

from __future__ import annotations

import html
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vitsee.analyses import REGISTRY
from vitsee.analyses.similarity import layer_measures
from vitsee.analyses.driver import AnalyzeConfig
from vitsee.errors import VitseeError
from vitsee.stats import check_level, stats_settings
from vitsee.store import Store as _EngineStore
from vitsee.analyses.views import available_views, load_view

from vitsee.library.progress import Bars
from vitsee.library.result import Result, _optional


@dataclass(frozen=True)
class Images:
    """The images of a store, in the order every model saw them."""

    dataset: str  # the dataset spec they came from (`vitsee extract --dataset`)
    index: np.ndarray  # (N,) which images of the dataset
    labels: np.ndarray | None  # (N,) class indices, None when the dataset has no labels
    class_names: list[str] | None
    shuffle_seed: int | None  # the seed of a random subset (`--shuffle-seed`), None for the first N

    def __len__(self) -> int:
        return len(self.index)

    def to_pandas(self):
        """Returns one row per image: `index` (in the dataset), `label` and `class_name` (None without labels).

        Raises:
            VitseeError: pandas is not installed.
        """
        pd = _optional("pandas", "Images.to_pandas()")
        labels = self.labels if self.labels is not None else np.full(len(self), -1)
        names = [
            self.class_names[int(c)] if self.class_names and 0 <= c < len(self.class_names) else None for c in labels
        ]
        return pd.DataFrame({"index": self.index, "label": labels, "class_name": names})


def view_config(
    batch_size: int | None = None,
    shuffles: int | None = None,
    seed: int | None = None,
    device: str | None = None,
    ci: float | None = None,
    permutations: int | None = None,
) -> AnalyzeConfig | None:
    """Returns the AnalyzeConfig `vitsee show` / `vitsee export` build from these options: None (any cached
    estimate serves) unless an estimator or statistics option is set; device alone is where to compute, not an
    estimate (load_view takes it apart). Kept equal to the CLI's by a test.

    >>> view_config() is None  # no option: any cached estimate serves
    True
    >>> cfg = view_config(shuffles=0)  # one option: the defaults for the rest, and only an exact match serves
    >>> cfg.shuffles, cfg.batch_size, cfg.ci, cfg.permutations
    (0, 256, 0.95, 99)
    """
    if batch_size is None and shuffles is None and seed is None and ci is None and permutations is None:
        return None
    base = AnalyzeConfig()
    stats = {}
    if ci is not None:
        stats["ci"] = check_level(ci) if ci else 0.0
    if permutations is not None:
        stats_settings(0.0, permutations, 0)  # the one-line error for a negative count
        stats["permutations"] = permutations
    return AnalyzeConfig(
        batch_size=base.batch_size if batch_size is None else batch_size,
        shuffles=base.shuffles if shuffles is None else shuffles,
        seed=base.seed if seed is None else seed,
        device=device or base.device,
        **stats,
    )


def analysis_options(given: dict) -> dict:
    """Returns the analyses' own options of a view (Python names: `max_images`, `zoo_measure`, ...) as load_view
    takes them; raises the one-line VitseeError for a name no analysis has."""
    known = {o.attr: o for a in REGISTRY.values() for o in a.options}
    for name in given:
        if name not in known:
            raise VitseeError(
                f"no view takes the option {name}=: the analyses' options are {', '.join(sorted(known))} "
                "(and batch_size, shuffles, seed, ci, permutations, device, progress)"
            )
    return {name: value for name, value in given.items() if value is not None}


class Store:
    """A vitsee store opened from Python (see `vitsee.open`): its models, layers and images, and every view
    `vitsee show` knows as a `Result`, computed and cached in the store the first time it is asked for."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(os.fspath(path))
        with _EngineStore.open(self.path):  # a missing, damaged or foreign file is refused here, once
            pass

    def __fspath__(self) -> str:
        return str(self.path)

    def _open(self) -> _EngineStore:
        return _EngineStore.open(self.path)

    # --- what it holds -------------------------------------------------------------------------------

    @property
    def models(self) -> list[str]:
        """The store keys of its models, in the order they were added (`test_vit@random:0`, ...)."""
        with self._open() as s:
            return s.models

    @property
    def names(self) -> dict[str, str]:
        """Each model's display name, {store key: name} in the store's order: what every title, axis, legend and
        file name calls it (`set_name` sets one; otherwise the timm name and its weights in a word, e.g.
        `resnet18 (random init)`). A view or shortcut takes a model by its key, a unique prefix or this name."""
        with self._open() as s:
            return s.display_names()

    def set_name(self, model: str, name: str | None) -> str:
        """Sets the display name of a model, kept in the store (`vitsee name STORE MODEL NAME` does the same);
        None or "" gives it back its automatic name. Returns its display name now.

        Raises:
            VitseeError: no such model, or a name that is empty, too long, holds a ':' or names another model.
        """
        with _EngineStore.writer(self.path) as s:
            return s.set_display_name(model, name if name else None)

    def layers(self, model: str) -> list[str]:
        """Returns a model's stored layers in forward order (timm module paths: `blocks.3`, `layer2.1`).

        Args:
            model: a store key, or a unique prefix of one.

        Raises:
            VitseeError: no model of that name, or a prefix that matches several.
        """
        with self._open() as s:
            return s.layers(s.resolve_model(model))

    @property
    def images(self) -> Images:
        """The store's images: dataset spec, indices, labels and class names."""
        with self._open() as s:
            return Images(s.dataset_spec, s.indices, s.labels, s.class_names, s.shuffle_seed)

    def info(self) -> dict:
        """Returns what `vitsee info` prints, as data.

        Returns:
            A dict with `path`, `n_images`, `dataset`, `complete`, `streaming`, `models` (key -> name, family, weights,
            layers with their per-image shapes, rows done, dtype) and `results` (the cached results' analysis and
            parameters).
        """
        with self._open() as s:
            models = {}
            names = s.display_names()
            for key in s.models:
                meta = s.model_info(key)
                models[key] = {
                    "name": names[key],
                    "family": meta.get("family"),
                    "weights": meta.get("weights"),
                    "dtype": meta.get("dtype"),
                    "layers": {layer: s.layer_shape(key, layer) for layer in s.layers(key)},
                    "rows_done": s.rows_done(key),
                }
            return {
                "path": str(self.path),
                "n_images": s.n_images,
                "dataset": s.dataset_spec,
                "complete": s.complete,
                "streaming": s.streaming,
                "models": models,
                "results": [{"analysis": r["analysis"], "params": r["params"]} for r in s.results()],
            }

    def views(self) -> list[str]:
        """Returns every view string that applies to this store (CKA pairs first, then per model)."""
        return available_views(self.path)

    # --- views ---------------------------------------------------------------------------------------

    def view(
        self,
        spec: str,
        *,
        batch_size: int | None = None,
        shuffles: int | None = None,
        seed: int | None = None,
        ci: float | None = None,
        permutations: int | None = None,
        device: str | None = None,
        progress: bool = True,
        **options,
    ) -> Result:
        """Returns the result of a view, computing and caching it in the store if it is not cached yet.

        Args:
            spec: a view string of `vitsee show`: `cka:A[:B]`, `attention:M`, `probes:M`, `skip:M`,
                `spatial:M[:LAYER]`, `heads:VIT:OTHER`, `erf:M[:LAYER]`; models by store key or a unique prefix.
            batch_size: CKA minibatch size if the result must be computed (the `show`/`export` options: none set,
                any cached estimate serves; one set, only a result made with these settings does).
            shuffles: CKA shuffles (0: store order).
            seed: seed of the shuffles and the probe split.
            ci: confidence level of the intervals (0: none).
            permutations: permutations behind each CKA p-value (0: none).
            device: auto, cpu, cuda or cuda:N for a computation.
            progress: draw a progress bar while computing.
            **options: the analyses' own options of `vitsee show`, by their Python names: `max_images`,
                `rbf_threshold`, `procrustes_alpha`, `cca_keep`, `knn_k`, `measure_bootstrap`, `measure_permutations`
                (the measures), `zoo_measure`, `zoo_summary`, `zoo_layers` (the zoo), `spatial_layer`, `erf_images`,
                `probe_max_dim`.

        Returns:
            A `Result`: the labelled values, intervals, p-values and parameters.

        Raises:
            VitseeError: an unknown view or model, a layer the model does not have, an analysis that does not apply
                to the model, an option no analysis has; the message is the one `vitsee show` prints.
        """
        cfg = view_config(batch_size, shuffles, seed, device, ci, permutations)
        given = analysis_options(options)
        with Bars(progress) as bars:
            return Result(load_view(self.path, spec, cfg, progress=bars.analysis, device=device, options=given))

    def cka(self, a: str, b: str | None = None, **options) -> Result:
        """Returns linear CKA of every layer of model `a` against every layer of `b` (paper Fig. 1, 2; `b` None: `a`
        with itself). Options as `view`."""
        return self.view(f"cka:{a}" if b is None else f"cka:{a}:{b}", **options)

    def attention(self, model: str, **options) -> Result:
        """Returns the mean attention distance (px) of every head per block (paper Fig. 3, 4). Options as `view`."""
        return self.view(f"attention:{model}", **options)

    def probes(self, model: str, **options) -> Result:
        """Returns the test accuracy of linear probes per layer and readout (paper Fig. 11, 13). Options as `view`."""
        return self.view(f"probes:{model}", **options)

    def skip(self, model: str, **options) -> Result:
        """Returns the skip-connection norm ratios ||z|| / ||f(z)|| per sublayer and token (paper Fig. 7)."""
        return self.view(f"skip:{model}", **options)

    def spatial(self, model: str, layer: str | None = None, **options) -> Result:
        """Returns the spatial localisation maps of a layer (default: the last block; paper Fig. 9, 10)."""
        return self.view(f"spatial:{model}" if layer is None else f"spatial:{model}:{layer}", **options)

    def heads(self, vit: str, other: str, **options) -> Result:
        """Returns the CKA of every attention head of `vit` with every layer of `other` (paper Fig. 5)."""
        return self.view(f"heads:{vit}:{other}", **options)

    def erf(self, model: str, layer: str | None = None, **options) -> Result:
        """Returns the effective receptive fields of a model's layers (paper Fig. 6); reloads the model."""
        return self.view(f"erf:{model}" if layer is None else f"erf:{model}:{layer}", **options)

    def measure(self, name: str, a: str, b: str | None = None, **options) -> Result:
        """Returns a layer x layer similarity measure of every layer of model `a` against every layer of `b` (`b`
        None: `a` with itself): `cka` or a measure beyond linear CKA, `rbf_cka`, `procrustes` (a distance: low is
        alike), `svcca`, `pwcca`, `mknn`, `cknna`, `rsa`. The measures other than CKA run on a seeded subset of at
        most `max_images` images. Options as `view`, e.g. `store.measure("procrustes", vit, resnet,
        procrustes_alpha=0.5)`.

        Raises:
            VitseeError: `name` is no layer x layer measure (the message names those there are), or as `view`.
        """
        measures = [a.name for a in layer_measures()]
        if name not in measures:
            raise VitseeError(f"'{name}' is not a layer x layer measure: use one of {', '.join(measures)}")
        return self.view(f"{name}:{a}" if b is None else f"{name}:{a}:{b}", **options)

    def agree(self, a: str, b: str | None = None, **options) -> Result:
        """Returns how the cached layer x layer measures of models `a` and `b` agree: the Spearman correlation of
        each measure's ranking of the layer pairs with each other's (`.extra["panels"]`: each measure's matrix).
        Compute the measures first (`store.measure(...)` or `vitsee analyze STORE --measures all`). Options as
        `view`."""
        return self.view(f"agree:{a}" if b is None else f"agree:{a}:{b}", **options)

    def zoo(
        self, measure: str | None = None, summary: str | None = None, layers: dict[str, str] | None = None, **options
    ) -> Result:
        """Returns the zoo: one value per pair of the store's models, summarising the pair's layer x layer matrix
        of `measure` (default `cka`) by `summary`: `best_match` (default: each layer's best match, both ways) or
        `layer` (one layer per model, `layers` {model: layer}, the others their last layer). Rows and columns are
        the store's models in its order; `.extra` holds the clustering `order`, the `families` and the layer
        `correspondences`. Options as `view`.

        Raises:
            VitseeError: an unknown measure or summary, a layer a model does not have, or as `view`.
        """
        own = {
            "zoo_measure": measure,
            "zoo_summary": summary,
            "zoo_layers": ",".join(f"{m}={layer}" for m, layer in layers.items()) if layers else None,
        }
        return self.view("zoo", **{k: v for k, v in own.items() if v is not None}, **options)

    # --- in a notebook -------------------------------------------------------------------------------

    def __repr__(self) -> str:
        with self._open() as s:
            models = ", ".join(s.models) or "no models"
            return f"<vitsee.Store {self.path}: {s.n_images} images of {s.dataset_spec}; {models}>"

    def _repr_html_(self) -> str:
        with self._open() as s:
            names = s.display_names()
            rows = "".join(
                f"<tr><td>{html.escape(names[key])}</td><td><code>{html.escape(key)}</code></td>"
                f"<td>{html.escape(str(s.model_info(key).get('family')))}"
                f"</td><td>{len(s.layers(key))}</td><td>{s.rows_done(key)}/{s.n_images}</td></tr>"
                for key in s.models
            )
            head = (
                f"<b>{html.escape(str(self.path))}</b>: {s.n_images} images of "
                f"<code>{html.escape(s.dataset_spec)}</code>"
            )
        return (
            f"<div>{head}<table><tr><th>model</th><th>key</th><th>family</th><th>layers</th><th>images done</th></tr>"
            f"{rows}</table></div>"
        )


def open(path: str | os.PathLike) -> Store:  # `vitsee.open` shadows the builtin, as h5py.File / xarray.open_dataset
    """Returns the vitsee store at `path`, opened for reading its views from Python.

    A store is what `vitsee extract` (or `vitsee.extract`, or `vitsee.from_features`) wrote: `run.h5` and the
    folder `run.h5.d/` beside it. Views that are not cached yet are computed when asked for and cached there,
    as `vitsee show` does; nothing else is ever written.

    Args:
        path: the store file (`run.h5`).

    Returns:
        A `Store`: `.models`, `.layers(model)`, `.images`, `.info()`, `.views()`, and the views themselves:
        `.view("cka:A:B")` for any view string of `vitsee show`, or `.cka(a, b)`, `.attention(m)`, `.probes(m)`,
        `.skip(m)`, `.spatial(m, layer)`, `.heads(vit, other)`, `.erf(m, layer)`, each a `Result`.

    Raises:
        VitseeError: the store does not exist, is not a vitsee store, or is damaged; the message says what to do.

    Example:
        store = vitsee.open("run.h5")
        vit, resnet = store.models
        store.cka(vit, resnet).to_pandas().head()   # paper Fig. 2 as a table: row, col, value, ci_low, ...
        store.attention(vit).plot()                 # paper Fig. 3, the figure `vitsee export` draws
    """
    return Store(path)
