"""The contract of an analysis: everything the driver, the CLI, the views, the figures, the app and the dossier
know about an analysis, declared by the analysis itself (as harlequin's adapters declare their options and timm's
models their configs), and the typed objects they hand each other.

    class Analysis        what an analysis declares (data) and does (methods); a subclass with a `name` is
                          registered when its module is imported (engine/analyses/__init__.py imports them all)
    class Shape           the picture a view is drawn as; figures.py, render.py and the app's panes draw each shape,
                          so a new analysis of an existing shape needs no drawing code
    class Request         what a view string asks for: an analysis, its models (resolved) and a layer
    class Result          a cached result: its arrays and the parameters it is cached under
    class View            a result shaped for looking at: a labelled matrix plus what its shape needs
    class AnalysisOption  a `vitsee analyze` option an analysis declares beside its flag

Nothing here knows any analysis by name: the rest of the project asks the analysis (`view.analysis`,
`REGISTRY[name]`) or the view's shape. tests/test_contract.py runs every registered analysis through the same path.
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from vitsee.errors import VitseeError
from vitsee.stats import ALPHA, ROUGH_BATCHES, benjamini_hochberg, interval_method, significance_label

from vitsee.analyses.config import AnalyzeConfig, StepFn

if TYPE_CHECKING:
    from vitsee.store import Store


SLOW = 2  # an analysis of this cost or more takes minutes where the others take seconds: it runs last


class Shape(Enum):
    """The picture a view is drawn as, and the fields of the view that picture reads.

    A new analysis whose view has one of these shapes is drawn by the PNG figures (engine/output/figures.py), `vitsee
    show` (engine/output/render.py) and the app (the pane of that shape) without any code of its own.
    """

    LAYER_MATRIX = "layer x layer matrix"
    """rows: model A's layers, cols: model B's (the same model within one); one value per pair between vmin and
    vmax (CKA, and any measure of how alike two layers are). Optional: ci_low/ci_high/p_value per cell."""
    HEADS_BY_BLOCK = "per-head values by block"
    """rows: blocks, cols: heads sorted per block; extra: std_px, hist_counts/hist_edges (a histogram per block),
    uniform_px (a reference value) and heads_per_block (fewer heads in some blocks)."""
    DEPTH_CURVES = "curves over depth"
    """rows: layers in forward order, cols: series (one curve each); optional extra: chance (a reference line),
    token_maps (layer -> a value per token, drawn as a grid beside the curves)."""
    TOKEN_RATIOS = "sublayer x token values"
    """rows: sublayers, cols: tokens (CLS first); extra: cls and spatial_mean, two curves over the rows."""
    TOKEN_MAPS = "a map per token"
    """rows: tokens, cols: input patches, each row a map over the grid; extra: grid (rows, cols of the map)."""
    HEADS_BY_LAYER = "per-head values x another model's layers"
    """rows: heads (blocks.B.head.H), cols: another model's layers; extra: distance_px per head, block, head and
    scatter_col (the column the scatter of value against distance shows first)."""
    PIXEL_MAP = "a map over the input"
    """rows x cols: the input's pixels, one layer's map; extra: layers, depth_layers/depth_maps (a few depths'
    maps side by side), min_positive (the floor of a log colour scale)."""
    MODEL_MATRIX = "models x models matrix"
    """rows = cols: the store's models in the store's order, one value per pair (a summary of the pair's layer x
    layer matrix); drawn in extra's `order` (a clustering), each model marked with its `families` entry. Optional:
    ci_low/ci_high per cell; extra: correspondences (each model's layers matched to another's: a, b, depth_a,
    depth_b_path, ...), measure (the analysis a cell opens: its layer x layer view of the pair)."""
    MEASURES_AGREE = "measures side by side"
    """rows x cols: the layer x layer measures of one pair of models, each against each, valued by how their
    rankings of the layer pairs agree (a rank correlation); extra: panels (measures, A layers, B layers) each
    measure's matrix, panel_rows/panel_cols (the layers), panel_names (each measure's value name),
    higher_is_better (per measure), n_pairs, note (said under the picture)."""
    SCORE_TABLE = "scores with intervals"
    """rows: what is scored (the measures), cols: the scores (d-prime, silhouette, ROC-AUC), higher is better in
    every column; optional ci_low/ci_high per cell; extra: panel (an optional models x models matrix drawn beside:
    panel_title, panel_labels, panel_groups), note (said under the picture)."""
    CURVES = "values against a count"
    """rows: the points of the x axis in order (a number of images, a k), cols: series, one curve each; optional
    ci_low/ci_high per cell (a band); extra: x_label, x (the numbers of the rows), log_x, note."""


@dataclass(frozen=True)
class AnalysisOption:
    """A `vitsee analyze` option an analysis declares beside its flag: `--NAME VALUE`, kept in the config's
    `field` (a field of AnalyzeConfig) or, when AnalyzeConfig has no such field, in its `options` by name."""

    name: str  # the option without its dashes: erf-images
    type: type
    help: str
    field: str = ""  # default: the name with '_' for '-'
    # where a result's params keep the value it sets ('stats.bootstrap': a key inside a key); default: `attr`. A
    # cached result serves a view asked for with this option only when its params hold the value asked for there
    param: str = ""

    @property
    def attr(self) -> str:
        return self.field or self.name.replace("-", "_")

    @property
    def path(self) -> str:
        """Returns where a result's params keep this option's value (dotted)."""
        return self.param or self.attr


@dataclass(frozen=True)
class Request:
    """What a view string asks of an analysis: its models (store keys) and, for some, a layer."""

    name: str  # the analysis
    keys: tuple[str, ...]
    layer: str | None = None
    joint: bool = False  # one result for the whole store (CKA over every model's layers): the driver says its name

    @property
    def analysis(self) -> Analysis:
        return REGISTRY[self.name]

    @property
    def spec(self) -> str:
        """Returns the view string: NAME:MODEL[:MODEL | :LAYER]."""
        return ":".join([self.name, *self.keys, *([self.layer] if self.layer else [])])

    @property
    def label(self) -> str:
        """Returns what the driver reports having done: the view string, or the analysis's name for a joint one."""
        return self.name if self.joint else self.spec


class Result(Mapping):
    """A cached result: its arrays by name (`result["matrix"]`), the parameters it is cached under (`.params`,
    its cache key) and where it came from (`.provenance`). Read-only; the store keeps it as it always has."""

    def __init__(self, analysis: str, params: dict, arrays: Mapping[str, Any], provenance: dict | None = None):
        self.analysis = analysis
        self.params = params
        self.arrays = dict(arrays)
        self.provenance = provenance or {}

    @classmethod
    def load(cls, store: Store, analysis: str, params: dict) -> Result | None:
        """Returns the result of `analysis` cached in the store under these params, or None."""
        cached = store.get_result(analysis, params)
        if cached is None:
            return None
        arrays = dict(cached)
        params, provenance = arrays.pop("_params"), arrays.pop("_provenance", {})
        return cls(analysis, params, arrays, provenance)

    def __getitem__(self, name: str):
        return self.arrays[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.arrays)

    def __len__(self) -> int:
        return len(self.arrays)

    def __repr__(self) -> str:
        return f"Result({self.analysis!r}, arrays={sorted(self.arrays)})"


def save_result(store: Store, analysis: str, params: dict, arrays: Mapping[str, Any]) -> Result:
    """Caches the arrays of a result under its params, with its provenance; returns it as the cache has it."""
    provenance = {
        "store": str(store.path),
        "dataset": store.dataset_spec,
        "n_images": store.n_images,
        "models": {m: store.model_info(m)["weights"] for m in store.models},
    }
    store.put_result(analysis, params, dict(arrays), provenance=provenance)
    result = Result.load(store, analysis, params)
    assert result is not None
    return result


# --- the registry ---------------------------------------------------------------------------------------------


class _Registry(Mapping):
    """The registered analyses by name, iterated in their declared `order` (the order of views, tabs and runs)."""

    def __init__(self) -> None:
        self._by_name: dict[str, Analysis] = {}

    def add(self, analysis: Analysis) -> None:
        old = self._by_name.get(analysis.name)
        if old is not None and type(old).__qualname__ != type(analysis).__qualname__:
            raise VitseeError(
                f"two analyses are named '{analysis.name}': {type(old).__module__}.{type(old).__name__} "
                f"and {type(analysis).__module__}.{type(analysis).__name__}: rename one"
            )
        self._by_name[analysis.name] = analysis

    def _ordered(self) -> list[str]:
        return sorted(self._by_name, key=lambda n: (self._by_name[n].order, n))

    def __getitem__(self, name: str) -> Analysis:
        return self._by_name[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._ordered())

    def __len__(self) -> int:
        return len(self._by_name)


REGISTRY = _Registry()


# --- the contract ----------------------------------------------------------------------------------------------


class Analysis(ABC):
    """One analysis: what it is, what it reads and to what it applies, how it runs and is cached, and how its view
    is shaped, worded and summarised. A subclass that sets `name` is registered when its module is imported.

    Declared as data (class attributes), each with a default where one is usual:
        name, label, short_label, title, figures, order, shape, family, tab, option_help, options, by_default, cost,
        models, takes_layer, needs, identity, model_fields, higher_is_better, nonfinite_source, dossier_title,
        layer_list_title, tooltip, measure_option.
    Declared as methods: `not_applicable` (the one place the reason is written), `params` and `run` (or `compute`,
    which the default `run` caches), `view`, and the optional hooks below them.
    """

    # --- what it is
    name: ClassVar[str] = ""  # its view strings NAME:..., its results' folder, its `vitsee analyze --NAME` flag
    label: ClassVar[str] = ""  # its tab in the app
    short_label: ClassVar[str] = ""  # its tab where the row is too narrow (default: the label's first 4 letters)
    title: ClassVar[str] = ""  # what it computes, in a line
    figures: ClassVar[tuple[str, ...]] = ()  # the figures of Raghu et al. 2021 it reproduces
    order: ClassVar[int] = 100  # its place among the views, the tabs and the number keys
    shape: ClassVar[Shape]  # the picture its view is drawn as
    family: ClassVar[str] = ""  # analyses of one family compare the same things (every layer x layer similarity)
    tooltip: ClassVar[str] = ""  # what its number key does in the app (default: 'Show the LABEL view')
    tab: ClassVar[bool] = True  # its own tab and number key in the app; False: it shows in the tab of the first
    # analysis of its family that has one, where `m` cycles the family's views cached for the models shown

    # --- `vitsee analyze`
    option_help: ClassVar[str] = ""  # the help of its `--NAME` flag
    options: ClassVar[tuple[AnalysisOption, ...]] = ()  # its own options beside the flag
    by_default: ClassVar[bool] = True  # `vitsee analyze` with none named (and the app after a new run) runs it
    cost: ClassVar[int] = 1  # 0: summaries of statistics recorded at extraction, 1: a pass over the activations,
    # 2: fits, 3: reloads the models. The driver runs those under SLOW first (in the registry's order), then the
    # slow ones by cost; the dossier computes a missing view of cost 0

    # --- what it reads and names
    models: ClassVar[tuple[int, int]] = (1, 1)  # how many models its view names (least, most); (0, 0): the whole store
    model_words: ClassVar[
        tuple[str, ...]
    ] = ()  # its view string's models for help (default MODEL, or MODEL_A, MODEL_B)
    takes_layer: ClassVar[bool] = False  # its view is of one layer: NAME:MODEL[:LAYER]
    needs: ClassVar[frozenset[str]] = (
        frozenset()
    )  # what it reads: activations, statistics, head outputs, input, labels, weights
    identity: ClassVar[
        tuple[str, ...]
    ] = ()  # the params that say what a result is about (any estimate of it serves a view)

    # --- its view
    model_fields: ClassVar[tuple[str, ...]] = ("model",)  # the JSON export's names of the view's models
    higher_is_better: ClassVar[bool] = True  # `vitsee show`'s best cell is the largest value (False: the smallest)
    nonfinite_source: ClassVar[str] = "per-image statistics"  # where a NaN/Inf cell's NaN came from
    dossier_title: ClassVar[str | None] = None  # its section in a layer pair's dossier (None: none)
    layer_list_title: ClassVar[str] = "Layers (Enter: go)"  # the app's side panel over its view
    # the attribute of its option that names the measure its view summarises (the zoo's `zoo_measure`): `m` in the app
    # cycles it over measure_choices; "" for a view of one fixed measure
    measure_option: ClassVar[str] = ""
    # what its intervals resample, said after them in captions (the separability's resample models, not images)
    what_varies: ClassVar[str] = "the images vary, the model is fixed"

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("name") and not inspect.isabstract(cls):
            REGISTRY.add(cls())

    # --- which models and views --------------------------------------------------------------------------------

    @property
    def usage(self) -> str:
        """Returns its view string for help and errors: cka:MODEL_A[:MODEL_B], heads:VIT:OTHER, erf:MODEL[:LAYER]."""
        least, most = self.models
        words = (self.model_words or (("MODEL",) if most == 1 else ("MODEL_A", "MODEL_B")))[:most]
        parts = [f":{w}" if i < least else f"[:{w}]" for i, w in enumerate(words)]
        return self.name + "".join(parts) + ("[:LAYER]" if self.takes_layer else "")

    @abstractmethod
    def not_applicable(self, store: Store, key: str) -> str | None:
        """Returns why the analysis does not apply to model `key` of the store (one line naming the way out), or
        None when it does: the one place that reason is written (the driver, the app and the dossier say it)."""

    def refusal(self, store: Store) -> str:
        """Returns why the analysis, named, has nothing to run on the store: the first model's reason."""
        for key in store.models:
            reason = self.not_applicable(store, key)
            if reason:
                return reason
        return f"{self.name} applies to no model of {store.path}"

    def requests(self, store: Store) -> list[Request]:
        """Returns every view it offers on the store (pickers): one per model it applies to, by default; a view of
        the whole store (models (0, 0)) is one view when it applies to every model."""
        if self.models[1] == 0:
            applies = bool(store.models) and all(self.not_applicable(store, key) is None for key in store.models)
            return [Request(self.name, ())] if applies else []
        return [Request(self.name, (key,)) for key in store.models if self.not_applicable(store, key) is None]

    def jobs(self, store: Store) -> list[Request]:
        """Returns what computing it on the store takes, one Request per result (default: every view)."""
        return self.requests(store)

    def served(self, store: Store, job: Request) -> list[Request]:
        """Returns the views a job's result serves (one; every view of the store for a joint result)."""
        return self.requests(store) if job.joint else [job]

    def layer_choices(self, store: Store, key: str) -> list[str]:
        """Returns the layers its view can be of (analyses that take a layer), in forward order."""
        return []

    def layer_missing(self, layer: str) -> str:
        """Returns why a layer has no view of this analysis (one of its layer_choices it is not)."""
        return f"{layer} has no {self.label} view"

    # --- parameters and running --------------------------------------------------------------------------------

    @abstractmethod
    def params(self, store: Store, request: Request, cfg: AnalyzeConfig) -> dict:
        """Returns the parameters a result of `request` is cached under (its cache key): what it is about and how
        it is estimated. Raises the VitseeError that says why when it cannot be computed."""

    def cached_params(self, store: Store, params: dict, given: Iterable[str] = ()) -> dict | None:
        """Returns the params of the cached result about the same thing as `params` (its `identity`) that the
        analysis prefers (`preference`, the newest among equals), whatever settings made it, except the options
        `given` (attributes: `max_images`, ...): on those it holds the values `params` hold. None when none is."""
        paths = [path for attr in given for path in self.option_paths(attr)]
        same = [
            r
            for r in store.results(self.name)
            if all(r["params"].get(k) == params.get(k) for k in self.identity)
            and all(param_at(r["params"], p) == param_at(params, p) for p in paths)
        ]

        def preference(r: dict) -> tuple:
            made = r["provenance"]
            return self.preference(r["params"]), made.get("created", ""), made.get("created_unix", 0.0)

        best = max(same, key=preference, default=None)
        return best["params"] if best else None

    def option_paths(self, attr: str) -> list[str]:
        """Returns where its results' params keep the value of its option `attr` (none: not its option)."""
        return [option.path for option in self.options if option.attr == attr]

    def run(self, store: Store, request: Request, cfg: AnalyzeConfig, progress: StepFn | None = None) -> Result:
        """Returns the result of `request`: cached, or computed (`compute`) and cached."""
        params = self.params(store, request, cfg)
        cached = None if cfg.recompute else Result.load(store, self.name, params)
        if cached is not None:
            return cached
        return save_result(store, self.name, params, self.compute(store, request, params, cfg, progress))

    def compute(
        self, store: Store, request: Request, params: dict, cfg: AnalyzeConfig, progress: StepFn | None = None
    ) -> dict[str, np.ndarray]:
        """Returns the arrays of a result computed from the store (what the default `run` caches)."""
        raise NotImplementedError(f"{type(self).__name__} overrides run(), or must implement compute()")

    def preference(self, params: dict) -> float:
        """Returns how much a cached result with these params is preferred among those about the same thing (the
        largest serves a view that asked for no particular estimate, ties going to the newest)."""
        return 0.0

    def warning(self, store: Store, request: Request, cfg: AnalyzeConfig) -> str | None:
        """Returns a line to show before computing `request` when it is expected to take long, else None."""
        return None

    def command(self, store_path: Any, layer: str | None = None) -> str:
        """Returns the `vitsee analyze` command that computes its result (for a layer, where that matters)."""
        return f"vitsee analyze {store_path} --{self.name}"

    def measure_choices(self, store: Store) -> list[str]:
        """Returns the measures (analysis names) its `measure_option` can name that the store has cached, so
        that its view of them is at hand; none where it has no such option."""
        return []

    def measure_of_view(self, view: View) -> str:
        """Returns the measure (analysis name) a view of it summarises; "" where it has no `measure_option`."""
        return ""

    # --- the view ----------------------------------------------------------------------------------------------

    @abstractmethod
    def view(self, result: Result, request: Request, info: dict) -> View:
        """Returns the view of `request` from its result (`info`: the first model's record)."""

    def interval_words(self, view: View, level: str) -> str:
        """Returns what the view's intervals are, in words ('95% Student-t interval of the mean over 48 images')."""
        return f"{level} Student-t interval of the mean over {view.params.get('n_images')} images"

    def caption_notes(self, view: View) -> str:
        """Returns what `vitsee show` adds to the view's caption ('; ...' per note), '' for nothing."""
        return ""

    def no_interval(self, view: View) -> str:
        """Returns what to say beside a value of a view that has no interval though the analysis could give one,
        naming how to get it ('no interval: --measure-bootstrap 200 gives one'); '' where nothing is missing."""
        return ""

    def present(self, view: View) -> np.ndarray | None:
        """Returns the (rows, cols) mask of the cells that hold a value at all (None: every cell); a NaN outside it
        is no non-finite value (a Swin stage's missing heads)."""
        return None

    def nonfinite_images(self, view: View, store: Store) -> np.ndarray | None:
        """Returns per cell how many images have NaN/Inf inputs behind it (-1 unknown), for the view's non-finite
        cells (`view.nonfinite`), or None when the store cannot tell."""
        return None

    def dossier_section(self, view: View, layer: str, note: str = "") -> DossierEntry:
        """Returns its section of a layer's dossier from its view of that layer's model (`note`: a line on the
        model's weights to add where it explains the numbers)."""
        return DossierEntry(layer, [], False)


@dataclass
class DossierEntry:
    """An analysis's lines about one layer for the dossier, the layer its view opens at, and whether it has any."""

    layer: str
    lines: list[str]
    available: bool = True


# --- views -----------------------------------------------------------------------------------------------------


def _names(labels: list[str], rows: np.ndarray) -> str:
    """Returns 'a, b, c, d and 3 more' for the labels of rows."""
    return ", ".join(labels[r] for r in rows[:4]) + (f" and {len(rows) - 4} more" if len(rows) > 4 else "")


@dataclass
class View:
    """A result ready to draw: `matrix` (rows x cols) with labels, a colour range, and what its shape needs in
    `extra`. `kind` names its analysis (`view.analysis`); the analysis's `shape` says how it is drawn."""

    kind: str
    spec: str
    title: str
    subtitle: str
    matrix: np.ndarray
    rows: list[str]
    cols: list[str]
    value_name: str
    vmin: float | None = None
    vmax: float | None = None
    params: dict = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    models: list[str] = field(default_factory=list)
    # cells that were computed but are NaN/Inf (non-finite inputs, or a readout skipped for them), beside the
    # values so that "non-finite" and "not computed" (NaN without a mark) stay two things
    nonfinite: np.ndarray | None = None  # (rows, cols) bool
    nonfinite_images: np.ndarray | None = None  # (rows, cols) images with non-finite inputs per cell, -1 unknown
    # (rows, cols) why a cell without a value has none, in words ('' where the result does not say): a constant layer,
    # one RSA cannot use, ... (a layer x layer measure's per-layer "undefined" codes, similarity.UNDEFINED)
    reasons: np.ndarray | None = None
    n_images: int = 0
    # statistics, each shaped like matrix when present (None: the result has none): see engine/stats.py
    ci_low: np.ndarray | None = None
    ci_high: np.ndarray | None = None
    p_value: np.ndarray | None = None
    # the store's models' display names (key -> name, engine/store/names.py): what titles, axes and legends call
    # them; the keys stay in `models`, `rows` (the zoo's) and the JSON
    names: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        request: Request,
        *,
        title: str,
        matrix: np.ndarray,
        rows: list[str],
        cols: list[str],
        value_name: str,
        **fields,
    ) -> View:
        """Returns the view of `request` (its analysis and view string), its other fields by keyword: what an
        analysis's `view` builds. The store's subtitle (weights, images) and its number of images are the store's to
        add (views.load_view)."""
        return cls(
            kind=request.name,
            spec=request.spec,
            title=title,
            subtitle="",
            matrix=matrix,
            rows=rows,
            cols=cols,
            value_name=value_name,
            **fields,
        )

    @property
    def analysis(self) -> Analysis:
        """Returns the registered analysis the view is of."""
        return REGISTRY[self.kind]

    @property
    def shape(self) -> Shape:
        """Returns the picture the view is drawn as (its analysis's shape)."""
        return self.analysis.shape

    def value(self, row: int, col: int) -> float:
        return float(self.matrix[row, col])

    def name(self, key: str) -> str:
        """Returns the display name of a model of the view (its key when it has none)."""
        return self.names.get(key, key)

    def is_nonfinite(self, row: int, col: int) -> bool:
        """Returns whether a cell was computed and came out non-finite (NaN/Inf)."""
        return self.nonfinite is not None and bool(self.nonfinite[row, col])

    def nonfinite_text(self, row: int, col: int) -> str:
        """Returns what made a cell non-finite: 'non-finite (3 of 48 images)' when images with NaN/Inf inputs are
        behind it, 'undefined: <why>' when the result says why (a constant layer, ...), 'undefined: not from NaN/Inf
        (...)' when the store has none behind it, else 'non-finite' (the images are unknown)."""
        count = int(self.nonfinite_images[row, col]) if self.nonfinite_images is not None else -1
        if count > 0:
            return f"non-finite ({count} of {self.n_images} images)"
        reason = str(self.reasons[row, col] or "") if self.reasons is not None else ""
        if reason:
            return f"undefined: {reason}"
        if count == 0:
            return f"undefined: not from NaN/Inf (the stored {self.analysis.nonfinite_source} hold none)"
        return "non-finite"

    def cell_text(self, row: int, col: int, digits: int = 4, missing: str = "not computed") -> str:
        """Returns a cell as text: its value, 'non-finite (k of N images)', or `missing` (not computed)."""
        value = self.matrix[row, col]
        if np.isfinite(value):
            return f"{value:.{digits}f}"
        return self.nonfinite_text(row, col) if self.is_nonfinite(row, col) else missing

    def nonfinite_note(self) -> str:
        """Returns one line on the cells without a value ('' when there are none): how many, which rows, and what
        made them so: NaN/Inf in the stored inputs only for the cells with such images behind them."""
        if self.nonfinite is None or not self.nonfinite.any():
            return ""
        counts = self.nonfinite_images if self.nonfinite_images is not None else np.full(self.matrix.shape, -1)
        inputs = self.nonfinite & (counts != 0)  # NaN/Inf behind them, or unknown: what the note always said
        if self.reasons is not None:
            inputs &= ~(self.reasons.astype(bool)) | (counts > 0)
        parts = []
        if inputs.any():
            whole = np.flatnonzero(inputs.all(axis=1))  # a layer with non-finite activations fills its row
            rows = whole if whole.size else np.flatnonzero(inputs.any(axis=1))
            where, names = self.analysis.nonfinite_source, _names(self.rows, rows)
            parts.append(
                f"{int(inputs.sum())} non-finite cell(s), from NaN/Inf in the stored {where}, in {names}"
                + (": see `vitsee info`" if where == "activations" else "")
            )
        rest = self.nonfinite & ~inputs
        if rest.any():  # each reason once, however many cells it leaves without a value
            texts = [self.nonfinite_text(r, c).removeprefix("undefined: ") for r, c in zip(*np.nonzero(rest))]
            reasons = dict.fromkeys(part for text in texts for part in text.split("; "))
            parts.append(f"{int(rest.sum())} undefined cell(s): {'; '.join(reasons)}")
        return "; ".join(parts)

    @property
    def ci_level(self) -> float:
        """Returns the confidence level of the intervals (0.0 when the result has none)."""
        return float((self.params.get("stats") or {}).get("ci") or 0.0) if self.ci_low is not None else 0.0

    @property
    def permutations(self) -> int:
        """Returns how many permutations make each p-value (0 when the result has none)."""
        return int((self.params.get("stats") or {}).get("permutations") or 0) if self.p_value is not None else 0

    @property
    def rough(self) -> bool:
        """Returns True when a bootstrap interval over minibatches (a result cached before the jackknife) rests on
        fewer than stats.ROUGH_BATCHES batches."""
        n = self.extra.get("n_batches")
        return (
            n is not None
            and self.ci_low is not None
            and n < ROUGH_BATCHES
            and interval_method(self.params.get("stats")) == "percentile"
        )

    def interval_text(self, row: int, col: int) -> str:
        """Returns ' [0.795, 0.828]  p<0.01' for a cell (with ' rough' for few batches), '' without statistics."""
        text = ""
        if self.ci_low is not None and np.isfinite(self.ci_low[row, col]):
            text += f" [{self.ci_low[row, col]:.3f}, {self.ci_high[row, col]:.3f}]" + (" rough" if self.rough else "")
        if self.p_value is not None:
            label = significance_label(float(self.p_value[row, col]), self.permutations)
            text += f"  {label}" if label else ""
        return text

    def interval_or_hint(self, row: int, col: int) -> str:
        """Returns interval_text, or where the result has no interval that its analysis could give, the words
        saying so and how to get one ('  no interval: --measure-bootstrap 200 gives one')."""
        text = self.interval_text(row, col)
        if text or self.ci_low is not None:
            return text
        hint = self.analysis.no_interval(self)
        return f"  {hint}" if hint else ""

    def interval_caption(self) -> str:
        """Returns what the intervals and p-values are, in words ('' without them), for captions and legends."""
        if self.ci_low is None and self.p_value is None:
            return self.interval_note()
        parts = [self.interval_note()] if self.interval_note() else []
        if self.ci_low is not None:
            parts.append(self.analysis.interval_words(self, f"{self.ci_level:.0%}"))
        if self.p_value is not None:
            parts.append(f"p: {self.permutations}-permutation test (images of the column layer shuffled)")
        return "; ".join(parts) + f"; {self.analysis.what_varies}"

    def interval_note(self) -> str:
        """Returns why the view has no interval where its analysis gives them ('' when that is not so)."""
        return str(self.extra.get("ci_note") or "")

    def _tested(self) -> np.ndarray:
        """Returns the cells that are tests of their own: all of them, but a view of a model with itself, whose
        lower triangle repeats its upper one and whose diagonal is each layer with itself (no test)."""
        p = np.asarray(self.p_value, dtype=np.float64)
        if p.ndim != 2 or self.models[:1] != self.models[-1:] or p.shape[0] != p.shape[1] or not self.models:
            return np.ones(p.shape, dtype=bool)
        return np.triu(np.ones(p.shape, dtype=bool), 1)

    def adjusted_p(self) -> np.ndarray | None:
        """Returns the Benjamini-Hochberg adjusted p-values of the view's cells over the cells that are tests of their
        own (a within-model view: its upper triangle, mirrored; the diagonal keeps its p); None without p-values."""
        if self.p_value is None:
            return None
        p = np.asarray(self.p_value, dtype=np.float64)
        tested = self._tested()
        q = p.copy()
        q[tested] = benjamini_hochberg(p[tested])
        if not tested.all():
            lower = np.tril_indices(p.shape[0], -1)
            q[lower] = q.T[lower]
        return q

    def not_significant(self, alpha: float = ALPHA) -> np.ndarray | None:
        """Returns a bool mask of the cells not significant at false discovery rate alpha: Benjamini-Hochberg over the
        view's cells (adjusted_p; the uncorrected p stays in `p_value` and the JSON); None without p-values."""
        q = self.adjusted_p()
        if q is None:
            return None
        with np.errstate(invalid="ignore"):
            return q > alpha

    def significance_words(self, alpha: float = ALPHA) -> str:
        """Returns what a mark of not_significant means, correction included, for legends and captions."""
        n = int(self._tested().sum()) if self.p_value is not None else 0
        return f"not significant: Benjamini-Hochberg q > {alpha:g} over the {n} cells' permutation p"

    def to_json(self) -> dict:
        """Returns the numbers with their labels and parameters (JSON-able; NaN becomes null)."""
        out: dict[str, Any] = {"view": self.kind}
        names = self.analysis.model_fields
        if names:  # a view of the whole store names none
            out.update(zip(names, [self.models[0]] if len(names) == 1 else [self.models[0], self.models[-1]]))
        out.update(
            title=self.title,
            rows=list(self.rows),
            cols=list(self.cols),
            value_name=self.value_name,
            values=to_jsonable(self.matrix),
        )
        for name in ("ci_low", "ci_high", "p_value"):  # same shape as values
            if getattr(self, name) is not None:
                out[name] = to_jsonable(np.asarray(getattr(self, name), dtype=float))
        if self.p_value is not None and self.shape is Shape.LAYER_MATRIX:  # an addition: p_value stays uncorrected
            out["p_adjusted"] = to_jsonable(self.adjusted_p())
            out["p_adjusted_method"] = "Benjamini-Hochberg over the view's cells (a model with itself: upper triangle)"
        if self.ci_low is not None:
            out["ci_level"] = self.ci_level
        for key, value in self.extra.items():
            out[key] = to_jsonable(value)
        out["nonfinite"] = (
            [  # the cells whose value is null because it is NaN/Inf (other nulls: not computed)
                {
                    "row": int(r),
                    "col": int(c),
                    "row_label": self.rows[r],
                    "col_label": self.cols[c],
                    "images": (
                        int(self.nonfinite_images[r, c])
                        if self.nonfinite_images is not None and self.nonfinite_images[r, c] >= 0
                        else None
                    ),
                    "why": self.nonfinite_text(r, c),
                }
                for r, c in zip(*np.nonzero(self.nonfinite))
            ]
            if self.nonfinite is not None
            else []
        )
        out["n_images"] = self.n_images
        if self.names:  # what the figures call the models; the keys above stay what identifies them
            out["names"] = {key: self.names[key] for key in (self.models or self.rows) if key in self.names}
        out["params"] = self.params
        return out

    def to_csv(self) -> str:
        """Returns the matrix as CSV: a header of column labels, each row led by its label."""
        import csv
        import io

        buf = io.StringIO()
        writer = csv.writer(buf)
        writer.writerow([self.value_name, *self.cols])
        for label, row in zip(self.rows, self.matrix):
            writer.writerow([label, *[("" if not np.isfinite(v) else repr(float(v))) for v in row]])
        return buf.getvalue()


def param_at(params: Mapping, path: str):
    """Returns the value at a dotted path of a result's params ('stats.bootstrap'), None where there is none."""
    value = params
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def to_jsonable(value):
    """Returns value with numpy arrays and numbers as lists and Python numbers, NaN/Inf as None (JSON's null)."""
    if isinstance(value, dict):
        return {k: to_jsonable(v) for k, v in value.items()}
    if isinstance(value, np.ndarray):
        if value.dtype.kind in "fc":
            return [to_jsonable(v) for v in value] if value.ndim else to_jsonable(float(value))
        return value.tolist()
    if isinstance(value, (float, np.floating)):
        return float(value) if np.isfinite(value) else None
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    return value


def bootstrap_words(view: View, level: str) -> str:
    """Returns the words of a CKA-like analysis's intervals: the delete-one-image jackknife of new results, the
    bootstrap over minibatches of results cached before."""
    if interval_method(view.params.get("stats")) == "jackknife":
        n = view.extra.get("n_interval_images") or view.params.get("n_images")
        return (
            f"{level} jackknife interval, each of the {n} images left out once: CKA -/+ t x sd "
            "(held the population CKA in 93-96% of simulated draws: README, Statistics)"
        )
    n = view.extra.get("n_batches")
    return f"{level} bootstrap interval over {n} minibatches of images" + (
        f" (rough: under {ROUGH_BATCHES} batches)" if view.rough else ""
    )


def streaming_reason(store: Store, what: str) -> str:
    """Returns why a streaming store cannot give `what` (it keeps no activations), with the way out."""
    return (
        f"{store.path} was extracted with --streaming, which keeps no activations, so {what}: "
        "re-extract without --streaming into another store"
    )


def features_reason(key: str, what: str) -> str:
    """Returns why a model made from another tool's activations (vitsee.from_features) has no `what`: the store
    holds no model of vitsee's run, whatever its family, and the way out."""
    return (
        f"{key} holds another tool's activations (vitsee.from_features), not a model vitsee ran: {what} are "
        "recorded while vitsee runs the model: extract it with `vitsee extract STORE --model NAME`"
    )


def analyses_of(family: str) -> list[Analysis]:
    """Returns the registered analyses of a family (e.g. every layer x layer similarity), in registry order."""
    return [a for a in REGISTRY.values() if family and a.family == family]


def per_model(analysis: Analysis) -> bool:
    """Returns whether the analysis's view names one model and no other (attention:MODEL, erf:MODEL[:LAYER])."""
    return analysis.models == (1, 1)
