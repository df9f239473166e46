"""File primitives of the local state store: atomic writes (temp file, fsync, rename, directory
fsync), reads, listings, an exclusive lock on an open file, and ``OSError`` translated into the
store's errors.

Portable: on POSIX the lock is ``fcntl.flock``; on Windows, where there is no ``fcntl``, it is
``msvcrt.locking`` on the file's first byte, polled, since its blocking mode gives up after ten
seconds. Either way the operating system drops the lock of a process that dies, so a killed
process cannot wedge the store. Windows has no directory fsync (NTFS journals the rename).
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

from azure_functions_db.errors import StateStoreError, TransientStoreError


def _optional(name: str) -> ModuleType | None:
    try:
        return __import__(name)
    except ImportError:
        return None


_fcntl = _optional("fcntl")  # POSIX
_msvcrt = _optional("msvcrt") if _fcntl is None else None  # Windows
#: Which lock the store uses here: ``flock``, ``msvcrt``, or ``None`` (no file locks at all).
LOCKS = "flock" if _fcntl is not None else "msvcrt" if _msvcrt is not None else None
#: Seconds between two tries of a contended ``msvcrt`` lock.
LOCK_POLL = 0.005
_LOCK_BUSY = frozenset({errno.EACCES, errno.EDEADLK, errno.EAGAIN})

TRANSIENT_ERRNOS = frozenset(
    {errno.EAGAIN, errno.EWOULDBLOCK, errno.EINTR, errno.EBUSY, errno.ETIMEDOUT, errno.ENOLCK}
)


def read_file(path: Path) -> bytes | None:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise translate(exc, "read", path) from exc


def write_atomic(path: Path, data: bytes) -> None:
    temp = path.parent / f".{path.name}.{uuid.uuid4().hex}.tmp"
    with os_errors("write", path):
        try:
            with open(temp, "xb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp)
            raise
        fsync_directory(path.parent)


def open_lock_file(path: Path) -> int:
    """Open (creating it) the lock file ``path``; not inherited by child processes."""
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOINHERIT", 0)
    return os.open(path, flags, 0o644)


def lock_exclusive(fd: int) -> None:
    """Wait until this process holds the exclusive lock of the open lock file ``fd``. Released
    by :func:`unlock` or by closing ``fd``, and by the system when the process dies."""
    if _fcntl is not None:
        _fcntl.flock(fd, _fcntl.LOCK_EX)
        return
    if _msvcrt is None:
        raise StateStoreError(
            "The local state store needs file locks (fcntl or msvcrt), which this platform does "
            "not have: use BlobStateStore or TableStateStore."
        )
    while True:
        os.lseek(fd, 0, os.SEEK_SET)
        try:
            _msvcrt.locking(fd, _msvcrt.LK_NBLCK, 1)
            return
        except OSError as exc:
            if exc.errno not in _LOCK_BUSY:
                raise
        time.sleep(LOCK_POLL)


def unlock(fd: int) -> None:
    """Release the lock :func:`lock_exclusive` took (Windows releases a closed file's locks
    only eventually, so they are released first)."""
    if _fcntl is None and _msvcrt is not None:
        os.lseek(fd, 0, os.SEEK_SET)
        _msvcrt.locking(fd, _msvcrt.LK_UNLCK, 1)


def fsync_directory(directory: Path) -> None:
    """Make a directory's entries (a rename, a new file) durable; a no-op on Windows, which
    cannot open a directory as a file."""
    directory_flag = getattr(os, "O_DIRECTORY", None)
    if directory_flag is None:
        return
    fd = os.open(directory, os.O_RDONLY | directory_flag | getattr(os, "O_CLOEXEC", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def list_dir(directory: Path) -> list[str]:
    try:
        return os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as exc:
        raise translate(exc, "list", directory) from exc


@contextlib.contextmanager
def os_errors(action: str, path: Path) -> Iterator[None]:
    try:
        yield
    except OSError as exc:
        raise translate(exc, action, path) from exc


def translate(exc: OSError, action: str, path: Path) -> StateStoreError:
    cls = TransientStoreError if exc.errno in TRANSIENT_ERRNOS else StateStoreError
    return cls(
        f"Local state store could not {action} `{path}`: {exc.strerror or exc}. Check that the "
        "directory is writable by this user and the disk is not full."
    )
