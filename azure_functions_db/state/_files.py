"""File primitives of the local state store: atomic writes (temp file, fsync, rename, directory
fsync), reads, listings, and ``OSError`` translated into the store's errors."""

from __future__ import annotations

import contextlib
import errno
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

from azure_functions_db.errors import StateStoreError, TransientStoreError

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


def fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
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
