"""An in-memory :class:`~azure_functions_db.core.ports.StateStore` for tests and experiments.

It keeps records as the encoded bytes a real store would hold, so a checkpoint read back has
gone through the same codec, and a corrupt record behaves exactly as it would on Blob or disk.
Lease expiry is decided by the injected clock. One process only; thread-safe.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from azure_functions_db.core.checkpoint import Checkpoint, PollerKey, encode_checkpoint
from azure_functions_db.core.clock import Clock, SystemClock
from azure_functions_db.core.ports import (
    LeaseGrant,
    LeaseInfo,
    StoredCheckpoint,
    StoredQuarantine,
)
from azure_functions_db.core.quarantine import QuarantineRecord, encode_record
from azure_functions_db.errors import RecordExistsError
from azure_functions_db.state import _common


class MemoryStateStore:
    """Checkpoints and leases kept in this process's memory.

    Args:
        clock: Decides lease expiry (``clock.now()``). Defaults to the system clock; tests pass a
            :class:`~azure_functions_db.testing.FakeClock` and move it.
    """

    def __init__(self, clock: Clock | None = None) -> None:
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._lock = threading.Lock()
        self._records: dict[PollerKey, tuple[bytes, str]] = {}
        self._leases: dict[PollerKey, _common.LeaseRecord] = {}
        self._quarantine: dict[tuple[PollerKey, str], tuple[bytes, str]] = {}

    # -- CheckpointStore ---------------------------------------------------------------------

    def read(self, key: PollerKey) -> StoredCheckpoint | None:
        """See :meth:`azure_functions_db.core.ports.CheckpointStore.read`."""
        with self._lock:
            stored = self._records.get(key)
        if stored is None:
            return None
        data, etag = stored
        return StoredCheckpoint(checkpoint=_common.decode_record(key, data), etag=etag)

    def create(self, checkpoint: Checkpoint) -> str:
        """See :meth:`azure_functions_db.core.ports.CheckpointStore.create`."""
        key = checkpoint.key
        data = encode_checkpoint(checkpoint)
        with self._lock:
            if key in self._records:
                raise RecordExistsError(key.poller, key.namespace)
            etag = _common.new_etag()
            self._records[key] = (data, etag)
        return etag

    def replace(self, checkpoint: Checkpoint, etag: str) -> str:
        """See :meth:`azure_functions_db.core.ports.CheckpointStore.replace`."""
        key = checkpoint.key
        data = encode_checkpoint(checkpoint)
        with self._lock:
            stored = self._records.get(key)
            if stored is None:
                raise _common.conflict(checkpoint, etag, None, None)
            if stored[1] != etag:
                raise _common.conflict(checkpoint, etag, stored[1], stored[0])
            new = _common.new_etag()
            self._records[key] = (data, new)
        return new

    def list_keys(self, namespace: str | None = None) -> Sequence[PollerKey]:
        """See :meth:`azure_functions_db.core.ports.CheckpointStore.list_keys`."""
        with self._lock:
            keys = list(self._records)
        return sorted(
            (k for k in keys if namespace is None or k.namespace == namespace),
            key=lambda k: (k.namespace, k.poller),
        )

    def write_raw(self, key: PollerKey, data: bytes) -> str:
        """Store ``data`` as the record of ``key`` unconditionally and return its new etag.

        For tests only: it plays an out-of-band writer (a bad restore, a bug elsewhere) so a
        test can check how a corrupt or foreign record is handled.
        """
        with self._lock:
            etag = _common.new_etag()
            self._records[key] = (bytes(data), etag)
        return etag

    # -- QuarantineStore ---------------------------------------------------------------------

    def put_quarantined(self, record: QuarantineRecord) -> str:
        """See :meth:`azure_functions_db.core.ports.QuarantineStore.put_quarantined`."""
        data = encode_record(record)
        with self._lock:
            if (record.key, record.id) in self._quarantine:
                raise _common.quarantine_exists(record)
            etag = _common.new_etag()
            self._quarantine[record.key, record.id] = (data, etag)
        return etag

    def read_quarantined(self, key: PollerKey, record_id: str) -> StoredQuarantine | None:
        """See :meth:`azure_functions_db.core.ports.QuarantineStore.read_quarantined`."""
        with self._lock:
            stored = self._quarantine.get((key, record_id))
        if stored is None:
            return None
        return StoredQuarantine(_common.decode_quarantined(key, record_id, stored[0]), stored[1])

    def replace_quarantined(self, record: QuarantineRecord, etag: str) -> str:
        """See :meth:`azure_functions_db.core.ports.QuarantineStore.replace_quarantined`."""
        data = encode_record(record)
        with self._lock:
            stored = self._quarantine.get((record.key, record.id))
            if stored is None or stored[1] != etag:
                raise _common.quarantine_conflict(record, etag, stored[1] if stored else None)
            new = _common.new_etag()
            self._quarantine[record.key, record.id] = (data, new)
        return new

    def list_quarantined(self, key: PollerKey) -> Sequence[str]:
        """See :meth:`azure_functions_db.core.ports.QuarantineStore.list_quarantined`."""
        with self._lock:
            return sorted(i for k, i in self._quarantine if k == key)

    def write_quarantined_raw(self, key: PollerKey, record_id: str, data: bytes) -> None:
        """Store ``data`` as record ``record_id`` unconditionally (tests: a corrupt record)."""
        with self._lock:
            self._quarantine[key, record_id] = (bytes(data), _common.new_etag())

    # -- LeaseManager ------------------------------------------------------------------------

    def acquire(self, key: PollerKey, owner: str, duration: float) -> LeaseGrant | None:
        """See :meth:`azure_functions_db.core.ports.LeaseManager.acquire`."""
        with self._lock:
            record = self._leases.get(key, _common.LeaseRecord())
            outcome = _common.acquire(record, key, owner, duration, self._clock.now())
            if outcome is None:
                return None
            self._leases[key] = outcome[0]
            return outcome[1]

    def renew(self, grant: LeaseGrant) -> None:
        """See :meth:`azure_functions_db.core.ports.LeaseManager.renew`."""
        with self._lock:
            record = self._leases.get(grant.key, _common.LeaseRecord())
            self._leases[grant.key] = _common.renew(record, grant, self._clock.now())

    def release(self, grant: LeaseGrant) -> None:
        """See :meth:`azure_functions_db.core.ports.LeaseManager.release`."""
        with self._lock:
            record = self._leases.get(grant.key, _common.LeaseRecord())
            released = _common.release(record, grant)
            if released is not None:
                self._leases[grant.key] = released

    def inspect(self, key: PollerKey) -> LeaseInfo:
        """See :meth:`azure_functions_db.core.ports.LeaseManager.inspect`."""
        with self._lock:
            record = self._leases.get(key, _common.LeaseRecord())
            return _common.info(record, key, self._clock.now())

    # -- StateStore --------------------------------------------------------------------------

    def describe(self) -> str:
        """``memory:<id>``: this store object, which no other process can see."""
        return f"memory:{id(self):x}"

    def __repr__(self) -> str:
        return f"MemoryStateStore(clock={self._clock!r})"
