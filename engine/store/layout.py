"""What a store file holds (the layout the docstring of store/__init__.py draws) and how a new one is allocated.

The names of its groups, the specs of the arrays a model fills, the size they take, the checks that a file is a
whole store of a format this vitsee reads, the identity (store_id) of a store, and the functions that allocate a
model's arrays in full when its file is made (HDF5 early allocation, so extraction only overwrites raw bytes).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import h5py
import numpy as np

from vitsee.errors import VitseeError, brief

FEATURES = "features"  # the weights kind of a model whose activations came from another tool (vitsee.from_features)


def is_features_model(info: dict) -> bool:
    """Returns whether a model's activations came from another tool (no input, no statistics, no model to reload)."""
    return (info.get("weights") or {}).get("kind") == FEATURES


FORMAT_VERSION = 2
HEADS = "heads/"  # per-head attention outputs of a ViT's blocks, (N, heads, tokens, head_dim), see head_outputs
GRAMS = "grams/"  # a zoo's per-batch layer Grams, (N, batch size), see zoo/streamed.py
CHUNK_BYTES = 64 << 20


def json_attr(obj) -> str:
    """Returns obj as the JSON text vitsee keeps in HDF5 attributes (keys sorted, arrays as lists): equal values
    give equal text, so attributes compare as strings."""
    return json.dumps(obj, sort_keys=True, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o))


def check_store_layout(file: h5py.File) -> None:
    """Raises a VitseeError naming what is wrong with a file that says it is a store but that this vitsee
    cannot read: a newer format, groups missing, or metadata whose bytes no longer decode."""
    path = file.filename
    try:
        version = int(file.attrs["vitsee_format"])
        if version > FORMAT_VERSION:
            raise VitseeError(
                f"{path} was made by a newer vitsee (format {version}; this one reads format "
                f"{FORMAT_VERSION}): upgrade vitsee"
            )
        models = list(file["models"].values()) if "models" in file else []
        missing = [name for name in ("images", "images/index", "images/label") if name not in file]
        missing += [f"{g.name}/{name}" for g in models for name in ("done", "nonfinite") if name not in g]
        if missing:
            raise VitseeError(
                f"{path} lacks {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}, which "
                "every vitsee store has: it is not a whole store; re-create it with `vitsee extract`"
            )
        for obj in (file, file["images"], *models):  # what readers decode: damaged bytes surface here, once
            for name in obj.attrs:
                value = obj.attrs[name]
                if name in ("record", "layers", "class_names", "layer_shapes", "layer_prefix_tokens"):
                    json.loads(value)
    except (OSError, KeyError, ValueError, TypeError) as exc:
        raise VitseeError(
            f"{path}: the store's metadata cannot be read ({brief(exc)}): the file is damaged; "
            "restore a copy, or re-create it with `vitsee extract ... --overwrite`"
        ) from None


def early_dataset(group: h5py.Group, name: str, shape: tuple, dtype, rows_per_chunk: int) -> h5py.Dataset:
    """Creates a dataset whose whole extent is allocated now, so later writes change no metadata."""
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
    dcpl.set_fill_time(h5py.h5d.FILL_TIME_NEVER)
    row_bytes = int(np.prod(shape[1:], dtype=np.int64)) * np.dtype(dtype).itemsize
    rows = max(1, min(rows_per_chunk, shape[0], CHUNK_BYTES // max(row_bytes, 1)))
    return group.create_dataset(name, shape=shape, dtype=dtype, chunks=(rows, *shape[1:]), dcpl=dcpl, track_times=False)


@dataclass(frozen=True)
class LayerSpec:
    """A layer to be stored: its name, per-image shape, and how many prefix tokens lead its token axis."""

    name: str
    shape: tuple[int, ...]
    prefix_tokens: int = 0
    module: str = ""
    kind: str = "output"
    layout: str = ""  # "tokens" (T, C), "nchw" (C, H, W), "nhwc" (H, W, C), "flat"; "" = unknown (read by shape)


@dataclass(frozen=True)
class ArraySpec:
    """A per-image array other than an activation: name, per-image shape, dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"


def estimate_bytes(n_images: int, layers: Sequence[LayerSpec], dtype: str, extra: Sequence[ArraySpec] = ()) -> int:
    """Returns the bytes on disk a model's arrays will take for n images."""
    size = np.dtype(dtype).itemsize
    total = sum(int(np.prod(layer.shape)) * size for layer in layers)
    total += sum(int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize for a in extra)
    return n_images * total


def human_bytes(n: float) -> str:
    """Returns a byte count as a short human string (1.2 GB)."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def store_identity(file: h5py.File) -> str:
    """Returns the store's identity: its store_id, or for a format-1 store (never rewritten) a digest of
    when and by what it was made."""
    if "store_id" in file.attrs:
        return str(file.attrs["store_id"])
    import hashlib

    seed = f"{file.attrs.get('created', '')}|{file.attrs.get('versions', '')}"
    if "images/index" in file:
        seed += f"|{file['images/index'].shape[0]}"
    return hashlib.sha1(seed.encode()).hexdigest()[:32]


def versions() -> dict:
    """Returns the versions that shape the numbers (vitsee, timm, torch, numpy, h5py)."""
    from importlib import metadata

    out = {}
    for pkg in ("vitsee", "timm", "torch", "numpy", "h5py"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = None
    return out


def add_model_layout(
    file: h5py.File,
    record: dict,
    layers: Sequence[LayerSpec],
    stats: Sequence[ArraySpec],
    input_shape: tuple[int, ...],
    batch_size: int,
    dtype: str,
    n_images: int,
    streaming: bool = False,
) -> None:
    """Allocates every array of a new model in full in a store file being created (see the module
    docstring for the layout)."""
    key = record["key"]
    models = file.require_group("models")
    if key in models:
        raise VitseeError(f"model {key} is already in {file.filename}: use another spec or --overwrite")
    group = models.create_group(key)
    fill_model_group(group, record, layers, stats, input_shape, batch_size, dtype, n_images, len(models) - 1, streaming)


def fill_model_group(
    group: h5py.Group,
    record: dict,
    layers: Sequence[LayerSpec],
    stats: Sequence[ArraySpec],
    input_shape: tuple[int, ...],
    batch_size: int,
    dtype: str,
    n_images: int,
    order: int,
    streaming: bool = False,
) -> None:
    """Writes a model's attrs and allocates its arrays in group (a store's /models/KEY or a model file's root)."""
    group.attrs["record"] = json_attr(record)
    group.attrs["layers"] = json_attr([layer.name for layer in layers])
    group.attrs["batch_size"] = int(batch_size)
    group.attrs["dtype"] = dtype
    group.attrs["order"] = int(order)
    if streaming:  # no activations: the layers' shapes are all a reader needs to know about them
        group.attrs["layer_shapes"] = json_attr({layer.name: list(layer.shape) for layer in layers})
        group.attrs["layer_prefix_tokens"] = json_attr({layer.name: int(layer.prefix_tokens) for layer in layers})
        group.attrs["layer_layouts"] = json_attr({layer.name: layer.layout for layer in layers if layer.layout})
    else:
        acts = group.create_group("acts")
        for layer in layers:
            ds = early_dataset(acts, layer.name, (n_images, *layer.shape), dtype, batch_size)
            ds.attrs["prefix_tokens"] = int(layer.prefix_tokens)
            ds.attrs["module"] = layer.module
            ds.attrs["kind"] = layer.kind
            if layer.layout:
                ds.attrs["layout"] = layer.layout
    stat_group = group.create_group("stats")
    for spec in stats:  # head outputs (heads/blocks.B) sit beside acts/, the statistics in stats/
        parent = group if spec.name.startswith((HEADS, GRAMS)) else stat_group
        early_dataset(parent, spec.name, (n_images, *spec.shape), spec.dtype, batch_size)
    if not streaming:
        early_dataset(group, "input", (n_images, *input_shape), dtype, batch_size)
    n_batches = -(-n_images // batch_size)
    early_dataset(group, "nonfinite", (n_batches, len(layers)), "int64", n_batches)
    done = early_dataset(group, "done", (n_batches,), "uint8", n_batches)
    done[:] = 0


def add_streaming_state(file: h5py.File, columns: Sequence[tuple[str, str]], batch_size: int) -> None:
    """Marks a new store as a streaming one and allocates its CKA accumulator slots."""
    file.attrs["streaming"] = True
    group = file.require_group("streaming")
    n = len(columns)
    ds = early_dataset(group, "cka_state", (2, n * n + 1), "float64", 2)
    ds.attrs["columns"] = json_attr([list(c) for c in columns])
    ds.attrs["batch_size"] = int(batch_size)


def add_streamed_heads_state(
    file: h5py.File, vit: str, blocks: Sequence[str], heads: int, columns: Sequence[tuple[str, str]]
) -> None:
    """Allocates the two slots of a ViT's head-level CKA accumulator in a new streaming store: its
    len(blocks) * heads heads against the columns (every layer of the other models)."""
    n = len(blocks) * heads + len(columns)
    ds = early_dataset(file.require_group("streaming/heads"), vit, (2, n * n + 1), "float64", 2)
    ds.attrs["blocks"] = json_attr(list(blocks))
    ds.attrs["heads"] = int(heads)
    ds.attrs["columns"] = json_attr([list(c) for c in columns])


def write_images(
    file: h5py.File, dataset: str, indices: np.ndarray, labels: np.ndarray, class_names, shuffle_seed
) -> None:
    """Writes a new store's /images group: the run's image indices and labels, in run order (see store/__init__.py)."""
    group = file.create_group("images")
    group.create_dataset("index", data=np.asarray(indices, dtype=np.int64))
    group.create_dataset("label", data=np.asarray(labels, dtype=np.int64))
    group.attrs["dataset"] = dataset
    group.attrs["shuffle_seed"] = -1 if shuffle_seed is None else int(shuffle_seed)
    group.attrs["class_names"] = json_attr(class_names)
