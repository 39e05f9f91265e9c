"""What the app reads from a store: a summary to build the pickers, and views with what their panes need.

Everything here opens HDF5 files and may compute an analysis, so it runs in thread workers only, never on
the event loop. No Textual here: plain functions over the engine's store and view API.

The app shows cached results whatever parameters they were computed with (a store analysed with
`vitsee analyze --shuffles 0 --batch-size 16` opens without recomputing), and computes what is missing
with its own configuration.
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from typing import TYPE_CHECKING

from vitsee.errors import VitseeError, brief

if TYPE_CHECKING:  # the engine pulls in torch (seconds): imported by the workers, not at start-up
    from vitsee.analyses import driver as an
    from vitsee.analyses.base import Step
    from vitsee.store import Store
    import numpy as np

    from vitsee.analyses.views import View

StepFn = Callable[["Step"], None]
INCOMPLETE_HINT = "R resumes it"  # the app's Resume (app.py), the engine call of `vitsee extract STORE`


@dataclass
class ModelSummary:
    """One model of a store as the pickers show it."""

    key: str
    family: str
    weights: str  # 'pretrained', 'random init (seed 0)', 'weights FILE'
    layers: list[str]
    shapes: dict[str, tuple[int, ...]]
    rows_done: int
    # analysis name -> why it does not apply to this model (its not_applicable), None where it does
    reasons: dict[str, str | None] = field(default_factory=dict)
    # analysis name -> the layers its view can be of, for the analyses whose view is of one layer (spatial, ERF)
    layer_choices: dict[str, list[str]] = field(default_factory=dict)
    heads: int = 0
    name: str = ""  # its display name (engine/store/names.py): what titles, lists and file names call it
    described: str = ""  # its name and weights in words: 'test_vit (random init), seed 0'

    @property
    def shown(self) -> str:
        """Returns what the screen calls the model: its display name (its key in a summary made without one)."""
        return self.name or self.key

    def reason(self, kind: str) -> str | None:
        """Returns why analysis `kind` does not apply to the model, or None when it does."""
        return self.reasons.get(kind)


@dataclass
class StoreSummary:
    """A store's models and images, and what is wrong with it (an interrupted extraction)."""

    path: Path
    n_images: int
    dataset: str
    models: list[ModelSummary]
    cached: list[str] = field(default_factory=list)  # analyses with a cached result
    streaming: bool = False  # extracted with --streaming: results only, no activations
    writer: str | None = None  # who holds the store's write lock when it was read ('process 12 (vitsee extract ...)')

    def model(self, key: str) -> ModelSummary:
        return next(m for m in self.models if m.key == key)

    @property
    def keys(self) -> list[str]:
        return [m.key for m in self.models]

    @property
    def names(self) -> dict[str, str]:
        """Returns each model's display name by key."""
        return {m.key: m.shown for m in self.models}

    @property
    def problem(self) -> str | None:
        """Returns the sentence to show when a model's extraction has not finished, else None."""
        unfinished = [m for m in self.models if m.rows_done < self.n_images]
        if not self.models:
            return f"{self.path.name} holds no models: add one with `vitsee extract {self.path} --model NAME`"
        if not unfinished:
            return None
        m = min(unfinished, key=lambda m: m.rows_done)
        if self.writer is not None:  # not interrupted: still running, and resuming would be refused
            return (
                f"extraction in progress: {m.rows_done} of {self.n_images} images, {self.path.name} is being "
                f"written by {self.writer}; reopen it (o) when that ends"
            )
        return (
            f"extraction incomplete: {m.rows_done} of {self.n_images} images; {INCOMPLETE_HINT} "
            f"(or `vitsee extract {self.path}`)"
        )


def weights_text(weights: dict) -> str:
    """Returns how a model was initialised, in the words the screen uses."""
    kind = weights.get("kind")
    if kind == "pretrained":
        return "pretrained"
    if kind == "random":
        return f"random init (seed {weights.get('seed')})"
    if kind == "file" and weights.get("trained"):
        return f"trained here on {weights['trained']}"
    if kind == "file":
        return f"weights {Path(weights.get('path') or '').name}"
    return str(kind)


def view_spec(
    summary: StoreSummary,
    kind: str,
    a: str | None,
    b: str | None,
    picked_layer: dict[tuple[str, str], str],
    path: Path,
) -> tuple[str | None, str]:
    """Returns (the view string, '') of the view `kind` of models A and B (B None: A with itself; a view of two
    models takes the first other model), at the layer picked for it where it shows one layer; or (None, why not)."""
    from vitsee.analyses import REGISTRY

    if a is None:
        return None, "no models in this store: add one with `vitsee extract STORE --model NAME`"
    analysis = REGISTRY[kind]
    least, most = analysis.models
    others = [k for k in summary.keys if k != a]
    b = b if b and b != a else None
    if least > 1 and b is None:  # a view of two models: model B, else the first other model
        b = others[0] if others else None
    keys = [] if most == 0 else [a] + ([b] if most > 1 and b else [])  # most 0: a view of every model (zoo)
    for key in keys or summary.keys:
        m = summary.model(key)
        if m.rows_done < summary.n_images:
            return None, (
                f"{key}: extraction incomplete: {m.rows_done} of {summary.n_images} images; "
                f"{INCOMPLETE_HINT} (or `vitsee extract {path}`)"
            )
    reason = summary.model(a).reason(kind)
    if reason:  # the analysis's own words; where it applies to another model, the key that shows it
        where = next((k for k in others if summary.model(k).reason(kind) is None), None)
        return None, reason + (f"; press a to pick {where} as model A" if where else "")
    if len(keys) < least:
        return None, f"{analysis.label} compares {least} models: extract another one into this store"
    layer = picked_layer.get((kind, a)) if analysis.takes_layer else None
    return ":".join([kind, *keys, *([layer] if layer else [])]), ""


def read_summary(path: str | Path) -> StoreSummary:
    """Returns the summary of the store at path: its models, and for each whether every registered analysis applies
    to it (the analysis's own reason where not); a missing, corrupt or foreign file is a VitseeError."""
    from vitsee.analyses import REGISTRY
    from vitsee.analyses.views import named_weights
    from vitsee.store import Store
    from vitsee.store.lock import writer_of

    path = Path(path)
    try:
        with ACCESS.read(), Store.open(path) as store:
            models = []
            names = store.display_names()
            for key in store.models:
                info = store.model_info(key)
                layers = store.layers(key)
                shapes = {layer: store.layer_shape(key, layer) for layer in layers}
                models.append(
                    ModelSummary(
                        key=key,
                        family=str(info.get("family", "other")),
                        weights=weights_text(info.get("weights", {})),
                        layers=layers,
                        shapes=shapes,
                        rows_done=store.rows_done(key),
                        reasons={name: a.not_applicable(store, key) for name, a in REGISTRY.items()},
                        layer_choices={
                            name: a.layer_choices(store, key) for name, a in REGISTRY.items() if a.takes_layer
                        },
                        heads=int(info.get("num_heads") or 0),
                        name=names[key],
                        described=named_weights(names[key], info),
                    )
                )
            cached = sorted({r["analysis"] for r in store.results()})
            writer = writer_of(path) if any(m.rows_done < store.n_images for m in models) else None
            return StoreSummary(path, store.n_images, store.dataset_spec, models, cached, store.streaming, writer)
    except VitseeError:
        raise
    except (OSError, KeyError, ValueError, TypeError, json.JSONDecodeError) as exc:  # a damaged file
        raise VitseeError(
            f"{path} is not a readable vitsee store ({brief(exc)}): re-create it with `vitsee extract ... --overwrite`"
        ) from exc


# --- views --------------------------------------------------------------------------------------------


class Cancelled(Exception):
    """Raised from a progress callback to stop an analysis whose worker was cancelled."""


@dataclass
class LoadedView:
    """A view plus what its pane shows beside the numbers (layer shapes for the pair detail)."""

    spec: str
    view: View
    computed: bool  # False: read from the cache
    seconds: float
    shapes: dict[str, dict[str, tuple[int, ...]]]  # model -> layer -> per-image shape
    init_notes: dict[str, str] = field(default_factory=dict)  # model -> why its random init looks degenerate
    path: Path | None = None  # the store it came from (a detail reads per-image numbers from it)
    options: dict = field(default_factory=dict)  # the analysis's own options it was read with (the zoo's measure)


class StoreAccess:
    """Lets the app's workers share one store: reads at any time, one computation at a time.

    HDF5 refuses to open a file for writing while the same process has it open read-only, but lets readers
    open it while a writer holds it. So a computation waits for open readers to finish and holds new ones
    back only while it opens its writer; once the writer is open, cached views read alongside it.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._opening = False
        self._one_writer = threading.Lock()

    @contextmanager
    def read(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._opening)
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                self._cond.notify_all()

    @contextmanager
    def write(self, path: str | Path) -> Iterator[Store]:
        from vitsee.store import Store

        with self._one_writer:
            with self._cond:
                self._opening = True
                try:
                    self._cond.wait_for(lambda: self._readers == 0)
                    store = Store.writer(path)
                finally:
                    self._opening = False
                    self._cond.notify_all()
            try:
                yield store
            finally:
                store.close()


ACCESS = StoreAccess()


# How much lower than the app's a computing worker's CPU priority is (nice; 19 the lowest). On a loaded CPU the
# event loop thread and the worker's threads queue for the same cores; this lets the event loop go first, so
# keys answer while probes compute (benchmarks/tui.py --while-probes: median 32-47 -> 16 ms, 2 cores at load 9).
WORKER_NICE = 10


def yield_cpu_to_event_loop(nice: int = WORKER_NICE) -> bool:
    """Returns whether the calling thread now runs at a lower CPU priority (Linux, where nice is per thread).

    It cannot be raised back without privileges, which is fine for Textual's thread workers: each runs in a
    thread of its own. Threads it starts (torch's compute pool on its first use, the prefetch readers) inherit it.
    """
    if not sys.platform.startswith("linux"):  # elsewhere setpriority(PRIO_PROCESS, id) names a process
        return False
    tid = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))
    except OSError:
        return False
    return True


def read_view(
    path: str | Path,
    spec: str,
    base: an.AnalyzeConfig | None,
    progress: StepFn | None = None,
    cancelled: Callable[[], bool] = lambda: False,
    warn: Callable[[str], None] | None = None,
    options: dict | None = None,
) -> LoadedView:
    """Returns the view named by spec, from the cache when it is there, else computed and cached first.
    `options`: the analysis's own options that say what the view is of (the zoo's measure), as `vitsee show` takes
    them (attribute -> value).

    `cancelled` is polled at every progress step; when it says so the computation stops with Cancelled
    and nothing is cached. `warn` hears, before it starts, that a computation is expected to be long.
    """
    from vitsee.models.init_notes import random_init_note
    from vitsee.store import Store
    from vitsee.analyses.views import cached_params, compute_view, load_view, request_of

    def step(event: Step) -> None:
        if cancelled():
            raise Cancelled(spec)
        if progress is not None:
            progress(event)

    start = time.perf_counter()
    with ACCESS.read(), Store.open(path) as store:
        cached = cached_params(store, spec, options=options) is not None  # any cached estimate serves the app
        request = request_of(store, spec)
        if base is not None:  # None: read a cached view only (the first frame's path, no engine config)
            base = base.with_options(options)
        warning = None if cached else request.analysis.warning(store, request, base)
    if warning and warn is not None:
        warn(warning)
    if not cached:
        yield_cpu_to_event_loop()
        from vitsee.threads import set_compute_threads  # imports torch: only when something is computed

        set_compute_threads()  # the free cores now, as `vitsee analyze` takes them
        with ACCESS.write(path) as store:
            if cancelled():
                raise Cancelled(spec)
            compute_view(store, spec, base, step)
    with ACCESS.read():
        view = load_view(path, spec, options=options)
        with Store.open(path) as store:
            shapes = {m: {layer: store.layer_shape(m, layer) for layer in store.layers(m)} for m in view.models}
            notes = {m: note for m in view.models if (note := random_init_note(store.model_info(m)))}
    return LoadedView(
        spec, view, not cached, time.perf_counter() - start, shapes, notes, Path(path), dict(options or {})
    )


def read_head_distances(path: str | Path, model: str, block: int, head: int) -> np.ndarray:
    """Returns the (N,) mean attention distance in px of one head (its index in the model, not the sorted one)
    per image, as the extraction recorded it (the attention view holds only the means and a histogram)."""
    from vitsee.store import Store

    with ACCESS.read(), Store.open(path) as store:
        distances = store.attention_distance(model)  # (N, blocks, heads)
    return distances[:, block, head]


# --- export ---------------------------------------------------------------------------------------------


def export_name(view: View, when: float | None = None) -> str:
    """Returns a file stem naming the view, its models by their display names, and the time:
    cka-ViT_trained_here-x-ResNet-18_trained_here-20240102-150405."""
    models = [re.sub(r"[^A-Za-z0-9_.-]+", "_", view.name(m)).strip("_") for m in dict.fromkeys(view.models)]
    layer = view.params.get("layer") if view.analysis.takes_layer else None
    parts = [view.kind, *(["-x-".join(models)] if models else [])] + ([layer] if layer else [])  # zoo: no model
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(when))
    return "-".join(parts + [stamp])


def export_view(
    view: View, folder: str | Path, selection: tuple[int, int] | None, cmap: str, marks: bool = False
) -> tuple[Path, Path | None, str | None]:
    """Writes the view's .json (the selected cell in it) and .png (the cell marked only with `marks`: a paper's
    figure has no cursor) into folder; returns (json path, png path or None, why no png)."""
    from vitsee.output.export import write_view

    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise VitseeError(f"cannot create export folder {folder} ({brief(exc)}): pass another --export-dir") from exc
    stem = export_name(view)
    out_json = write_view(view, folder / f"{stem}.json", selection=selection, cmap=cmap)
    try:
        out_png = write_view(view, folder / f"{stem}.png", selection=selection if marks else None, cmap=cmap)
    except ImportError as exc:  # engine/output/figures.py not installed yet
        return out_json, None, f"PNG export is unavailable ({brief(exc)}); wrote the numbers"
    return out_json, out_png, None


# --- planning a run ---------------------------------------------------------------------------------------


def estimate_size(cfg) -> str:
    """Returns 'N images x M model(s), expected size on disk 1.2 GB' for an extraction config, by planning
    it (nothing is written). Raises VitseeError for a bad config."""
    from vitsee.extraction.plan import estimate

    return estimate(cfg).describe()
