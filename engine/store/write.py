"""Writing a store: creating it, appending a model as a file of its own, and filling rows in place.

`StoreWriting` is the part of `Store` (store/__init__.py) that writes; it uses `file`, `path`, `sidecar`, `store_id`,
`writable`, `n_images`, `streaming`, `models`, `model_group`, `_mode`, `_model_files` and `_open_files` of Store.
Every array is allocated when its file is made; a batch's rows are written, flushed, and only then marked done.
"""

from __future__ import annotations

import errno
import os
import shutil
import time
import urllib.parse
import uuid
from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path

import h5py
import numpy as np

from vitsee.errors import VitseeError, brief
from vitsee.store.files import (
    check_not_a_folder,
    durable_rename,
    existing_store_id,
    no_space,
    open_h5,
    open_store_file,
    remove_stale_starts,
    reserve_blocks,
    tidy,
    write_file_atomically,
)
from vitsee.store.layout import (
    FORMAT_VERSION,
    GRAMS,
    HEADS,
    ArraySpec,
    LayerSpec,
    fill_model_group,
    json_attr,
    versions,
)
from vitsee.store.lock import WriteLock


class StoreWriting:
    """The write methods of Store (see store/__init__.py): appending models, writing batches of rows."""

    # --- appending a model -----------------------------------------------------------------------------------

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
                f.attrs["run_config"] = json_attr(run_config)
            fill_model_group(
                f,
                record,
                layers,
                stats,
                input_shape,
                batch_size,
                dtype,
                self.n_images,
                order=order,
                streaming=self.streaming,
            )
            f.flush()
            reserve_blocks(Path(f.filename), os.path.getsize(f.filename), self.path)

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

        write_file_atomically(final, fill_file, self.path)
        self._model_files[key] = final
        self._open_files[key] = open_store_file(final, self._mode, what=f"model file of {self.path}")

    # --- rows of a run ---------------------------------------------------------------------------------------

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
        group = self.model_group(model)
        try:
            self._write_rows(model, batch, activations, stats, model_input, nonfinite)
            group.file.flush()
        except OSError as exc:
            raise self._write_failed(group, batch, exc) from exc
        group["done"][batch] = 1
        group.file.flush()

    def write_streamed_batch(
        self,
        batch: int,
        stats: dict[str, dict[str, np.ndarray]],
        nonfinite: dict[str, Sequence[int]],
        cka_state: np.ndarray,
        heads_states: dict[str, np.ndarray] | None = None,
    ) -> None:
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
            self.model_group(model)["done"][batch] = 1
        self.file.flush()

    def _write_failed(self, group: h5py.Group, batch: int, exc: OSError) -> VitseeError:
        where = Path(group.file.filename)
        if getattr(exc, "errno", None) == errno.ENOSPC or shutil.disk_usage(where.parent).free < (1 << 20):
            return no_space(self.path, where, 1 << 20)
        return VitseeError(
            f"writing batch {batch} into {where} failed ({brief(exc)}): the batch is not marked done; check the disk "
            "and rerun the same command to resume"
        )

    def _write_rows(self, model, batch, activations, stats, model_input, nonfinite) -> None:
        group = self.model_group(model)
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


@contextmanager
def creating(path: str | Path, overwrite: bool = False, lock: WriteLock | None = None):
    """Builds a new store under a temporary name and renames it into place when the block succeeds.

    Yields the open h5py.File. Without overwrite an existing file at path is an error; with it, the old
    store is replaced only once the new one is complete, and its files beside it are removed then. Files of
    any other store found there are moved aside, never deleted (store_files.tidy). The store's write lock is
    held throughout: the caller's, or one taken here, so two runs can never create or replace the same store
    at once.
    """
    path = Path(path)
    check_not_a_folder(path)  # before the lock, which makes PATH.d beside it
    if not path.parent.exists():
        raise VitseeError(f"folder {path.parent} does not exist: create it first or choose another store path")
    own = lock is None
    lock = WriteLock(path) if own else lock
    try:
        if path.exists() and not overwrite:
            raise VitseeError(f"{path} already exists: pass --overwrite to replace it, or choose another path")
        replaced = existing_store_id(path)  # its files beside it go with it
        remove_stale_starts(path)
        tmp = path.with_name(f".{path.name}.creating-{os.getpid()}")
        tmp.unlink(missing_ok=True)  # a leftover of an earlier process with this pid (a link: never written through)
        try:
            file = open_h5(tmp, "w")
        except OSError as exc:
            raise VitseeError(f"cannot create {tmp} ({brief(exc)}): check that {path.parent} is writable") from exc
        try:
            file.attrs["vitsee_format"] = FORMAT_VERSION
            file.attrs["store_id"] = store_id = uuid.uuid4().hex
            file.attrs["created"] = time.strftime("%Y-%m-%dT%H:%M:%S")
            file.attrs["versions"] = json_attr(versions())
            yield file
            file.close()
            reserve_blocks(tmp, os.path.getsize(tmp), path)
            durable_rename(tmp, path)
            tidy(path, store_id, replaced=replaced)  # a kill before this leaves them to the next writer: moved aside
        except BaseException:
            if file.id.valid:
                file.close()
            tmp.unlink(missing_ok=True)
            raise
    finally:
        if own:
            lock.release()
