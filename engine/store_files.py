"""The files of a store's folder (STORE.d): made only as real folders, tidied without following a link, and the
files of another store moved aside, never deleted.

STORE.d sits beside a file that can be moved, copied or replaced on its own, so what the folder holds is not
always the store's. Every file in it carries the store_id of the store that wrote it (see store.py); a writer
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

import os
import stat
import warnings
from pathlib import Path

import h5py

from .errors import VitseeError, VitseeNote
from .store_lock import check_real_folder, sidecar_dir

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
        f"before {store.name} was made or replaced) aside to {aside.name}/; if that store was moved without its folder, "
        "rename this one to its name + '.d' (`vitsee info` on it says so)",
        VitseeNote, stacklevel=2,
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
