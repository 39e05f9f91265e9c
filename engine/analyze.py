"""Store-level runners of the paper's analyses: stream the store batch by batch, compute on the device,
cache each result in the store keyed by its parameters.

Every runner reads through `Store` only, never holds more than a batch of one layer (plus a few read
ahead) in memory, and returns the cached result when one with the same parameters exists.
"""
from __future__ import annotations

import queue
import re
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from . import stats as stats_mod
from .errors import VitseeError
from .lazy import lazy_module
from .store import Store, read_rows

# Imported on first use: a cached view is read (engine/views.py, the app) without torch.
torch = lazy_module("torch")
cka_mod = lazy_module("vitsee.engine.cka")
probes_mod = lazy_module("vitsee.engine.probes")
attention_mod = lazy_module("vitsee.engine.attention")

ANALYSES = ("cka", "attention", "probes", "skip", "spatial")


@dataclass
class AnalyzeConfig:
    """Parameters shared by the analyses (each result records the ones it used)."""

    batch_size: int = 256
    shuffles: int = 1
    seed: int = 0
    device: str = "auto"
    recompute: bool = False
    probe_tokens: bool = True
    spatial_layer: str | None = None
    probe_max_dim: int = 1024  # per-token probes keep a (D, D) fp64 matrix per token: wider layers get none
    erf_images: int = 32  # effective receptive fields: the first N images of the store (analyses/erf.py)
    ci: float = stats_mod.DEFAULT_CI  # confidence level of the intervals; 0: none
    permutations: int = stats_mod.DEFAULT_PERMUTATIONS  # permutations behind each CKA p-value; 0: none
    # no estimator settings were asked for: a streaming store answers CKA with the estimate it streamed
    any_cka_estimate: bool = False

    def __post_init__(self):
        # checked where the CLI and the app build the config, before a store is opened
        if self.batch_size < 1:
            raise VitseeError(f"--batch-size {self.batch_size} is not a batch size: use at least 4 images per CKA "
                              f"minibatch (default {AnalyzeConfig.batch_size})")
        if self.shuffles < 0:
            raise VitseeError(f"--shuffles {self.shuffles} is negative: use 0 (store order) or the number of seeded shuffles")
        if self.seed < 0:
            raise VitseeError(f"--seed {self.seed} is negative: use a seed of 0 or more")
        if self.probe_max_dim < 0:
            raise VitseeError(f"--probe-max-dim {self.probe_max_dim} is negative: use 0 (no per-token probes) or a "
                              f"channel count (default {AnalyzeConfig.probe_max_dim})")


@dataclass
class Step:
    """A progress event: which analysis, how far (done/total in its own units)."""

    analysis: str
    done: int
    total: int
    message: str = ""


StepFn = Callable[[Step], None]


def _device(name: str) -> torch.device:
    from .extract import resolve_device

    return resolve_device(name)


def _emit(progress: StepFn | None, analysis: str, done: int, total: int, message: str = "") -> None:
    if progress is not None:
        progress(Step(analysis, done, total, message))


# --- reading ahead ----------------------------------------------------------------------------------


class _Prefetch:
    """Reads (rows, dataset) jobs in a background thread, at most `ahead` arrays in memory, in order.

    HDF5 reads run while the device computes on the previous array, so the GPU does not wait on disk.
    """

    def __init__(self, jobs: Iterator[tuple[np.ndarray, object]], ahead: int = 3):
        self._queue: queue.Queue = queue.Queue(maxsize=ahead)
        self._thread = threading.Thread(target=self._run, args=(jobs,), daemon=True, name="vitsee-prefetch")
        self._stop = threading.Event()
        self._thread.start()

    def _run(self, jobs) -> None:
        try:
            for rows, read in jobs:
                if self._stop.is_set():
                    return
                self._queue.put(("ok", read(rows)))
            self._queue.put(("end", None))
        except BaseException as exc:  # handed to the consumer
            self._queue.put(("error", exc))

    def get(self) -> np.ndarray:
        kind, value = self._queue.get()
        if kind == "error":
            raise value
        if kind == "end":
            raise StopIteration
        return value

    def close(self) -> None:
        self._stop.set()
        while self._thread.is_alive():
            try:
                self._queue.get(timeout=0.05)
            except queue.Empty:
                pass


def _read_batch(ds, rows: np.ndarray, pinned: bool) -> np.ndarray:
    """Returns ds[rows] (rows increasing), read straight into the returned buffer: pinned host memory for a
    CUDA device, so the copy to the device is one DMA from what HDF5 filled."""
    shape = (len(rows), *ds.shape[1:])
    if pinned:
        out = torch.empty(shape, dtype=torch.from_numpy(np.empty(0, dtype=ds.dtype)).dtype, pin_memory=True).numpy()
    else:
        out = np.empty(shape, dtype=ds.dtype)
    if len(rows) == 0:
        return out
    contiguous = rows[-1] - rows[0] == len(rows) - 1
    ds.read_direct(out, np.s_[int(rows[0]) : int(rows[-1]) + 1] if contiguous else np.s_[rows.tolist()])
    return out


class _Lazy:
    """One layer's batch that is read only when the CKA accumulator asks for it (keeps memory at one layer)."""

    def __init__(self, shape: tuple[int, ...], source: _Prefetch):
        self.shape = shape
        self._source = source

    def __array__(self, dtype=None, copy=None):
        array = self._source.get()
        return array if dtype is None else array.astype(dtype)


# --- CKA -------------------------------------------------------------------------------------------


def batch_plan(n: int, batch_size: int, shuffles: int, seed: int) -> list[tuple[int, np.ndarray]]:
    """Returns [(shuffle, rows)] batches defined by global index: store order, or K seeded shuffles."""
    if shuffles < 0:
        raise VitseeError(f"--shuffles must be 0 (store order) or more, got {shuffles}")
    if batch_size < cka_mod.MIN_BATCH:
        raise VitseeError(f"--batch-size {batch_size} is too small for CKA: use at least {cka_mod.MIN_BATCH}")
    orders = [np.arange(n)] if shuffles == 0 else [np.random.default_rng([seed, k]).permutation(n) for k in range(shuffles)]
    # a batch's HSIC does not depend on the order of its images, and HDF5 reads increasing rows directly
    return [(k, np.sort(order[s : s + batch_size])) for k, order in enumerate(orders) for s in range(0, n, batch_size)]


def _check_ready(store: Store, models: Sequence[str]) -> None:
    if not models:
        raise VitseeError(f"{store.path} holds no models: add one with `vitsee extract {store.path} --model NAME`")
    for m in models:
        store.require_complete(m)
    if store.n_images < cka_mod.MIN_BATCH:
        raise VitseeError(
            f"{store.path} has {store.n_images} images; CKA needs at least {cka_mod.MIN_BATCH}: extract more (--n-images)"
        )


def cka_params(store: Store, cfg: AnalyzeConfig) -> dict:
    models = store.models
    batch_size = min(cfg.batch_size, store.n_images)
    params = {
        "models": models,
        "layers": {m: store.layers(m) for m in models},
        "batch_size": batch_size,
        "shuffles": cfg.shuffles,
        "seed": cfg.seed if cfg.shuffles else None,
        "n_images": store.n_images,
    }
    return _with_stats(params, cfg, cfg.permutations)


def _with_stats(params: dict, cfg: AnalyzeConfig, permutations: int = 0) -> dict:
    """Returns params plus the statistics settings under "stats"; none asked for: params unchanged, so results
    cached before statistics existed keep their keys, and a request with statistics never takes one of them."""
    settings = stats_mod.stats_settings(cfg.ci, permutations, cfg.seed)
    return params if settings is None else {**params, "stats": settings}


def _cka_slots(params: dict) -> int:
    """Returns how many batches one pass (shuffle) over the images has: the per-batch slots of the statistics."""
    return -(-params["n_images"] // params["batch_size"])


def _cka_accumulator(n_layers: int, device, params: dict, shuffle: int) -> cka_mod.MinibatchCKA:
    """Returns the accumulator of one shuffle, keeping per-batch terms and permutations when params ask for them."""
    st = params.get("stats")
    if st is None:
        return cka_mod.MinibatchCKA(n_layers, device)
    return cka_mod.MinibatchCKA(n_layers, device, batch_slots=_cka_slots(params) if st["ci"] else 0,
                                permutations=st["permutations"], seed=[st["seed"], shuffle])


def compute_cka(store: Store, params: dict, device: torch.device, progress: StepFn | None = None,
                share: tuple[int, int] | None = None) -> dict:
    """Returns the joint (L, L) CKA over every stored layer of every model, averaged over the shuffles.

    One pass over the store per batch: every layer of every model is read once, its Gram built once, and
    all pairs come from one product inside MinibatchCKA. `share` (rank, world) gives this process every
    world-th batch from its rank on; the per-shuffle accumulator states are returned for an all-reduce.
    """
    models = params["models"]
    columns = [(m, layer) for m in models for layer in params["layers"][m]]
    datasets = [store._layer(m, layer) for m, layer in columns]
    full_plan = batch_plan(params["n_images"], params["batch_size"], params["shuffles"], params["seed"] or 0)
    slots = _cka_slots(params)
    plan = [(k, rows, i % slots) for i, (k, rows) in enumerate(full_plan)]  # slot: the batch's index in its shuffle
    if share is not None:
        plan = plan[share[0] :: share[1]]
    n_shuffles = max(1, params["shuffles"])
    accumulators = [_cka_accumulator(len(columns), device, params, k) for k in range(n_shuffles)]
    pinned = device.type == "cuda"
    jobs = ((rows, lambda r, ds=ds: _read_batch(ds, r, pinned)) for _, rows, _ in plan for ds in datasets)
    prefetch = _Prefetch(jobs)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a short last batch is reported once below, not per shuffle
            for b, (k, rows, slot) in enumerate(plan):
                if len(rows) < cka_mod.MIN_BATCH:  # skipped by the estimator: drain its reads
                    for _ in datasets:
                        prefetch.get()
                else:
                    accumulators[k].update([_Lazy((len(rows), *ds.shape[1:]), prefetch) for ds in datasets], slot=slot)
                _emit(progress, "cka", b + 1, len(plan))
    finally:
        prefetch.close()
    states = torch.stack([acc.state for acc in accumulators])  # (K, L*L + 1)
    return {"states": states, "columns": columns}


def finish_cka(states: torch.Tensor, columns: list[tuple[str, str]], params: dict) -> dict:
    """Returns the cached arrays of a CKA result from the (merged) per-shuffle accumulator states, with the
    intervals and p-values when params ask for them (pooled over shuffles as engine/stats.py says)."""
    matrices, per_shuffle = [], []
    st = params.get("stats")
    for k, state in enumerate(states):
        acc = _cka_accumulator(len(columns), "cpu", params, k)
        acc.state = state.cpu().to(torch.float64)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            matrices.append(acc.result(nonfinite="nan"))  # a layer with NaN/Inf activations: NaN cells
            if st is not None:
                per_shuffle.append(acc.statistics(st["ci"], st["bootstrap"], [st["seed"], k]))
    matrix = np.mean(matrices, axis=0)
    last = params["n_images"] % params["batch_size"]
    dropped = last if 0 < last < cka_mod.MIN_BATCH else 0
    arrays = {
        "matrix": matrix,
        "model": np.array([params["models"].index(m) for m, _ in columns]),
        "layer": np.array([layer for _, layer in columns]),
        "shuffle_std": np.std(matrices, axis=0) if len(matrices) > 1 else np.zeros_like(matrix),
        "dropped_per_shuffle": np.array(dropped),
    }
    return arrays | _pooled_stats(per_shuffle)


def _pooled_stats(per_shuffle: list[dict]) -> dict:
    """Returns the statistics arrays of a CKA-like result from each shuffle's `MinibatchCKA.statistics()`."""
    if not per_shuffle:
        return {}
    out = stats_mod.pool_shuffles([s["ci_low"] for s in per_shuffle if "ci_low" in s],
                                  [s["ci_high"] for s in per_shuffle if "ci_high" in s],
                                  [s["p_value"] for s in per_shuffle if "p_value" in s])
    out["n_batches"] = np.array(min(s["n_batches"] for s in per_shuffle))  # bootstrap units per shuffle
    return out


def run_cka(store: Store, cfg: AnalyzeConfig, progress: StepFn | None = None) -> dict:
    """Returns the CKA result (cached or computed): `matrix` (L, L) over all models' layers."""
    _check_ready(store, store.models)
    params = cka_params(store, cfg)
    cached = None if cfg.recompute else store.get_result("cka", params)
    if cached is not None:
        return cached
    if store.streaming:
        return _streamed_cka(store, cfg, params)
    if params["n_images"] % params["batch_size"] and params["n_images"] % params["batch_size"] < cka_mod.MIN_BATCH:
        warnings.warn(
            f"the last batch of {params['n_images'] % params['batch_size']} images is dropped from each pass: "
            f"unbiased HSIC needs at least {cka_mod.MIN_BATCH}; pick --batch-size to avoid it",
            stacklevel=2,
        )
    out = compute_cka(store, params, _device(cfg.device), progress)
    arrays = finish_cka(out["states"], out["columns"], params)
    return _save(store, "cka", params, arrays)


def _streamed_cka(store: Store, cfg: AnalyzeConfig, params: dict) -> dict:
    """Returns the CKA a streaming extraction cached, when the asked-for settings allow it; without the
    activations no other estimate can be made."""
    from .extract import save_streamed_cka, streamed_cka_params

    streamed = streamed_cka_params(store)
    if cfg.any_cka_estimate and not cfg.recompute:
        return store.get_result("cka", streamed) or save_streamed_cka(store)
    raise VitseeError(
        f"{store.path} was extracted with --streaming: its CKA was computed during extraction with batch size "
        f"{streamed['batch_size']} in store order, without intervals or p-values (--batch-size {streamed['batch_size']} "
        "--shuffles 0 --ci 0 --permutations 0) and other settings need the activations, which were not stored: "
        "re-extract without --streaming into another store"
    )


def _save(store: Store, analysis: str, params: dict, arrays: dict) -> dict:
    store.put_result(analysis, params, arrays, provenance=_provenance(store))
    result = store.get_result(analysis, params)
    assert result is not None
    return result


def _provenance(store: Store) -> dict:
    return {
        "store": str(store.path),
        "dataset": store.dataset_spec,
        "n_images": store.n_images,
        "models": {m: store.model_info(m)["weights"] for m in store.models},
    }


def cka_block(result: dict, store_models: Sequence[str], model_a: str, model_b: str | None = None,
              key: str = "matrix") -> tuple[np.ndarray, list[str], list[str]]:
    """Returns (matrix, row layers, col layers) of model_a x model_b (model_b defaults to model_a); key names
    another (L, L) array of the result to cut the same block from (ci_low, ci_high, p_value)."""
    model_b = model_b or model_a
    models = result["_params"]["models"]
    ia, ib = models.index(model_a), models.index(model_b)
    rows = np.flatnonzero(result["model"] == ia)
    cols = np.flatnonzero(result["model"] == ib)
    layers = [str(x) for x in result["layer"]]
    return result[key][np.ix_(rows, cols)], [layers[i] for i in rows], [layers[i] for i in cols]


# --- attention distances ----------------------------------------------------------------------------


def attention_params(store: Store, key: str, cfg: AnalyzeConfig) -> dict:
    return _with_interval({"model": key, "n_images": store.n_images, "bins": 32}, cfg)


def _with_interval(params: dict, cfg: AnalyzeConfig) -> dict:
    """Returns params plus {"stats": {"ci": level}} for a closed-form interval; unchanged when cfg.ci is 0."""
    settings = stats_mod.interval_settings(cfg.ci)
    return params if settings is None else {**params, "stats": settings}


def run_attention(store: Store, model: str, cfg: AnalyzeConfig, progress: StepFn | None = None) -> dict:
    """Returns per block: heads' mean distances (sorted), their spread over images, and the histogram
    over heads and images, with the distance of uniform attention for the model's grid."""
    key = store.resolve_model(model)
    store.require_complete(key)
    info = store.model_info(key)
    if "attention_distance" not in store.stats(key):
        raise VitseeError(no_attention_reason(key, info))
    params = attention_params(store, key, cfg)
    bins = params["bins"]
    cached = None if cfg.recompute else store.get_result("attention", params)
    if cached is not None:
        return cached
    uniform, max_px = _attention_reference(info)
    edges = np.linspace(0.0, max_px, bins + 1)
    plain, renorm = RunningMoments(), RunningMoments()
    hist = 0
    for batch in store.stat_batches(key, ["attention_distance", "attention_distance_renorm"]):
        dist = batch["attention_distance"]  # (b, blocks, heads)
        plain.update(dist)
        renorm.update(batch["attention_distance_renorm"])
        # a Swin block's missing heads (fewer than the widest stage's) are NaN: not counted
        hist = hist + np.stack([np.histogram(_present(dist[:, b, :]), bins=edges)[0] for b in range(dist.shape[1])])
    mean = plain.mean  # (blocks, heads)
    order = np.argsort(mean, axis=1)  # missing heads sort last
    arrays = {
        "mean_px": np.take_along_axis(mean, order, axis=1),  # sorted ascending per block
        "std_px": np.take_along_axis(plain.std, order, axis=1),
        "head_order": order,
        "mean_renorm_px": np.take_along_axis(renorm.mean, order, axis=1),  # the same head in the same column
        "hist_counts": hist,
        "hist_edges": edges,
        "uniform_px": np.array(uniform[-1]),
        "uniform_px_per_block": np.array(uniform),
        "heads_per_block": _heads_per_block(info, mean.shape),
        "blocks": np.array(_attention_block_names(info, mean.shape[0])),
    }
    if "stats" in params:  # Student-t interval of each head's mean over the images
        low, high = stats_mod.mean_interval(mean, plain.std, plain.n, params["stats"]["ci"])
        arrays["ci_low_px"] = np.take_along_axis(low, order, axis=1)
        arrays["ci_high_px"] = np.take_along_axis(high, order, axis=1)
    _emit(progress, f"attention {key}", 1, 1)
    return _save(store, "attention", params, arrays)


def no_attention_reason(key: str, info: dict) -> str:
    """Returns the one line that says why a model has no attention distances."""
    if info.get("family") == "mixer":
        return f"{key} is an MLP-Mixer: it mixes tokens with MLPs, not attention, so it has no attention distances"
    return f"{key} has no attention distances ({info['family']} model): they exist for ViT- and Swin-like models only"


def _attention_reference(info: dict) -> tuple[list[float], float]:
    """Returns per block the mean distance of uniform attention (over the grid; for Swin over a window of its
    stage) and the largest distance any head can have (the histogram's range), in px."""
    if info.get("family") == "swin":
        uniform, largest = [], 0.0
        for stage in info["extra"]["stages"]:
            (wh, ww), (ph, pw) = stage["window"], stage["token_px"]
            uniform += [attention_mod.uniform_attention_distance_px((wh, ww), (ph, pw))] * stage["blocks"]
            largest = max(largest, float(np.hypot((wh - 1) * ph, (ww - 1) * pw)))  # a window's diagonal
        return uniform, largest
    gh, gw = info["grid_size"]
    ph, pw = info["patch_size"]  # px per token: input size / grid (a hybrid's stem patch is smaller)
    uniform = attention_mod.uniform_attention_distance_px((gh, gw), (ph, pw))
    return [uniform] * int(info["num_blocks"]), float(np.hypot((gh - 1) * ph, (gw - 1) * pw))


def _present(values: np.ndarray) -> np.ndarray:
    values = values.ravel()
    return values[~np.isnan(values)]


def _heads_per_block(info: dict, shape: tuple[int, int]) -> np.ndarray:
    if info.get("family") == "swin":
        return np.array([st["heads"] for st in info["extra"]["stages"] for _ in range(st["blocks"])])
    return np.full(shape[0], shape[1])


def _attention_block_names(info: dict, n: int) -> list[str]:
    if info.get("family") == "swin":
        return [f"layers.{s}.blocks.{b}" for s, st in enumerate(info["extra"]["stages"]) for b in range(st["blocks"])]
    return [f"blocks.{b}" for b in range(n)]


# --- skip ratios ------------------------------------------------------------------------------------


def skip_params(store: Store, key: str, cfg: AnalyzeConfig) -> dict:
    return _with_interval({"model": key, "n_images": store.n_images}, cfg)


def run_skip(store: Store, model: str, cfg: AnalyzeConfig, progress: StepFn | None = None) -> dict:
    """Returns skip-connection norm ratios ||z||/||f(z)||: ViT per sublayer x token (mean over images),
    with CLS vs mean of spatial tokens; ResNet per block."""
    key = store.resolve_model(model)
    store.require_complete(key)
    info = store.model_info(key)
    params = skip_params(store, key, cfg)
    cached = None if cfg.recompute else store.get_result("skip", params)
    if cached is not None:
        return cached
    stats = store.stats(key)
    pairs = [(names, parts) for names, parts in SKIP_SUBLAYERS if names[0] in stats]
    if pairs:
        (names, parts), = pairs
        first, second = _finite_means(store, key, list(names))  # (blocks, T) each
        blocks = first.shape[0]
        per_token = np.empty((2 * blocks, first.shape[1]))
        per_token[0::2] = first
        per_token[1::2] = second
        prefix = int(info.get("num_prefix_tokens") or 0)
        has_cls = has_cls_token(info)
        prefix_names = info.get("prefix_names") or (["CLS"] if has_cls else []) + [f"prefix {t}" for t in range(1, prefix)]
        rows = [f"blocks.{b}.{part}" for b in range(blocks) for part in parts]
        cols = [prefix_names[t] if t < prefix else f"token {t - prefix}" for t in range(first.shape[1])]
        arrays = {
            "ratio": per_token,
            "rows": np.array(rows),
            "cols": np.array(cols),
            # a register-only ViT has prefix tokens but no class token: it gets no CLS series
            "cls": per_token[:, 0] if has_cls else np.full(2 * blocks, np.nan),
            "spatial_mean": per_token[:, prefix:].mean(axis=1),
        }
        if "stats" in params:
            arrays |= _skip_intervals(store, key, list(names), arrays, prefix, params["stats"]["ci"], has_cls)
    elif "skip_ratio_block" in stats:
        (ratio,) = _finite_means(store, key, ["skip_ratio_block"])  # (blocks,)
        blocks = [layer for layer in store.layers(key) if layer[:5] in ("layer", "stage")]
        arrays = {
            "ratio": ratio[:, None],
            "rows": np.array(blocks[: len(ratio)] if len(blocks) >= len(ratio) else [f"block {i}" for i in range(len(ratio))]),
            "cols": np.array(["whole map"]),
            "cls": np.full(len(ratio), np.nan),
            "spatial_mean": ratio,
        }
        if "stats" in params:
            arrays |= _skip_intervals(store, key, ["skip_ratio_block"], arrays, 0, params["stats"]["ci"], False)
    else:
        raise VitseeError(f"{key} has no skip-connection statistics: they are recorded for ViT-, Mixer- and ResNet-like models")
    _emit(progress, f"skip {key}", 1, 1)
    return _save(store, "skip", params, arrays)


# per-token statistics of a block's two residual sublayers and the row labels they get
SKIP_SUBLAYERS = (
    (("skip_ratio_attn", "skip_ratio_mlp"), ("attn", "mlp")),
    (("skip_ratio_token_mixing", "skip_ratio_channel_mixing"), ("token_mixing", "channel_mixing")),
)


def has_cls_token(info: dict) -> bool:
    """Returns whether a model has a class token: recorded from timm's cls_token; stores written before that was
    recorded say so by having prefix tokens (register-only ViTs were taken for CLS ViTs then)."""
    if "cls_token" in info:
        return bool(info["cls_token"])
    return info.get("family") == "vit" and int(info.get("num_prefix_tokens") or 0) > 0


def _skip_intervals(store: Store, key: str, names: list[str], arrays: dict, prefix: int, level: float,
                    has_cls: bool) -> dict:
    """Returns Student-t intervals over images for the skip ratios: per cell (ci_low, ci_high, like `ratio`), the CLS
    curve (cls_ci_*) and the spatial curve (spatial_ci_*), the last from each image's mean over its spatial tokens.

    Like the means, they skip inf (a zero branch). Each interval is centred on the cached estimate, so where an image
    has inf tokens the spatial interval's centre (a mean of token means) and its spread (of image means) differ a
    little; with all finite they agree.
    """
    mean = arrays["ratio"]  # (rows, T): for ViTs attn and mlp interleaved, as `ratio` is built
    m2, count = np.zeros_like(mean), np.zeros_like(mean)
    spatial = RunningMoments()
    for batch in store.stat_batches(key, names):
        x = np.stack([batch[n] for n in names], axis=2).reshape(len(batch[names[0]]), *mean.shape) if len(names) > 1 \
            else np.asarray(batch[names[0]], dtype=np.float64).reshape(-1, *mean.shape)  # (b, rows, T)
        finite = np.isfinite(x)
        m2 += np.where(finite, np.square(np.where(finite, x, 0.0) - mean), 0.0).sum(axis=0)
        count += finite.sum(axis=0)
        tokens = np.where(finite, x, np.nan)[:, :, prefix:]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # an image with no finite spatial token: nan, left out
            spatial.update(np.nanmean(tokens, axis=2))  # (b, rows)
    with np.errstate(divide="ignore", invalid="ignore"):
        std = np.sqrt(m2 / np.maximum(count, 1))
    low, high = stats_mod.mean_interval(mean, std, count, level)
    s_low, s_high = stats_mod.mean_interval(arrays["spatial_mean"], spatial.std, spatial.n, level)
    return {"ci_low": low, "ci_high": high, "cls_ci_low": low[:, 0] if has_cls else np.full(len(mean), np.nan),
            "cls_ci_high": high[:, 0] if has_cls else np.full(len(mean), np.nan),
            "spatial_ci_low": s_low, "spatial_ci_high": s_high}


def _finite_means(store: Store, key: str, names: Sequence[str]) -> list[np.ndarray]:
    """Returns per statistic the mean over images ignoring inf (a zero branch, e.g. a ResNet's
    zero-initialised last BN), nan where no image is finite; streamed batch by batch."""
    sums: list = [0.0] * len(names)
    counts: list = [0] * len(names)
    for batch in store.stat_batches(key, names):
        for i, name in enumerate(names):
            finite = np.isfinite(batch[name])
            sums[i] = sums[i] + np.where(finite, batch[name], 0.0).sum(axis=0, dtype=np.float64)
            counts[i] = counts[i] + finite.sum(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return [np.where(c > 0, s / np.maximum(c, 1), np.nan) for s, c in zip(sums, counts)]


class RunningMoments:
    """Per-element mean and standard deviation over images, merged batch by batch in fp64 (Chan et al.)."""

    def __init__(self):
        self.n = 0
        self._mean: np.ndarray | float = 0.0
        self._m2: np.ndarray | float = 0.0  # sum of squared deviations from the mean

    def update(self, x: np.ndarray) -> None:
        """Adds a batch x (b, ...)."""
        b = len(x)
        if b == 0:
            return
        x = np.asarray(x, dtype=np.float64)
        mean_b = x.mean(axis=0)
        m2_b = np.square(x - mean_b).sum(axis=0)
        n = self.n + b
        delta = mean_b - self._mean
        self._mean = self._mean + delta * (b / n)
        self._m2 = self._m2 + m2_b + np.square(delta) * (self.n * b / n)
        self.n = n

    @property
    def mean(self) -> np.ndarray:
        return np.asarray(self._mean)

    @property
    def std(self) -> np.ndarray:
        """The population standard deviation (numpy's default, ddof=0)."""
        return np.sqrt(np.asarray(self._m2) / max(self.n, 1))


# --- linear probes ----------------------------------------------------------------------------------


def _readouts(store: Store, key: str, layer: str) -> dict[str, Callable[[np.ndarray], np.ndarray]]:
    """Returns readout name -> function (b, ...) activations -> (b, P, D) features for the probes."""
    layout = store.layer_layout(key, layer)
    prefix = store.layer_prefix_tokens(key, layer)
    if layout == "tokens":  # tokens x dim
        out = {}
        if prefix and has_cls_token(store.model_info(key)):  # registers lead the tokens too, but are no CLS
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


def probe_params(store: Store, key: str, cfg: AnalyzeConfig) -> dict:
    return _with_interval({"model": key, "n_images": store.n_images, "seed": cfg.seed, "tokens": cfg.probe_tokens,
                           "max_token_dim": cfg.probe_max_dim, "l2_ratios": [float(r) for r in probes_mod.L2_RATIOS]}, cfg)


def run_probes(store: Store, model: str, cfg: AnalyzeConfig, progress: StepFn | None = None) -> dict:
    """Returns test accuracy per layer and readout (CLS, GAP; per-token maps for ViTs), with the split
    and the L2 chosen per probe on a held-out part of the training split."""
    key = store.resolve_model(model)
    store.require_complete(key)
    store._require_activations("linear probes cannot be fitted")
    labels = store.labels
    if labels is None:
        raise VitseeError(
            f"{store.path} has no labels ({store.dataset_spec}): probes need a labelled dataset "
            "(digits, synthetic, samples, an image folder with class sub-folders); CKA and the rest still work"
        )
    params = probe_params(store, key, cfg)
    cached = None if cfg.recompute else store.get_result("probes", params)
    if cached is not None:
        return cached
    device = _device(cfg.device)
    layers = store.layers(key)
    readout_names = ["cls", "gap"]
    table = np.full((len(layers), len(readout_names)), np.nan)
    l2 = np.full_like(table, np.nan)
    token_maps: dict[str, np.ndarray] = {}
    too_wide: list[str] = []  # layers whose per-token probes were left out (wider than cfg.probe_max_dim)
    skipped: list[tuple[str, str, int]] = []  # (layer, readout, images): readouts with non-finite features
    nonfinite = store.nonfinite_counts(key)
    split = probes_mod.split_examples(len(labels), cfg.seed)  # what fit_probes draws with the same seed
    for li, layer in enumerate(layers):
        ds = store._layer(key, layer)
        readouts = _readouts(store, key, layer)
        groups = [[n for n in readouts if n in ("cls", "gap", "flat")]]
        if cfg.probe_tokens and "tokens" in readouts:
            if ds.shape[-1] <= cfg.probe_max_dim:
                groups.append(["tokens"])
            else:
                too_wide.append(layer)
        if nonfinite.get(layer):  # a ridge fit on NaN/Inf features has no answer: leave those readouts out
            bad = _nonfinite_readouts(ds, {n: readouts[n] for group in groups for n in group}, cfg.batch_size)
            skipped += [(layer, name, count) for name, count in bad.items()]
            groups = [[n for n in names if n not in bad] for names in groups]
        for names in filter(None, groups):
            fns = [readouts[n] for n in names]

            def batches(mask, fns=fns, ds=ds):
                rows = np.flatnonzero(mask)
                for s in range(0, len(rows), cfg.batch_size):
                    r = rows[s : s + cfg.batch_size]
                    a = read_rows(ds, r).astype(np.float32)
                    yield np.concatenate([f(a) for f in fns], axis=1), labels[r]

            res = probes_mod.fit_probes(batches, labels, seed=cfg.seed, device=device)
            if names == ["tokens"]:
                token_maps[layer] = res.test_accuracy
            else:
                for name, acc, pen in zip(names, res.test_accuracy, res.l2):
                    col = readout_names.index("gap" if name == "flat" else name)
                    table[li, col] = acc
                    l2[li, col] = pen
            split = res.split
        _emit(progress, f"probes {key}", li + 1, len(layers), layer)
    arrays = {
        "accuracy": table,
        "l2": l2,
        "layers": np.array(layers),
        "readouts": np.array(readout_names),
        "split_train": split.train,
        "split_test": split.test,
        "chance": np.array(np.bincount(labels).max() / len(labels)),
        # how many prefix tokens (CLS, registers) lead each layer's token axis: 0 for the patch embedding
        "token_prefix": np.array([store.layer_prefix_tokens(key, layer) for layer in layers]),
        "tokens_too_wide": np.array(too_wide, dtype=str),
        # readouts not fitted because their features hold NaN/Inf, and in how many images
        "skipped_layer": np.array([x[0] for x in skipped], dtype=str),
        "skipped_readout": np.array(["gap" if x[1] == "flat" else x[1] for x in skipped], dtype=str),
        "skipped_images": np.array([x[2] for x in skipped], dtype=np.int64),
    }
    if "stats" in params:  # exact binomial interval on the test count
        n_test = len(split.test)
        arrays["ci_low"], arrays["ci_high"] = stats_mod.clopper_pearson(np.round(table * n_test), n_test, params["stats"]["ci"])
    for layer, acc in token_maps.items():
        arrays[f"tokens/{layer}"] = acc
    return _save(store, "probes", params, arrays)


PROBE_WARN_S = 60.0  # the app warns before a probe job it expects to take longer


def probe_jobs(store: Store, key: str, cfg: AnalyzeConfig) -> list[tuple[str, str, int, int]]:
    """Returns (layer, 'pooled' | 'tokens', probes P, features D) for every fit run_probes makes on a model."""
    jobs = []
    for layer in store.layers(key):
        shape = store.layer_shape(key, layer)
        readouts = _readouts(store, key, layer)
        pooled = [n for n in readouts if n in ("cls", "gap", "flat")]
        width = int(np.prod(shape)) if pooled == ["flat"] else shape[0] if len(shape) == 3 else shape[-1]  # C of (C, H, W)
        jobs.append((layer, "pooled", len(pooled), int(width)))
        if cfg.probe_tokens and "tokens" in readouts and shape[-1] <= cfg.probe_max_dim:
            jobs.append((layer, "tokens", int(shape[0]), int(shape[-1])))  # one probe per token
    return jobs


def estimate_probe_seconds(store: Store, model: str, cfg: AnalyzeConfig) -> float:
    """Returns the seconds run_probes is expected to compute for (0 when its result is cached)."""
    key = store.resolve_model(model)
    if store.labels is None or not cfg.recompute and store.get_result("probes", probe_params(store, key, cfg)) is not None:
        return 0.0
    n_classes = int(store.labels.max()) + 1
    flops = sum(probes_mod.probe_flops(store.n_images, d, p, n_classes) for _, _, p, d in probe_jobs(store, key, cfg))
    return flops / probes_mod.matmul_flops_per_s(_device(cfg.device))


def probe_warning(store: Store, model: str, cfg: AnalyzeConfig, limit_s: float = PROBE_WARN_S) -> str | None:
    """Returns a one-line warning naming the ways to narrow the job when the probes of a model are expected
    to take over limit_s, else None."""
    seconds = estimate_probe_seconds(store, model, cfg)
    if seconds <= limit_s:
        return None
    key = store.resolve_model(model)
    token_widths = [d for _, group, _, d in probe_jobs(store, key, cfg) if group == "tokens"]
    narrow = (f"vitsee analyze {store.path.name} --probes --probe-max-dim {max(token_widths) // 2} (no per-token "
              "probes of wider layers), or " if token_widths else "")
    return (f"probes of {key} are expected to take about {seconds / 60:.0f} min ({len(store.layers(key))} layers, "
            f"{store.n_images} images; x cancels): narrow them with {narrow}a store of fewer layers (extract --layers NAME,NAME)")


# --- spatial localisation ---------------------------------------------------------------------------


def _spatial_layout(store: Store, key: str, layer: str) -> tuple[tuple[int, int], int, Callable[[np.ndarray], list[np.ndarray]]]:
    """Returns (grid, patch px, function activations (b, ...) -> per-cell (b, D) features)."""
    shape = store.layer_shape(key, layer)
    layout = store.layer_layout(key, layer)
    info = store.model_info(key)
    _, h, w = info["data_config"]["input_size"]
    if layout == "tokens":  # ViT / Mixer tokens
        if not info.get("grid_size"):
            raise VitseeError(f"{key} has no patch grid: spatial maps need a ViT-like or CNN model")
        gh, gw = info["grid_size"]
        prefix = store.layer_prefix_tokens(key, layer)
        if shape[0] != prefix + gh * gw:
            raise VitseeError(f"layer {layer} of {key} has {shape[0]} tokens, not a {gh}x{gw} grid: pick a block output")
        return (gh, gw), h // gh, lambda a: [a[:, prefix + t, :] for t in range(gh * gw)]
    if layout in ("nchw", "nhwc"):
        gh, gw = shape[1:] if layout == "nchw" else shape[:2]
        if h % gh or w % gw:
            raise VitseeError(f"layer {layer} of {key} has a {gh}x{gw} map that does not tile the {h}x{w} input: pick another layer")
        if layout == "nhwc":  # channels-last (Swin): a cell is a[:, i, j, :]
            return (gh, gw), h // gh, lambda a: [a[:, i, j, :] for i in range(gh) for j in range(gw)]
        return (gh, gw), h // gh, lambda a: [a[:, :, i, j] for i in range(gh) for j in range(gw)]
    raise VitseeError(f"layer {layer} of {key} has shape {shape}: spatial maps need tokens or feature maps")


def default_spatial_layer(store: Store, key: str) -> str:
    """Returns the last block output (the paper's choice), or the last stored layer."""
    layers = store.layers(key)
    blocks = [layer for layer in layers if layer.startswith("blocks.") and layer.count(".") == 1]
    blocks = blocks or [layer for layer in layers if re.fullmatch(r"layers\.\d+\.blocks\.\d+", layer)]  # Swin
    if blocks:
        return blocks[-1]
    cnn = [layer for layer in layers if store.layer_layout(key, layer) in ("nchw", "nhwc")]
    return (cnn or layers)[-1]


def spatial_params(store: Store, key: str, cfg: AnalyzeConfig, layer: str | None = None) -> dict:
    store._require_activations("spatial maps cannot be computed")
    layer = layer or cfg.spatial_layer or default_spatial_layer(store, key)
    store._layer(key, layer)  # names the close matches if the layer is unknown
    params = {"model": key, "layer": layer, "n_images": store.n_images, "batch_size": min(cfg.batch_size, store.n_images),
              "shuffles": cfg.shuffles, "seed": cfg.seed if cfg.shuffles else None}
    # intervals only: a permutation per token and patch pair would cost more than the maps themselves
    return _with_stats(params, cfg, permutations=0)


def run_spatial(store: Store, model: str, cfg: AnalyzeConfig, layer: str | None = None, progress: StepFn | None = None) -> dict:
    """Returns the (cells, cells) CKA between each token position's representation and the raw pixels of
    each input patch (the preprocessed model input): row t reshaped to the grid is token t's map."""
    key = store.resolve_model(model)
    store.require_complete(key)
    params = spatial_params(store, key, cfg, layer)
    layer, batch_size = params["layer"], params["batch_size"]
    (gh, gw), patch, cells = _spatial_layout(store, key, layer)
    cached = None if cfg.recompute else store.get_result("spatial", params)
    if cached is not None:
        return cached
    _check_ready(store, [key])
    device = _device(cfg.device)
    n_cells = gh * gw
    plan = batch_plan(store.n_images, batch_size, cfg.shuffles, cfg.seed)
    accumulators = [_cka_accumulator(2 * n_cells, device, params, k) for k in range(max(1, cfg.shuffles))]
    slots = _cka_slots(params)
    ds = store._layer(key, layer)
    pixels = store._model(key)["input"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for b, (k, rows) in enumerate(plan):
            acts = read_rows(ds, rows)
            img = read_rows(pixels, rows)  # (b, 3, H, W)
            b_ = len(rows)
            patches = img.reshape(b_, 3, gh, patch, gw, patch).transpose(0, 2, 4, 1, 3, 5).reshape(b_, n_cells, -1)
            accumulators[k].update([*cells(acts), *[patches[:, c] for c in range(n_cells)]], slot=b % slots)
            _emit(progress, f"spatial {key}", b + 1, len(plan))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        maps = np.mean([acc.result(nonfinite="nan")[:n_cells, n_cells:] for acc in accumulators], axis=0)
        st = params.get("stats")
        per_shuffle = [] if st is None else [acc.statistics(st["ci"], st["bootstrap"], [st["seed"], k])
                                             for k, acc in enumerate(accumulators)]
    arrays = {"maps": maps, "grid": np.array([gh, gw]), "patch_px": np.array(patch)}
    for name, value in _pooled_stats(per_shuffle).items():
        arrays[name] = value[:n_cells, n_cells:] if value.ndim == 2 else value
    return _save(store, "spatial", params, arrays)


# --- all of them ------------------------------------------------------------------------------------


def applicable(store: Store, model: str) -> list[str]:
    """Returns the per-model analyses that apply to a model of this store."""
    key = store.resolve_model(model)
    stats = store.stats(key)
    out = []
    if "attention_distance" in stats:
        out.append("attention")
    if store.labels is not None and not store.streaming:
        out.append("probes")
    if any(s.startswith("skip_ratio") for s in stats):
        out.append("skip")
    if store.streaming:  # probes and spatial maps read activations
        return out
    try:
        _spatial_layout(store, key, default_spatial_layer(store, key))
        out.append("spatial")
    except VitseeError:
        pass
    return out


def run_analyses(path: str | Path, which: Sequence[str] | None, cfg: AnalyzeConfig, progress: StepFn | None = None) -> list[str]:
    """Runs the named analyses (None: all that apply) on a store and caches them; returns what was done."""
    unknown = [a for a in (which or []) if a not in ANALYSES]
    if unknown:
        raise VitseeError(f"unknown analysis '{unknown[0]}': choose from {', '.join(ANALYSES)}")
    from . import distributed

    rank = distributed.current()
    if rank is not None:
        return _run_analyses_distributed(path, which, cfg, progress, rank)
    return _run_analyses_here(path, which, cfg, progress)


def _run_analyses_distributed(path, which, cfg: AnalyzeConfig, progress, rank) -> list[str]:
    """Under torchrun: every rank accumulates its share of the CKA batches, the HSIC sums are all-reduced
    and rank 0 caches the result, then runs the rest as one process would (the CKA is cached by then)."""
    from dataclasses import replace

    from . import distributed

    device = distributed.rank_device(rank, cfg.device)
    distributed.init(rank, device)
    try:
        cfg = replace(cfg, device=device)
        store, compute, params, error = None, False, {}, None
        try:
            store = Store.writer(path) if rank.main else Store.open(path)
            _check_ready(store, store.models)
            params = cka_params(store, cfg)
            compute = (which is None or "cka" in which) and not store.streaming and (
                cfg.recompute or store.get_result("cka", params) is None)
        except BaseException as exc:
            error = exc
        try:
            distributed.agree(error, f"opening {path}")
            if compute:
                out = compute_cka(store, params, torch.device(device), progress if rank.main else None,
                                  share=(rank.rank, rank.world))  # batches dealt out round-robin
                states = distributed.all_reduce_sum(out["states"])
                if rank.main:
                    _save(store, "cka", params, finish_cka(states, out["columns"], params))
        finally:
            if store is not None:
                store.close()
        if not rank.main:
            return ["cka"] if compute else []
        return _run_analyses_here(path, which, cfg, progress)
    finally:
        distributed.shutdown()


def _run_analyses_here(path, which, cfg: AnalyzeConfig, progress) -> list[str]:
    done = []
    with Store.writer(path) as store:
        _check_ready(store, store.models)
        if which is None or "cka" in which:
            run_cka(store, cfg, progress)
            done.append("cka")
        for key in store.models:
            apply = applicable(store, key)
            for name, fn in (("attention", run_attention), ("probes", run_probes), ("skip", run_skip), ("spatial", run_spatial)):
                if which is not None and name not in which:
                    continue
                if name not in apply:
                    needs_acts = store.streaming and name in ("probes", "spatial")
                    if which is not None and (needs_acts or name == "probes" and store.labels is None):
                        fn(store, key, cfg, progress=progress)  # raises the clear error saying why not
                    continue
                fn(store, key, cfg, progress=progress)
                done.append(f"{name}:{key}")
    return done


def config_dict(cfg: AnalyzeConfig) -> dict:
    return asdict(cfg)
