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

Every writer writes the lock file (its pid and command), so it must be the store's own: STORE.d is opened as a
real folder (never through a symbolic link) and the lock inside it with O_NOFOLLOW, and it is used only when it
is a regular file of this user with no other name (a hard link). Otherwise a crafted `lock -> ~/notes.txt`
would have every writer truncate that file.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import sys
import threading
import time
from pathlib import Path

from vitsee.errors import VitseeError, brief


class StoreBusy(VitseeError):
    """Another writer holds the store's lock: the message names it. Worth waiting for (`writer_of` says when it is
    gone), unlike the other failures of a write."""


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


def writer_of(store: str | Path) -> str | None:
    """Returns who is writing the store now ('process 123 (vitsee extract, since ...)'), None when nobody is.

    It asks the kernel who holds the lock (F_GETLK) without taking it, so it never gets in a writer's way and
    never drops a lock this process holds (closing a descriptor of the lock file would: see the module docstring).
    """
    import struct

    path = lock_file(Path(store))
    with _HELD_GUARD:
        held = _HELD.get(os.path.realpath(path))
        if held is not None:
            return _holder(held._fd)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError:
            return None  # no lock file (never written), or not a plain one: nobody is writing through it
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            query = struct.pack(
                "hhqqi", fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0
            )  # struct flock: type, whence, start, len, pid
            answer = fcntl.fcntl(fd, fcntl.F_GETLK, query + bytes(max(0, 32 - len(query))))
            if struct.unpack("hhqqi", answer[: len(query)])[0] == fcntl.F_UNLCK:
                return None
            return _holder(fd)
        except OSError:  # a file system without locks: nobody can be told apart
            return None
        finally:
            os.close(fd)  # this process holds no lock on it (checked above): nothing to drop


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
                raise StoreBusy(
                    f"{self.store} is being written by {_holder(held._fd)}: wait for it to finish, or use another store"
                )
            self._open_and_lock(command)
            _HELD[key] = self
        self._key = key

    def _open_and_lock(self, command: str | None) -> None:
        folder = self.path.parent
        if not self.store.parent.is_dir():
            raise VitseeError(
                f"folder {self.store.parent} does not exist: create it first or choose another store path"
            )
        fd = _open_lock_file(self.store, folder)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _holder(fd)
            os.close(fd)
            if exc.errno in (errno.EACCES, errno.EAGAIN):
                raise StoreBusy(
                    f"{self.store} is being written by {holder}: wait for it to finish, or use another store"
                ) from None
            raise VitseeError(
                f"cannot lock {self.path} ({brief(exc)}): the file system may not support locks (NFS without lockd); "
                "put the store on a local disk"
            ) from exc
        stamp = (
            f"{os.getpid()}\n{command or ' '.join(['vitsee', *sys.argv[1:2]])}\n{time.strftime('%Y-%m-%d %H:%M:%S')}\n"
        )
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


def check_real_folder(store: Path, folder: Path, holds: str) -> bool:
    """Returns whether folder (one of the store's own, holding `holds`) exists, after raising a VitseeError
    naming the way out when it is a symbolic link or not a folder: vitsee never writes or deletes through one."""
    try:
        st = os.lstat(folder)
    except FileNotFoundError:
        return False
    if stat.S_ISLNK(st.st_mode):
        target = os.readlink(folder)
        raise VitseeError(
            f"{folder} is a symbolic link (to {target}) where {store.name} keeps {holds}: vitsee never writes or "
            f"deletes through a link, since the target may be another store's; put the folder itself there "
            f"(`rm {folder} && mv {target} {folder}`), or remove the link to start it afresh"
        )
    if not stat.S_ISDIR(st.st_mode):
        raise VitseeError(
            f"{folder} is {_kind(st.st_mode)}, not the folder where {store.name} keeps {holds}: move it away "
            f"(`mv {folder} {folder}.moved`) and rerun"
        )
    return True


def _kind(mode: int) -> str:
    """Returns what a file of this mode is, in words ('a file', 'a folder', 'a symbolic link', ...)."""
    if stat.S_ISREG(mode):
        return "a file"
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    return "a special file (a pipe, socket or device)"


def _open_lock_file(store: Path, folder: Path) -> int:
    """Returns a read-write descriptor of STORE.d/lock, made if missing, refusing one that is not the store's own
    (see the module docstring)."""
    try:
        if not check_real_folder(store, folder, "its appended models, cached results and lock"):
            folder.mkdir()
        dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileExistsError:  # another writer made it just now: check what it made
        return _open_lock_file(store, folder)
    except OSError as exc:
        raise _permission_error(store, folder, exc) from exc
    lock = folder / "lock"
    try:
        fd = os.open("lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise VitseeError(
                f"{lock} is a symbolic link (to {os.readlink(lock)}): a store's lock is a plain file of its own, and "
                f"every writer writes into it; remove the link (`rm {lock}`) and rerun"
            ) from None
        if exc.errno == errno.EISDIR:
            raise VitseeError(
                f"{lock} is a folder, not the store's lock file: move it away (`mv {lock} {lock}.moved`) and rerun"
            ) from None
        raise _permission_error(store, folder, exc) from exc
    finally:
        os.close(dir_fd)
    st = os.fstat(fd)
    problem = None if stat.S_ISREG(st.st_mode) else _kind(st.st_mode)
    if problem is None and st.st_nlink != 1:
        problem = f"a file with {st.st_nlink} names (a hard link: writing it would change the others)"
    if problem is None and st.st_uid != os.geteuid():
        problem = f"a file of another user (uid {st.st_uid})"
    if problem is not None:
        os.close(fd)
        raise VitseeError(f"{lock} is {problem}, not a lock this user's vitsee made: remove it (`rm {lock}`) and rerun")
    return fd


def read_only_mount(path: Path) -> bool:
    """Returns whether path (or the folder it would be made in) lies on a file system mounted read-only."""
    for where in (path, path.parent):
        try:
            return bool(os.statvfs(where).f_flag & os.ST_RDONLY)
        except OSError:
            continue
    return False


def _permission_error(store: Path, folder: Path, exc: OSError) -> VitseeError:
    where = folder if folder.exists() else folder.parent
    if exc.errno == errno.EROFS or read_only_mount(where):
        return VitseeError(
            f"cannot write beside {store}: {where} is on a read-only file system ({brief(exc)}); the store is intact: "
            "copy it with its folder somewhere writable (`vitsee` reads it where it is)"
        )
    if exc.errno in (errno.EACCES, errno.EPERM):
        return VitseeError(
            f"cannot write beside {store}: {where} is read-only for this user ({brief(exc)}); "
            "the store is intact: fix the permissions (chmod/chown) or copy it somewhere writable"
        )
    return VitseeError(f"cannot create the lock {folder / 'lock'} ({brief(exc)}): check the folder")
