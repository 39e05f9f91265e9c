"""The HDF5 store: one file per run holding images, per-model activations and statistics, and results.

Layout
    /                      attrs: vitsee_format, created, versions, run_config (json: the `vitsee extract` run that
                           made the store, see run_config.py; absent in stores made before it was recorded)
    /images/index          (N,) int64   which images of the dataset, in run order
    /images/label          (N,) int64   -1 where the dataset has no labels
                           attrs: dataset (canonical spec), shuffle_seed, class_names (json)
    /models/<key>/         attrs: record (json: spec, weights, data config, grid, ...), layers (json,
                           forward order), batch_size, dtype
        acts/<layer>       (N, ...) activations, ViT (N, tokens, dim) with prefix tokens, CNN (N, C, H, W)
        input              (N, 3, H, W) the preprocessed model input (for spatial maps)
        stats/<name>       (N, ...) per-image statistics (attention distances, skip ratios)
        heads/blocks.B     (N, heads, spatial tokens, head_dim) a ViT block's per-head attention outputs
                           before the projection (head-level CKA), in the activations' dtype
        grams/<layer>      (N, B) float32 the layer's Gram of each batch of B images, in a streaming store made
                           with --grams (a zoo's statistics; layout and size in zoo_store.py)
        nonfinite          (batches, layers) count of non-finite values written per batch and layer
        done               (batches,) uint8, 1 once every array of the batch is on disk
    /results/<analysis>/<id>   cached analysis results, attrs: params (json), provenance (json)

A streaming store (`vitsee extract --streaming`, file attr streaming=1) has the same layout without acts/
and input: each model group records its layers' per-image shapes and prefix tokens in attrs instead, and
/streaming/cka_state (2, L*L + 1) holds the all-pairs CKA accumulator of the batches done so far (two
slots, batch b writes slot b % 2 before `done` marks it, so the state of the last finished batch is never
the one being overwritten). With `--heads`, /streaming/heads/<vit> (2, S) holds a ViT's head-level CKA accumulator
the same way (attrs blocks, heads, columns: its heads against every layer of the run's other models). A streaming
store made with `--grams` (a zoo) has no accumulator: /streaming (attrs grams, batch_size) marks it, and each model keeps
its layers' per-batch Grams in grams/<layer>, so models run one at a time and are appended later (zoo_store.py).

A store stitched from torchrun shards (file attr shards: json list of relative paths) holds the images and,
per model, HDF5 virtual datasets over the shards' datasets of the same names; see shards.py. Readers use
it like any store; opening one whose shard files are gone is an error rather than rows of fill values.

Files (format 2). The store is a file and a folder beside it, and no finished file is ever written into
again except in place:
    STORE                   the run's images and the models of the extraction that created it (layout above);
                            built under a temporary name and renamed into place; attrs: store_id (random hex)
    STORE.d/lock            the one-writer lock (see store_lock.py)
    STORE.d/models/K.h5     a model appended later (K = its key, %-quoted): the group layout above at the file's
                            root, attrs store_id, order and run_config (the run that added it); allocated in full under a temporary name, then renamed
    STORE.d/results/A/I.h5  one cached result of analysis A (I = hash of its parameters): arrays at the root,
                            attrs params, provenance, store_id; written under a temporary name, then renamed
Every data array a run fills is allocated in full when its file is made (HDF5 early allocation, and the
file's blocks reserved with posix_fallocate, so a full disk is refused up front instead of failing mid-run),
so extraction only overwrites raw bytes at fixed places and never touches a file's metadata; a batch counts
only once `done` says so, after its data was flushed. Caching a result or appending a model makes a new
file and renames it, so a kill at any moment leaves either the old store or the new one, never a broken
one, and a reader never sees a half-written result. Files under STORE.d/ whose store_id is not STORE's
(left by a store replaced with --overwrite) are ignored and removed by the next writer.
Format 1 stores (one file, results under /results) open as they are; results and models added to them go
to STORE.d/ like any store's. Plain h5py reads every file.
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import time
import urllib.parse
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

from .errors import VitseeError, brief
from .store_check import check_own_file
from .store_lock import WriteLock, pid_alive, sidecar_dir

FORMAT_VERSION = 2
HEADS = "heads/"  # per-head attention outputs of a ViT's blocks, (N, heads, tokens, head_dim), see head_outputs
GRAMS = "grams/"  # a zoo's per-batch layer Grams, (N, batch size), see zoo_store.py
CHUNK_BYTES = 64 << 20


def _json(obj) -> str:
    return json.dumps(obj, sort_keys=True, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o))


def check_store_layout(file: h5py.File) -> None:
    """Raises a VitseeError naming what is wrong with a file that says it is a store but that this vitsee
    cannot read: a newer format, groups missing, or metadata whose bytes no longer decode."""
    path = file.filename
    try:
        version = int(file.attrs["vitsee_format"])
        if version > FORMAT_VERSION:
            raise VitseeError(f"{path} was made by a newer vitsee (format {version}; this one reads format "
                              f"{FORMAT_VERSION}): upgrade vitsee")
        models = list(file["models"].values()) if "models" in file else []
        missing = [name for name in ("images", "images/index", "images/label") if name not in file]
        missing += [f"{g.name}/{name}" for g in models for name in ("done", "nonfinite") if name not in g]
        if missing:
            raise VitseeError(f"{path} lacks {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}, which "
                              "every vitsee store has: it is not a whole store; re-create it with `vitsee extract`")
        for obj in (file, file["images"], *models):  # what readers decode: damaged bytes surface here, once
            for name in obj.attrs:
                value = obj.attrs[name]
                if name in ("record", "layers", "class_names", "layer_shapes", "layer_prefix_tokens"):
                    json.loads(value)
    except (OSError, KeyError, ValueError, TypeError) as exc:
        raise VitseeError(f"{path}: the store's metadata cannot be read ({brief(exc)}): the file is damaged; "
                          "restore a copy, or re-create it with `vitsee extract ... --overwrite`") from None


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


def _open_store_file(path: Path, mode: str, what: str = "vitsee store") -> h5py.File:
    """Opens one of a store's HDF5 files, naming the real cause when it cannot be (never inviting
    --overwrite for a file that is merely unreadable to this user)."""
    if mode != "r" and not os.access(path, os.W_OK):
        raise VitseeError(
            f"{path} is read-only for this user: the store is intact; fix its permissions (chmod u+w) "
            "or copy it somewhere writable"
        )
    if not os.access(path, os.R_OK):
        raise VitseeError(f"{path} cannot be read by this user (permission denied): fix its permissions (chmod u+r)")
    try:
        return _open_h5(path, mode)
    except OSError as exc:
        if getattr(exc, "errno", None) in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise VitseeError(f"{path} cannot be opened ({brief(exc)}): fix its permissions") from exc
        raise VitseeError(
            f"{path} is not a readable {what} ({brief(exc)}): it is damaged or not HDF5; "
            "restore it from a copy, or re-create it with `vitsee extract ... --overwrite`"
        ) from exc


def _store_id(file: h5py.File) -> str:
    """Returns the store's identity: its store_id, or for a format-1 store (never rewritten) a digest of
    when and by what it was made."""
    if "store_id" in file.attrs:
        return str(file.attrs["store_id"])
    import hashlib

    seed = f"{file.attrs.get('created', '')}|{file.attrs.get('versions', '')}"
    if "images/index" in file:
        seed += f"|{file['images/index'].shape[0]}"
    return hashlib.sha1(seed.encode()).hexdigest()[:32]


def remove_stale_starts(path: Path) -> list[Path]:
    """Removes the `.NAME.creating-PID` files that killed starts into `path` left behind, only those whose
    process is gone (a live one is another run still building the store); returns what was removed."""
    import glob

    removed = []
    for tmp in path.parent.glob(f".{glob.escape(path.name)}.creating-*"):
        pid = tmp.name.rpartition("-")[2]
        if pid.isdigit() and not pid_alive(int(pid)):
            tmp.unlink(missing_ok=True)
            removed.append(tmp)
    return removed


def _check_shard_file(store: Path, shard: Path, run_id) -> None:
    """Raises VitseeError unless the shard is there, readable, and from the run that made the store."""
    if not shard.exists():
        raise VitseeError(
            f"{store} reads its rows from shard {shard}, which is missing: put the store's "
            f".shards folder back beside it, or re-extract"
        )
    try:
        with _open_h5(shard, "r") as f:
            meta = json.loads(f.attrs.get("shard", "null") or "null") or {}
    except OSError as exc:
        raise VitseeError(
            f"shard {shard} of {store} cannot be read ({brief(exc)}): it is truncated or damaged; "
            "restore it, or rerun the torchrun extraction with --overwrite"
        ) from exc
    if run_id is not None and meta.get("run_id") != str(run_id):
        raise VitseeError(
            f"shard {shard} is not from the run that made {store} (another run's images): put the right shard "
            "back, or rerun the torchrun extraction with --overwrite"
        )


def _reserve(file: Path, size: int, store: Path) -> None:
    """Allocates the file's blocks up to size (posix_fallocate), so later in-place writes cannot hit a
    full disk; raises VitseeError naming the space needed when there is not enough."""
    if not hasattr(os, "posix_fallocate") or size <= 0:
        return
    fd = os.open(file, os.O_RDWR)
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise _no_space(store, file, size) from None
        # file systems without fallocate (some network ones): the up-front disk check is all we have
    finally:
        os.close(fd)


def _no_space(store: Path, file: Path, needed: int) -> VitseeError:
    free = shutil.disk_usage(file.parent).free
    return VitseeError(
        f"not enough disk space for {store}: {file.name} needs {human_bytes(needed)} and {file.parent} has "
        f"{human_bytes(free)} free; free some space and rerun the same command (nothing finished is lost)"
    )


def _write_file_atomically(final: Path, fill, store: Path) -> None:
    """Makes the HDF5 file `final` by calling fill(h5py.File) on a temporary file, flushing it to disk and
    renaming it into place: a kill or a full disk at any moment leaves the old file (or none), never half
    of the new one."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    try:
        with _open_h5(tmp, "w") as f:
            fill(f)
        _durable_rename(tmp, final)
    except VitseeError:
        tmp.unlink(missing_ok=True)
        raise
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        if getattr(exc, "errno", None) == errno.ENOSPC or shutil.disk_usage(final.parent).free < (1 << 20):
            raise _no_space(store, final, 1 << 20) from None
        raise VitseeError(f"cannot write {final} ({brief(exc)}): check the folder's permissions and space") from exc
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _durable_rename(tmp: Path, final: Path) -> None:
    """Renames a finished file into place once its bytes are on disk, then makes the rename itself durable."""
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, final)
    _fsync_dir(final.parent)


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class Store:
    """Read access to a store, plus the write operations extraction and analyses use."""

    def __init__(self, path: str | Path, mode: str = "r", lock: WriteLock | None = None):
        self.path = Path(path)
        _check_store_path(self.path)
        self.file = _open_store_file(self.path, mode)
        self._lock = lock
        self._mode = mode
        self._model_files: dict[str, Path] = {}
        self._open_files: dict[str, h5py.File] = {}
        try:
            if "vitsee_format" not in self.file.attrs:
                raise VitseeError(f"{path} is an HDF5 file but not a vitsee store: give a store made by `vitsee extract`")
            check_store_layout(self.file)
            check_own_file(self.path, self.file)
            # a stitched store reads its rows from shard files; HDF5 would quietly fill a missing one's with zeros
            for shard in self.shard_files:
                _check_shard_file(self.path, shard, self.file.attrs.get("run_id"))
            self.store_id = _store_id(self.file)
            self._scan_models()
        except BaseException:
            self.file.close()
            raise
        self.writable = lock is not None

    # --- opening --------------------------------------------------------------------------------

    @classmethod
    def open(cls, path: str | Path, mode: str = "r") -> Store:
        """Returns the store at path, for use as a context manager (`with Store.open(p) as s:`)."""
        return cls(path, mode)

    @classmethod
    def writer(cls, path: str | Path, rows: bool = False, lock: WriteLock | None = None) -> Store:
        """Returns the store opened for writing, holding the store's write lock so two writers never mix.

        rows: extraction writes rows into the data files, which are then opened read-write; caching results
        and appending models write new files only, so without it the data files stay read-only.
        lock: a lock the caller already holds (kept when the store closes); by default one is taken here.
        """
        path = Path(path)
        _check_store_path(path)
        own = lock is None
        lock = WriteLock(path) if own else lock
        try:
            store = cls(path, "r+" if rows else "r", lock=lock)
        except BaseException:
            if own:
                lock.release()
            raise
        store._owns_lock = own
        try:
            store._remove_stale()
            if rows:
                store.reserve_space()
        except BaseException:
            store.close()
            raise
        return store

    def close(self) -> None:
        for f in self._open_files.values():
            if f.id.valid:
                f.close()
        self._open_files.clear()
        if self.file.id.valid:
            self.file.close()
        if self._lock is not None and getattr(self, "_owns_lock", False):
            self._lock.release()
        self._lock = None

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- the files beside the store -------------------------------------------------------------

    @property
    def sidecar(self) -> Path:
        """Returns the folder beside the store (STORE.d) holding appended models and cached results."""
        return sidecar_dir(self.path)

    def _own(self, f: h5py.File) -> bool:
        return str(f.attrs.get("store_id", "")) == self.store_id

    def _scan_models(self) -> None:
        folder = self.sidecar / "models"
        if not folder.is_dir():
            return
        main = set(self.file["models"]) if "models" in self.file else set()
        found = []
        for p in folder.glob("*.h5"):
            key = urllib.parse.unquote(p.name[: -len(".h5")])
            if key in main:
                continue
            f = _open_store_file(p, self._mode, what=f"model file of {self.path}")
            if not self._own(f):  # left by a store this one replaced (--overwrite)
                f.close()
                continue
            check_own_file(self.path, f)
            found.append((int(f.attrs.get("order", 0)), key, p, f))
        for _order, key, p, f in sorted(found):
            self._model_files[key] = p
            self._open_files[key] = f

    def _remove_stale(self) -> None:
        """Removes what a killed writer or a replaced store left (the caller holds the lock)."""
        remove_stale_starts(self.path)
        if not self.sidecar.is_dir():
            return
        for p in self.sidecar.rglob("*.h5*"):
            if ".tmp-" in p.name:
                p.unlink(missing_ok=True)  # a write that never finished; no other writer can be busy
                continue
            if p.parent.name == "models" and urllib.parse.unquote(p.name[:-3]) in self._model_files:
                continue
            try:
                with h5py.File(p, "r", locking=False) as f:
                    stale = not self._own(f)
            except OSError:
                stale = False  # leave a file we cannot read alone; readers skip it
            if stale:
                p.unlink(missing_ok=True)

    def files_beside(self) -> dict:
        """Returns what the folder beside the store holds: {models, results, files, bytes} of this store."""
        models = len(self._model_files)
        results = len(self._result_files(None))
        sizes = [p.stat().st_size for p in self._model_files.values()]
        sizes += [p.stat().st_size for _a, _r, p in self._result_files(None)]
        return {"models": models, "results": results, "files": models + results, "bytes": sum(sizes)}

    def reserve_space(self) -> None:
        """Makes sure every block the run will write is allocated on disk, so a full disk is one clear
        error now instead of a failed write mid-run."""
        for f in [self.file, *self._open_files.values()]:
            _reserve(Path(f.filename), os.path.getsize(f.filename), self.path)

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
        main = []
        if "models" in self.file:
            group = self.file["models"]
            main = sorted(group, key=lambda k: int(group[k].attrs.get("order", 0)))
        return main + list(self._model_files)

    def resolve_model(self, name: str) -> str:
        """Returns the key of the model a user named: the exact key, or a unique prefix of one."""
        if name in self._model_files or "/" not in name and "models" in self.file and name in self.file["models"]:
            return name  # an exact key, without ordering every model's group (analyses look keys up per layer)
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
        key = self.resolve_model(model)
        if key in self._open_files:
            return self._open_files[key]
        return self.file["models"][key]

    def model_info(self, model: str) -> dict:
        """Returns the model's metadata: spec, family, weights (kind, seed, path, sha256), grid, ..."""
        group = self._model(model)
        info = json.loads(group.attrs["record"])
        info.update(batch_size=int(group.attrs["batch_size"]), dtype=str(group.attrs["dtype"]))
        return info

    def run_config(self, model: str | None = None) -> dict | None:
        """Returns the recorded configuration of the run that made the store (or that added `model` to it),
        None for a store made before runs were recorded (see run_config.py)."""
        attrs = self.file.attrs
        if model is not None and self.resolve_model(model) in self._open_files:
            attrs = self._open_files[self.resolve_model(model)].attrs
        text = attrs.get("run_config")
        return None if text is None else json.loads(text)

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

    def layer_layout(self, model: str, layer: str) -> str:
        """Returns how a layer's per-image axes are laid out: 'tokens' (T, C), 'nchw' (C, H, W), 'nhwc' (H, W, C)
        or 'flat'. Stores written before layouts were recorded read as tokens (2 axes) or nchw (3 axes)."""
        group = self._model(model)
        if "layer_shapes" in group.attrs:
            layout = json.loads(group.attrs.get("layer_layouts", "{}")).get(layer)
        else:
            layout = self._layer(model, layer).attrs.get("layout")
        if layout:
            return str(layout)
        shape = self.layer_shape(model, layer)
        return {2: "tokens", 3: "nchw"}.get(len(shape), "flat")

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
                    + (f"resume it with `vitsee extract {self.path}`" if self.run_config(m) is not None
                       else "rerun the same `vitsee extract` command to resume")
                )

    def activations(self, model: str, layer: str, rows: slice | np.ndarray | None = None) -> np.ndarray:
        """Returns a layer's activations as float32: all finished rows, or the rows asked for."""
        return self._finished(model, self._layer(model, layer), rows)

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
        return self._finished(model, self._model(model)["input"], rows)

    # --- head outputs (head-level CKA, engine/analyses/heads.py) ------------------------------------

    def head_blocks(self, model: str) -> list[str]:
        """Returns the blocks (blocks.B, forward order) whose per-head attention outputs are stored, or, in a
        streaming store, whose head-level CKA was accumulated (`extract --streaming --heads`)."""
        if self.streaming:
            layout = self.streamed_heads().get(self.resolve_model(model))
            return list(layout["blocks"]) if layout else []
        group = self._model(model)
        if "heads" not in group:
            return []
        return sorted(group["heads"], key=lambda name: int(name.rsplit(".", 1)[1]))

    def head_outputs(self, model: str, block: str, rows: slice | np.ndarray | None = None) -> np.ndarray:
        """Returns a block's per-head attention outputs (N, heads, spatial tokens, head_dim) as float32."""
        self._require_activations("head outputs cannot be read")
        group = self._model(model)
        if block not in self.head_blocks(model):
            raise VitseeError(
                f"no head outputs of '{block}' stored for {self.resolve_model(model)} (stored: "
                f"{', '.join(self.head_blocks(model)) or 'none'}): re-extract the ViT with this vitsee, without --streaming"
            )
        return self._finished(model, group["heads"][block], rows)

    def _finished(self, model: str, ds: h5py.Dataset, rows: slice | np.ndarray | None) -> np.ndarray:
        """Returns a per-image dataset's finished rows as float32: all of them, a slice of them, or those asked for
        (a row not extracted yet is an error naming the way out)."""
        done = self.rows_done(model)
        if rows is None:
            return ds[:done].astype(np.float32)
        if isinstance(rows, slice):
            start, stop, step = rows.indices(done)
            return ds[start:stop:step].astype(np.float32)
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

    def nonfinite_batches(self, model: str) -> np.ndarray:
        """Returns the (batches, layers) counts of non-finite values written per batch and layer."""
        return self._model(model)["nonfinite"][:]

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

    def _result_file(self, analysis: str, rid: str) -> Path:
        return self.sidecar / "results" / analysis / f"{rid}.h5"

    def _legacy_results(self) -> h5py.Group | None:
        """Returns the /results group of a format-1 store (results cached inside the store file)."""
        return self.file["results"] if "results" in self.file else None

    def _result_files(self, analysis: str | None) -> list[tuple[str, str, Path]]:
        root = self.sidecar / "results"
        if not root.is_dir():
            return []
        out = []
        for folder in sorted(root.iterdir()) if analysis is None else [root / analysis]:
            if folder.is_dir():
                out += [(folder.name, p.name[:-3], p) for p in sorted(folder.glob("*.h5")) if not p.name.startswith(".")]
        return out

    def _open_result(self, p: Path) -> h5py.File | None:
        """Opens a cached result file, or None when it belongs to another store or cannot be read."""
        try:
            f = _open_h5(p, "r")
        except OSError:
            return None  # damaged (a disk error): the result is missing, it will be computed again
        if not self._own(f) or not f.attrs.get("complete", False):
            f.close()
            return None
        check_own_file(self.path, f)
        return f

    def results(self, analysis: str | None = None) -> list[dict]:
        """Returns [{analysis, id, params, provenance}] for the cached results."""
        out, seen = [], set()
        for name, rid, p in self._result_files(analysis):
            f = self._open_result(p)
            if f is None:
                continue
            with f:
                out.append(_result_entry(name, rid, f))
            seen.add((name, rid))
        legacy = self._legacy_results()
        if legacy is not None:
            for name, group in legacy.items():
                if analysis is not None and name != analysis:
                    continue
                for rid, res in group.items():
                    if (name, rid) not in seen and res.attrs.get("complete", False):
                        out.append(_result_entry(name, rid, res))
        return out

    @staticmethod
    def result_id(params: dict) -> str:
        import hashlib

        return hashlib.sha1(_json(params).encode()).hexdigest()[:16]

    def get_result(self, analysis: str, params: dict) -> dict[str, np.ndarray] | None:
        """Returns the cached arrays of an analysis run with these params, or None."""
        rid = self.result_id(params)
        p = self._result_file(analysis, rid)
        if p.exists():
            f = self._open_result(p)
            if f is not None:
                with f:
                    return _read_result(f)
        legacy = self._legacy_results()
        if legacy is not None and f"{analysis}/{rid}" in legacy:
            group = legacy[f"{analysis}/{rid}"]
            if group.attrs.get("complete", False):
                return _read_result(group)
        return None

    def put_result(self, analysis: str, params: dict, arrays: dict, provenance: dict | None = None) -> str:
        """Caches an analysis result (arrays keyed by name, '/' makes sub-groups) in a file of its own,
        written whole and renamed into place; returns its id."""
        if not self.writable:
            raise VitseeError(f"{self.path} is open read-only: reopen it for writing to cache results")
        rid = self.result_id(params)
        now = time.time()  # created_unix orders results made within the same second
        provenance = {"created": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(now)),
                      "created_unix": now, **versions(), **(provenance or {})}

        def fill(f: h5py.File) -> None:
            for name, value in arrays.items():
                value = np.asarray(value)
                if value.dtype.kind == "U":
                    value = value.astype(h5py.string_dtype())
                f.create_dataset(name, data=value)
            f.attrs["analysis"] = analysis
            f.attrs["store_id"] = self.store_id
            f.attrs["params"] = _json(params)
            f.attrs["provenance"] = _json(provenance)
            f.attrs["complete"] = True

        _write_file_atomically(self._result_file(analysis, rid), fill, self.path)
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

    def streamed_heads(self) -> dict[str, dict]:
        """Returns {vit: {blocks, heads, columns}} of the head-level CKA a streaming run accumulates (empty
        without `--heads`); columns are the [(model, layer)] of the other models its heads are compared with."""
        if "streaming/heads" not in self.file:
            return {}
        out = {}
        for vit, ds in self.file["streaming/heads"].items():
            out[vit] = {"blocks": json.loads(ds.attrs["blocks"]), "heads": int(ds.attrs["heads"]),
                        "columns": [tuple(c) for c in json.loads(ds.attrs["columns"])]}
        return {vit: out[vit] for vit in self.models if vit in out}  # store order

    def streamed_heads_state(self, vit: str) -> np.ndarray | None:
        """Returns a ViT's head-level CKA accumulator after the last finished batch of a streaming run, or None
        when nothing has been accumulated yet."""
        saved = self.streamed_cka_state()  # the same batches, written in the same slot
        if saved is None or f"streaming/heads/{vit}" not in self.file:
            return None
        done = min(self.rows_done(m) for m in self.models)
        finished = -(-done // int(self.file["streaming/cka_state"].attrs["batch_size"]))
        return self.file[f"streaming/heads/{vit}"][(finished - 1) % 2].astype(np.float64)

    # --- writing (extraction) -------------------------------------------------------------------

    def add_model(
        self,
        record: dict,
        layers: Sequence[LayerSpec],
        stats: Sequence[ArraySpec],
        input_shape: tuple[int, ...],
        batch_size: int,
        dtype: str,
        run_config: dict | None = None,
    ) -> str:
        """Adds a model to the store as a file of its own beside it (STORE.d/models), every array allocated
        and its blocks reserved before it is renamed into place; returns its key. run_config: the record of
        the run adding it, so that run can be resumed from the store alone."""

        def fill(f: h5py.File, order: int) -> None:
            if run_config is not None:
                f.attrs["run_config"] = _json(run_config)
            fill_model_group(f, record, layers, stats, input_shape, batch_size, dtype, self.n_images, order=order,
                             streaming=self.streaming)
            f.flush()
            _reserve(Path(f.filename), os.path.getsize(f.filename), self.path)

        self._add_model_file(record["key"], fill)
        return record["key"]

    def add_virtual_model(self, key: str, fill) -> None:
        """Adds a model whose datasets fill(group) makes (virtual datasets over torchrun shards) as a file
        of its own beside the store, like add_model."""

        def fill_file(f: h5py.File, order: int) -> None:
            fill(f)
            f.attrs["order"] = order

        self._add_model_file(key, fill_file)

    def _add_model_file(self, key: str, fill) -> None:
        """Writes STORE.d/models/KEY.h5 whole (fill(file, order) makes its content) and opens it as the model."""
        if not self.writable:
            raise VitseeError(f"{self.path} is open read-only: reopen it for writing to add a model")
        if key in self.models:
            raise VitseeError(f"model {key} is already in {self.path}: use another spec or --overwrite")
        order = len(self.models)
        final = self.sidecar / "models" / f"{urllib.parse.quote(key, safe='')}.h5"

        def fill_file(f: h5py.File) -> None:
            f.attrs["store_id"] = self.store_id
            f.attrs["vitsee_model_file"] = FORMAT_VERSION
            fill(f, order)

        _write_file_atomically(final, fill_file, self.path)
        self._model_files[key] = final
        self._open_files[key] = _open_store_file(final, self._mode, what=f"model file of {self.path}")

    def write_batch(
        self,
        model: str,
        batch: int,
        activations: dict[str, np.ndarray],
        stats: dict[str, np.ndarray],
        model_input: np.ndarray,
        nonfinite: Sequence[int],
    ) -> None:
        """Writes one batch of a model and marks it done once the data is flushed to disk; a failed write
        leaves the batch not done, so the rerun writes it again."""
        group = self._model(model)
        try:
            self._write_rows(model, batch, activations, stats, model_input, nonfinite)
            group.file.flush()
        except OSError as exc:
            raise self._write_failed(group, batch, exc) from exc
        group["done"][batch] = 1
        group.file.flush()

    def write_streamed_batch(self, batch: int, stats: dict[str, dict[str, np.ndarray]],
                             nonfinite: dict[str, Sequence[int]], cka_state: np.ndarray,
                             heads_states: dict[str, np.ndarray] | None = None) -> None:
        """Writes one batch of a streaming run (every model's statistics, the CKA accumulator and each ViT's
        head-level CKA accumulator after it), then marks it done for every model once the data is flushed."""
        try:
            for model, values in stats.items():
                self._write_rows(model, batch, {}, values, None, nonfinite[model])
            self.file["streaming/cka_state"][batch % 2] = cka_state
            for vit, state in (heads_states or {}).items():
                self.file[f"streaming/heads/{vit}"][batch % 2] = state
            self.file.flush()
        except OSError as exc:
            raise self._write_failed(self.file, batch, exc) from exc
        for model in stats:
            self._model(model)["done"][batch] = 1
        self.file.flush()

    def _write_failed(self, group: h5py.Group, batch: int, exc: OSError) -> VitseeError:
        where = Path(group.file.filename)
        if getattr(exc, "errno", None) == errno.ENOSPC or shutil.disk_usage(where.parent).free < (1 << 20):
            return _no_space(self.path, where, 1 << 20)
        return VitseeError(
            f"writing batch {batch} into {where} failed ({brief(exc)}): the batch is not marked done; check the disk "
            "and rerun the same command to resume"
        )

    def _write_rows(self, model, batch, activations, stats, model_input, nonfinite) -> None:
        group = self._model(model)
        bs = int(group.attrs["batch_size"])
        start = batch * bs
        stop = min(start + bs, self.n_images)
        for name, value in activations.items():
            group["acts"][name][start:stop] = value
        for name, value in stats.items():
            group[name if name.startswith((HEADS, GRAMS)) else f"stats/{name}"][start:stop] = value
        if model_input is not None:
            group["input"][start:stop] = model_input
        group["nonfinite"][batch] = np.asarray(nonfinite, dtype=np.int64)


def _result_entry(analysis: str, rid: str, node) -> dict:
    return {
        "analysis": analysis,
        "id": rid,
        "params": json.loads(node.attrs["params"]),
        "provenance": json.loads(node.attrs.get("provenance", "{}")),
    }


def _read_result(group) -> dict:
    """Returns a cached result's arrays (text as str) with its _params and _provenance."""
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
    """Allocates every array of a new model in full in a store file being created (see the module
    docstring for the layout)."""
    key = record["key"]
    models = file.require_group("models")
    if key in models:
        raise VitseeError(f"model {key} is already in {file.filename}: use another spec or --overwrite")
    group = models.create_group(key)
    fill_model_group(group, record, layers, stats, input_shape, batch_size, dtype, n_images, len(models) - 1, streaming)


def fill_model_group(group: h5py.Group, record: dict, layers: Sequence[LayerSpec], stats: Sequence[ArraySpec],
                     input_shape: tuple[int, ...], batch_size: int, dtype: str, n_images: int, order: int,
                     streaming: bool = False) -> None:
    """Writes a model's attrs and allocates its arrays in group (a store's /models/KEY or a model file's root)."""
    group.attrs["record"] = _json(record)
    group.attrs["layers"] = _json([layer.name for layer in layers])
    group.attrs["batch_size"] = int(batch_size)
    group.attrs["dtype"] = dtype
    group.attrs["order"] = int(order)
    if streaming:  # no activations: the layers' shapes are all a reader needs to know about them
        group.attrs["layer_shapes"] = _json({layer.name: list(layer.shape) for layer in layers})
        group.attrs["layer_prefix_tokens"] = _json({layer.name: int(layer.prefix_tokens) for layer in layers})
        group.attrs["layer_layouts"] = _json({layer.name: layer.layout for layer in layers if layer.layout})
    else:
        acts = group.create_group("acts")
        for layer in layers:
            ds = _early_dataset(acts, layer.name, (n_images, *layer.shape), dtype, batch_size)
            ds.attrs["prefix_tokens"] = int(layer.prefix_tokens)
            ds.attrs["module"] = layer.module
            ds.attrs["kind"] = layer.kind
            if layer.layout:
                ds.attrs["layout"] = layer.layout
    stat_group = group.create_group("stats")
    for spec in stats:  # head outputs (heads/blocks.B) sit beside acts/, the statistics in stats/
        parent = group if spec.name.startswith((HEADS, GRAMS)) else stat_group
        _early_dataset(parent, spec.name, (n_images, *spec.shape), spec.dtype, batch_size)
    if not streaming:
        _early_dataset(group, "input", (n_images, *input_shape), dtype, batch_size)
    n_batches = -(-n_images // batch_size)
    _early_dataset(group, "nonfinite", (n_batches, len(layers)), "int64", n_batches)
    done = _early_dataset(group, "done", (n_batches,), "uint8", n_batches)
    done[:] = 0


@contextmanager
def creating(path: str | Path, overwrite: bool = False, lock: WriteLock | None = None):
    """Builds a new store under a temporary name and renames it into place when the block succeeds.

    Yields the open h5py.File. Without overwrite an existing file at path is an error; with it, the old
    store is replaced only once the new one is complete (its files beside it then belong to no store and
    are removed by the next writer). The store's write lock is held throughout: the caller's, or one taken
    here, so two runs can never create or replace the same store at once.
    """
    path = Path(path)
    if not path.parent.exists():
        raise VitseeError(f"folder {path.parent} does not exist: create it first or choose another store path")
    own = lock is None
    lock = WriteLock(path) if own else lock
    try:
        if path.exists() and not overwrite:
            raise VitseeError(f"{path} already exists: pass --overwrite to replace it, or choose another path")
        remove_stale_starts(path)
        tmp = path.with_name(f".{path.name}.creating-{os.getpid()}")
        try:
            file = _open_h5(tmp, "w")
        except OSError as exc:
            raise VitseeError(f"cannot create {tmp} ({brief(exc)}): check that {path.parent} is writable") from exc
        try:
            file.attrs["vitsee_format"] = FORMAT_VERSION
            file.attrs["store_id"] = uuid.uuid4().hex
            file.attrs["created"] = time.strftime("%Y-%m-%dT%H:%M:%S")
            file.attrs["versions"] = _json(versions())
            yield file
            file.close()
            _reserve(tmp, os.path.getsize(tmp), path)
            _durable_rename(tmp, path)
        except BaseException:
            if file.id.valid:
                file.close()
            tmp.unlink(missing_ok=True)
            raise
    finally:
        if own:
            lock.release()


def add_streaming_state(file: h5py.File, columns: Sequence[tuple[str, str]], batch_size: int) -> None:
    """Marks a new store as a streaming one and allocates its CKA accumulator slots."""
    file.attrs["streaming"] = True
    group = file.require_group("streaming")
    n = len(columns)
    ds = _early_dataset(group, "cka_state", (2, n * n + 1), "float64", 2)
    ds.attrs["columns"] = _json([list(c) for c in columns])
    ds.attrs["batch_size"] = int(batch_size)


def add_streamed_heads_state(file: h5py.File, vit: str, blocks: Sequence[str], heads: int,
                             columns: Sequence[tuple[str, str]]) -> None:
    """Allocates the two slots of a ViT's head-level CKA accumulator in a new streaming store: its
    len(blocks) * heads heads against the columns (every layer of the other models)."""
    n = len(blocks) * heads + len(columns)
    ds = _early_dataset(file.require_group("streaming/heads"), vit, (2, n * n + 1), "float64", 2)
    ds.attrs["blocks"] = _json(list(blocks))
    ds.attrs["heads"] = int(heads)
    ds.attrs["columns"] = _json([list(c) for c in columns])


def write_images(file: h5py.File, dataset: str, indices: np.ndarray, labels: np.ndarray, class_names, shuffle_seed) -> None:
    group = file.create_group("images")
    group.create_dataset("index", data=np.asarray(indices, dtype=np.int64))
    group.create_dataset("label", data=np.asarray(labels, dtype=np.int64))
    group.attrs["dataset"] = dataset
    group.attrs["shuffle_seed"] = -1 if shuffle_seed is None else int(shuffle_seed)
    group.attrs["class_names"] = _json(class_names)


def copy_store(src: str | Path, dst: str | Path) -> Path:
    """Copies a store with its folder of appended models and cached results (not its lock); returns dst.
    A plain copy of the store file alone keeps its images and first models but not what was added later."""
    src, dst = Path(src), Path(dst)
    shutil.copy2(src, dst)
    folder = sidecar_dir(src)
    if folder.is_dir():
        shutil.copytree(folder, sidecar_dir(dst), ignore=shutil.ignore_patterns("lock", ".*"), dirs_exist_ok=True)
    return dst
