"""A file-backed state store (:class:`~azure_functions_db.core.ports.StateStore`), safe across
processes on one host.

Layout under the root directory (names are percent-encoded so any poller name is one safe file
name)::

    <root>/<namespace>/<poller>.checkpoint   "afdb-checkpoint etag=<hex>\\n" + record bytes
    <root>/<namespace>/<poller>.lease        JSON: lease_id, owner, expires_at (epoch s), fence
    <root>/<namespace>/<poller>.lock         empty; its lock serialises read-modify-write
    <root>/<namespace>/<poller>.quarantine/<id>.record
                                             a quarantine record, with the checkpoint's header

Every change happens under an exclusive lock on the poller's lock file (``flock``; ``msvcrt``
locking on Windows, see ``_files``) and lands with
temp file + fsync + ``os.replace`` + directory fsync, so a reader sees the old or the new file,
never half of one, and a crash never leaves a torn record. The system drops a dead process's
lock, so a killed process cannot wedge the store; its lease simply expires. Lease expiry is
decided by the machine's monotonic clock, which cannot step: a wall clock set forward (NTP, an
operator) must not let a second process take a live lease. Every process using one directory
must run on the same machine (``flock`` over network file systems is not trusted here). The
lease file records the kernel's boot id with its monotonic expiry; a lease from an earlier boot
is free (its owner cannot have survived the reboot). Where the kernel has no boot id (not
Linux) expiry falls back to the wall clock.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import functools
import json
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

from azure_functions_db.core.checkpoint import Checkpoint, PollerKey, encode_checkpoint
from azure_functions_db.core.clock import Clock, SystemClock
from azure_functions_db.core.ports import (
    LeaseGrant,
    LeaseInfo,
    StoredCheckpoint,
    StoredQuarantine,
)
from azure_functions_db.core.quarantine import QuarantineRecord, encode_record
from azure_functions_db.errors import (
    CheckpointCorruptError,
    ConfigurationError,
    QuarantineCorruptError,
    RecordExistsError,
    StateStoreError,
)
from azure_functions_db.state import _common
from azure_functions_db.state._files import (
    fsync_directory,
    list_dir,
    lock_exclusive,
    open_lock_file,
    os_errors,
    read_file,
    unlock,
    write_atomic,
)

_CHECKPOINT = ".checkpoint"
_LEASE = ".lease"
_LOCK = ".lock"
_QUARANTINE = ".quarantine"
_RECORD = ".record"
_HEADER = re.compile(rb"afdb-checkpoint etag=([0-9a-f]{32})")


class LocalStateStore:
    """Checkpoints and leases kept as files under one directory, created on first use.

    Args:
        path: Root directory of the store. Every process sharing it must run on this machine.
        clock: Decides lease expiry (``clock.now()``); defaults to the system clock.
    """

    def __init__(self, path: str | os.PathLike[str], clock: Clock | None = None) -> None:
        self._root = Path(os.path.abspath(os.fspath(path)))
        self._clock: Clock = clock if clock is not None else SystemClock()

    # -- paths -------------------------------------------------------------------------------

    @property
    def root(self) -> Path:
        """The absolute root directory."""
        return self._root

    def checkpoint_path(self, key: PollerKey) -> Path:
        """The file holding the checkpoint record of ``key`` (it may not exist yet)."""
        return self._directory(key) / (_encode_name(key.poller, "poller") + _CHECKPOINT)

    def lease_path(self, key: PollerKey) -> Path:
        """The file holding the lease record of ``key`` (it may not exist yet)."""
        return self._directory(key) / (_encode_name(key.poller, "poller") + _LEASE)

    def _directory(self, key: PollerKey) -> Path:
        return self._root / _encode_name(key.namespace, "namespace")

    # -- CheckpointStore ---------------------------------------------------------------------

    def read(self, key: PollerKey) -> StoredCheckpoint | None:
        """See :meth:`azure_functions_db.core.ports.CheckpointStore.read`."""
        path = self.checkpoint_path(key)
        data = read_file(path)
        if data is None:
            return None
        etag, body = _split_record(data)
        if etag is None:
            raise CheckpointCorruptError(
                key.poller, key.namespace, f"`{path}` does not start with a valid header"
            )
        return StoredCheckpoint(checkpoint=_common.decode_record(key, body), etag=etag)

    def create(self, checkpoint: Checkpoint) -> str:
        """See :meth:`azure_functions_db.core.ports.CheckpointStore.create`."""
        key = checkpoint.key
        body = encode_checkpoint(checkpoint)
        path = self.checkpoint_path(key)
        with self._locked(key):
            if os.path.lexists(path):
                raise RecordExistsError(key.poller, key.namespace)
            return _write_record(path, body)

    def replace(self, checkpoint: Checkpoint, etag: str) -> str:
        """See :meth:`azure_functions_db.core.ports.CheckpointStore.replace`."""
        key = checkpoint.key
        body = encode_checkpoint(checkpoint)
        path = self.checkpoint_path(key)
        with self._locked(key):
            data = read_file(path)
            if data is None:
                raise _common.conflict(checkpoint, etag, None, None)
            found_etag, found_body = _split_record(data)
            if found_etag is None:
                raise _common.conflict(
                    checkpoint,
                    etag,
                    None,
                    None,
                    reason=f"`{path}` is corrupt (no valid header); inspect it with `afdb status`",
                )
            if found_etag != etag:
                raise _common.conflict(checkpoint, etag, found_etag, found_body)
            return _write_record(path, body)

    def list_keys(self, namespace: str | None = None) -> Sequence[PollerKey]:
        """See :meth:`azure_functions_db.core.ports.CheckpointStore.list_keys`."""
        if namespace is not None:
            directories = [self._root / _encode_name(namespace, "namespace")]
        else:
            directories = [self._root / name for name in list_dir(self._root)]
        keys: list[PollerKey] = []
        for directory in directories:
            ns = _decode_name(directory.name)
            if ns is None or not directory.is_dir():
                continue
            for name in list_dir(directory):
                if not name.endswith(_CHECKPOINT):
                    continue
                poller = _decode_name(name[: -len(_CHECKPOINT)])
                if poller is not None:
                    keys.append(PollerKey(namespace=ns, poller=poller))
        return sorted(keys, key=lambda k: (k.namespace, k.poller))

    def write_raw(self, key: PollerKey, data: bytes) -> str:
        """Store ``data`` as the record body of ``key`` unconditionally; return its new etag.

        For tests and repair tools only: it plays an out-of-band writer so a test can check how a
        corrupt or foreign record is handled.
        """
        path = self.checkpoint_path(key)
        with self._locked(key):
            return _write_record(path, bytes(data))

    # -- QuarantineStore ---------------------------------------------------------------------

    def quarantine_path(self, key: PollerKey, record_id: str) -> Path:
        """The file holding quarantine record ``record_id`` of ``key`` (it may not exist)."""
        return self._quarantine_directory(key) / (_encode_name(record_id, "record") + _RECORD)

    def _quarantine_directory(self, key: PollerKey) -> Path:
        return self._directory(key) / (_encode_name(key.poller, "poller") + _QUARANTINE)

    def put_quarantined(self, record: QuarantineRecord) -> str:
        """See :meth:`azure_functions_db.core.ports.QuarantineStore.put_quarantined`."""
        body = encode_record(record)
        path = self.quarantine_path(record.key, record.id)
        with self._locked(record.key):
            self._ensure_directory(path.parent)
            if os.path.lexists(path):
                raise _common.quarantine_exists(record)
            return _write_record(path, body)

    def read_quarantined(self, key: PollerKey, record_id: str) -> StoredQuarantine | None:
        """See :meth:`azure_functions_db.core.ports.QuarantineStore.read_quarantined`."""
        path = self.quarantine_path(key, record_id)
        data = read_file(path)
        if data is None:
            return None
        etag, body = _split_record(data)
        if etag is None:
            raise QuarantineCorruptError(
                key.poller, key.namespace, record_id, f"`{path}` does not start with a valid header"
            )
        return StoredQuarantine(_common.decode_quarantined(key, record_id, body), etag)

    def replace_quarantined(self, record: QuarantineRecord, etag: str) -> str:
        """See :meth:`azure_functions_db.core.ports.QuarantineStore.replace_quarantined`."""
        body = encode_record(record)
        path = self.quarantine_path(record.key, record.id)
        with self._locked(record.key):
            data = read_file(path)
            found = _split_record(data)[0] if data is not None else None
            if found is None or found != etag:
                raise _common.quarantine_conflict(record, etag, found)
            return _write_record(path, body)

    def list_quarantined(self, key: PollerKey) -> Sequence[str]:
        """See :meth:`azure_functions_db.core.ports.QuarantineStore.list_quarantined`."""
        ids = []
        for name in list_dir(self._quarantine_directory(key)):
            if name.endswith(_RECORD):
                record_id = _decode_name(name[: -len(_RECORD)])
                if record_id is not None:
                    ids.append(record_id)
        return sorted(ids)

    def write_quarantined_raw(self, key: PollerKey, record_id: str, data: bytes) -> None:
        """Store ``data`` as record ``record_id`` unconditionally (tests: a corrupt record)."""
        path = self.quarantine_path(key, record_id)
        with self._locked(key):
            self._ensure_directory(path.parent)
            _write_record(path, bytes(data))

    # -- LeaseManager ------------------------------------------------------------------------

    def acquire(self, key: PollerKey, owner: str, duration: float) -> LeaseGrant | None:
        """See :meth:`azure_functions_db.core.ports.LeaseManager.acquire`."""
        _common.check_duration(duration)
        path = self.lease_path(key)
        with self._locked(key):
            record = _read_lease(path)
            outcome = _common.acquire(record, key, owner, duration, self._lease_now())
            if outcome is None:
                return None
            write_atomic(path, _encode_lease(outcome[0]))
            return outcome[1]

    def renew(self, grant: LeaseGrant) -> None:
        """See :meth:`azure_functions_db.core.ports.LeaseManager.renew`."""
        path = self.lease_path(grant.key)
        with self._locked(grant.key):
            record = _read_lease(path)
            renewed = _common.renew(record, grant, self._lease_now())
            write_atomic(path, _encode_lease(renewed))

    def release(self, grant: LeaseGrant) -> None:
        """See :meth:`azure_functions_db.core.ports.LeaseManager.release`."""
        path = self.lease_path(grant.key)
        with self._locked(grant.key):
            released = _common.release(_read_lease(path), grant)
            if released is not None:
                write_atomic(path, _encode_lease(released))

    def inspect(self, key: PollerKey) -> LeaseInfo:
        """See :meth:`azure_functions_db.core.ports.LeaseManager.inspect`."""
        record, doc = _read_lease_doc(self.lease_path(key))
        info = _common.info(record, key, self._lease_now())
        info = dataclasses.replace(info, process=_process(doc, info.holder))
        if info.expires_at is None or _boot_id() is None:
            return info
        # Shown as wall-clock time: the monotonic expiry, as far from now as it is.
        wall = self._clock.now() + (info.expires_at - self._lease_now())
        return dataclasses.replace(info, expires_at=wall)

    def _lease_now(self) -> dt.datetime:
        """The lease clock: the monotonic clock as a datetime where the boot id is known."""
        if _boot_id() is None:
            return self._clock.now()
        return _STEADY_EPOCH + dt.timedelta(seconds=self._clock.monotonic())

    # -- StateStore --------------------------------------------------------------------------

    def describe(self) -> str:
        """``local:<absolute root path>``."""
        return f"local:{self._root}"

    def __repr__(self) -> str:
        return f"LocalStateStore({str(self._root)!r}, clock={self._clock!r})"

    # -- internals ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self, key: PollerKey) -> Iterator[None]:
        """Hold the poller's exclusive lock (blocking) for one read-modify-write."""
        directory = self._directory(key)
        lock_path = directory / (_encode_name(key.poller, "poller") + _LOCK)
        self._ensure_directory(directory)
        with os_errors("lock", lock_path):
            fd = open_lock_file(lock_path)
        try:
            with os_errors("lock", lock_path):
                lock_exclusive(fd)
            try:
                yield
            finally:
                with contextlib.suppress(OSError):
                    unlock(fd)
        finally:
            # Closing the descriptor drops the lock (and the system does so if we die).
            os.close(fd)

    def _ensure_directory(self, directory: Path) -> None:
        if directory.is_dir():
            return
        with os_errors("create the directory", directory):
            os.makedirs(directory, exist_ok=True)
            # Make the new directory entries durable before any record lands in them.
            fsync_directory(directory.parent)
        with contextlib.suppress(OSError):
            fsync_directory(directory.parent.parent)


def _encode_name(name: str, what: str) -> str:
    if not isinstance(name, str) or not name:
        raise ConfigurationError(f"The {what} name `{name!r}` must be a non-empty string.")
    encoded = quote(name, safe="")
    # "." and ".." are not file names we may use, and dot files are our temp files.
    return "%2E" + encoded[1:] if encoded.startswith(".") else encoded


def _decode_name(encoded: str) -> str | None:
    """The name behind ``encoded``, or ``None`` for files this store did not name."""
    if not encoded or encoded.startswith("."):
        return None
    try:
        name = unquote(encoded, errors="strict")
    except UnicodeDecodeError:
        return None
    return name if _encode_name(name, "file") == encoded else None


def _write_record(path: Path, body: bytes) -> str:
    etag = _common.new_etag()
    write_atomic(path, b"afdb-checkpoint etag=" + etag.encode("ascii") + b"\n" + body)
    return etag


def _split_record(data: bytes) -> tuple[str | None, bytes]:
    header, newline, body = data.partition(b"\n")
    match = _HEADER.fullmatch(header)
    if match is None or not newline:
        return None, data
    return match.group(1).decode("ascii"), body


#: The origin of lease times on the monotonic clock (any fixed instant will do).
_STEADY_EPOCH = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)


def _lease_clock() -> str:
    """Which clock this machine's lease times are on: ``monotonic`` with a boot id, else wall."""
    return "wall" if _boot_id() is None else "monotonic"


@functools.cache
def _boot_id() -> str | None:
    """The kernel's id of this boot (Linux), or ``None`` where there is none."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def _encode_lease(record: _common.LeaseRecord) -> bytes:
    doc: dict[str, Any] = {
        "lease_id": record.lease_id,
        "owner": record.owner,
        "expires_at": record.expires_at.timestamp() if record.expires_at else None,
        "fence": record.fence,
        # `monotonic`: expires_at is seconds on this boot's monotonic clock (see _lease_now).
        "clock": _lease_clock(),
        "boot_id": _boot_id(),
        # The owning process, so a lease whose process died is free at once (see _owner_alive).
        "pid": os.getpid(),
        "pid_start": _process_start(os.getpid()),
        "pid_ns": _pid_namespace(),
    }
    return json.dumps(doc, sort_keys=True).encode("utf-8")


def _process(doc: Mapping[str, Any], holder: str | None) -> str | None:
    """The lease's process, ``pid 123, alive``; a lease freed because its process died still
    names it (``pid 123, dead``), so an operator sees why it was free early."""
    alive = _owner_alive(doc)
    if alive is None or (holder is None and (alive or doc.get("lease_id") is None)):
        return None
    return f"pid {doc['pid']}, {'alive' if alive else 'dead'}"


@functools.cache
def _pid_namespace() -> str | None:
    """This process's pid namespace (containers on one kernel share the boot id, not pids)."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def _process_start(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot (Linux), or ``None``."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: count after its last `)`.
    return int(stat.rpartition(")")[2].split()[19])


def _owner_alive(doc: Mapping[str, Any]) -> bool | None:
    """Whether the process that wrote the lease still runs: ``None`` if this cannot be known
    (another machine's boot, no ``/proc``, an older lease file)."""
    pid, start = doc.get("pid"), doc.get("pid_start")
    if not isinstance(pid, int) or not isinstance(start, int) or _boot_id() is None:
        return None
    if doc.get("boot_id") != _boot_id() or doc.get("pid_ns") != _pid_namespace():
        return None  # another boot, or another container's process ids: cannot be seen here
    return _process_start(pid) == start  # a dead pid, or one reused by another process


def _read_lease(path: Path) -> _common.LeaseRecord:
    return _read_lease_doc(path)[0]


def _read_lease_doc(path: Path) -> tuple[_common.LeaseRecord, Mapping[str, Any]]:
    """The lease record at ``path`` and the JSON document it was decoded from (``{}``: none)."""
    data = read_file(path)
    if data is None:
        return _common.LeaseRecord(), {}
    try:
        doc = json.loads(data.decode("utf-8"))
        fence, lease_id, owner, expires = (
            doc["fence"],
            doc["lease_id"],
            doc["owner"],
            doc["expires_at"],
        )
        if not isinstance(fence, int) or isinstance(fence, bool) or fence < 0:
            raise ValueError(f"bad fence {fence!r}")
        if not (lease_id is None or isinstance(lease_id, str)):
            raise ValueError(f"bad lease_id {lease_id!r}")
        if not (owner is None or isinstance(owner, str)):
            raise ValueError(f"bad owner {owner!r}")
        if not (expires is None or isinstance(expires, int | float)):
            raise ValueError(f"bad expires_at {expires!r}")
        expires_at = None if expires is None else dt.datetime.fromtimestamp(expires, dt.UTC)
        if expires_at is not None and (
            doc.get("clock", "wall") != _lease_clock() or doc.get("boot_id") != _boot_id()
        ):
            # Written on another boot (its owner is gone) or on another clock: expired.
            expires_at = None
        if expires_at is not None and _owner_alive(doc) is False:
            expires_at = None  # its process was killed: free now, not when the lease expires
    except (ValueError, TypeError, KeyError, OverflowError, OSError) as exc:
        raise StateStoreError(
            f"Lease file `{path}` is corrupt ({exc!r}). Stop every instance of this poller, "
            'then repair the file: write `{"fence": N, "lease_id": null, "owner": '
            'null, "expires_at": null}` with N at least the checkpoint\'s fence (shown by '
            "`afdb status`). Do not delete it: a new lease file restarts its fence at 1, below "
            "the checkpoint's, and the poller then stops with FenceBehindCheckpointError."
        ) from exc
    record = _common.LeaseRecord(fence=fence, lease_id=lease_id, owner=owner, expires_at=expires_at)
    return record, doc
