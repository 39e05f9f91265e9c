"""Planning an extraction and checking it before anything is written: the config, the per-model plan
(recorders, layers, shapes from a dry run), the checks against an existing store, and the size estimate."""

from __future__ import annotations

import dataclasses
import itertools
import re
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from vitsee import store as store_mod
from vitsee.analyses.base import resolve_device
from vitsee.data import ImageSet, Selection, open_dataset, select_indices
from vitsee.errors import VitseeError
from vitsee.models.load import LoadedModel, ModelSpec, layer_points, load_model, make_transform, parse_model_spec
from vitsee.extraction.recorders import (
    ActivationRecorder,
    HeadOutputRecorder,
    Recorder,
    default_recorders,
    fp16_lossy_layers,
)
from vitsee.store import ArraySpec, LayerSpec, Store, estimate_bytes, human_bytes
from vitsee.zoo.streamed import gram_batch_size, gram_specs, keeps_grams


DTYPES = {"float16": torch.float16, "float32": torch.float32}


# images of the dry run that learns the layer shapes and what fp16 storage loses (its centring over images needs
# several; the loss is an order of magnitude, so data.MIN_IMAGES do)
DRY_RUN_IMAGES = 4
# without --memory-budget, the models resident at once may take this share of the memory available when the run
# starts (the device's free memory on a GPU, else the host's available RAM); the rest is for the loader, the writer's
# queue and whatever else runs there
MEMORY_FRACTION = 0.5


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
    heads: bool = False  # with streaming: accumulate head-level CKA (without, head outputs are stored anyway)
    shard: Shard | None = None  # set by the torchrun driver: this process extracts these rows into their own file
    grams: bool = (
        False  # streaming that keeps each layer's per-batch Gram (a zoo: models run in waves; zoo/streamed.py)
    )
    memory_budget: int | None = (
        None  # bytes the resident models may take at once (None: MEMORY_FRACTION of what is free)
    )

    @classmethod
    def from_options(cls, store: Path | str, models: Sequence[str], options: Mapping[str, object]) -> ExtractConfig:
        """Returns the config of a run of `models` into `store` from options named as its fields: the parameters of
        `vitsee extract`, the arguments of `vitsee.extract`, a store's run record. Other names are ignored; a
        memory budget may be a size ("4G")."""
        names = {f.name for f in dataclasses.fields(cls)} - {"store", "models"}
        values = {name: options[name] for name in names if name in options}
        if values.get("memory_budget") is not None:
            values["memory_budget"] = parse_bytes(str(values["memory_budget"]))
        return cls(store=Path(store), models=list(models), **values)

    def __post_init__(self):
        # checked here, where the CLI and the app's form both build the config, so both get one line
        self.layers = parse_layers(self.layers)
        if self.grams:
            self.streaming = True  # Grams are what a streaming zoo keeps instead of activations
            if self.heads:
                raise VitseeError(
                    "--heads streams head-level CKA in one pass over all models, and --grams runs the models "
                    "one at a time: leave out --heads (or --grams), or analyze heads on a store with activations"
                )
        if self.memory_budget is not None and self.memory_budget <= 0:
            raise VitseeError(
                f"--memory-budget {self.memory_budget} is not a size: give bytes such as 4G or 512M, "
                "or leave it out for half of the memory available"
            )
        if self.img_size is not None and self.img_size < 1:
            raise VitseeError(
                f"--img-size {self.img_size} is not a size in pixels: use a positive size such as 224, "
                "or leave it out for the model's own"
            )
        if self.shuffle_seed is not None and not 0 <= self.shuffle_seed < 2**63:
            raise VitseeError(f"--shuffle-seed {self.shuffle_seed} is out of range: use a seed from 0 to {2**63 - 1}")
        if self.workers is not None and self.workers < 0:
            raise VitseeError(f"--workers {self.workers} is negative: use 0 (load images in this process) or more")
        if self.batch_size < 1:
            raise VitseeError(f"--batch-size must be at least 1, got {self.batch_size}")
        if self.dtype not in DTYPES:
            raise VitseeError(f"unknown --dtype '{self.dtype}': use float16 or float32")
        if self.heads and self.streaming and len(self.models) == 1:
            raise VitseeError(
                f"--heads compares a ViT's attention heads with another model's layers, and this "
                f"streaming run has one model ({self.models[0]}): add --model NAME (e.g. a ResNet) or leave out --heads"
            )


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
        raise VitseeError(
            f"--layers {layers!r} names no layer: use blocks, sublayers or NAME,NAME,... "
            "(the names `vitsee layers MODEL` lists)"
        )
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


@dataclass
class ModelPlan:
    """A model of the run: its recorders, what it stores, and whether it is new or resumed.

    In a run of waves (see `waves`) a model is resident only while its wave runs: `release` frees its weights and
    hooks, `reload` builds it again as planned (`reopen`), refusing weights that changed since.
    """

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
    resident_bytes: int = 0  # its parameters and buffers, measured once it was loaded
    batch_bytes: int = 0  # what one batch of it records (activations, statistics, input), from the dry run's shapes
    reopen: Callable[[], tuple[LoadedModel, list[Recorder]]] | None = None
    gram_maker: object = None  # with --grams: the MinibatchCKA whose layer_gram() builds each layer's batch Gram

    @property
    def key(self) -> str:
        return self.loaded.key

    @property
    def cost(self) -> int:
        """Returns the memory the model takes while its wave runs: its weights and one batch of what it records."""
        return self.resident_bytes + self.batch_bytes

    @property
    def resident(self) -> bool:
        return self.loaded.model is not None

    def release(self) -> None:
        """Frees the model's weights and hooks; `reload` brings them back."""
        for rec in self.recorders:
            rec.detach()
        self.recorders = []
        self.loaded = dataclasses.replace(self.loaded, model=None)

    def reload(self) -> None:
        """Builds the model and its recorders again, as planned, unless it is resident."""
        if self.resident:
            return
        loaded, recorders = self.reopen()
        if loaded.weights != self.loaded.weights:
            for rec in recorders:
                rec.detach()
            raise VitseeError(
                f"the weights of {self.key} changed while the run was going ({loaded.weights.get('path')}): "
                "put the file back and rerun the same command to resume, or extract into a new store"
            )
        self.loaded, self.recorders = loaded, recorders

    @property
    def head_recorder(self) -> HeadOutputRecorder | None:
        """Returns the recorder of the model's per-head attention outputs, if it has one."""
        return next((r for r in self.recorders if isinstance(r, HeadOutputRecorder)), None)

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


def check_same_images(store: Store, images: ImageSet, indices: np.ndarray) -> None:
    """Raises the VitseeError that says so when a store holds other images than the ones asked for."""
    if store.dataset_spec != images.spec or not np.array_equal(store.indices, indices):
        raise VitseeError(
            f"{store.path} holds {store.n_images} images of '{store.dataset_spec}' but this run asks for "
            f"{len(indices)} of '{images.spec}': "
            "use the same --dataset/--n-images/--shuffle-seed, a new store, or --overwrite"
        )


def _check_same_model(store: Store, key: str, record: dict, layers: list[LayerSpec]) -> None:
    old = store.model_info(key)
    for field_name in ("spec", "weights", "data_config", "dtype"):
        a, b = old.get(field_name), record.get(field_name)
        if store_mod.json_attr(a) != store_mod.json_attr(b):
            raise VitseeError(
                f"{key} is already in {store.path} with a different {field_name} ({a} vs {b}): "
                "use a new store, or --overwrite to replace it"
            )
    if store.layers(key) != [layer.name for layer in layers]:
        raise VitseeError(
            f"{key} is already in {store.path} with other layers ({len(store.layers(key))} stored, "
            f"{len(layers)} asked): use the same --layers, a new store, or --overwrite"
        )


def check_same_mode(store: Store, cfg: ExtractConfig, keys: list[str]) -> None:
    """A streaming store resumes only as the same streaming run; a store with activations takes no
    streaming run (its CKA could not cover the models already in it)."""
    if store.streaming and not cfg.streaming:
        raise VitseeError(
            f"{store.path} was made with --streaming (no activations stored): add --streaming to resume it, "
            "or extract with activations into another store (or --overwrite)"
        )
    if cfg.streaming and not store.streaming:
        raise VitseeError(
            f"{store.path} already holds activations; "
            "--streaming makes a store of its own: choose another path or --overwrite"
        )
    if cfg.streaming and cfg.grams != keeps_grams(store):
        raise VitseeError(
            (
                f"{store.path} keeps each layer's per-batch Grams (--grams): "
                "add --grams to resume it or to add models to it"
            )
            if keeps_grams(store)
            else (
                f"{store.path} streamed one all-pairs CKA accumulator, not per-model Grams: "
                "stream the zoo with --grams into another store (or --overwrite), or leave out --grams to resume it"
            )
        )
    new = [k for k in keys if k not in store.models]
    if cfg.grams and new and cfg.batch_size != gram_batch_size(store):
        raise VitseeError(
            f"{store.path} keeps Grams of batches of {gram_batch_size(store)} images and a model's pairs need the same "
            f"batches: add {', '.join(new)} with --batch-size {gram_batch_size(store)}"
        )
    if cfg.streaming and cfg.heads and not store.streamed_heads():
        raise VitseeError(
            f"{store.path} was streamed without --heads, and head-level CKA needs every batch from the first: "
            "stream into another store (or --overwrite) with --heads, or leave out --heads to resume it"
        )
    if cfg.streaming and not cfg.grams and store.models != keys:
        raise VitseeError(
            f"{store.path} streamed {', '.join(store.models)}; a streaming store cannot take other models "
            f"({', '.join(keys)}) since its CKA covers all models of one pass: "
            "give the same --model list, another store or --overwrite"
        )


def plan(
    cfg: ExtractConfig,
    device: torch.device,
    emit: ProgressFn,
    lock: store_mod.WriteLock | None = None,
    budget: int | None = None,
) -> tuple[Selection, list[ModelPlan], Store | None]:
    """Returns the run's images, one ModelPlan per model, and the existing store if resuming/appending
    (opened for writing under lock, or read-only to only look, as `estimate` does).

    Each model is loaded and run once on a few images (its shapes, what fp16 loses, its memory cost). With a memory
    budget, models stay loaded while their costs together fit it; from the first that does not fit on, each is released
    after its dry run and loaded again when its wave starts (extraction/extract.py). Without a budget all stay loaded.
    """
    if not cfg.models:
        raise VitseeError("no model given: pass --model NAME[.TAG][@WEIGHTS] at least once")
    specs: list[ModelSpec] = [parse_model_spec(m) for m in cfg.models]
    keys = [s.key for s in specs]
    if len(set(keys)) != len(keys):
        raise VitseeError(
            f"model {keys[0] if keys.count(keys[0]) > 1 else keys[1]} is given twice: list each model once"
        )
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
            check_same_images(existing, images, indices)
            check_same_mode(existing, cfg, keys)
        except BaseException:
            existing.close()
            raise

    plans = []
    kept, releasing = 0, False  # bytes of the models kept loaded; whether the models from here on are released
    gram_maker = _gram_maker(device) if cfg.grams else None
    try:
        for spec in specs:
            emit(Progress("load", message=f"loading {spec}", model=spec.key))
            mp = _plan_model(spec, cfg, device, selection, existing, gram_maker)
            plans.append(mp)
            if budget is not None and (releasing or kept + mp.cost > budget):
                releasing = True
                mp.release()
                _free_memory(device)
            else:
                kept += mp.cost
        if cfg.heads and not any(mp.head_recorder for mp in plans):
            raise VitseeError(
                f"--heads compares a ViT's attention heads with another model, and no model of this run "
                f"({', '.join(keys)}) has attention heads (ViT-like models do): "
                "add a ViT with --model, or leave out --heads"
            )
    except BaseException:
        if existing is not None:
            existing.close()
        raise
    return selection, plans, existing


def _plan_model(
    spec: ModelSpec, cfg: ExtractConfig, device: torch.device, selection: Selection, existing: Store | None, gram_maker
) -> ModelPlan:
    """Returns the plan of one model: loaded, run once on a few images (its layers' shapes, what fp16 loses), and
    checked against the same model in the existing store, whose batch size and done batches it resumes with."""
    images, indices = selection.images, selection.indices
    loaded, recorders = _open_model(spec, cfg, device, lambda m: _records_heads(cfg, m, existing))
    transform = make_transform(loaded)
    example = torch.stack([transform(images.image(int(i))) for i in indices[:DRY_RUN_IMAGES]]).to(device)
    act = next(r for r in recorders if isinstance(r, ActivationRecorder))
    act.measure_rounding = True
    shapes = _dry_run(loaded, recorders, example)
    act.measure_rounding = False
    layer_specs = act.layer_specs(shapes)
    stats = [s for r in recorders for s in r.specs()]
    record = _model_record(
        loaded, transform, cfg.layers if isinstance(cfg.layers, str) else list(cfg.layers), cfg.dtype
    )
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
        n_batches = -(-len(indices) // cfg.batch_size)
        batch_size, done, new = cfg.batch_size, np.zeros(n_batches, dtype=bool), True
    if cfg.streaming:  # head outputs feed the streamed head-level CKA and are not stored
        stats = [s for s in stats if not s.name.startswith(HeadOutputRecorder.PREFIX)]
    if cfg.grams:  # a zoo keeps each layer's Gram of each batch instead (zoo/streamed.py)
        stats += gram_specs(layer_specs, batch_size)
    heads = any(isinstance(r, HeadOutputRecorder) for r in recorders)
    mp = ModelPlan(
        loaded,
        recorders,
        layer_specs,
        stats,
        tuple(example.shape[1:]),
        transform,
        batch_size,
        new,
        done,
        record,
        resident_bytes=_resident_bytes(loaded.model),
        reopen=lambda: _open_model(spec, cfg, device, lambda _m: heads),
        gram_maker=gram_maker,
    )
    mp.batch_bytes = mp.bytes(batch_size, cfg.dtype)
    return mp


def _open_model(
    spec: ModelSpec, cfg: ExtractConfig, device: torch.device, heads: Callable[[LoadedModel], bool]
) -> tuple[LoadedModel, list[Recorder]]:
    """Returns a spec's model on the device with the run's recorders attached (head outputs when heads(model) says)."""
    torch_dtype = DTYPES[cfg.dtype]
    loaded = load_model(spec, img_size=cfg.img_size, device=device)
    points = layer_points(loaded.model, loaded.family, cfg.layers if isinstance(cfg.layers, str) else list(cfg.layers))
    recorders = default_recorders(loaded, points, torch_dtype)
    if heads(loaded):  # head-level CKA (analyses/heads.py)
        recorders.append(HeadOutputRecorder(torch_dtype))
    for rec in recorders:
        rec.attach(loaded)
    return loaded, recorders


def _gram_maker(device: torch.device):
    """Returns what builds a layer's batch Gram the way CKA does (analyses/cka.MinibatchCKA.layer_gram)."""
    from vitsee.analyses.cka import MinibatchCKA

    return MinibatchCKA(1, device)


def _resident_bytes(model: torch.nn.Module) -> int:
    """Returns the bytes of a model's parameters and buffers: what stays resident while it is loaded."""
    return sum(t.numel() * t.element_size() for t in itertools.chain(model.parameters(), model.buffers()))


def _free_memory(device: torch.device) -> None:
    """Hands the memory of released models back to the device (a GPU's caching allocator keeps it otherwise).

    A released model is freed by reference counting as soon as its plan lets go of it: no reference cycle holds one
    (tests/test_zoo_extract.py checks it with the collector off). gc.collect() is not called: with timm's registry in
    the heap one collection took 1.1 s, 15 s over a zoo of seven tiny models.
    """
    if device.type == "cuda":
        torch.cuda.empty_cache()


def memory_budget(cfg: ExtractConfig, device: torch.device) -> int:
    """Returns the bytes the run's resident models may take at once: --memory-budget, else MEMORY_FRACTION of the
    device's free memory (a GPU) or of the host's available memory."""
    if cfg.memory_budget is not None:
        return int(cfg.memory_budget)
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free * MEMORY_FRACTION)
    import psutil

    return int(psutil.virtual_memory().available * MEMORY_FRACTION)


def waves(plans: Sequence[ModelPlan], budget: int | None) -> list[list[ModelPlan]]:
    """Returns the models with batches left, in store order, cut into waves: each wave a run of consecutive models
    whose costs (weights plus one batch of what they record) sum to at most the budget, a model alone over it a wave
    of its own. No budget: one wave."""
    todo = [mp for mp in plans if not mp.done.all()]
    if budget is None:
        return [todo] if todo else []
    out: list[list[ModelPlan]] = []
    cost = 0
    for mp in todo:
        if out and cost + mp.cost <= budget:
            out[-1].append(mp)
            cost += mp.cost
        else:
            out.append([mp])
            cost = mp.cost
    return out


UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_bytes(text: str) -> int:
    """Returns the bytes `--memory-budget` text gives: a number with an optional K, M, G or T (powers of 1024)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*", str(text), flags=re.IGNORECASE)
    if match is None or float(match.group(1)) <= 0:
        raise VitseeError(f"--memory-budget {text!r} is not a size: give bytes such as 4G, 512M or 2000000000")
    return int(float(match.group(1)) * UNITS[match.group(2).lower()])


def _records_heads(cfg: ExtractConfig, loaded: LoadedModel, existing: Store | None) -> bool:
    """Whether a model's head outputs are recorded: always for a ViT-like model stored with activations; in a
    streaming run only when it accumulates head-level CKA (asked with --heads, or resumed from a store that did)."""
    if not HeadOutputRecorder.applies(loaded):
        return False
    if not cfg.streaming:
        return True
    return cfg.heads if existing is None else bool(existing.head_blocks(loaded.key))


def _without_heads(recorders: list[Recorder], stats: list[ArraySpec]) -> tuple[list[Recorder], list[ArraySpec]]:
    """Returns the recorders and statistics without the head outputs (detaching their recorder)."""
    for rec in recorders:
        if isinstance(rec, HeadOutputRecorder):
            rec.detach()
    return (
        [r for r in recorders if not isinstance(r, HeadOutputRecorder)],
        [s for s in stats if not s.name.startswith(HeadOutputRecorder.PREFIX)],
    )


def _check_disk(path: Path, needed: int, force: bool) -> None:
    free = shutil.disk_usage(path.parent if path.parent.exists() else Path.cwd()).free
    if needed > free and not force:
        raise VitseeError(
            f"{path} needs {human_bytes(needed)} but {path.parent} has {human_bytes(free)} free: free space, "
            "use fewer images or layers (--n-images, --layers blocks), or pass --force"
        )


@dataclass
class SizeEstimate:
    """What a run will put on disk: in all, and still to write (less when a store is resumed)."""

    n_images: int
    n_models: int
    total_bytes: int
    todo_bytes: int
    resuming: bool
    streaming: bool
    grams: bool = False

    def describe(self) -> str:
        """Returns the one-line plan message: images, models and the expected size on disk."""
        text = (
            f"{self.n_images} images x {self.n_models} model(s), expected size on disk {human_bytes(self.total_bytes)}"
        )
        if self.grams:
            text += " (streaming Grams: statistics and each layer's batch Grams, activations not stored)"
        elif self.streaming:
            text += " (streaming: statistics and CKA only, activations not stored)"
        if self.resuming:
            text += f" (to write now: {human_bytes(self.todo_bytes)})"
        return text


def _estimate(plans: list[ModelPlan], n: int, cfg: ExtractConfig, resuming: bool) -> SizeEstimate:
    total = sum(mp.bytes(n, cfg.dtype, cfg.streaming) for mp in plans)
    todo = sum(mp.bytes(n, cfg.dtype, cfg.streaming) * (1 - mp.done.mean()) for mp in plans if not mp.done.all())
    return SizeEstimate(n, len(plans), int(total), int(todo), resuming, cfg.streaming, cfg.grams)


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
