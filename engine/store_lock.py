"""The one-writer lock of a store: a POSIX record lock on STORE.d/lock.

Why POSIX (fcntl) locks and not flock: a flock belongs to the open file description, so DataLoader worker
processes forked by extraction inherit it and keep the store locked for seconds after their parent was
killed; the rerun is then told, wrongly, that someone else is writing. A POSIX lock belongs to the process
that took it: fork does not pass it on, and the kernel drops it the moment that process dies, so a stale
lock never blocks. The lock file names its holder (pid, command, start time), so the refusal can tell a
live writer from one that has gone. The file itself is never deleted (deleting a lock file races with the
next process opening it).

POSIX locks have one trap: closing any descriptor of the file drops every lock the process holds on it.
So this module opens the lock file once per store and path per process and counts its holders; a second
writer inside the same process is refused like one in another process.
"""
from __future__ import annotations

import errno
import fcntl
import os
import sys
import threading
import time
from pathlib import Path

from .errors import VitseeError, brief

_HELD: dict[str, "WriteLock"] = {}
_HELD_GUARD = threading.Lock()


def sidecar_dir(store: Path) -> Path:
    """Returns the folder beside a store that holds its appended models, cached results and lock."""
    return store.with_name(store.name + ".d")


def lock_file(store: Path) -> Path:
    return sidecar_dir(store) / "lock"


def pid_alive(pid: int) -> bool:
    """Returns whether a process with this pid exists on this machine (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _holder(fd: int) -> str:
    """Returns who holds the lock, from what they wrote into the lock file."""
    try:
        text = os.pread(fd, 4096, 0).decode(errors="replace").splitlines()
    except OSError:
        text = []
    if not text or not text[0].strip().isdigit():
        return "another vitsee process"
    pid = int(text[0])
    command = text[1] if len(text) > 1 else "vitsee"
    started = text[2] if len(text) > 2 else "?"
    if pid == os.getpid():
        return f"this process ({command}, since {started})"
    if pid_alive(pid):
        return f"process {pid} ({command}, since {started})"
    # the kernel drops a dead process's lock, so a live lock under a dead pid is held on another machine (NFS)
    return f"a process on another machine, or pid {pid} in another container ({command}, since {started})"


class WriteLock:
    """An exclusive, non-blocking write lock on a store; `release()` (or the context manager) frees it."""

    def __init__(self, store: str | Path, command: str | None = None):
        self.store = Path(store)
        self.path = lock_file(self.store)
        self._fd: int | None = None
        key = os.path.realpath(self.path)
        with _HELD_GUARD:
            held = _HELD.get(key)
            if held is not None:
                raise VitseeError(
                    f"{self.store} is being written by {_holder(held._fd)}: wait for it to finish, or use another store"
                )
            self._open_and_lock(command)
            _HELD[key] = self
        self._key = key

    def _open_and_lock(self, command: str | None) -> None:
        folder = self.path.parent
        if not self.store.parent.is_dir():
            raise VitseeError(f"folder {self.store.parent} does not exist: create it first or choose another store path")
        try:
            folder.mkdir(exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise _permission_error(self.store, folder, exc) from exc
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _holder(fd)
            os.close(fd)
            if exc.errno in (errno.EACCES, errno.EAGAIN):
                raise VitseeError(f"{self.store} is being written by {holder}: wait for it to finish, or use another store") from None
            raise VitseeError(
                f"cannot lock {self.path} ({brief(exc)}): the file system may not support locks (NFS without lockd); "
                "put the store on a local disk"
            ) from exc
        stamp = f"{os.getpid()}\n{command or ' '.join(['vitsee', *sys.argv[1:2]])}\n{time.strftime('%Y-%m-%d %H:%M:%S')}\n"
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, stamp.encode(), 0)
        except OSError:
            pass  # the lock holds without its label
        self._fd = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Frees the lock (idempotent); the lock file stays (see the module docstring)."""
        if self._fd is None:
            return
        with _HELD_GUARD:
            _HELD.pop(self._key, None)
            os.close(self._fd)  # drops the POSIX lock
            self._fd = None

    def __enter__(self) -> WriteLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def __del__(self):
        try:
            self.release()
        except Exception:
            pass


def _permission_error(store: Path, folder: Path, exc: OSError) -> VitseeError:
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        where = folder if folder.exists() else folder.parent
        return VitseeError(
            f"cannot write beside {store}: {where} is read-only for this user ({brief(exc)}); "
            "the store is intact: fix the permissions (chmod/chown) or copy it somewhere writable"
        )
    return VitseeError(f"cannot create the lock {folder / 'lock'} ({brief(exc)}): check the folder")
