"""Linear probes (Raghu et al. 2021, Fig. 11, 13): the store-facing runner and the analysis.

The arithmetic is engine/analyses/ridge.py (arrays in, arrays out: ridge fits streamed batch by batch, the split,
the L2 choice, what a fit costs). Here: which readouts a layer offers (CLS, GAP, per-token; a CNN's pooled
channels), how a layer is read from the store into batches, the layers fitted side by side, the parameters and the
cached result (`run_probes`), the time estimate the app warns with, and the `LinearProbes` view and dossier section.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from vitsee import stats as stats_mod
from vitsee.errors import VitseeError
from vitsee.stats import clopper_pearson
from vitsee.store import Store, read_rows
from vitsee.lazy import lazy_module
from vitsee.analyses.base import (
    NO_CLS,
    AnalyzeConfig,
    StepFn,
    emit,
    has_cls_token,
    no_cls,
    resolve_device,
    save_result,
    with_interval,
)
from vitsee.analyses.contract import (
    Analysis,
    AnalysisOption,
    DossierEntry,
    Request,
    Result,
    Shape,
    View,
    streaming_reason,
)
from vitsee.analyses.ridge import (
    L2_RATIOS,
    BatchesFn,
    ProbeResult,
    ProgressFn,
    Workspace,
    blas_controller,
    fit_probes,
    matmul_flops_per_s,
    probe_flops,
    solve_space,
    split_examples,
)

torch = lazy_module("torch")  # reading a cached result needs numpy only; torch is imported by the first computation


def probe_readouts(
    store: Store,
    key: str,
    layer: str,
    prefix: int | None = None,
    cls_token: bool | None = None,
    layout: str | None = None,
) -> dict[str, Callable[[np.ndarray], np.ndarray]]:
    """Returns readout name -> function (b, ...) float32 activations -> (b, P, D) features for the probes.

    prefix (the layer's prefix tokens), cls_token (whether the model has one) and layout are read from the store unless
    the caller, looping over layers, already has them (each store look-up resolves the model again).
    """
    layout = store.layer_layout(key, layer) if layout is None else layout
    prefix = store.layer_prefix_tokens(key, layer) if prefix is None else prefix
    if layout == "tokens":  # tokens x dim
        out = {}
        if cls_token is None and prefix:
            cls_token = has_cls_token(store.model_info(key))
        if prefix and cls_token:  # registers lead the tokens too, but are no CLS
            out["cls"] = lambda a: a[:, None, 0, :]
        out["gap"] = lambda a, p=prefix: a[:, None, p:, :].mean(axis=2)
        out["tokens"] = lambda a: a
        return out
    if layout == "nchw":  # C x H x W
        return {"gap": lambda a: a.mean(axis=(2, 3))[:, None, :]}
    if layout == "nhwc":  # H x W x C (Swin)
        return {"gap": lambda a: a.mean(axis=(1, 2))[:, None, :]}
    return {"flat": lambda a: a.reshape(a.shape[0], 1, -1)}


def _nonfinite_readouts(ds, readouts: dict[str, Callable[[np.ndarray], np.ndarray]], batch_size: int) -> dict[str, int]:
    """Returns readout name -> number of images whose features hold NaN/Inf, for the readouts that have any."""
    counts = dict.fromkeys(readouts, 0)
    for s in range(0, ds.shape[0], batch_size):
        a = ds[s : s + batch_size].astype(np.float32)
        for name, fn in readouts.items():
            f = fn(a)
            counts[name] += int((~np.isfinite(f.reshape(len(f), -1)).all(axis=1)).sum())
    return {name: n for name, n in counts.items() if n}


# A layer up to this size is read from the store once and its fit, holdout and test rows served from memory
# (each part touches every HDF5 chunk, so streaming reads the layer three times); a larger one streams.
LAYER_IN_MEMORY_BYTES = 256 * 2**20


def _layer_batches(
    ds, fns: list[Callable[[np.ndarray], np.ndarray]], labels: np.ndarray, batch_size: int, tokens_last: bool = False
) -> BatchesFn:
    """Returns the batches(mask) of fit_probes over one layer: (b, P, D) float32 features of every readout in
    fns, side by side, and their labels. tokens_last: the last readout is the layer's tokens as they are (fns[-1]
    the identity), which are then cast into their place in the batch and the other readouts read from there."""
    whole = ds[: len(labels)] if ds.size * ds.dtype.itemsize <= LAYER_IN_MEMORY_BYTES else None
    n_tokens = ds.shape[1] if tokens_last else 0

    def batches(mask):
        rows = np.flatnonzero(mask)
        for s in range(0, len(rows), batch_size):
            r = rows[s : s + batch_size]
            raw = whole[r] if whole is not None else read_rows(ds, r)
            if tokens_last:  # one cast, into the batch; CLS and GAP read the float32 tokens from there
                out = np.empty((len(r), len(fns) - 1 + n_tokens, raw.shape[-1]), dtype=np.float32)
                a = _float32(raw, out=out[:, len(fns) - 1 :])
                features = [f(a) for f in fns[:-1]]
            else:
                a = _float32(raw)  # means in float32
                features = [f(a) for f in fns]  # (b, P_i, D) each
                out = np.empty((len(r), sum(f.shape[1] for f in features), features[0].shape[2]), dtype=np.float32)
            start = 0
            for f in features:  # token-major, as the dual keeps them (its float64 cast is one contiguous pass)
                out[:, start : start + f.shape[1]] = f
                start += f.shape[1]
            yield out, labels[r]  # (b, P, D)

    return batches


def _float32(a: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Return the activations a as float32 (into out, a float32 array of a's shape, where given): the same
    values, fp16 converted by torch (10x numpy's astype)."""
    if out is None:
        out = np.empty(a.shape, dtype=np.float32)
    if a.dtype == np.float16:  # exact, like every fp16 -> fp32
        torch.from_numpy(out).copy_(torch.from_numpy(np.ascontiguousarray(a)))
    else:
        out[...] = a
    return out


def probe_params(store: Store, key: str, cfg: AnalyzeConfig) -> dict:
    return with_interval(
        {
            "model": key,
            "n_images": store.n_images,
            "seed": cfg.seed,
            "tokens": cfg.probe_tokens,
            "max_token_dim": cfg.probe_max_dim,
            "l2_ratios": [float(r) for r in L2_RATIOS],
        },
        cfg,
    )


def run_probes(store: Store, model: str, cfg: AnalyzeConfig, progress: StepFn | None = None) -> Result:
    """Returns test accuracy per layer and readout (CLS, GAP; per-token maps for ViTs), with the split
    and the L2 chosen per probe on a held-out part of the training split."""
    key = store.resolve_model(model)
    store.require_complete(key)
    store.require_activations("linear probes cannot be fitted")
    labels = store.labels
    if labels is None:
        raise VitseeError(no_labels_reason(store))
    params = probe_params(store, key, cfg)
    cached = None if cfg.recompute else Result.load(store, "probes", params)
    if cached is not None:
        return cached
    device = resolve_device(cfg.device)
    layers = store.layers(key)
    split = split_examples(len(labels), cfg.seed)  # what fit_probes draws with the same seed
    plan = _plan_fits(store, key, layers, len(labels), cfg)
    fits = plan.fits
    read = [0] * len(layers)  # examples read per layer, for the progress events

    def report(li: int, done: int) -> None:
        read[li] = done
        emit(progress, f"probes {key}", sum(read), len(layers) * len(labels), layers[li])

    def fit(job: int, progress_fn: ProgressFn, workspace: Workspace) -> ProbeResult:
        _, _, ds, fns, _ = fits[job]
        tokens_last = fits[job][1][-1] == "tokens"
        return fit_probes(
            _layer_batches(ds, fns, labels, cfg.batch_size, tokens_last),
            labels,
            seed=cfg.seed,
            device=device,
            progress=progress_fn,
            workspace=workspace,
        )

    emit(progress, f"probes {key}", 0, len(layers) * len(labels), layers[fits[0][0]] if fits else "")
    workers = _layer_workers(device, [f[4] for f in fits])
    results = _fit_layers(fit, len(fits), workers, lambda job, done: report(fits[job][0], done))
    for li in range(len(layers)):  # layers without a fit (every readout non-finite) count as read
        if read[li] < len(labels):
            report(li, len(labels))
    split = results[-1].split if results else split
    ci = params["stats"]["ci"] if "stats" in params else None
    return save_result(store, "probes", params, _probe_arrays(layers, plan, results, labels, split, ci))


READOUTS = ("cls", "gap")  # the columns of the probe table; a flat layer's one readout counts as its GAP


@dataclass
class _FitPlan:
    """The fits run_probes makes on a model's layers, and the readouts it leaves out."""

    # (layer index, readouts fitted together, dataset, their feature functions, bytes the fit holds at most)
    fits: list[tuple[int, list[str], object, list, float]] = field(default_factory=list)
    prefixes: list[int] = field(default_factory=list)  # prefix tokens (CLS, registers) leading each layer's tokens
    too_wide: list[str] = field(default_factory=list)  # layers whose per-token probes were left out (too wide)
    skipped: list[tuple[str, str, int]] = field(default_factory=list)  # (layer, readout, images) non-finite


def _plan_fits(store: Store, key: str, layers: list[str], n_examples: int, cfg: AnalyzeConfig) -> _FitPlan:
    """Returns one fit per layer over the readouts it offers, less those wider than cfg.probe_max_dim (per-token)
    or with non-finite features."""
    plan = _FitPlan(prefixes=[store.layer_prefix_tokens(key, layer) for layer in layers])
    nonfinite = store.nonfinite_counts(key)
    cls_token = has_cls_token(store.model_info(key))
    for li, layer in enumerate(layers):
        ds, layout = store.layer_dataset(key, layer), store.layer_layout(key, layer)
        readouts = probe_readouts(store, key, layer, plan.prefixes[li], cls_token, layout)
        names = [n for n in readouts if n in ("cls", "gap", "flat")]
        if cfg.probe_tokens and "tokens" in readouts:
            if ds.shape[-1] <= cfg.probe_max_dim:
                names.append("tokens")
            else:
                plan.too_wide.append(layer)
        if nonfinite.get(layer):  # a ridge fit on NaN/Inf features has no answer: leave those readouts out
            bad = _nonfinite_readouts(ds, {n: readouts[n] for n in names}, cfg.batch_size)
            plan.skipped += [(layer, name, count) for name, count in bad.items()]
            names = [n for n in names if n not in bad]
        if names:
            # one fit serves every readout of the layer (the probes are independent; they share D and the
            # labels), so the layer is read once and each solve is one batched call
            width = _feature_width(ds.shape[1:], layout)
            n_probes = sum(ds.shape[1] if name == "tokens" else 1 for name in names)
            plan.fits.append((li, names, ds, [readouts[n] for n in names], _fit_bytes(ds, n_examples, n_probes, width)))
    return plan


def _probe_arrays(
    layers: list[str], plan: _FitPlan, results: list[ProbeResult], labels, split, ci: float | None
) -> dict:
    """Returns the arrays of the probes' result: the table of accuracies and penalties (layer x readout), with an
    exact binomial interval at level `ci` (None: none), the split, chance, what was left out, and each layer's
    per-token accuracies."""
    table = np.full((len(layers), len(READOUTS)), np.nan)
    l2 = np.full_like(table, np.nan)
    token_maps: dict[str, np.ndarray] = {}
    for (li, names, ds, _, _), res in zip(plan.fits, results):
        start = 0
        for name in names:
            width = ds.shape[1] if name == "tokens" else 1  # tokens: one probe per token
            accuracy, penalty = res.test_accuracy[start : start + width], res.l2[start : start + width]
            start += width
            if name == "tokens":
                token_maps[layers[li]] = accuracy
            else:
                col = READOUTS.index("gap" if name == "flat" else name)
                table[li, col] = accuracy[0]
                l2[li, col] = penalty[0]
    skipped = plan.skipped
    arrays = {
        "accuracy": table,
        "l2": l2,
        "layers": np.array(layers),
        "readouts": np.array(READOUTS),
        "split_train": split.train,
        "split_test": split.test,
        "chance": np.array(np.bincount(labels).max() / len(labels)),
        # how many prefix tokens (CLS, registers) lead each layer's token axis: 0 for the patch embedding
        "token_prefix": np.array(plan.prefixes),
        "tokens_too_wide": np.array(plan.too_wide, dtype=str),
        # readouts not fitted because their features hold NaN/Inf, and in how many images
        "skipped_layer": np.array([x[0] for x in skipped], dtype=str),
        "skipped_readout": np.array(["gap" if x[1] == "flat" else x[1] for x in skipped], dtype=str),
        "skipped_images": np.array([x[2] for x in skipped], dtype=np.int64),
    }
    if ci is not None:  # exact binomial interval on the test count
        n_test = len(split.test)
        arrays["ci_low"], arrays["ci_high"] = stats_mod.clopper_pearson(np.round(table * n_test), n_test, ci)
    for layer, acc in token_maps.items():
        arrays[f"tokens/{layer}"] = acc
    return arrays


def no_labels_reason(store: Store) -> str:
    """Returns the one line that says why a store's images cannot be probed: they have no labels."""
    return (
        f"{store.path} has no labels ({store.dataset_spec}): probes need a labelled dataset "
        "(digits, synthetic, samples, an image folder with class sub-folders); CKA and the rest still work"
    )


# Layers are fitted side by side, one compute thread each, where every fit holds at most this much memory.
PARALLEL_FIT_BYTES = 256 * 2**20


def _feature_width(shape: tuple[int, ...], layout: str) -> int:
    """Return D, the features per probe of a layer of per-image `shape` in `layout` (tokens, nchw, nhwc, flat)."""
    if layout in ("tokens", "nhwc"):
        return int(shape[-1])
    if layout == "nchw":
        return int(shape[0])
    return int(np.prod(shape))


def _fit_bytes(ds, n_examples: int, n_probes: int, width: int) -> float:
    """Return about the most memory one layer's fit holds: the layer read into memory, and the examples kept
    in float64 (dual) or X'X and its eigenvectors (P, D, D) (primal)."""
    layer = ds.size * ds.dtype.itemsize
    layer = layer if layer <= LAYER_IN_MEMORY_BYTES else 0
    if solve_space(int(0.8 * n_examples), width) == "dual":
        return layer + 8.0 * n_examples * n_probes * width * 1.5
    return layer + 8.0 * n_probes * width * width * 3


def _layer_workers(device, fit_bytes: list[float]) -> int:
    """Return how many layers to fit at once: on CPU, task_workers() when each fit is small enough.

    A fit of one 196-token Mixer layer is a chain of small products, decompositions and copies (~45 ms);
    split over two threads op by op, each hand-off costs about what it saves, while two layers side by side on
    one thread each keep both cores busy (torch and numpy release the GIL in their kernels).
    """
    from vitsee.threads import task_workers

    workers = task_workers()
    if torch.device(device).type != "cpu" or workers < 2 or len(fit_bytes) < 2:
        return 1
    return min(workers, len(fit_bytes)) if max(fit_bytes) <= PARALLEL_FIT_BYTES else 1


class _Stopped(Exception):
    """Raised in a layer's fit when another one failed or the run was cancelled."""


def _fit_layers(
    fit: Callable[[int, ProgressFn, Workspace], ProbeResult],
    n_jobs: int,
    workers: int,
    report: Callable[[int, int], None],
) -> list[ProbeResult]:
    """Return fit(job, progress, workspace) for each job, `workers` of them at once.

    report(job, examples read) is only ever called on this thread, so a progress callback may raise (the
    app cancels a run that way): then, as when a fit fails, the fits still running stop at their next batch
    and the error is raised here. Each worker lends its fits one Workspace; with several, torch computes on
    one thread per worker (as one fit would at --threads 1: the same numbers, bit for bit).
    """
    if workers < 2:
        workspace = Workspace()  # the layers' fits reuse one set of buffers (most layers have the same shape)
        return [fit(job, lambda done, total, job=job: report(job, done), workspace) for job in range(n_jobs)]
    events: queue.SimpleQueue = queue.SimpleQueue()
    spare: queue.SimpleQueue = queue.SimpleQueue()
    for _ in range(workers):
        spare.put(Workspace())
    stop = threading.Event()

    def run(job: int) -> ProbeResult:
        def progress_fn(done: int, total: int) -> None:
            if stop.is_set():
                raise _Stopped()
            events.put((job, done))

        workspace = spare.get()
        try:
            return fit(job, progress_fn, workspace)
        finally:
            spare.put(workspace)

    def drain() -> None:
        while True:
            try:
                job, done = events.get_nowait()
            except queue.Empty:
                return
            report(job, done)

    from vitsee.threads import torch_threads

    results: list[ProbeResult | None] = [None] * n_jobs
    blas = blas_controller()
    # one BLAS thread for the whole run, not set and reset by each worker's products (that would race)
    limit = blas.limit(limits=1, user_api="blas") if blas is not None else contextlib.nullcontext()
    with limit, torch_threads(1):
        pool = ThreadPoolExecutor(workers, thread_name_prefix="vitsee-probe-layers")  # started here: inherits nice
        futures = {pool.submit(run, job): job for job in range(n_jobs)}
        remaining = set(futures)
        try:
            while remaining:
                finished, remaining = wait(remaining, timeout=0.1, return_when=FIRST_COMPLETED)
                drain()
                for future in finished:
                    results[futures[future]] = future.result()  # a fit's error is raised here
            drain()
        except BaseException:
            stop.set()
            for future in futures:
                future.cancel()
            raise
        finally:
            pool.shutdown(wait=True)
    return results  # type: ignore[return-value]


PROBE_WARN_S = 60.0  # the app warns before a probe job it expects to take longer


def probe_jobs(store: Store, key: str, cfg: AnalyzeConfig) -> list[tuple[str, str, int, int]]:
    """Returns (layer, 'pooled' | 'tokens', probes P, features D) for every fit run_probes makes on a model."""
    jobs = []
    for layer in store.layers(key):
        shape = store.layer_shape(key, layer)
        readouts = probe_readouts(store, key, layer)
        pooled = [n for n in readouts if n in ("cls", "gap", "flat")]
        jobs.append((layer, "pooled", len(pooled), _feature_width(shape, store.layer_layout(key, layer))))
        if cfg.probe_tokens and "tokens" in readouts and shape[-1] <= cfg.probe_max_dim:
            jobs.append((layer, "tokens", int(shape[0]), int(shape[-1])))  # one probe per token
    return jobs


def estimate_probe_seconds(store: Store, model: str, cfg: AnalyzeConfig) -> float:
    """Returns the seconds run_probes is expected to compute for (0 when its result is cached)."""
    key = store.resolve_model(model)
    if (
        store.labels is None
        or not cfg.recompute
        and Result.load(store, "probes", probe_params(store, key, cfg)) is not None
    ):
        return 0.0
    n_classes = int(store.labels.max()) + 1
    flops = sum(probe_flops(store.n_images, d, p, n_classes) for _, _, p, d in probe_jobs(store, key, cfg))
    return flops / matmul_flops_per_s(resolve_device(cfg.device))


def probe_warning(store: Store, model: str, cfg: AnalyzeConfig, limit_s: float = PROBE_WARN_S) -> str | None:
    """Returns a one-line warning naming the ways to narrow the job when the probes of a model are expected
    to take over limit_s, else None."""
    seconds = estimate_probe_seconds(store, model, cfg)
    if seconds <= limit_s:
        return None
    key = store.resolve_model(model)
    token_widths = [d for _, group, _, d in probe_jobs(store, key, cfg) if group == "tokens"]
    narrow = (
        f"vitsee analyze {store.path.name} --probes --probe-max-dim {max(token_widths) // 2} (no per-token "
        "probes of wider layers), or "
        if token_widths
        else ""
    )
    return (
        f"probes of {key} are expected to take about {seconds / 60:.0f} min ({len(store.layers(key))} layers, "
        f"{store.n_images} images; x cancels): narrow them with {narrow}a store of fewer layers "
        "(extract --layers NAME,NAME)"
    )


# --- the view and its dossier section --------------------------------------------------------------------


def probe_lines(view: View, layer: str) -> list[str]:
    """Returns the layer's test accuracy per readout with its interval, and the best layer of each readout."""
    r = view.rows.index(layer)
    cells, best = [], []
    for c, readout in enumerate(view.cols):
        if np.isfinite(view.matrix[r, c]):
            cells.append(f"{readout} {view.matrix[r, c]:.3f}{view.interval_text(r, c)}")
        else:
            cells.append(f"{readout} {view.cell_text(r, c, missing='n/a')}")
        column = np.where(np.isfinite(view.matrix[:, c]), view.matrix[:, c], -np.inf)
        if np.isfinite(column).any():
            b = int(np.argmax(column))
            best.append(f"{readout} {view.rows[b]} {view.matrix[b, c]:.3f}")
    chance = view.extra.get("chance")
    tail = f"; chance {float(chance):.3f}" if chance is not None else ""
    return ["  ".join(cells), f"best: {'  '.join(best)}{tail}"]


def skipped_note(view: View) -> str:
    """Returns, for a probes view, '; not fitted (non-finite features): ...' naming the skipped readouts, else ''."""
    skipped = view.extra.get("skipped") or []
    if not skipped:
        return ""
    named = ", ".join(f"{s['layer']} {s['readout']} ({s['images']} of {view.n_images} images)" for s in skipped[:4])
    more = f" and {len(skipped) - 4} more" if len(skipped) > 4 else ""
    return f"; not fitted, their features hold NaN/Inf: {named}{more} (see `vitsee info`)"


def too_wide_note(view: View) -> str:
    """Returns, for a probes view, '; no per-token maps for ...' naming the layers left out for width, else ''."""
    wide = view.extra.get("tokens_too_wide") or []
    if not wide:
        return ""
    return (
        f"; no per-token maps for {len(wide)} layer(s) wider than {view.params.get('max_token_dim')} channels "
        f"({', '.join(wide[:3])}{', ...' if len(wide) > 3 else ''}): vitsee analyze STORE --probes --probe-max-dim N"
    )


class LinearProbes(Analysis):
    """Linear probes per layer and readout (paper Fig. 11, 13): ridge fits to one-hot labels, test accuracy."""

    name = "probes"
    label = "Probes"
    title = "test accuracy of a linear probe per layer and readout (CLS, GAP, per token)"
    figures = ("11", "13")
    order = 30
    shape = Shape.DEPTH_CURVES
    tooltip = "Show the linear probe accuracies"
    option_help = "linear probes per layer and readout (needs labels)"
    options = (
        AnalysisOption(
            "probe-max-dim",
            int,
            "per-token probes for layers up to N channels wide; each token holds "
            "an N x N fp64 matrix (ViT-B: 197 x 768 x 768 x 8 B = 0.9 GB) [default: 1024]",
            param="max_token_dim",
        ),
    )
    cost = 2  # the fits take longest: the app caches them last
    needs = frozenset({"activations", "labels"})
    identity = ("model", "n_images", "tokens")  # a result with a larger max_token_dim only adds token maps
    nonfinite_source = "activations"
    dossier_title = "Linear probes"

    def not_applicable(self, store: Store, key: str) -> str | None:
        if store.streaming:
            return streaming_reason(store, "linear probes cannot be fitted")
        if store.labels is None:
            return no_labels_reason(store)
        return None

    def params(self, store: Store, request: Request, cfg: AnalyzeConfig) -> dict:
        return probe_params(store, request.keys[0], cfg)

    def run(self, store: Store, request: Request, cfg: AnalyzeConfig, progress: StepFn | None = None) -> Result:
        return run_probes(store, request.keys[0], cfg, progress)

    def preference(self, params: dict) -> float:
        return params.get("max_token_dim", 0)  # more token maps, the same rest

    def warning(self, store: Store, request: Request, cfg: AnalyzeConfig) -> str | None:
        return probe_warning(store, request.keys[0], cfg)

    def interval_words(self, view: View, level: str) -> str:
        return f"{level} Clopper-Pearson interval on {view.params.get('n_test')} test images"

    def caption_notes(self, view: View) -> str:
        return too_wide_note(view) + skipped_note(view)

    def view(self, result: Result, request: Request, info: dict) -> View:
        """Returns test accuracy per layer and readout (CLS, GAP, mean over tokens), its own non-finite marks set
        (the readouts left out for NaN/Inf features)."""
        r, key = result, request.keys[0]
        layers = [str(x) for x in r["layers"]]
        token_maps = {name.split("/", 1)[1]: v for name, v in r.items() if name.startswith("tokens/")}
        prefix = int(info.get("num_prefix_tokens") or 0)
        gh, gw = info.get("grid_size") or (0, 0)
        if "token_prefix" in r:
            token_prefix = {layer: int(n) for layer, n in zip(layers, r["token_prefix"])}
        else:  # results cached before the count was recorded: a layer holds the prefix tokens or none
            token_prefix = {layer: prefix if len(m) == prefix + gh * gw else 0 for layer, m in token_maps.items()}
        # the token maps hold the prefix tokens first (CLS...): the mean is over the spatial positions only
        token_mean = np.array(
            [np.mean(token_maps[layer][token_prefix[layer] :]) if layer in token_maps else np.nan for layer in layers]
        )
        matrix = np.column_stack([r["accuracy"], token_mean])
        cols = ["CLS", "GAP", "tokens (mean)"]
        skipped = np.zeros(matrix.shape, dtype=np.int64)  # images with non-finite features, per readout not fitted
        for layer, readout, count in zip(
            *(np.atleast_1d(r.get(k, [])) for k in ("skipped_layer", "skipped_readout", "skipped_images"))
        ):
            skipped[layers.index(str(layer)), {"cls": 0, "gap": 1, "tokens": 2}[str(readout)]] = int(count)
        keep = [i for i in range(matrix.shape[1]) if np.isfinite(matrix[:, i]).any() or skipped[:, i].any()]
        params = dict(
            r.params, split_seed=r.params["seed"], n_train=int(len(r["split_train"])), n_test=int(len(r["split_test"]))
        )
        extra = {
            "token_maps": {k: np.asarray(v) for k, v in token_maps.items()},
            "chance": float(r["chance"]),
            "l2": r["l2"],
            "grid": list(info.get("grid_size") or []),
            "prefix_tokens": prefix,
            "token_prefix": {layer: token_prefix[layer] for layer in token_maps},
            "tokens_too_wide": [str(x) for x in np.atleast_1d(r.get("tokens_too_wide", []))],
            "skipped": [
                {"layer": layers[i], "readout": cols[c], "images": int(skipped[i, c])}
                for i, c in zip(*np.nonzero(skipped))
            ],
        }
        extra["cls_token"] = has_cls_token(info)
        title = f"Linear probe test accuracy {key}" + (
            f" ({NO_CLS}: GAP and per-token readouts)" if no_cls(info) else ""
        )
        ci = {}
        if "ci_low" in r:  # the token mean: Clopper-Pearson on its mean count, at least as wide as an average of rates
            n_test, level = params["n_test"], float(r.params["stats"]["ci"])
            t_low, t_high = clopper_pearson(np.round(token_mean * n_test), n_test, level)
            ci = {
                "ci_low": np.column_stack([r["ci_low"], t_low])[:, keep],
                "ci_high": np.column_stack([r["ci_high"], t_high])[:, keep],
            }
        nonfinite = skipped[:, keep] > 0  # a readout left out for NaN/Inf features: marked, not "not computed"
        return View.of(
            request,
            title=title,
            matrix=matrix[:, keep],
            rows=layers,
            cols=[cols[i] for i in keep],
            value_name="accuracy",
            vmin=0.0,
            vmax=1.0,
            params=params,
            extra=extra,
            models=[key],
            nonfinite=nonfinite,
            nonfinite_images=np.where(nonfinite, skipped[:, keep], -1),
            **ci,
        )

    def dossier_section(self, view: View, layer: str, note: str = "") -> DossierEntry:
        if layer not in view.rows:
            return DossierEntry(layer, [f"{layer} was not probed"], False)
        return DossierEntry(layer, probe_lines(view, layer))
