"""The HDF5 store: one file per run holding images, per-model activations and statistics, and results.

Layout
    /                      attrs: vitsee_format, created, versions
    /images/index          (N,) int64   which images of the dataset, in run order
    /images/label          (N,) int64   -1 where the dataset has no labels
                           attrs: dataset (canonical spec), shuffle_seed, class_names (json)
    /models/<key>/         attrs: record (json: spec, weights, data config, grid, ...), layers (json,
                           forward order), batch_size, dtype
        acts/<layer>       (N, ...) activations, ViT (N, tokens, dim) with prefix tokens, CNN (N, C, H, W)
        input              (N, 3, H, W) the preprocessed model input (for spatial maps)
        stats/<name>       (N, ...) per-image statistics (attention distances, skip ratios)
        nonfinite          (batches, layers) count of non-finite values written per batch and layer
        done               (batches,) uint8, 1 once every array of the batch is on disk
    /results/<analysis>/<id>   cached analysis results, attrs: params (json), provenance (json)

A streaming store (`vitsee extract --streaming`, file attr streaming=1) has the same layout without acts/
and input: each model group records its layers' per-image shapes and prefix tokens in attrs instead, and
/streaming/cka_state (2, L*L + 1) holds the all-pairs CKA accumulator of the batches done so far (two
slots, batch b writes slot b % 2 before `done` marks it, so the state of the last finished batch is never
the one being overwritten).

A store stitched from torchrun shards (file attr shards: json list of relative paths) holds the images and,
per model, HDF5 virtual datasets over the shards' datasets of the same names; see shards.py. Readers use
it like any store; opening one whose shard files are gone is an error rather than rows of fill values.

Crash safety: every dataset a run will fill is allocated in full when the model is added (HDF5 early
allocation, no fill), so extraction only overwrites raw bytes at fixed places and never touches the
file's metadata; a batch counts only once `done` says so, after its data was flushed. A new store is
built under a temporary name and renamed into place, so a killed start leaves nothing half-made.
Adding a model to, or caching a result in, an existing store are short metadata updates.
"""
from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

from .errors import VitseeError, brief

FORMAT_VERSION = 1
CHUNK_BYTES = 64 << 20


def _json(obj) -> str:
    return json.dumps(obj, sort_keys=True, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o))


def _early_dataset(group: h5py.Group, name: str, shape: tuple, dtype, rows_per_chunk: int) -> h5py.Dataset:
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


def _open_h5(path: Path, mode: str) -> h5py.File:
    # HDF5's own flock is off: it fails on NFS/ZFS, and it would stop a reader (the terminal app) from
    # looking at a store while extraction fills it. Writers take their own lock (see Store.writer).
    return h5py.File(path, mode, locking=False)


def _check_store_path(path: Path) -> None:
    if not path.exists():
        raise VitseeError(f"store {path} does not exist: create it with `vitsee extract {path} --model NAME --dataset DATASET`")
    if path.is_dir():
        raise VitseeError(f"store {path} is a folder: give the path of a .h5 store file")
    if path.stat().st_size == 0:  # HDF5 would turn an empty file opened for writing into an HDF5 file
        raise VitseeError(f"store {path} is an empty file, not a vitsee store: give a store made by `vitsee extract` (which replaces this file with --overwrite)")


class Store:
    """Read access to a store, plus the write operations extraction and analyses use."""

    def __init__(self, path: str | Path, mode: str = "r"):
        self.path = Path(path)
        _check_store_path(self.path)
        try:
            self.file = _open_h5(self.path, mode)
        except OSError as exc:
            raise VitseeError(
                f"{path} is not a readable vitsee store ({brief(exc)}): it may be corrupt or "
                "not HDF5; re-create it with `vitsee extract ... --overwrite`"
            ) from exc
        if "vitsee_format" not in self.file.attrs:
            self.file.close()
            raise VitseeError(f"{path} is an HDF5 file but not a vitsee store: give a store made by `vitsee extract`")
        # a stitched store reads its rows from shard files; HDF5 would quietly fill a missing one's with zeros
        for shard in self.shard_files:
            if not shard.exists():
                self.file.close()
                raise VitseeError(
                    f"{path} reads its rows from shard {shard}, which is missing: put the store's "
                    f".shards folder back beside it, or re-extract"
                )
        self.writable = mode != "r"
        self._lock_fd: int | None = None

    # --- opening --------------------------------------------------------------------------------

    @classmethod
    def open(cls, path: str | Path, mode: str = "r") -> Store:
        """Returns the store at path, for use as a context manager (`with Store.open(p) as s:`)."""
        return cls(path, mode)

    @classmethod
    def writer(cls, path: str | Path) -> Store:
        """Returns the store opened for writing, holding an exclusive lock so two writers never mix."""
        _check_store_path(Path(path))
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as exc:
            raise VitseeError(f"cannot open store {path} ({brief(exc)}): check its permissions") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise VitseeError(f"{path} is being written by another vitsee process: wait for it to finish, or use another store") from None
        try:
            store = cls(path, "r+")
        except BaseException:
            os.close(fd)
            raise
        store._lock_fd = fd
        return store

    def close(self) -> None:
        if self.file.id.valid:
            self.file.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- images ---------------------------------------------------------------------------------

    @property
    def n_images(self) -> int:
        return int(self.file["images/index"].shape[0])

    @property
    def dataset_spec(self) -> str:
        return str(self.file["images"].attrs["dataset"])

    @property
    def shuffle_seed(self) -> int | None:
        seed = int(self.file["images"].attrs.get("shuffle_seed", -1))
        return None if seed < 0 else seed

    @property
    def indices(self) -> np.ndarray:
        return self.file["images/index"][:]

    @property
    def labels(self) -> np.ndarray | None:
        """Returns the (N,) labels, or None when the dataset has none."""
        labels = self.file["images/label"][:]
        return labels if (labels >= 0).any() else None

    @property
    def class_names(self) -> list[str] | None:
        names = json.loads(self.file["images"].attrs.get("class_names", "null"))
        return names

    # --- models ---------------------------------------------------------------------------------

    @property
    def models(self) -> list[str]:
        """Returns the model keys, in the order they were added."""
        if "models" not in self.file:
            return []
        group = self.file["models"]
        return sorted(group, key=lambda k: int(group[k].attrs.get("order", 0)))

    def resolve_model(self, name: str) -> str:
        """Returns the key of the model a user named: the exact key, or a unique prefix of one."""
        models = self.models
        if name in models:
            return name
        matches = [m for m in models if m.startswith(name)]
        if len(matches) == 1:
            return matches[0]
        if not matches:
            raise VitseeError(f"no model '{name}' in {self.path}: it holds {', '.join(models) or 'no models'}")
        raise VitseeError(f"'{name}' matches several models in {self.path} ({', '.join(matches)}): give the full key")

    def _model(self, model: str) -> h5py.Group:
        return self.file["models"][self.resolve_model(model)]

    def model_info(self, model: str) -> dict:
        """Returns the model's metadata: spec, family, weights (kind, seed, path, sha256), grid, ..."""
        group = self._model(model)
        info = json.loads(group.attrs["record"])
        info.update(batch_size=int(group.attrs["batch_size"]), dtype=str(group.attrs["dtype"]))
        return info

    def layers(self, model: str) -> list[str]:
        """Returns the stored layer names in forward order."""
        return json.loads(self._model(model).attrs["layers"])

    @property
    def shard_files(self) -> list[Path]:
        """Returns the shard files a store stitched by torchrun reads its rows from (empty otherwise)."""
        return [self.path.parent / rel for rel in json.loads(self.file.attrs.get("shards", "[]"))]

    @property
    def streaming(self) -> bool:
        """True for a store made with `--streaming`: statistics and results only, no activations."""
        return bool(self.file.attrs.get("streaming", False))

    def _require_activations(self, what: str) -> None:
        if self.streaming:
            raise VitseeError(
                f"{self.path} was extracted with --streaming: activations were not stored, so {what}: "
                "re-extract without --streaming into another store (or --overwrite)"
            )

    def _layer(self, model: str, layer: str) -> h5py.Dataset:
        self._require_activations(f"layer '{layer}' cannot be read")
        acts = self._model(model)["acts"]
        if layer not in acts:
            import difflib

            close = difflib.get_close_matches(layer, list(acts), n=4, cutoff=0.5)
            hint = f"close matches: {', '.join(close)}" if close else f"stored layers: {', '.join(self.layers(model)[:8])} ..."
            raise VitseeError(f"no layer '{layer}' stored for {self.resolve_model(model)}: {hint}")
        return acts[layer]

    def _layer_attrs(self, model: str, layer: str) -> dict:
        """Returns {shape, prefix_tokens} of a layer (from the model's attrs in a streaming store)."""
        group = self._model(model)
        if "layer_shapes" not in group.attrs:
            ds = self._layer(model, layer)
            return {"shape": tuple(ds.shape[1:]), "prefix_tokens": int(ds.attrs.get("prefix_tokens", 0))}
        shapes = json.loads(group.attrs["layer_shapes"])
        if layer not in shapes:
            raise VitseeError(f"no layer '{layer}' recorded for {self.resolve_model(model)}: it has {', '.join(list(shapes)[:8])} ...")
        return {"shape": tuple(shapes[layer]), "prefix_tokens": int(json.loads(group.attrs["layer_prefix_tokens"])[layer])}

    def layer_shape(self, model: str, layer: str) -> tuple[int, ...]:
        """Returns the per-image shape of a stored layer."""
        return self._layer_attrs(model, layer)["shape"]

    def layer_prefix_tokens(self, model: str, layer: str) -> int:
        return self._layer_attrs(model, layer)["prefix_tokens"]

    def batch_size(self, model: str) -> int:
        return int(self._model(model).attrs["batch_size"])

    def rows_done(self, model: str) -> int:
        """Returns how many leading rows of the model are finished (written and flushed)."""
        group = self._model(model)
        done = group["done"][:]
        pending = np.flatnonzero(done == 0)
        batches = len(done) if len(pending) == 0 else int(pending[0])
        return min(self.n_images, batches * int(group.attrs["batch_size"]))

    def done_batches(self, model: str) -> np.ndarray:
        return self._model(model)["done"][:].astype(bool)

    def is_complete(self, model: str | None = None) -> bool:
        """Returns whether every row of the model (or of every model) is finished."""
        models = [model] if model is not None else self.models
        return bool(models) and all(self.rows_done(m) == self.n_images for m in models)

    @property
    def complete(self) -> bool:
        return self.is_complete()

    def require_complete(self, model: str | None = None) -> None:
        """Raises a VitseeError naming the way out if a model's extraction has not finished."""
        for m in [self.resolve_model(model)] if model else self.models:
            done = self.rows_done(m)
            if done < self.n_images:
                raise VitseeError(
                    f"{self.path}: {m} has {done} of {self.n_images} images extracted (the run was interrupted): "
                    "rerun the same `vitsee extract` command to resume"
                )

    def activations(self, model: str, layer: str, rows: slice | np.ndarray | None = None) -> np.ndarray:
        """Returns a layer's activations as float32: all finished rows, or the rows asked for."""
        ds = self._layer(model, layer)
        done = self.rows_done(model)
        if rows is None:
            return ds[:done].astype(np.float32)
        if isinstance(rows, slice):
            start, stop, step = rows.indices(done)
            return ds[start:stop:step].astype(np.float32)
        return read_rows(ds, np.asarray(rows), limit=done).astype(np.float32)

    def iter_batches(
        self, model: str, layers: Sequence[str] | None = None, batch_size: int = 256, order: np.ndarray | None = None
    ) -> Iterator[tuple[np.ndarray, dict[str, np.ndarray]]]:
        """Yields (row indices, {layer: float32 array}) batch by batch over finished rows, streaming.

        order: the rows in the order to visit them (e.g. a shuffle); default the store order.
        """
        layers = list(layers) if layers is not None else self.layers(model)
        datasets = {name: self._layer(model, name) for name in layers}
        done = self.rows_done(model)
        order = np.arange(done) if order is None else np.asarray(order)
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            yield rows, {name: read_rows(ds, rows, limit=done).astype(np.float32) for name, ds in datasets.items()}

    def model_input(self, model: str, rows: slice | np.ndarray | None = None) -> np.ndarray:
        """Returns the preprocessed model input (N, 3, H, W) as float32."""
        self._require_activations("the model input cannot be read")
        ds = self._model(model)["input"]
        done = self.rows_done(model)
        if rows is None:
            return ds[:done].astype(np.float32)
        if isinstance(rows, slice):
            return ds[rows][: max(0, done - (rows.start or 0))].astype(np.float32)
        return read_rows(ds, np.asarray(rows), limit=done).astype(np.float32)

    def stats(self, model: str) -> list[str]:
        """Returns the names of the per-image statistics stored for a model."""
        group = self._model(model)
        return list(group["stats"]) if "stats" in group else []

    def _stat(self, model: str, name: str) -> h5py.Dataset:
        group = self._model(model)
        if "stats" not in group or name not in group["stats"]:
            raise VitseeError(
                f"{self.resolve_model(model)} has no '{name}' statistic in {self.path} "
                f"(stored: {', '.join(self.stats(model)) or 'none'}): it is recorded for ViT-like models at extraction"
            )
        return group["stats"][name]

    def stat(self, model: str, name: str, rows: slice | None = None) -> np.ndarray:
        """Returns a per-image statistic (finished rows, or a slice of them), float32."""
        start, stop, step = (rows or slice(None)).indices(self.rows_done(model))
        return self._stat(model, name)[start:stop:step].astype(np.float32)

    def stat_batches(self, model: str, names: Sequence[str], batch_size: int = 1024) -> Iterator[dict[str, np.ndarray]]:
        """Yields {name: (b, ...) float32} of per-image statistics over the finished rows, in store order,
        batch by batch, so an aggregate over any number of images holds one batch in memory."""
        datasets = {name: self._stat(model, name) for name in names}
        done = self.rows_done(model)
        for start in range(0, done, batch_size):
            stop = min(start + batch_size, done)
            yield {name: ds[start:stop].astype(np.float32) for name, ds in datasets.items()}

    def attention_distance(self, model: str, renormalised: bool = False) -> np.ndarray:
        """Returns (N, blocks, heads) mean attention distances in pixels."""
        return self.stat(model, "attention_distance_renorm" if renormalised else "attention_distance")

    def nonfinite_counts(self, model: str) -> dict[str, int]:
        """Returns the number of non-finite values written per layer (fp16 overflow shows up here)."""
        counts = self._model(model)["nonfinite"][:].sum(axis=0)
        return {layer: int(c) for layer, c in zip(self.layers(model), counts)}

    def model_bytes(self, model: str) -> int:
        group = self._model(model)
        total = 0

        def visit(_name, obj):
            nonlocal total
            if isinstance(obj, h5py.Dataset):  # a stitched store's rows live in its shards
                total += obj.nbytes if obj.is_virtual else obj.id.get_storage_size()

        group.visititems(visit)
        return total

    # --- results --------------------------------------------------------------------------------

    def results(self, analysis: str | None = None) -> list[dict]:
        """Returns [{analysis, id, params, provenance}] for the cached results."""
        out = []
        if "results" not in self.file:
            return out
        for name, group in self.file["results"].items():
            if analysis is not None and name != analysis:
                continue
            for rid, res in group.items():
                if res.attrs.get("complete", False):
                    out.append({
                        "analysis": name,
                        "id": rid,
                        "params": json.loads(res.attrs["params"]),
                        "provenance": json.loads(res.attrs.get("provenance", "{}")),
                    })
        return out

    @staticmethod
    def result_id(params: dict) -> str:
        import hashlib

        return hashlib.sha1(_json(params).encode()).hexdigest()[:16]

    def get_result(self, analysis: str, params: dict) -> dict[str, np.ndarray] | None:
        """Returns the cached arrays of an analysis run with these params, or None."""
        path = f"results/{analysis}/{self.result_id(params)}"
        if path not in self.file or not self.file[path].attrs.get("complete", False):
            return None
        group = self.file[path]
        out: dict = {}

        def visit(name, obj):
            if isinstance(obj, h5py.Dataset):
                is_text = h5py.check_string_dtype(obj.dtype) is not None
                value = obj.asstr()[()] if is_text else obj[()]
                out[name] = value.astype(str) if is_text and isinstance(value, np.ndarray) else value

        group.visititems(visit)
        out["_params"] = json.loads(group.attrs["params"])
        out["_provenance"] = json.loads(group.attrs.get("provenance", "{}"))
        return out

    def put_result(self, analysis: str, params: dict, arrays: dict, provenance: dict | None = None) -> str:
        """Caches an analysis result (arrays keyed by name, '/' makes sub-groups); returns its id."""
        if not self.writable:
            raise VitseeError(f"{self.path} is open read-only: reopen it for writing to cache results")
        rid = self.result_id(params)
        final = f"results/{analysis}/{rid}"
        tmp = f"results/{analysis}/.writing-{rid}"
        for stale in (tmp,):
            if stale in self.file:
                del self.file[stale]
        group = self.file.require_group(tmp)
        for name, value in arrays.items():
            value = np.asarray(value)
            if value.dtype.kind == "U":
                value = value.astype(h5py.string_dtype())
            group.create_dataset(name, data=value)
        group.attrs["params"] = _json(params)
        now = time.time()  # created_unix orders results made within the same second
        group.attrs["provenance"] = _json({"created": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(now)),
                                           "created_unix": now, **versions(), **(provenance or {})})
        group.attrs["complete"] = True
        if final in self.file:
            del self.file[final]
        self.file.move(tmp, final)
        self.file.flush()
        return rid

    # --- the CKA of a streaming extraction -------------------------------------------------------

    def streamed_cka_state(self) -> tuple[np.ndarray, list[tuple[str, str]]] | None:
        """Returns (accumulator state after the last finished batch, its [(model, layer)] columns), or None
        when nothing has been accumulated yet (or the store is not a streaming one)."""
        if "streaming/cka_state" not in self.file:
            return None
        ds = self.file["streaming/cka_state"]
        columns = [tuple(c) for c in json.loads(ds.attrs["columns"])]
        batches = int(ds.attrs["batch_size"])
        done = min((self.rows_done(m) for m in self.models), default=0)
        finished = -(-done // batches)  # batches, the last possibly short
        if finished == 0:
            return None
        return ds[(finished - 1) % 2].astype(np.float64), columns

    # --- writing (extraction) -------------------------------------------------------------------

    def add_model(
        self,
        record: dict,
        layers: Sequence[LayerSpec],
        stats: Sequence[ArraySpec],
        input_shape: tuple[int, ...],
        batch_size: int,
        dtype: str,
    ) -> str:
        """Allocates every array of a new model in full; returns its key."""
        add_model_layout(self.file, record, layers, stats, input_shape, batch_size, dtype, self.n_images)
        self.file.flush()
        return record["key"]

    def write_batch(
        self,
        model: str,
        batch: int,
        activations: dict[str, np.ndarray],
        stats: dict[str, np.ndarray],
        model_input: np.ndarray,
        nonfinite: Sequence[int],
    ) -> None:
        """Writes one batch of a model and marks it done once the data is flushed to disk."""
        self._write_rows(model, batch, activations, stats, model_input, nonfinite)
        self.file.flush()
        self._model(model)["done"][batch] = 1
        self.file.flush()

    def write_streamed_batch(self, batch: int, stats: dict[str, dict[str, np.ndarray]],
                             nonfinite: dict[str, Sequence[int]], cka_state: np.ndarray) -> None:
        """Writes one batch of a streaming run (every model's statistics and the CKA accumulator after
        it), then marks it done for every model once the data is flushed."""
        for model, values in stats.items():
            self._write_rows(model, batch, {}, values, None, nonfinite[model])
        self.file["streaming/cka_state"][batch % 2] = cka_state
        self.file.flush()
        for model in stats:
            self._model(model)["done"][batch] = 1
        self.file.flush()

    def _write_rows(self, model, batch, activations, stats, model_input, nonfinite) -> None:
        group = self.file["models"][model]
        bs = int(group.attrs["batch_size"])
        start = batch * bs
        stop = min(start + bs, self.n_images)
        for name, value in activations.items():
            group["acts"][name][start:stop] = value
        for name, value in stats.items():
            group["stats"][name][start:stop] = value
        if model_input is not None:
            group["input"][start:stop] = model_input
        group["nonfinite"][batch] = np.asarray(nonfinite, dtype=np.int64)


def read_rows(ds: h5py.Dataset, rows: np.ndarray, limit: int | None = None) -> np.ndarray:
    """Returns ds[rows] for any order of row indices (HDF5 wants them increasing, so sort and undo)."""
    rows = np.asarray(rows, dtype=np.int64)
    if limit is not None and len(rows) and rows.max() >= limit:
        raise VitseeError(f"row {int(rows.max())} is not extracted yet ({limit} rows finished): finish the extraction first")
    if len(rows) == 0:
        return np.empty((0, *ds.shape[1:]), dtype=ds.dtype)
    if len(rows) > 1 and np.all(np.diff(rows) == 1):
        return ds[int(rows[0]) : int(rows[-1]) + 1]
    if np.all(np.diff(rows) > 0):  # increasing: HDF5 reads them as they are
        return _read_increasing(ds, rows)
    order = np.argsort(rows, kind="stable")
    sorted_rows = rows[order]
    unique, inverse = np.unique(sorted_rows, return_inverse=True)
    data = _read_increasing(ds, unique)
    out = np.empty((len(rows), *ds.shape[1:]), dtype=ds.dtype)
    out[order] = data[inverse]
    return out


def _read_increasing(ds: h5py.Dataset, rows: np.ndarray) -> np.ndarray:
    """Returns ds[rows] for increasing rows, one slice per chunk the rows touch.

    HDF5 reads whole chunks either way, but h5py's point selection of scattered rows costs about 10x the
    slices (21 of 32 rows of 196 x 768 fp16: 0.30 s against 0.025 s), which made probe splits slow to read.
    """
    if ds.chunks is None:
        return ds[rows]
    groups = np.split(rows, np.flatnonzero(np.diff(rows // ds.chunks[0])) + 1)  # runs of rows within one chunk
    return np.concatenate([ds[int(g[0]) : int(g[-1]) + 1][g - g[0]] for g in groups])


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
    """Allocates every array of a new model in full (see the module docstring for the layout)."""
    key = record["key"]
    models = file.require_group("models")
    if key in models:
        raise VitseeError(f"model {key} is already in {file.filename}: use another spec or --overwrite")
    group = models.create_group(key)
    group.attrs["record"] = _json(record)
    group.attrs["layers"] = _json([layer.name for layer in layers])
    group.attrs["batch_size"] = int(batch_size)
    group.attrs["dtype"] = dtype
    group.attrs["order"] = len(models) - 1
    if streaming:  # no activations: the layers' shapes are all a reader needs to know about them
        group.attrs["layer_shapes"] = _json({layer.name: list(layer.shape) for layer in layers})
        group.attrs["layer_prefix_tokens"] = _json({layer.name: int(layer.prefix_tokens) for layer in layers})
    else:
        acts = group.create_group("acts")
        for layer in layers:
            ds = _early_dataset(acts, layer.name, (n_images, *layer.shape), dtype, batch_size)
            ds.attrs["prefix_tokens"] = int(layer.prefix_tokens)
            ds.attrs["module"] = layer.module
            ds.attrs["kind"] = layer.kind
    stat_group = group.create_group("stats")
    for spec in stats:
        _early_dataset(stat_group, spec.name, (n_images, *spec.shape), spec.dtype, batch_size)
    if not streaming:
        _early_dataset(group, "input", (n_images, *input_shape), dtype, batch_size)
    n_batches = -(-n_images // batch_size)
    _early_dataset(group, "nonfinite", (n_batches, len(layers)), "int64", n_batches)
    done = _early_dataset(group, "done", (n_batches,), "uint8", n_batches)
    done[:] = 0


@contextmanager
def creating(path: str | Path, overwrite: bool = False):
    """Builds a new store under a temporary name and renames it into place when the block succeeds.

    Yields the open h5py.File. Without overwrite an existing file at path is an error; with it, the old
    store is replaced only once the new one is complete.
    """
    path = Path(path)
    if path.exists() and not overwrite:
        raise VitseeError(f"{path} already exists: pass --overwrite to replace it, or choose another path")
    if not path.parent.exists():
        raise VitseeError(f"folder {path.parent} does not exist: create it first or choose another store path")
    tmp = path.with_name(f".{path.name}.creating-{os.getpid()}")
    file = _open_h5(tmp, "w")
    try:
        file.attrs["vitsee_format"] = FORMAT_VERSION
        file.attrs["created"] = time.strftime("%Y-%m-%dT%H:%M:%S")
        file.attrs["versions"] = _json(versions())
        yield file
        file.close()
        os.replace(tmp, path)
    except BaseException:
        if file.id.valid:
            file.close()
        tmp.unlink(missing_ok=True)
        raise


def add_streaming_state(file: h5py.File, columns: Sequence[tuple[str, str]], batch_size: int) -> None:
    """Marks a new store as a streaming one and allocates its CKA accumulator slots."""
    file.attrs["streaming"] = True
    group = file.require_group("streaming")
    n = len(columns)
    ds = _early_dataset(group, "cka_state", (2, n * n + 1), "float64", 2)
    ds.attrs["columns"] = _json([list(c) for c in columns])
    ds.attrs["batch_size"] = int(batch_size)


def write_images(file: h5py.File, dataset: str, indices: np.ndarray, labels: np.ndarray, class_names, shuffle_seed) -> None:
    group = file.create_group("images")
    group.create_dataset("index", data=np.asarray(indices, dtype=np.int64))
    group.create_dataset("label", data=np.asarray(labels, dtype=np.int64))
    group.attrs["dataset"] = dataset
    group.attrs["shuffle_seed"] = -1 if shuffle_seed is None else int(shuffle_seed)
    group.attrs["class_names"] = _json(class_names)
