"""Extraction: one pass over the images feeds every model of a run, hooks record, a writer thread stores.

The main thread loads batches (DataLoader workers), runs each model's forward with its recorders and
starts the device-to-host copies on a side stream (so they overlap the next batch's forward); a background
thread waits for those copies and writes the batch into the store, so the device never waits on HDF5. A
bounded queue keeps host memory flat. Progress and plan messages reach the caller through one callback
(the CLI draws a Rich bar, the terminal app a widget).

With `streaming`, activations never leave the device: each batch's layers of every model go straight
into one all-pairs CKA accumulator, and the store keeps the per-image statistics, the accumulator and,
at the end, the CKA result (what `vitsee analyze --cka --shuffles 0` with the same batch size gives).
"""
from __future__ import annotations

import os
import queue
import shutil
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from . import store as store_mod
from .data import ImageSet, Selection, loader_batches, open_dataset, select_indices
from .errors import VitseeError
from .models import LoadedModel, ModelSpec, layer_points, load_model, make_transform, parse_model_spec
from .recorders import ActivationRecorder, HeadOutputRecorder, Recorder, default_recorders, fp16_lossy_layers, fp16_note
from .store import ArraySpec, LayerSpec, Store, estimate_bytes, human_bytes

DTYPES = {"float16": torch.float16, "float32": torch.float32}
# images of the dry run that learns the layer shapes and what fp16 storage loses (its centring over images needs
# several; the loss is an order of magnitude, so data.MIN_IMAGES do)
DRY_RUN_IMAGES = 4


@dataclass
class ExtractConfig:
    """Everything `vitsee extract` takes."""

    store: Path
    models: Sequence[str]
    dataset: str = "samples"
    n_images: int | None = None
    batch_size: int = 64
    device: str = "auto"
    layers: str | list[str] = "blocks"
    img_size: int | None = None
    dtype: str = "float16"
    shuffle_seed: int | None = None
    overwrite: bool = False
    force: bool = False
    workers: int | None = None
    streaming: bool = False
    shard: Shard | None = None  # set by the torchrun driver: this process extracts these rows into their own file

    def __post_init__(self):
        # checked here, where the CLI and the app's form both build the config, so both get one line
        self.layers = parse_layers(self.layers)
        if self.img_size is not None and self.img_size < 1:
            raise VitseeError(f"--img-size {self.img_size} is not a size in pixels: use a positive size such as 224, "
                              "or leave it out for the model's own")
        if self.shuffle_seed is not None and not 0 <= self.shuffle_seed < 2**63:
            raise VitseeError(f"--shuffle-seed {self.shuffle_seed} is out of range: use a seed from 0 to {2**63 - 1}")
        if self.workers is not None and self.workers < 0:
            raise VitseeError(f"--workers {self.workers} is negative: use 0 (load images in this process) or more")
        if self.batch_size < 1:
            raise VitseeError(f"--batch-size must be at least 1, got {self.batch_size}")
        if self.dtype not in DTYPES:
            raise VitseeError(f"unknown --dtype '{self.dtype}': use float16 or float32")


LAYER_GRANULARITIES = ("blocks", "sublayers")


def parse_layers(layers: str | Sequence[str]) -> str | list[str]:
    """Returns 'blocks', 'sublayers' or the list of layer names that `--layers` text (NAME,NAME) gives."""
    if isinstance(layers, str):
        text = layers.strip()
        if text in LAYER_GRANULARITIES:
            return text
        names = [name.strip() for name in text.split(",")]
    else:
        names = [str(name).strip() for name in layers]
    names = [name for name in names if name]
    if not names:
        raise VitseeError(f"--layers {layers!r} names no layer: use blocks, sublayers or NAME,NAME,... "
                          "(the names `vitsee layers MODEL` lists)")
    return names


@dataclass(frozen=True)
class Shard:
    """The part of a run one torchrun process extracts: whole batches [first_batch, stop_batch) of the
    run's images, rows [start, stop), stored as a store of its own and stitched into the run's store."""

    rank: int
    world: int
    first_batch: int
    stop_batch: int
    start: int
    stop: int
    run_id: str = ""  # the same for every shard of one run (its images and process count); see shards.run_id


@dataclass
class Progress:
    """One event of a run: stage is 'plan' (message), 'load' (message), 'extract' (done/total images),
    'warning' (message: something the user should look at, e.g. non-finite values) or 'done'."""

    stage: str
    done: int = 0
    total: int = 0
    message: str = ""
    model: str | None = None


@dataclass
class ExtractResult:
    store: Path
    models: list[str]
    images_processed: int
    seconds: float
    bytes_written: int
    cancelled: bool = False
    messages: list[str] = field(default_factory=list)


ProgressFn = Callable[[Progress], None]


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


# --- planning ---------------------------------------------------------------------------------------


@dataclass
class ModelPlan:
    """A model of the run: its recorders, what it stores, and whether it is new or resumed."""

    loaded: LoadedModel
    recorders: list[Recorder]
    layers: list[LayerSpec]
    stats: list[ArraySpec]
    input_shape: tuple[int, ...]
    transform: object
    batch_size: int
    new: bool
    done: np.ndarray  # (batches,) bool
    record: dict

    @property
    def key(self) -> str:
        return self.loaded.key

    def bytes(self, n_images: int, dtype: str, streaming: bool = False) -> int:
        if streaming:
            return estimate_bytes(n_images, [], dtype, self.stats)
        inputs = ArraySpec("input", self.input_shape, dtype)
        return estimate_bytes(n_images, self.layers, dtype, [*self.stats, inputs])


def _dry_run(loaded: LoadedModel, recorders: list[Recorder], example: torch.Tensor) -> dict[str, tuple[int, ...]]:
    with torch.inference_mode():
        loaded.model(example)
    shapes = {}
    for rec in recorders:
        for name, value in rec.collect().items():
            shapes[name] = tuple(value.shape[1:])
    return shapes


def _model_record(loaded: LoadedModel, transform, layers_arg, dtype: str) -> dict:
    record = loaded.record()
    record.update(transform=str(transform), layers_arg=layers_arg, dtype=dtype)
    return record


def _check_same_images(store: Store, images: ImageSet, indices: np.ndarray) -> None:
    if store.dataset_spec != images.spec or not np.array_equal(store.indices, indices):
        raise VitseeError(
            f"{store.path} holds {store.n_images} images of '{store.dataset_spec}' but this run asks for "
            f"{len(indices)} of '{images.spec}': use the same --dataset/--n-images/--shuffle-seed, a new store, or --overwrite"
        )


def _check_same_model(store: Store, key: str, record: dict, layers: list[LayerSpec]) -> None:
    old = store.model_info(key)
    for field_name in ("spec", "weights", "data_config", "dtype"):
        a, b = old.get(field_name), record.get(field_name)
        if store_mod._json(a) != store_mod._json(b):
            raise VitseeError(
                f"{key} is already in {store.path} with a different {field_name} ({a} vs {b}): "
                "use a new store, or --overwrite to replace it"
            )
    if store.layers(key) != [layer.name for layer in layers]:
        raise VitseeError(
            f"{key} is already in {store.path} with other layers ({len(store.layers(key))} stored, "
            f"{len(layers)} asked): use the same --layers, a new store, or --overwrite"
        )


def _check_same_mode(store: Store, cfg: ExtractConfig, keys: list[str]) -> None:
    """A streaming store resumes only as the same streaming run; a store with activations takes no
    streaming run (its CKA could not cover the models already in it)."""
    if store.streaming and not cfg.streaming:
        raise VitseeError(
            f"{store.path} was made with --streaming (no activations stored): add --streaming to resume it, "
            "or extract with activations into another store (or --overwrite)"
        )
    if cfg.streaming and not store.streaming:
        raise VitseeError(
            f"{store.path} already holds activations; --streaming makes a store of its own: choose another path or --overwrite"
        )
    if cfg.streaming and store.models != keys:
        raise VitseeError(
            f"{store.path} streamed {', '.join(store.models)}; a streaming store cannot take other models "
            f"({', '.join(keys)}) since its CKA covers all models of one pass: give the same --model list, another store or --overwrite"
        )


def plan(cfg: ExtractConfig, device: torch.device, emit: ProgressFn,
         lock: store_mod.WriteLock | None = None) -> tuple[Selection, list[ModelPlan], Store | None]:
    """Returns the run's images, one ModelPlan per model, and the existing store if resuming/appending
    (opened for writing under lock, or read-only to only look, as `estimate` does)."""
    if not cfg.models:
        raise VitseeError("no model given: pass --model NAME[.TAG][@WEIGHTS] at least once")
    specs: list[ModelSpec] = [parse_model_spec(m) for m in cfg.models]
    keys = [s.key for s in specs]
    if len(set(keys)) != len(keys):
        raise VitseeError(f"model {keys[0] if keys.count(keys[0]) > 1 else keys[1]} is given twice: list each model once")
    images = open_dataset(cfg.dataset)
    indices = select_indices(len(images), cfg.n_images, cfg.shuffle_seed)
    if cfg.shard is not None:
        indices = indices[cfg.shard.start : cfg.shard.stop]
    images.check_readable(indices)
    selection = Selection(images, indices, cfg.shuffle_seed)

    existing: Store | None = None
    store_path = Path(cfg.store)
    if store_path.exists() and not cfg.overwrite:
        existing = Store.writer(store_path, rows=True, lock=lock) if lock is not None else Store.open(store_path)
        try:
            _check_same_images(existing, images, indices)
            _check_same_mode(existing, cfg, keys)
        except BaseException:
            existing.close()
            raise

    layers_arg = cfg.layers if isinstance(cfg.layers, str) else list(cfg.layers)
    torch_dtype = DTYPES[cfg.dtype]
    plans = []
    n_batches_default = -(-len(indices) // cfg.batch_size)
    try:
        for spec in specs:
            emit(Progress("load", message=f"loading {spec}", model=spec.key))
            loaded = load_model(spec, img_size=cfg.img_size, device=device)
            points = layer_points(loaded.model, loaded.family, layers_arg)
            transform = make_transform(loaded)
            recorders = default_recorders(loaded, points, torch_dtype)
            if not cfg.streaming and HeadOutputRecorder.applies(loaded):  # head-level CKA (analyses/heads.py)
                recorders.append(HeadOutputRecorder(torch_dtype))
            for rec in recorders:
                rec.attach(loaded)
            example = torch.stack([transform(images.image(int(i))) for i in indices[:DRY_RUN_IMAGES]]).to(device)
            act = next(r for r in recorders if isinstance(r, ActivationRecorder))
            act.measure_rounding = True
            shapes = _dry_run(loaded, recorders, example)
            act.measure_rounding = False
            layer_specs = act.layer_specs(shapes)
            stats = [s for r in recorders for s in r.specs()]
            record = _model_record(loaded, transform, layers_arg, cfg.dtype)
            if cfg.dtype == "float16":
                loss = act.rounding_loss()
                record.update(fp16_loss=loss, fp16_lossy_layers=fp16_lossy_layers(loss))
            if existing is not None and loaded.key in existing.models:
                _check_same_model(existing, loaded.key, record, layer_specs)
                batch_size = existing.batch_size(loaded.key)
                done = existing.done_batches(loaded.key)
                new = False
                if not existing.head_blocks(loaded.key):  # stored before head outputs were recorded: resume without
                    recorders, stats = _without_heads(recorders, stats)
            else:
                batch_size, done, new = cfg.batch_size, np.zeros(n_batches_default, dtype=bool), True
            plans.append(
                ModelPlan(loaded, recorders, layer_specs, stats, tuple(example.shape[1:]), transform, batch_size, new, done, record)
            )
    except BaseException:
        if existing is not None:
            existing.close()
        raise
    return selection, plans, existing


def _without_heads(recorders: list[Recorder], stats: list[ArraySpec]) -> tuple[list[Recorder], list[ArraySpec]]:
    """Returns the recorders and statistics without the head outputs (detaching their recorder)."""
    for rec in recorders:
        if isinstance(rec, HeadOutputRecorder):
            rec.detach()
    return ([r for r in recorders if not isinstance(r, HeadOutputRecorder)],
            [s for s in stats if not s.name.startswith(HeadOutputRecorder.PREFIX)])


def _check_disk(path: Path, needed: int, force: bool) -> None:
    free = shutil.disk_usage(path.parent if path.parent.exists() else Path.cwd()).free
    if needed > free and not force:
        raise VitseeError(
            f"{path} needs {human_bytes(needed)} but {path.parent} has {human_bytes(free)} free: free space, "
            "use fewer images or layers (--n-images, --layers blocks), or pass --force"
        )


# --- the pass ---------------------------------------------------------------------------------------


class _TransformedImages(torch.utils.data.Dataset):
    """Row j of the run -> one tensor per distinct transform (models sharing preprocessing share it)."""

    def __init__(self, images: ImageSet, indices: np.ndarray, transforms: list):
        self.images, self.indices, self.transforms = images, indices, transforms

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, j: int):
        try:
            img = self.images.image(int(self.indices[j]))
        except VitseeError as exc:
            return _Unreadable(str(exc))
        return tuple(t(img) for t in self.transforms)


@dataclass(frozen=True)
class _Unreadable:
    """An image that could not be read, carried to the main process as a value: raised in a DataLoader
    worker, its one-line error would arrive wrapped in the worker's traceback."""

    message: str


def _collate(items: list):
    """Returns the batch of a loader's items, or the first unreadable image among them."""
    for item in items:
        if isinstance(item, _Unreadable):
            return item
    return torch.utils.data.default_collate(items)


@contextmanager
def _batches(loader) -> Iterator[Iterator]:
    """Yields an iterator over a loader's batches, an unreadable image ending the run with its one-line
    error; the loader's workers are shut down when the block ends (see data.loader_batches)."""
    with loader_batches(loader) as it:
        yield (_checked(inputs) for inputs in it)


def _checked(inputs):
    if isinstance(inputs, _Unreadable):
        raise VitseeError(f"{inputs.message}, then rerun the same command to resume (finished batches are kept)")
    return inputs


@dataclass
class _Batch:
    """One model's batch on its way to the store (host tensors, pinned on CUDA)."""

    model: str
    batch: int
    activations: dict[str, torch.Tensor]
    stats: dict[str, torch.Tensor]
    model_input: torch.Tensor
    nonfinite: torch.Tensor  # (layers, b) per image
    ready: object = None  # a CUDA event the writer waits on before reading host memory

    def write(self, store: Store) -> int:
        acts = {k: v.numpy() for k, v in self.activations.items()}
        stats = {k: v.numpy() for k, v in self.stats.items()}
        inp = self.model_input.numpy()
        store.write_batch(self.model, self.batch, acts, stats, inp, self.nonfinite.numpy().sum(axis=1).tolist())
        return sum(a.nbytes for a in acts.values()) + inp.nbytes + sum(v.nbytes for v in stats.values())


@dataclass
class _StreamedBatch:
    """One batch of a streaming run: every model's statistics and the CKA accumulator after it."""

    batch: int
    stats: dict[str, dict[str, torch.Tensor]]  # model -> name -> (b, ...)
    nonfinite: dict[str, torch.Tensor]  # model -> (layers, b) per image
    cka_state: torch.Tensor
    ready: object = None

    def write(self, store: Store) -> int:
        stats = {m: {k: v.numpy() for k, v in values.items()} for m, values in self.stats.items()}
        state = self.cka_state.numpy()
        counts = {m: c.numpy().sum(axis=1).tolist() for m, c in self.nonfinite.items()}
        store.write_streamed_batch(self.batch, stats, counts, state)
        return state.nbytes + sum(v.nbytes for values in stats.values() for v in values.values())


class BatchWriter:
    """A thread that writes finished batches into the store; a bounded queue applies back-pressure."""

    def __init__(self, store: Store, max_pending: int = 3, nonfinite: NonfiniteLog | None = None):
        self.store = store
        self.nonfinite = nonfinite  # told which images of each written batch hold non-finite values
        self.queue: queue.Queue = queue.Queue(maxsize=max_pending)
        self.error: BaseException | None = None
        self.bytes_written = 0
        self.thread = threading.Thread(target=self._run, name="vitsee-writer", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            item = self.queue.get()
            if item is None:
                return
            if self.error is not None:
                continue  # drain after a failure so the producer never blocks
            try:
                if item.ready is not None:
                    item.ready.synchronize()
                self.bytes_written += item.write(self.store)
                self._log_nonfinite(item)
            except BaseException as exc:  # reported to the producer on its next put/close
                self.error = exc

    def _log_nonfinite(self, item: _Batch | _StreamedBatch) -> None:
        if self.nonfinite is None:
            return
        per_model = {item.model: item.nonfinite} if isinstance(item, _Batch) else item.nonfinite
        for model, per_row in per_model.items():
            self.nonfinite.add(model, item.batch, per_row.numpy())

    def put(self, item: _Batch | _StreamedBatch) -> None:
        if self.error is not None:
            raise self.error
        self.queue.put(item)

    def close(self) -> None:
        self.queue.put(None)
        self.thread.join()
        if self.error is not None:
            raise self.error


class _HostCopies:
    """Device-to-host copies into pinned memory on a side stream, so they overlap the next forward.

    The side stream first waits for the compute stream (the values must be finished), and every source
    tensor is marked as used by it, so the caching allocator does not hand its memory to the next batch
    before the copy has read it. On CPU the tensors are already on the host: nothing is copied.
    """

    def __init__(self, device: torch.device):
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    def begin(self) -> None:
        if self.stream is not None:
            self.stream.wait_stream(torch.cuda.current_stream(self.stream.device))

    def to_host(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if self.stream is None:
            return {name: t.contiguous() for name, t in tensors.items()}
        out = {}
        with torch.cuda.stream(self.stream):
            for name, t in tensors.items():
                host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
                host.copy_(t, non_blocking=True)
                t.record_stream(self.stream)
                out[name] = host
        return out

    def ready(self):
        """Returns an event the writer waits on before it reads the copies (None on CPU)."""
        if self.stream is None:
            return None
        event = torch.cuda.Event()
        event.record(self.stream)
        return event


def _nonfinite_rows(acts: dict[str, torch.Tensor], layers: Sequence[LayerSpec]) -> torch.Tensor:
    """Returns (layers, b) counts of inf/nan values per layer and image (fp16 overflow shows up here)."""
    values = [acts[layer.name].flatten(1) for layer in layers]
    if not values:
        return torch.zeros((0, 0), dtype=torch.int64)
    if values[0].device.type == "cpu":
        # a sum in fp32 is finite exactly when every value is (fp16 values cannot overflow it), and reads
        # the data once at memory speed; only a layer that fails it is counted value by value
        b = values[0].shape[0]
        return torch.stack([torch.zeros(b, dtype=torch.int64) if torch.isfinite(v.sum(dtype=torch.float32))
                            else (~torch.isfinite(v)).sum(dim=1) for v in values])
    return torch.stack([(~torch.isfinite(v)).sum(dim=1) for v in values])  # no host sync on the device


class NonfiniteLog:
    """Which images (store rows) held non-finite values in which layer, gathered batch by batch as the
    writer stores them; `message()` is the run's one closing line about them."""

    MAX_LAYERS = 4
    MAX_RANGES = 10

    def __init__(self, store: Path, plans: Sequence[ModelPlan], row_offset: int = 0):
        self.store = store
        self.layers = {mp.key: [layer.name for layer in mp.layers] for mp in plans}
        self.batch_size = {mp.key: mp.batch_size for mp in plans}
        self.row_offset = row_offset
        self.rows: dict[str, dict[str, set[int]]] = {mp.key: {} for mp in plans}  # model -> layer -> rows
        self._lock = threading.Lock()

    def add(self, model: str, batch: int, per_row: np.ndarray) -> None:
        """Records the (layers, b) non-finite counts of one of a model's batches."""
        if not per_row.any():
            return
        first = self.row_offset + batch * self.batch_size[model]
        with self._lock:
            for li, j in zip(*np.nonzero(per_row)):
                self.rows[model].setdefault(self.layers[model][li], set()).add(first + int(j))

    def message(self) -> str | None:
        """Returns one line naming the layers and images with non-finite values and how to look, or None."""
        parts = []
        for model, layers in self.rows.items():
            if not layers:
                continue
            names = [name for name in self.layers[model] if name in layers]  # forward order
            shown = ", ".join(names[: self.MAX_LAYERS]) + (f" and {len(names) - self.MAX_LAYERS} more" if len(names) > self.MAX_LAYERS else "")
            rows = sorted(set().union(*layers.values()))
            parts.append(f"{model} layer(s) {shown} in {len(rows)} image(s) (store rows {row_ranges(rows, self.MAX_RANGES)})")
        if not parts:
            return None
        return (f"non-finite values (NaN/Inf) in {'; '.join(parts)}: see `vitsee info {self.store}`; views mark "
                "what they touch as non-finite and probes skip them (fp16 overflow? extract with --dtype float32)")


def row_ranges(rows: Sequence[int], limit: int = 10) -> str:
    """Returns sorted rows as ranges, '5-9, 17', at most `limit` of them and then 'and N more' (rows)."""
    spans: list[list[int]] = []
    for r in rows:
        if spans and r == spans[-1][1] + 1:
            spans[-1][1] = r
        else:
            spans.append([r, r])
    text = ", ".join(f"{a}-{b}" if b > a else f"{a}" for a, b in spans[:limit])
    if len(spans) > limit:
        text += f" and {sum(b - a + 1 for a, b in spans[limit:])} more"
    return text


def _forward(mp: ModelPlan, x: torch.Tensor) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Returns (activations, statistics) of one batch, on the model's device."""
    with torch.inference_mode():
        mp.loaded.model(x)
    acts: dict[str, torch.Tensor] = {}
    stats: dict[str, torch.Tensor] = {}
    for rec in mp.recorders:
        (acts if isinstance(rec, ActivationRecorder) else stats).update(rec.collect())
    # head outputs stay in the store's dtype, like activations; statistics are fp32
    return acts, {k: v if k.startswith(HeadOutputRecorder.PREFIX) else v.float() for k, v in stats.items()}


def _forward_batch(mp: ModelPlan, x: torch.Tensor, batch: int, torch_dtype: torch.dtype, copies: _HostCopies) -> _Batch:
    acts, stats = _forward(mp, x)
    nonfinite = _nonfinite_rows(acts, mp.layers)
    model_input = x.to(torch_dtype)
    copies.begin()
    host_acts = copies.to_host(acts)
    host_stats = copies.to_host(stats)
    host_rest = copies.to_host({"input": model_input, "nonfinite": nonfinite})
    return _Batch(mp.key, batch, host_acts, host_stats, host_rest["input"], host_rest["nonfinite"], copies.ready())


def _cka_columns(plans: Sequence[ModelPlan]) -> list[tuple[str, str]]:
    """The streamed CKA's columns: every layer of every model, models in store order, layers in forward order."""
    return [(mp.key, layer.name) for mp in plans for layer in mp.layers]


def streamed_cka_params(store: Store) -> dict:
    """Returns the parameters of a streaming store's CKA: those of `analyze --cka --shuffles 0` with the
    extraction's batch size, so views and the app find it like any cached CKA."""
    from .analyze import AnalyzeConfig, cka_params

    batch_size = int(store.file["streaming/cka_state"].attrs["batch_size"])
    # the stream kept no per-batch terms or permutations: its CKA carries no statistics
    return cka_params(store, AnalyzeConfig(batch_size=batch_size, shuffles=0, ci=0, permutations=0))


def save_streamed_cka(store: Store) -> dict:
    """Caches the CKA of a finished streaming run, from the accumulator it stored."""
    from .analyze import _save, finish_cka

    saved = store.streamed_cka_state()
    if saved is None:
        raise VitseeError(f"{store.path} has no finished batch to compute CKA from: rerun the same `vitsee extract --streaming` command")
    state, columns = saved
    params = streamed_cka_params(store)
    if [tuple(c) for c in columns] != [(m, layer) for m in params["models"] for layer in params["layers"][m]]:
        raise VitseeError(f"{store.path}: the streamed CKA's layers do not match the store's models: re-extract it with --overwrite")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a batch under 4 images was skipped; the result records it
        arrays = finish_cka(torch.as_tensor(state)[None], columns, params)
    return _save(store, "cka", params, arrays)


@dataclass
class SizeEstimate:
    """What a run will put on disk: in all, and still to write (less when a store is resumed)."""

    n_images: int
    n_models: int
    total_bytes: int
    todo_bytes: int
    resuming: bool
    streaming: bool

    def describe(self) -> str:
        """Returns the one-line plan message: images, models and the expected size on disk."""
        text = f"{self.n_images} images x {self.n_models} model(s), expected size on disk {human_bytes(self.total_bytes)}"
        if self.streaming:
            text += " (streaming: statistics and CKA only, activations not stored)"
        if self.resuming:
            text += f" (to write now: {human_bytes(self.todo_bytes)})"
        return text


def _estimate(plans: list[ModelPlan], n: int, cfg: ExtractConfig, resuming: bool) -> SizeEstimate:
    total = sum(mp.bytes(n, cfg.dtype, cfg.streaming) for mp in plans)
    todo = sum(mp.bytes(n, cfg.dtype, cfg.streaming) * (1 - mp.done.mean()) for mp in plans if not mp.done.all())
    return SizeEstimate(n, len(plans), int(total), int(todo), resuming, cfg.streaming)


def _release(plans: list[ModelPlan], existing: Store | None) -> None:
    for mp in plans:
        for rec in mp.recorders:
            rec.detach()
    if existing is not None:
        existing.close()


def estimate(cfg: ExtractConfig) -> SizeEstimate:
    """Returns the size a run would take, without writing anything (models are built and run once on
    one image to learn the layer shapes). Raises VitseeError for a bad config, as the run would."""
    selection, plans, existing = plan(cfg, resolve_device(cfg.device), lambda _event: None)
    try:
        return _estimate(plans, len(selection), cfg, existing is not None)
    finally:
        _release(plans, existing)


def run_extraction(
    cfg: ExtractConfig, progress: ProgressFn | None = None, cancel: threading.Event | None = None
) -> ExtractResult:
    """Extracts (or resumes, or appends) every model of cfg into the store; returns what was done.

    Launched by torchrun (WORLD_SIZE > 1), each process extracts its share into a shard and rank 0
    stitches them into the store (see `distributed.extract_sharded`).
    """
    from . import distributed

    if cfg.shard is None and distributed.current() is not None:
        return distributed.extract_sharded(cfg, progress, cancel)
    emit: ProgressFn = progress or (lambda _p: None)
    device = resolve_device(cfg.device)
    t0 = time.perf_counter()
    store_path = Path(cfg.store)
    # the lock covers resuming, appending, creating and replacing alike; a new store's is taken once the
    # run's inputs have been checked, so a refused run leaves nothing beside the path
    lock = store_mod.WriteLock(store_path) if store_path.exists() else None
    try:
        selection, plans, existing = plan(cfg, device, emit, lock=lock)
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    if lock is None and existing is not None:  # another run created the store while this one was planned
        _release(plans, existing)
        raise VitseeError(f"{store_path} was created by another vitsee process while this run started: "
                          "rerun the same command to add to it (or resume it)")
    n = len(selection)
    messages = []
    try:
        size = _estimate(plans, n, cfg, existing is not None)
        msg = f"{store_path}: {size.describe()}"
        messages.append(msg)
        emit(Progress("plan", message=msg))
        for mp in plans:
            note = fp16_note(mp.key, mp.record.get("fp16_loss", {}))
            if note:
                messages.append(note)
                emit(Progress("plan", message=note, model=mp.key))
            if not mp.new and mp.batch_size != cfg.batch_size:
                note = f"{mp.key}: resuming with the stored batch size {mp.batch_size}"
                messages.append(note)
                emit(Progress("plan", message=note, model=mp.key))
        _check_disk(store_path, size.todo_bytes, cfg.force)
        stale = store_mod.remove_stale_starts(store_path)
        if stale:
            note = f"removed {len(stale)} file(s) a killed start left: {', '.join(t.name for t in stale)}"
            messages.append(note)
            emit(Progress("plan", message=note))

        if existing is None:
            if lock is None:
                lock = store_mod.WriteLock(store_path)
            with store_mod.creating(store_path, overwrite=cfg.overwrite, lock=lock) as h5:
                images = selection.images
                store_mod.write_images(h5, images.spec, selection.indices, selection.labels, images.class_names, selection.shuffle_seed)
                if cfg.shard is not None:
                    h5.attrs["shard"] = store_mod._json(cfg.shard.__dict__)
                for mp in plans:
                    store_mod.add_model_layout(h5, mp.record, mp.layers, mp.stats, mp.input_shape, mp.batch_size,
                                               cfg.dtype, n, streaming=cfg.streaming)
                if cfg.streaming:
                    store_mod.add_streaming_state(h5, _cka_columns(plans), cfg.batch_size)
            existing = Store.writer(store_path, rows=True, lock=lock)
        else:
            for mp in plans:
                if mp.new:
                    existing.add_model(mp.record, mp.layers, mp.stats, mp.input_shape, mp.batch_size, cfg.dtype)
        run_pass = _streaming_pass if cfg.streaming else _extract_pass
        nonfinite = NonfiniteLog(store_path, plans, cfg.shard.start if cfg.shard is not None else 0)
        processed, bytes_written, cancelled = run_pass(existing, selection, plans, device, cfg, emit, cancel, nonfinite)
        if cfg.streaming and not cancelled and existing.complete and cfg.shard is None:
            save_streamed_cka(existing)  # a shard's share is summed with the others' when they are stitched
    finally:
        _release(plans, existing)
        if lock is not None:
            lock.release()
    seconds = time.perf_counter() - t0
    warning = nonfinite.message()
    if warning is not None:  # after the bar, so it is the line a user reads last
        messages.append(warning)
        emit(Progress("warning", message=warning))
    emit(Progress("done", done=processed, total=n, message=f"{processed} images in {seconds:.1f} s"))
    return ExtractResult(store_path, [mp.key for mp in plans], processed, seconds, bytes_written, cancelled, messages)


def _loader(selection: Selection, group: Sequence[ModelPlan], batches: list[list[int]], device: torch.device,
            cfg: ExtractConfig) -> tuple[torch.utils.data.DataLoader, dict[str, int]]:
    """Returns a loader yielding per batch one input tensor per distinct transform, and model -> slot."""
    transforms, slot = [], {}
    for mp in group:
        key = repr(mp.transform)
        if key not in slot:
            slot[key] = len(transforms)
            transforms.append(mp.transform)
    dataset = _TransformedImages(selection.images, selection.indices, transforms)
    workers = cfg.workers if cfg.workers is not None else min(4, max(1, (os.cpu_count() or 2) - 1))
    loader = torch.utils.data.DataLoader(
        dataset, batch_sampler=batches, num_workers=workers, pin_memory=device.type == "cuda", collate_fn=_collate
    )
    return loader, {mp.key: slot[repr(mp.transform)] for mp in group}


def _extract_pass(store, selection, plans, device, cfg, emit, cancel, nonfinite=None) -> tuple[int, int, bool]:
    """Runs the pending batches of every model, grouped by batch size (one pass per group)."""
    n = len(selection)
    torch_dtype = DTYPES[cfg.dtype]
    processed = 0
    cancelled = False
    writer = BatchWriter(store, nonfinite=nonfinite)
    copies = _HostCopies(device)
    try:
        for bs in sorted({mp.batch_size for mp in plans}):
            group = [mp for mp in plans if mp.batch_size == bs and not mp.done.all()]
            if not group:
                continue
            n_batches = -(-n // bs)
            pending = [b for b in range(n_batches) if any(not mp.done[b] for mp in group)]
            batches = [list(range(b * bs, min((b + 1) * bs, n))) for b in pending]
            loader, slot = _loader(selection, group, batches, device, cfg)
            done_images = n - sum(len(rows) for rows in batches)
            emit(Progress("extract", done=done_images, total=n))
            with _batches(loader) as loaded:
                for b, inputs in zip(pending, loaded):
                    if cancel is not None and cancel.is_set():
                        cancelled = True
                        break
                    for mp in group:
                        if mp.done[b]:
                            continue
                        x = inputs[slot[mp.key]].to(device, non_blocking=True)
                        writer.put(_forward_batch(mp, x, b, torch_dtype, copies))
                    rows = min(bs, n - b * bs)
                    processed += rows
                    done_images += rows
                    emit(Progress("extract", done=done_images, total=n))
            if cancelled:
                break
    finally:
        writer.close()
    return processed, writer.bytes_written, cancelled


def _streaming_pass(store, selection, plans, device, cfg, emit, cancel, nonfinite=None) -> tuple[int, int, bool]:
    """Runs the pending batches of all models together: statistics to the store, activations into one
    all-pairs CKA accumulator on the device (resumed from the store's copy of it)."""
    from .cka import MinibatchCKA

    n = len(selection)
    bs = plans[0].batch_size
    n_batches = -(-n // bs)
    done = np.logical_and.reduce([mp.done for mp in plans])
    first = int(np.argmin(done)) if not done.all() else n_batches  # streaming writes batches in order
    columns = _cka_columns(plans)
    acc = MinibatchCKA(len(columns), device)
    saved = store.streamed_cka_state()
    if first > 0 and saved is not None:
        acc.state.copy_(torch.as_tensor(saved[0]))
    pending = list(range(first, n_batches))
    batches = [list(range(b * bs, min((b + 1) * bs, n))) for b in pending]
    processed, cancelled = 0, False
    writer = BatchWriter(store, nonfinite=nonfinite)
    copies = _HostCopies(device)
    try:
        if not pending:
            return 0, 0, False
        loader, slot = _loader(selection, plans, batches, device, cfg)
        done_images = n - sum(len(rows) for rows in batches)
        emit(Progress("extract", done=done_images, total=n))
        with _batches(loader) as loaded:
            for b, inputs in zip(pending, loaded):
                if cancel is not None and cancel.is_set():
                    cancelled = True
                    break
                feats, stats, bad = [], {}, {}
                for mp in plans:
                    acts, stats[mp.key] = _forward(mp, inputs[slot[mp.key]].to(device, non_blocking=True))
                    bad[mp.key] = _nonfinite_rows(acts, mp.layers)
                    feats += [acts[layer.name] for layer in mp.layers]
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # a last batch under 4 images is skipped, as analyze does
                    acc.update(feats)
                del feats
                state = acc.state.clone()  # the next batch adds to the accumulator in place while this one is written
                copies.begin()
                host = _StreamedBatch(b, {m: copies.to_host(v) for m, v in stats.items()},
                                      {m: copies.to_host({"c": c})["c"] for m, c in bad.items()},
                                      copies.to_host({"state": state})["state"])
                host.ready = copies.ready()
                writer.put(host)
                rows = min(bs, n - b * bs)
                processed += rows
                done_images += rows
                emit(Progress("extract", done=done_images, total=n))
    finally:
        writer.close()
    return processed, writer.bytes_written, cancelled
