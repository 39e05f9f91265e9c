"""Plumbing the analyses share: their config, progress events, device choice, the read-ahead of store batches,
the CKA batch plan, saving a result with its provenance, reading which images hold NaN/Inf, and the parts the
analyses of one run share (SHARED: the layer measures' Grams). No analysis lives here (the contract they keep is
contract.py)."""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Iterator, Sequence

import numpy as np

from vitsee import stats as stats_mod
from vitsee.errors import VitseeError
from vitsee.lazy import lazy_module
from vitsee.store import Store
from vitsee.analyses.config import AnalyzeConfig, Step, StepFn
from vitsee.analyses.contract import save_result  # noqa: F401  (the analyses' runners save through base)

torch = lazy_module("torch")  # reading a cached result needs numpy only; torch is imported by the first computation

MIN_BATCH = 4  # unbiased HSIC divides by m (m - 3) and (m - 1)(m - 2): it needs m >= 4 examples


def resolve_device(name: str) -> torch.device:
    """Returns the torch device for auto|cpu|cuda|cuda:N, refusing CUDA where there is none."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise VitseeError(f"--device {name} but no CUDA GPU is visible to torch: use --device cpu (or auto)")
        return torch.device(name)
    if name == "cpu":
        return torch.device("cpu")
    raise VitseeError(f"unknown device '{name}': use auto, cpu, cuda or cuda:N")


class SharedParts:
    """What the analyses of one run may share: parts expensive to build that several analyses read (the layer
    Grams every layer x layer measure is computed from), kept by key while a run is open and dropped when it ends.

    The driver opens a run around its jobs (`with SHARED.run(): ...`); outside one, `get` builds every time, so a
    lone analysis holds nothing after it returns. Safe to call from several threads: two that ask for one key at
    once may both build it, and the first one kept serves later askers.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._depth = 0
        self._parts: dict = {}

    @contextlib.contextmanager
    def run(self) -> Iterator[None]:
        with self._lock:
            self._depth += 1
        try:
            yield
        finally:
            with self._lock:
                self._depth -= 1
                if self._depth == 0:
                    self._parts.clear()

    def get(self, key, build):
        """Returns the part kept under `key` in the open run, else `build()` (kept while a run is open)."""
        with self._lock:
            if key in self._parts:
                return self._parts[key]
        part = build()
        with self._lock:
            if self._depth:
                part = self._parts.setdefault(key, part)
        return part


SHARED = SharedParts()


def emit(progress: StepFn | None, analysis: str, done: int, total: int, message: str = "") -> None:
    """Sends one progress event to `progress` (nothing when it is None)."""
    if progress is not None:
        progress(Step(analysis, done, total, message))


class Prefetch:
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


def read_batch(ds, rows: np.ndarray, pinned: bool) -> np.ndarray:
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


class LazyBatch:
    """One layer's batch that is read only when the CKA accumulator asks for it (keeps memory at one layer)."""

    def __init__(self, shape: tuple[int, ...], source: Prefetch):
        self.shape = shape
        self._source = source

    def __array__(self, dtype=None, copy=None):
        array = self._source.get()
        return array if dtype is None else array.astype(dtype)


def batch_plan(n: int, batch_size: int, shuffles: int, seed: int) -> list[tuple[int, np.ndarray]]:
    """Returns [(shuffle, rows)] batches defined by global index: store order, or K seeded shuffles."""
    if shuffles < 0:
        raise VitseeError(f"--shuffles must be 0 (store order) or more, got {shuffles}")
    if batch_size < MIN_BATCH:
        raise VitseeError(f"--batch-size {batch_size} is too small for CKA: use at least {MIN_BATCH}")
    orders = (
        [np.arange(n)] if shuffles == 0 else [np.random.default_rng([seed, k]).permutation(n) for k in range(shuffles)]
    )
    # a batch's HSIC does not depend on the order of its images, and HDF5 reads increasing rows directly
    return [(k, np.sort(order[s : s + batch_size])) for k, order in enumerate(orders) for s in range(0, n, batch_size)]


def check_ready(store: Store, models: Sequence[str]) -> None:
    """Raises the VitseeError that says why the models cannot be analysed yet (none, incomplete, too few images)."""
    if not models:
        raise VitseeError(f"{store.path} holds no models: add one with `vitsee extract {store.path} --model NAME`")
    for m in models:
        store.require_complete(m)
    if store.n_images < MIN_BATCH:
        raise VitseeError(
            f"{store.path} has {store.n_images} images; CKA needs at least {MIN_BATCH}: extract more (--n-images)"
        )


def with_stats(params: dict, cfg: AnalyzeConfig, permutations: int = 0) -> dict:
    """Returns params plus the statistics settings under "stats"; none asked for: params unchanged, so results
    cached before statistics existed keep their keys, and a request with statistics never takes one of them."""
    settings = stats_mod.stats_settings(cfg.ci, permutations, cfg.seed)
    return params if settings is None else {**params, "stats": settings}


def with_interval(params: dict, cfg: AnalyzeConfig) -> dict:
    """Returns params plus {"stats": {"ci": level}} for a closed-form interval; unchanged when cfg.ci is 0."""
    settings = stats_mod.interval_settings(cfg.ci)
    return params if settings is None else {**params, "stats": settings}


def has_cls_token(info: dict) -> bool:
    """Returns whether a model has a class token: recorded from timm's cls_token; stores written before that was
    recorded say so by having prefix tokens (register-only ViTs were taken for CLS ViTs then)."""
    if "cls_token" in info:
        return bool(info["cls_token"])
    return info.get("family") == "vit" and int(info.get("num_prefix_tokens") or 0) > 0


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
        # an Inf input makes its element's moments NaN (inf - inf), which the views mark as computed from NaN/Inf
        # inputs: numpy's warning about it would be a stray line on the command line's output, not news
        with np.errstate(invalid="ignore", over="ignore"):
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


NO_CLS = "no class token"


def no_cls(info: dict) -> bool:
    """Returns whether a token model has no class token (register-only ViTs, Mixer), which a user would look for."""
    return info.get("family") in ("vit", "mixer") and not has_cls_token(info)


def nonfinite_image_mask(store: Store, key: str, layer: str, cells=None) -> np.ndarray | None:
    """Returns the (N,) mask of images whose stored activations in a layer hold NaN/Inf (with `cells`, a
    function activations -> per-cell (b, D) features: the (N, cells) mask), or None when the store cannot
    tell (no activations stored). Reads only the batches the extraction counted non-finite values in."""
    if store.streaming:
        return None
    per_batch = store.nonfinite_batches(key)[:, store.layers(key).index(layer)]
    bs, n = store.batch_size(key), store.n_images
    mask = None
    for b in np.flatnonzero(per_batch):
        rows = slice(int(b) * bs, min((int(b) + 1) * bs, n))
        a = store.activations(key, layer, rows)
        bad = (
            np.stack([~np.isfinite(c).all(axis=1) for c in cells(a)], axis=1)
            if cells
            else ~np.isfinite(a.reshape(len(a), -1)).all(axis=1)
        )
        if mask is None:
            mask = np.zeros((n, *bad.shape[1:]), dtype=bool)
        mask[rows] = bad
    if mask is None:
        n_cells = len(cells(np.zeros((0, *store.layer_shape(key, layer)), dtype=np.float32))) if cells else None
        mask = np.zeros((n, n_cells) if cells else (n,), dtype=bool)
    return mask
