"""The HDF5 store: one file per run holding images, per-model activations and statistics, and results.

Layout
    /                      attrs: vitsee_format, created, versions, run_config (json: the `vitsee extract` run that
                           made the store, see extraction/run_config.py; absent in stores made before it was recorded)
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
                           with --grams (a zoo's statistics; layout and size in zoo/streamed.py)
        nonfinite          (batches, layers) count of non-finite values written per batch and layer
        done               (batches,) uint8, 1 once every array of the batch is on disk
    /results/<analysis>/<id>   cached analysis results, attrs: params (json), provenance (json)

A streaming store (`vitsee extract --streaming`, file attr streaming=1) has the same layout without acts/
and input: each model group records its layers' per-image shapes and prefix tokens in attrs instead, and
/streaming/cka_state (2, L*L + 1) holds the all-pairs CKA accumulator of the batches done so far (two
slots, batch b writes slot b % 2 before `done` marks it, so the state of the last finished batch is never
the one being overwritten). With `--heads`, /streaming/heads/<vit> (2, S) holds a ViT's head-level CKA accumulator
the same way (attrs blocks, heads, columns: its heads against every layer of the run's other models). A streaming
store made with `--grams` (a zoo) has no accumulator: /streaming (attrs grams, batch_size) marks it, and each model
keeps its layers' per-batch Grams in grams/<layer>, so models run one at a time and are appended later
(zoo/streamed.py).

A store stitched from torchrun shards (file attr shards: json list of relative paths) holds the images and,
per model, HDF5 virtual datasets over the shards' datasets of the same names; see extraction/shards.py. Readers use
it like any store; opening one whose shard files are gone is an error rather than rows of fill values.

Files (format 2). The store is a file and a folder beside it, and no finished file is ever written into
again except in place:
    STORE                   the run's images and the models of the extraction that created it (layout above);
                            built under a temporary name and renamed into place; attrs: store_id (random hex)
    STORE.d/lock            the one-writer lock (see store/lock.py)
    STORE.d/models/K.h5     a model appended later (K = its key, %-quoted): the group layout above at the file's
                            root, attrs store_id, order and run_config (the run that added it); allocated in full
                            under a temporary name, then renamed
    STORE.d/results/A/I.h5  one cached result of analysis A (I = hash of its parameters): arrays at the root,
                            attrs params, provenance, store_id; written under a temporary name, then renamed
    STORE.d/names.h5        the display names set for its models (attrs names: JSON {key: name}, store_id), written
                            whole under a temporary name and renamed (store/names.py)
Every data array a run fills is allocated in full when its file is made (HDF5 early allocation, and the
file's blocks reserved with posix_fallocate, so a full disk is refused up front instead of failing mid-run),
so extraction only overwrites raw bytes at fixed places and never touches a file's metadata; a batch counts
only once `done` says so, after its data was flushed. Caching a result or appending a model makes a new
file and renames it, so a kill at any moment leaves either the old store or the new one, never a broken
one, and a reader never sees a half-written result. Files under STORE.d/ whose store_id is not STORE's are
ignored; --overwrite removes the replaced store's, and a writer moves any other store's aside, never deleting
them, nor writing or deleting through a symbolic link (see store/files.py).
Format 1 stores (one file, results under /results) open as they are; results and models added to them go
to STORE.d/ like any store's. Plain h5py reads every file.

The code is split by concern, each part short enough to read whole: store/layout.py (what a file holds, allocating
it), store/files.py (the files on disk: opening, atomic writes, the folder beside the store), store/read.py,
store/results.py, store/write.py and store/names.py (the methods of Store that read, cache results, write and name
models), store/lock.py and store/check.py. Store and every public name of those modules are importable from here.
"""

from __future__ import annotations

import os
import urllib.parse
from pathlib import Path

import h5py

from vitsee.errors import VitseeError
from vitsee.store.check import check_own_file
from vitsee.store.files import (
    check_not_a_folder,
    check_shard_file,
    check_store_path,
    check_writable_layout,
    copy_store,
    durable_rename,
    existing_store_id,
    is_real_file,
    is_real_folder,
    no_space,
    open_h5,
    open_store_file,
    real_folder,
    remove_stale_starts,
    reserve_blocks,
    tidy,
    write_file_atomically,
)
from vitsee.store.layout import (
    CHUNK_BYTES,
    FORMAT_VERSION,
    GRAMS,
    HEADS,
    ArraySpec,
    LayerSpec,
    add_model_layout,
    add_streamed_heads_state,
    add_streaming_state,
    check_store_layout,
    early_dataset,
    estimate_bytes,
    fill_model_group,
    human_bytes,
    json_attr,
    store_identity,
    versions,
    write_images,
)
from vitsee.store.lock import StoreBusy, WriteLock, pid_alive, sidecar_dir
from vitsee.store.names import StoreNames
from vitsee.store.read import StoreReading, read_rows
from vitsee.store.results import StoreResults
from vitsee.store.write import StoreWriting, creating

__all__ = [
    "Store",
    "StoreBusy",
    "WriteLock",
    "LayerSpec",
    "ArraySpec",
    "FORMAT_VERSION",
    "HEADS",
    "GRAMS",
    "CHUNK_BYTES",
    "add_model_layout",
    "add_streamed_heads_state",
    "add_streaming_state",
    "check_store_layout",
    "copy_store",
    "creating",
    "estimate_bytes",
    "fill_model_group",
    "human_bytes",
    "json_attr",
    "read_rows",
    "remove_stale_starts",
    "sidecar_dir",
    "versions",
    "write_images",
    # the files and layout helpers the other store modules share, public for them
    "check_not_a_folder",
    "check_shard_file",
    "check_store_path",
    "check_writable_layout",
    "durable_rename",
    "early_dataset",
    "existing_store_id",
    "is_real_file",
    "is_real_folder",
    "no_space",
    "open_h5",
    "open_store_file",
    "pid_alive",
    "real_folder",
    "reserve_blocks",
    "store_identity",
    "tidy",
    "write_file_atomically",
]

_json = json_attr  # the old name, still called on branches written before it was made public


class Store(StoreReading, StoreResults, StoreWriting, StoreNames):
    """Read access to a store, plus the write operations extraction and analyses use.

    This class holds what is open (the store file, the model files beside it, the lock) and the files beside it;
    reading, cached results and writing are its three bases (store/read.py, store/results.py, store/write.py).
    """

    def __init__(self, path: str | Path, mode: str = "r", lock: WriteLock | None = None):
        self.path = Path(path)
        check_store_path(self.path)
        self.file = open_store_file(self.path, mode)
        self._lock = lock
        self._mode = mode
        self._model_files: dict[str, Path] = {}
        self._open_files: dict[str, h5py.File] = {}
        try:
            if "vitsee_format" not in self.file.attrs:
                raise VitseeError(
                    f"{path} is an HDF5 file but not a vitsee store: give a store made by `vitsee extract`"
                )
            check_store_layout(self.file)
            check_own_file(self.path, self.file)
            # a stitched store reads its rows from shard files; HDF5 would quietly fill a missing one's with zeros
            for shard in self.shard_files:
                check_shard_file(self.path, shard, self.file.attrs.get("run_id"))
            self.store_id = store_identity(self.file)
            self._scan_models()
        except BaseException:
            self.file.close()
            raise
        self.writable = lock is not None

    # --- opening ---------------------------------------------------------------------------------------------

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
        check_store_path(path)
        check_writable_layout(path)  # before the lock is made: a refused layout gets no new file
        own = lock is None
        lock = WriteLock(path) if own else lock
        try:
            check_writable_layout(path)  # and under it, as it is now
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

    # --- the files beside the store --------------------------------------------------------------------------

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
        for p in sorted(folder.glob("*.h5")):
            key = urllib.parse.unquote(p.name[: -len(".h5")])
            if key in main:
                continue
            self._check_model_file(p)
            f = open_store_file(p, self._mode, what=f"model file of {self.path}")
            if not self._own(f):  # left by a store this one replaced (--overwrite)
                f.close()
                continue
            check_own_file(self.path, f)
            found.append((int(f.attrs.get("order", 0)), key, p, f))
        for _order, key, p, f in sorted(found):
            self._model_files[key] = p
            self._open_files[key] = f

    def _check_model_file(self, p: Path) -> None:
        """Raises a VitseeError naming the way out when a model file is not a regular file (a folder, a pipe) or,
        for a writer of rows, a symbolic link: rows are never written through a link."""
        if is_real_file(p) or (p.is_symlink() and self._mode == "r" and p.is_file()):
            return
        what = (
            "a symbolic link (to {})".format(os.readlink(p))
            if p.is_symlink()
            else ("a folder" if p.is_dir() else "not a regular file")
        )
        way = (
            f"put the file itself there (`cp --remove-destination {os.path.realpath(p)} {p}`)"
            if p.is_file()
            else f"move it away (`mv {p} {p.parent / ('.' + p.name + '.moved')}`)"
        )
        raise VitseeError(
            f"{p} is {what} where {self.path.name} keeps a model file: vitsee writes rows only into a file "
            f"of its own; {way} and rerun"
        )

    def _remove_stale(self) -> None:
        """Removes what a killed writer left and moves the files of other stores aside (store_files.tidy; the
        caller holds the lock)."""
        remove_stale_starts(self.path)
        tidy(self.path, self.store_id)

    def files_beside(self) -> dict:
        """Returns what the folder beside the store holds: {models, results, files, bytes} of this store."""
        models = len(self._model_files)
        results = len(self._result_files(None))
        sizes = [p.stat().st_size for p in self._model_files.values()]
        sizes += [p.lstat().st_size for _a, _r, p in self._result_files(None)]
        return {"models": models, "results": results, "files": models + results, "bytes": sum(sizes)}

    def reserve_space(self) -> None:
        """Makes sure every block the run will write is allocated on disk, so a full disk is one clear
        error now instead of a failed write mid-run."""
        for f in [self.file, *self._open_files.values()]:
            reserve_blocks(Path(f.filename), os.path.getsize(f.filename), self.path)

    # the old private names of model_group, layer_dataset, layer_attrs and require_activations, which other modules
    # called before they were made public: kept for the branches written against them
    _model = StoreReading.model_group
    _layer = StoreReading.layer_dataset
    _layer_attrs = StoreReading.layer_attrs
    _require_activations = StoreReading.require_activations
