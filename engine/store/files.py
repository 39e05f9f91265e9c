"""A store's files on disk: opening them, writing one whole, reserving its blocks, and the folder beside it.

Opening and writing (the second half of this module): every HDF5 file is opened without HDF5's own file
locking (writers take the store's lock, store/lock.py), and a new file is written under a temporary name,
fsynced and renamed, so a kill or a full disk leaves the old file or the new one, never half of it.

The folder (STORE.d) is made only of real folders, tidied without following a link, and the files of another
store are moved aside, never deleted.

STORE.d sits beside a file that can be moved, copied or replaced on its own, so what the folder holds is not
always the store's. Every file in it carries the store_id of the store that wrote it (see store/__init__.py); a writer
finds, under its lock:
- temporaries (`.NAME.tmp-PID`) of a write that never finished: removed (no other writer can be busy);
- files of the store it replaced with --overwrite: removed by `creating` right after the replacement;
- files of any other store: that store may have been moved without its folder (`mv run.h5 old.h5`, then a new
  `run.h5`), so they are moved, as they are, to `STORE.d.store-ID/` beside it (ID: the first 12 hex of their
  store_id) with one line saying so; renaming that folder to `old.h5.d` gives them back to their store, and
  `vitsee info old.h5` says where it went.
A symbolic link is never followed for writing or deleting: STORE.d, its models/ and results/ folders and the
results/ANALYSIS folders must be real folders for a writer (store_lock.check_real_folder names the way out), and
a link among the files is left alone. A file, folder or link where a model file should be is refused.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import warnings
from pathlib import Path

import h5py

from vitsee.errors import VitseeError, VitseeNote, brief
from vitsee.store.layout import human_bytes, store_identity
from vitsee.store.lock import check_real_folder, pid_alive, read_only_mount, sidecar_dir

ASIDE = ".store-"  # STORE.d.store-ID: the files of another store, moved aside
ASIDE_ID = 12  # hex digits of the store_id in that name


def real_folder(store: Path, *parts: str) -> Path:
    """Returns STORE.d/parts..., made where missing, after checking that it and every folder above it up to
    STORE.d is a real folder (a VitseeError naming the way out otherwise)."""
    folder = sidecar_dir(store)
    for i in range(len(parts) + 1):
        if i:
            folder = folder / parts[i - 1]
        if not check_real_folder(store, folder, "/".join(("its folder", *parts[:i])) if i else "its folder's files"):
            try:
                folder.mkdir()
            except FileExistsError:  # made by someone just now: check what
                check_real_folder(store, folder, "its files")
    return folder


def check_writable_layout(store: Path) -> None:
    """Raises a VitseeError naming the way out unless STORE.d, models/ and results/ are real folders or absent."""
    folder = sidecar_dir(store)
    if check_real_folder(store, folder, "its appended models, cached results and lock"):
        check_real_folder(store, folder / "models", "its appended models")
        check_real_folder(store, folder / "results", "its cached results")


def is_real_folder(path: Path) -> bool:
    """Returns whether path is a folder and not a symbolic link to one."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def is_real_file(path: Path) -> bool:
    """Returns whether path is a regular file and not a symbolic link to one."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def data_files(store: Path) -> list[Path]:
    """Returns the regular files (links left out) in STORE.d/models and STORE.d/results/*/, sorted: what a
    writer tidies and what moves aside."""
    root = sidecar_dir(store)
    if not is_real_folder(root):
        return []
    folders = [root / "models"]
    if is_real_folder(root / "results"):
        folders += sorted(p for p in (root / "results").iterdir() if is_real_folder(p))
    return [p for folder in folders if is_real_folder(folder) for p in sorted(folder.iterdir()) if is_real_file(p)]


def file_store_id(path: Path) -> str | None:
    """Returns the store_id a store file records, None when it cannot be read or has none."""
    try:
        with h5py.File(path, "r", locking=False) as f:
            value = f.attrs.get("store_id")
    except (OSError, ValueError):
        return None
    return None if value is None else str(value)


def tidy(store: Path, store_id: str, replaced: str | None = None) -> list[Path]:
    """Removes a killed writer's temporaries and the files of the store `replaced` (--overwrite), moves the files
    of any other store aside (see the module docstring, with one VitseeNote per store) and returns where they went.
    The caller holds the store's write lock."""
    foreign: dict[str, list[Path]] = {}
    for p in data_files(store):
        if ".tmp-" in p.name:
            p.unlink(missing_ok=True)  # a write that never finished; no other writer can be busy
            continue
        if not p.name.endswith(".h5"):
            continue
        owner = file_store_id(p)
        if owner is None or owner == store_id:
            continue  # ours, or unreadable: left alone (readers skip it)
        if owner == replaced:
            p.unlink(missing_ok=True)
        else:
            foreign.setdefault(owner, []).append(p)
    return [_move_aside(store, owner, files) for owner, files in sorted(foreign.items())]


def _move_aside(store: Path, owner: str, files: list[Path]) -> Path:
    """Moves another store's files from STORE.d to STORE.d.store-ID/ (the same layout inside) and says so."""
    root = sidecar_dir(store)
    aside, n = root.with_name(f"{root.name}{ASIDE}{owner[:ASIDE_ID]}"), 1
    while os.path.lexists(aside) and not is_real_folder(aside):
        n += 1
        aside = root.with_name(f"{root.name}{ASIDE}{owner[:ASIDE_ID]}-{n}")
    moved = 0
    for p in files:
        dest = aside / p.relative_to(root)
        if _make_folders(aside, dest.parent.relative_to(aside)) and not os.path.lexists(dest):  # never over a file
            os.rename(p, dest)
            moved += 1
    warnings.warn(
        f"{store}: moved {moved} file(s) of another store (store_id {owner[:ASIDE_ID]}...: models and results made "
        f"before {store.name} was made or replaced) aside to {aside.name}/; "
        "if that store was moved without its folder, rename this one to its name + '.d' (`vitsee info` on it says so)",
        VitseeNote,
        stacklevel=2,
    )
    return aside


def _make_folders(top: Path, rel: Path) -> bool:
    """Makes top/rel folder by folder; returns False where a part of it exists but is not a real folder."""
    folder = top
    for part in ("", *rel.parts):
        folder = folder / part if part else folder
        if not is_real_folder(folder):
            if os.path.lexists(folder):
                return False
            folder.mkdir()
    return True


def find_moved_folder(store: Path, store_id: str) -> Path | None:
    """Returns a folder beside the store holding files of this store_id other than its own STORE.d: one moved
    aside (STORE2.d.store-ID) or the folder of the path it was moved from. None when there is none."""
    own = sidecar_dir(store)
    beside = sorted(p for p in store.parent.iterdir() if p != own and is_real_folder(p))
    aside = [p for p in beside if ASIDE in p.name and p.name.rpartition(ASIDE)[2][:ASIDE_ID] == store_id[:ASIDE_ID]]
    if aside:
        return aside[0]
    for folder in beside:
        if folder.name.endswith(".d") and any(file_store_id(p) == store_id for p in data_files(folder.with_suffix(""))):
            return folder
    return None


# --- opening and writing a store's files ----------------------------------------------------------------------


def open_h5(path: Path, mode: str) -> h5py.File:
    """Returns the HDF5 file at path opened in mode, without HDF5's own file locking."""
    # HDF5's own flock is off: it fails on NFS/ZFS, and it would stop a reader (the terminal app) from
    # looking at a store while extraction fills it. Writers take their own lock (see Store.writer).
    return h5py.File(path, mode, locking=False)


def check_not_a_folder(path: Path) -> None:
    """Raises a VitseeError naming the way out when path, where a store is to be written, is a folder (or a link
    to one): a store is a file, and a folder is the user's, never replaced or deleted, with --overwrite or not."""
    if path.is_dir():
        raise VitseeError(
            f"{path} is a folder, not a store file: name the store to write, such as {path / 'run.h5'} "
            "(a folder is never replaced, even with --overwrite)"
        )


def check_store_path(path: Path) -> None:
    """Raises a VitseeError naming the way out unless path is a non-empty file (what a store is)."""
    if not path.exists():
        if is_real_folder(sidecar_dir(path)):  # the store was deleted by hand (or moved) without its folder
            raise VitseeError(f"store {path} does not exist; {leftover_words(path)}")
        raise VitseeError(
            f"store {path} does not exist: create it with `vitsee extract {path} --model NAME --dataset DATASET`"
        )
    if path.is_dir():
        raise VitseeError(f"store {path} is a folder: give the path of a .h5 store file")
    if path.stat().st_size == 0:  # HDF5 would turn an empty file opened for writing into an HDF5 file
        raise VitseeError(
            f"store {path} is an empty file, not a vitsee store: "
            "give a store made by `vitsee extract` (which replaces this file with --overwrite)"
        )


def open_store_file(path: Path, mode: str, what: str = "vitsee store") -> h5py.File:
    """Opens one of a store's HDF5 files, naming the real cause when it cannot be (never inviting
    --overwrite for a file that is merely unreadable to this user)."""
    if mode != "r" and read_only_mount(path):
        raise VitseeError(
            f"{path} is on a read-only file system: the store is intact; copy it with its folder "
            "somewhere writable to add to it (reading works where it is)"
        )
    if mode != "r" and not os.access(path, os.W_OK):
        raise VitseeError(
            f"{path} is read-only for this user: the store is intact; fix its permissions (chmod u+w) "
            "or copy it somewhere writable"
        )
    if not os.access(path, os.R_OK):
        raise VitseeError(f"{path} cannot be read by this user (permission denied): fix its permissions (chmod u+r)")
    try:
        return open_h5(path, mode)
    except OSError as exc:
        if getattr(exc, "errno", None) in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise VitseeError(f"{path} cannot be opened ({brief(exc)}): fix its permissions") from exc
        raise VitseeError(
            f"{path} is not a readable {what} ({brief(exc)}): it is damaged or not HDF5; "
            "restore it from a copy, or re-create it with `vitsee extract ... --overwrite`"
        ) from exc


def existing_store_id(path: Path) -> str | None:
    """Returns the identity of the store at path, None when there is none (or it cannot be read as one)."""
    if not is_real_file(path):
        return None
    try:
        with open_h5(path, "r") as f:
            return store_identity(f) if "vitsee_format" in f.attrs else None
    except OSError:
        return None


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


def check_shard_file(store: Path, shard: Path, run_id) -> None:
    """Raises VitseeError unless the shard is there, readable, and from the run that made the store."""
    if not shard.exists():
        raise VitseeError(
            f"{store} reads its rows from shard {shard}, which is missing: put the store's "
            f".shards folder back beside it, or re-extract"
        )
    try:
        with open_h5(shard, "r") as f:
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


def reserve_blocks(file: Path, size: int, store: Path) -> None:
    """Allocates the file's blocks up to size (posix_fallocate), so later in-place writes cannot hit a
    full disk; raises VitseeError naming the space needed when there is not enough."""
    if not hasattr(os, "posix_fallocate") or size <= 0:
        return
    fd = os.open(file, os.O_RDWR)
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise no_space(store, file, size) from None
        # file systems without fallocate (some network ones): the up-front disk check is all we have
    finally:
        os.close(fd)


def no_space(store: Path, file: Path, needed: int) -> VitseeError:
    """Returns the error for a disk too small for file of store: what it needs, what is free, the way out."""
    free = shutil.disk_usage(file.parent).free
    return VitseeError(
        f"not enough disk space for {store}: {file.name} needs {human_bytes(needed)} and {file.parent} has "
        f"{human_bytes(free)} free; free some space and rerun the same command (nothing finished is lost)"
    )


def write_file_atomically(final: Path, fill, store: Path) -> None:
    """Makes the HDF5 file `final` by calling fill(h5py.File) on a temporary file, flushing it to disk and
    renaming it into place: a kill or a full disk at any moment leaves the old file (or none), never half
    of the new one. Its folders under STORE.d must be real ones (never a link) and final no folder; a link at
    final is replaced, its target left alone."""
    real_folder(store, *final.parent.relative_to(sidecar_dir(store)).parts)
    if is_real_folder(final):
        raise VitseeError(
            f"{final} is a folder where {store.name} keeps a file: move it away (`mv {final} {final}.moved`) and rerun"
        )
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    tmp.unlink(missing_ok=True)  # a leftover of an earlier process with this pid (a link: never written through)
    try:
        with open_h5(tmp, "w") as f:
            fill(f)
        durable_rename(tmp, final)
    except VitseeError:
        tmp.unlink(missing_ok=True)
        raise
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        if getattr(exc, "errno", None) == errno.ENOSPC or shutil.disk_usage(final.parent).free < (1 << 20):
            raise no_space(store, final, 1 << 20) from None
        raise VitseeError(f"cannot write {final} ({brief(exc)}): check the folder's permissions and space") from exc
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def durable_rename(tmp: Path, final: Path) -> None:
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


def copy_store(src: str | Path, dst: str | Path) -> Path:
    """Copies a store with its folder of appended models and cached results (not its lock); returns dst.
    A plain copy of the store file alone keeps its images and first models but not what was added later."""
    src, dst = Path(src), Path(dst)
    shutil.copy2(src, dst)
    folder = sidecar_dir(src)
    if folder.is_dir():
        shutil.copytree(folder, sidecar_dir(dst), ignore=shutil.ignore_patterns("lock", ".*"), dirs_exist_ok=True)
    return dst


def leftover_words(path: Path) -> str:
    """Returns what to do with the folder of a store that is gone, in words: move it beside the store that claims
    its files (one beside it, when there is), or remove it with --leftover."""
    folder = sidecar_dir(path)
    ids = {file_store_id(p) for p in data_files(path)} - {None}
    owner = claimed_by(path, ids)
    if owner is not None:
        return (
            f"its folder {folder.name} holds the files of {owner.name} (the store was moved from {path.name} to "
            f"{owner.name} without it): move the folder beside it (`mv {folder} {sidecar_dir(owner)}`)"
        )
    files = data_files(path)
    return (
        f"its folder {folder} is left ({len(files)} cached result or model file(s), "
        f"{human_bytes(sum(p.stat().st_size for p in files))}): if you moved the store, move the folder beside it "
        f"(`mv {folder} NEW.h5.d`); to remove it, `vitsee rm {path} --leftover`"
    )


def claimed_by(path: Path, ids: set[str]) -> Path | None:
    """Returns a store file beside path whose id is among ids (the store the folder's files belong to), or None."""
    if not ids:
        return None
    for other in sorted(path.parent.iterdir()):
        if other != path and is_real_file(other) and other.suffix in (".h5", ".hdf5") and file_store_id(other) in ids:
            return other
    return None
