"""`vitsee rm STORE`: a store's file and everything of it beside it, removed together, and nothing else.

A store is STORE plus STORE.d/ (its appended models, cached results and lock) and, when torchrun made it, the shards
in STORE.shards/. Deleting STORE by hand leaves STORE.d behind, and the next store of that name then moves it aside.
`remove_store` removes, under the store's write lock (never while another vitsee process writes it):
- STORE itself first, so that a kill at any moment leaves either the whole store or a folder without its store;
- then in STORE.d and STORE.shards the files that carry this store's id (store_id, or its shards' run_id), the
  temporaries of killed writes and the lock, then the folders left empty.
Files of another store (moved there with the folder), files vitsee did not write and symbolic links are left where
they are and named: vitsee removes only what it can tell is this store's, and never deletes through a link.

`remove_leftover` removes a STORE.d whose STORE is gone (deleted by hand, or a `vitsee rm` killed half-way) once
the user says so (`vitsee rm STORE --leftover`): the folder may also belong to a store that was moved
(`mv run.h5 old.h5`), whose cached results and appended models would be lost with it, so a store beside it that
claims its files is named instead, and nothing is removed.
"""

from __future__ import annotations

import os
from pathlib import Path

from vitsee.errors import VitseeError, brief
from vitsee.store.files import claimed_by, data_files, file_store_id, is_real_file, is_real_folder, leftover_words
from vitsee.store.layout import human_bytes
from vitsee.store.lock import WriteLock, lock_file, sidecar_dir


def shards_dir(store: Path) -> Path:
    """Returns the folder beside a store where torchrun's shards of it are kept."""
    return store.with_name(store.name + ".shards")


def store_identity_of(path: Path) -> tuple[str, str | None]:
    """Returns (store_id, run_id) of a vitsee store file; a VitseeError naming the way out for anything else (a
    folder, a link, a file vitsee did not write): nothing is removed then."""
    import h5py

    if path.is_symlink():
        raise VitseeError(
            f"{path} is a symbolic link (to {os.readlink(path)}): vitsee rm never deletes through a link; remove the "
            f"link itself (`rm {path}`), or name the store it points to"
        )
    if path.is_dir():
        raise VitseeError(f"{path} is a folder, not a store file: vitsee rm removes stores only; nothing was removed")
    try:
        with h5py.File(path, "r", locking=False) as f:
            if "vitsee_format" not in f.attrs:
                raise VitseeError(
                    f"{path} is an HDF5 file but not a vitsee store (no vitsee_format): nothing was removed; "
                    "if it is yours to delete, `rm` it"
                )
            from vitsee.store.layout import store_identity

            run_id = f.attrs.get("run_id")
            return store_identity(f), None if run_id is None else str(run_id)
    except VitseeError:
        raise
    except (OSError, ValueError, KeyError) as exc:
        raise VitseeError(
            f"{path} cannot be read as a vitsee store ({brief(exc)}): nothing was removed; if it is a damaged store "
            f"you mean to delete, `rm {path}` and then `vitsee rm {path} --leftover` removes its folder"
        ) from None


def remove_store(path: str | Path) -> dict:
    """Removes the store at path (see the module); returns {removed: [paths], left: [paths], bytes: int}."""
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        folder = sidecar_dir(path)
        if is_real_folder(folder):
            raise VitseeError(f"store {path} does not exist; {leftover_words(path)}")
        raise VitseeError(f"store {path} does not exist: nothing to remove")
    store_id, run_id = store_identity_of(path)
    lock = WriteLock(path, command="vitsee rm")  # refused while another process writes the store
    try:
        store_id_again, run_id = store_identity_of(path)  # the file the lock guards, as it is now
        if store_id_again != store_id:
            raise VitseeError(f"{path} was replaced by another store while vitsee rm started: rerun it")
        size = path.stat().st_size
        shard_files = _shard_files(path, run_id)
        path.unlink()  # first: from here on a kill leaves a folder without its store, which --leftover removes
        removed, freed = [path], size
        for shard in shard_files:
            freed += shard.stat().st_size
            shard.unlink()
            removed.append(shard)
        gone, more = _remove_files_of(path, {store_id})
        removed += gone
        freed += more
        _remove_empty(shards_dir(path))
        _remove_lock_and_empty_folders(path)  # under the lock: a writer starting now finds it held, or no folder
    finally:
        lock.release()
    return {"removed": removed, "left": _what_is_left(path), "bytes": freed}


def remove_leftover(path: str | Path) -> dict:
    """Removes the folder of a store that is gone (see the module); returns what remove_store returns."""
    path = Path(path)
    folder = sidecar_dir(path)
    if path.exists() or path.is_symlink():
        raise VitseeError(f"{path} exists: --leftover removes only the folder of a store that is gone; drop it")
    if folder.is_symlink():
        raise VitseeError(f"{folder} is a symbolic link: vitsee rm never deletes through one; remove the link itself")
    if not is_real_folder(folder):
        raise VitseeError(f"{folder} does not exist: nothing is left of store {path}")
    ids = {file_store_id(p) for p in data_files(path)} - {None}
    owner = claimed_by(path, ids)
    if owner is not None:
        raise VitseeError(f"store {path} does not exist; {leftover_words(path)}; nothing was removed")
    lock = WriteLock(path, command="vitsee rm --leftover")
    try:
        removed, freed = _remove_files_of(path, ids)
        _remove_empty(shards_dir(path))
        _remove_lock_and_empty_folders(path)
    finally:
        lock.release()
    return {"removed": removed, "left": _what_is_left(path), "bytes": freed}


def _shard_files(path: Path, run_id: str | None) -> list[Path]:
    """Returns the shard files of the store in STORE.shards/ (real files carrying its run_id): those it removes."""
    import h5py

    folder = shards_dir(path)
    if run_id is None or not is_real_folder(folder):
        return []
    out = []
    for shard in sorted(folder.iterdir()):
        if not is_real_file(shard):
            continue
        try:
            with h5py.File(shard, "r", locking=False) as f:
                if str(f.attrs.get("run_id")) == run_id:
                    out.append(shard)
        except (OSError, ValueError):
            continue
    return out


def _remove_files_of(path: Path, ids: set[str]) -> tuple[list[Path], int]:
    """Removes STORE.d's model and result files carrying one of ids and the temporaries of killed writes (links and
    other files left: _what_is_left names them); returns (removed, bytes freed)."""
    removed, freed = [], 0
    for p in data_files(path):
        if ".tmp-" in p.name or file_store_id(p) in ids:
            freed += p.stat().st_size
            p.unlink()
            removed.append(p)
    return removed, freed


def _remove_lock_and_empty_folders(path: Path) -> None:
    folder = sidecar_dir(path)
    lock = lock_file(path)
    if is_real_file(lock):
        lock.unlink()
    if not is_real_folder(folder):
        return
    results = folder / "results"
    if is_real_folder(results):
        for sub in results.iterdir():
            _remove_empty(sub)
    for sub in (results, folder / "models", folder):
        _remove_empty(sub)


def _remove_empty(folder: Path) -> None:
    if is_real_folder(folder):
        try:
            folder.rmdir()
        except OSError:  # not empty: what is left is named by _what_is_left
            pass


def _what_is_left(path: Path) -> list[Path]:
    """Returns what is still in STORE.d and STORE.shards (files of other stores, links, files not vitsee's)."""
    out = []
    for folder in (sidecar_dir(path), shards_dir(path)):
        if is_real_folder(folder):
            out += [p for p in sorted(folder.rglob("*")) if not is_real_folder(p)]
    return out


def summary(path: Path, done: dict) -> str:
    """Returns the line `vitsee rm` prints: what it removed and what it left, and why."""
    text = f"removed {path} and its files beside it: {len(done['removed'])} file(s), {human_bytes(done['bytes'])}"
    if done["left"]:
        names = ", ".join(str(p) for p in done["left"][:3]) + (" ..." if len(done["left"]) > 3 else "")
        text += (
            f"; left {len(done['left'])} that are not this store's (another store's files, links, files vitsee did "
            f"not write): {names}"
        )
    return text
