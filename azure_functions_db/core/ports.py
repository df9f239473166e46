"""The ports between the engine and the outside world. Each method's docstring is its contract.

Every adapter of a port must pass that port's contract suite in :mod:`azure_functions_db.testing`
unchanged; an adapter that behaves differently from the contract is a bug, fakes included.

- :class:`Source`: reads changed rows of one table in keyset order (optionally as the
  handler's changes: :class:`ChangeSource`; the next batch read ahead on a worker thread:
  :class:`~azure_functions_db.core.reader.ReadAheadSource`).
- :class:`CheckpointStore`: one versioned record per poller, written only by compare-and-set.
- :class:`LeaseManager`: one exclusive, expiring lease per poller with a fencing counter.
- :class:`StateStore`: both of the above, in one place (Blob, Table, local file, memory).
- :class:`QuarantineStore`: the records of quarantined batches, kept with the checkpoints.
- :class:`TransactionalSink`: a target that commits a batch's writes and the poller's position
  in one transaction, and refuses writers of an older fence.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from azure_functions_db.core.batch import Batch, Change
from azure_functions_db.core.checkpoint import Checkpoint, PollerKey, SourceDescription
from azure_functions_db.core.position import KeyValue, Position
from azure_functions_db.core.quarantine import QuarantineRecord
from azure_functions_db.errors import SinkFencedError

# --------------------------------------------------------------------------------------------
# State: checkpoint records and leases
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StoredCheckpoint:
    """A checkpoint record as read from a store, with the etag that identifies this version."""

    checkpoint: Checkpoint
    etag: str


@dataclass(frozen=True)
class LeaseGrant:
    """Proof of holding a poller's lease.

    ``lease_id`` is the opaque token that renew/release need; ``fence`` is the fencing token the
    acquire raised (strictly greater than every fence granted before for this poller).
    """

    key: PollerKey
    lease_id: str
    owner: str
    fence: int
    duration: float


@dataclass(frozen=True)
class LeaseInfo:
    """What an observer can see of a poller's lease (for ``status`` and log lines)."""

    key: PollerKey
    state: Literal["held", "free"]
    holder: str | None
    fence: int
    expires_at: dt.datetime | None = None
    #: The holder's process where the store can see it (the local store: ``pid 4242, alive``;
    #: ``pid 4242, dead`` on a lease freed because its process died); ``None`` otherwise.
    process: str | None = None


@runtime_checkable
class CheckpointStore(Protocol):
    """Versioned checkpoint records, one per :class:`PollerKey`, changed only by etag CAS."""

    def read(self, key: PollerKey) -> StoredCheckpoint | None:
        """Return the current record and its etag, or ``None`` when no record exists.

        Raises ``CheckpointCorruptError`` when a record exists but does not decode (bad JSON,
        unknown schema) or names another poller than ``key``; a corrupt record is never
        reported as missing, so it is never overwritten by a create.
        """
        ...

    def create(self, checkpoint: Checkpoint) -> str:
        """Store ``checkpoint`` only if no record exists for its key; return the new etag.

        Raises ``RecordExistsError`` when any record (even a corrupt one) is already there.
        """
        ...

    def replace(self, checkpoint: Checkpoint, etag: str) -> str:
        """Overwrite the record for ``checkpoint.key`` only if its current etag is ``etag``.

        Returns the new etag, which differs from every etag this key had before (the etag
        rotates on every write, even when the content is identical). Raises
        ``CheckpointConflictError`` when the current etag differs or the record does not exist
        (an etag for a missing record is rejected, never turned into a create). The store does
        not inspect fences or positions: those rules live in the core, the etag makes them safe.
        """
        ...

    def list_keys(self, namespace: str | None = None) -> Sequence[PollerKey]:
        """Keys of every stored record (optionally of one namespace), sorted."""
        ...


@runtime_checkable
class LeaseManager(Protocol):
    """One exclusive lease per :class:`PollerKey`, expiring on the store's side, with a fence.

    Expiry is decided by the store (Azure's lease service, or the one machine a local store
    lives on): never by comparing the clocks of two machines. A lease is live while the store's
    time is before its expiry; exactly at expiry it is free.
    """

    def acquire(self, key: PollerKey, owner: str, duration: float) -> LeaseGrant | None:
        """Take the lease if it is free or expired, and raise its fence by one, atomically.

        Returns ``None`` (no error) when another owner holds a live lease. ``owner`` is a human
        readable identity (host, pid) shown by ``status``. Also ``None`` for a lease held by the
        same ``owner`` string under another grant: two grants never coexist.

        The fence lives with the lease and must survive releases and expiries; a store that
        loses it (say, a deleted lease file) restarts at 1, and the core then refuses that owner
        because the checkpoint carries a higher fence: safe, but stuck until repaired.
        """
        ...

    def renew(self, grant: LeaseGrant) -> None:
        """Extend ``grant`` by its duration from now.

        Raises ``LeaseLostError`` if another owner acquired the lease since (fence moved on) or
        the grant was released. Renewing an expired lease nobody else took succeeds and keeps
        the fence.
        """
        ...

    def release(self, grant: LeaseGrant) -> None:
        """Free the lease so the next run can acquire at once; keep the fence counter.

        Idempotent; does nothing (no error) if the lease was already lost to another owner.
        """
        ...

    def inspect(self, key: PollerKey) -> LeaseInfo:
        """Current holder and fence of the lease, without changing it."""
        ...


@dataclass(frozen=True)
class StoredQuarantine:
    """A quarantine record as read from a store, with the etag of this version."""

    record: QuarantineRecord
    etag: str


@runtime_checkable
class QuarantineStore(Protocol):
    """Records of quarantined batches (:mod:`azure_functions_db.core.quarantine`), kept where
    the poller's checkpoint is, each changed only by etag compare-and-set.

    Records have no size limit a batch could reach (a store whose entities are small splits a
    record and writes the part that makes it visible last), and a record is either wholly
    readable or absent: never half written.
    """

    def put_quarantined(self, record: QuarantineRecord) -> str:
        """Store ``record`` only if no record with its key and id exists; return the etag.

        Raises ``RecordExistsError`` when one exists (even a corrupt one).
        """
        ...

    def read_quarantined(self, key: PollerKey, record_id: str) -> StoredQuarantine | None:
        """The record ``record_id`` of ``key`` and its etag, or ``None`` when there is none.

        Raises ``CheckpointCorruptError`` when it exists but does not decode or belongs to
        another poller or id.
        """
        ...

    def replace_quarantined(self, record: QuarantineRecord, etag: str) -> str:
        """Overwrite the record only if its current etag is ``etag``; return the new etag.

        Raises ``CheckpointConflictError`` when the etag differs or the record is gone.
        """
        ...

    def list_quarantined(self, key: PollerKey) -> Sequence[str]:
        """The ids of ``key``'s records, sorted (no other poller's, not the checkpoints)."""
        ...


@runtime_checkable
class StateStore(CheckpointStore, LeaseManager, QuarantineStore, Protocol):
    """Checkpoints, leases and quarantine records of pollers kept in one place.

    ``describe()`` returns a one-line, secret-free description for logs and ``status``.
    """

    def describe(self) -> str:
        """Where the state lives, with no secrets (``local:/path``, ``blob:account/container``)."""
        ...


# --------------------------------------------------------------------------------------------
# Source: rows in keyset order
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SourceRow:
    """One row version read from the source: its keyset position and its column values."""

    position: Position
    data: Mapping[str, Any]
    op: Literal["upsert", "delete"] = "upsert"


@dataclass(frozen=True)
class HorizonHold:
    """The open transaction that holds a commit-safe horizon back (the oldest one).

    ``since``: when it started (aware, UTC); ``holder``: who it is, for people (e.g.
    ``pid 4242, app `report`, idle in transaction``).
    """

    since: dt.datetime
    holder: str


@dataclass(frozen=True)
class Horizon:
    """Upper bounds of one batch, fixed before the read and applied by the database.

    ``bound``: exclusive upper bound on the leading cursor column (``None``: none).
    ``until``: inclusive upper bound on the whole key ``(cursor..., pk...)``, compared by the
    database in its own collation and type order (a backfill chunk's end; ``None``: none).
    ``method`` names how ``bound`` was computed (``lag``, ``none``, ...), ``detail`` says why
    when the safe method was unavailable. ``hold``: the open transaction the bound waits for,
    when a commit-safe method found one (``None``: nothing holds it but the settle margin).
    ``fix``: after a fallback, the one statement that restores the safe method (a ``GRANT``).
    ``privileges``: what the method in effect needs of the database role (``GRANT`` names).
    """

    bound: KeyValue | None
    method: str
    detail: str = ""
    until: Position | None = None
    hold: HorizonHold | None = None
    fix: str | None = None
    privileges: tuple[str, ...] = ()


@dataclass(frozen=True)
class SourceHealth:
    """Findings of a source check: NULL cursors, missing index, horizon method."""

    null_cursor_rows: int | None = None
    warnings: tuple[str, ...] = ()


@runtime_checkable
class Source(Protocol):
    """Changed rows of one table (or query), read in ``ORDER BY cursor..., pk...`` batches.

    Preconditions the user promises (documented, checked where possible): the cursor never
    decreases for a row; the primary key is stable and unique; the query is deterministic.
    """

    @property
    def description(self) -> SourceDescription:
        """Table, cursor and pk columns, and a fingerprint of the filter, for the checkpoint."""
        ...

    def open(self, settings: Mapping[str, str]) -> None:
        """Resolve ``%NAME%`` placeholders from ``settings``, connect and reflect the table.

        Raises ``SettingNotFoundError`` for an undefined setting and ``SourceDefinitionError``
        (naming the table or column and the fix) when the table or a column is missing. Calling
        it again on an open source does nothing.
        """
        ...

    def horizon(self) -> Horizon:
        """The upper bound for the next batch, computed before reading it.

        No row with a cursor below the bound may still become visible later (see the late
        commit rules); rows at or above it wait for a later batch.
        """
        ...

    def fetch(self, after: Position | None, limit: int, horizon: Horizon) -> Sequence[SourceRow]:
        """Up to ``limit`` rows strictly after ``after`` and below ``horizon``, in keyset order.

        Both bounds are predicates in the query, so the database decides them in its own
        collation and type order: rows after ``after``, with a leading cursor below
        ``horizon.bound`` and a key at or below ``horizon.until``. ``after=None`` starts from
        the beginning. A position without pk values means "before
        every row with this cursor". Rows whose cursor is NULL are never returned (see
        :meth:`check`). Transient database errors raise ``TransientSourceError``.
        """
        ...

    def latest(self, horizon: Horizon) -> Position | None:
        """Position of the last row below ``horizon`` (both its bounds; for ``seek --now``)."""
        ...

    def parse_cursor(self, text: str) -> tuple[KeyValue, ...]:
        """Parse operator input (``seek --cursor``) into cursor values of the column types."""
        ...

    def check(self) -> SourceHealth:
        """Count NULL-cursor rows and report problems; raises ``NullCursorError`` if configured."""
        ...

    def close(self) -> None:
        """Release connections. The source may be opened again."""
        ...


@runtime_checkable
class ChangeSource(Protocol):
    """A source that builds the handler's :class:`Change` objects itself: one object per row
    instead of a :class:`SourceRow` and then a ``Change`` (optional; the engine uses it when the
    source has it and is not an :class:`AcknowledgingSource`, which gets back its own rows)."""

    def fetch_changes(
        self, after: Position | None, limit: int, horizon: Horizon, poller: str
    ) -> Sequence[Change]:
        """Exactly what :meth:`Source.fetch` returns for the same arguments (same rows, same
        order, same errors), each row as ``Change(row.data, row.position, poller, row.op)``."""
        ...


@runtime_checkable
class AcknowledgingSource(Protocol):
    """A source that acts on rows once their batch is acknowledged (e.g. an outbox that deletes
    delivered rows).

    The engine calls :meth:`acknowledge` after the checkpoint commit of a batch succeeded, with
    exactly the rows of that batch and the committed position. It must touch only those rows:
    a row it never delivered may still be waiting below the position (a late commit). A failure
    is logged and the run goes on; the rows stay where they are.
    """

    def acknowledge(self, rows: Sequence[SourceRow], position: Position) -> None:
        """Act on the rows of an acknowledged batch."""
        ...


@runtime_checkable
class BacklogSource(Protocol):
    """A source that can count the rows still to read, cheaply and up to a cap (for metrics).

    Optional, and never on the delivery path: the engine does not call it. The OpenTelemetry
    observer (:mod:`azure_functions_db.observers.telemetry`) calls it at most once per run, after
    a run
    that did not catch up, to report ``afdb.lag.rows_behind``.
    """

    def rows_after(self, after: Position | None, horizon: Horizon, cap: int) -> int:
        """How many rows :meth:`Source.fetch` would still return after ``after`` and below
        ``horizon``, counting at most ``cap`` (so ``cap`` means "``cap`` or more").

        The cost is bounded by ``cap`` whatever the table's size (an index range scan that stops
        after ``cap`` keys), not by the backlog.
        """
        ...


@runtime_checkable
class ZonedSource(Protocol):
    """A source whose date-time cursor values may be naive: the zone they hold wall-clock time in.

    Optional, and never on the delivery path (the database orders and compares cursors). The
    OpenTelemetry observer reads it to turn a naive cursor value into an age (``afdb.lag``);
    a source without it is read as UTC.
    """

    @property
    def cursor_timezone(self) -> dt.tzinfo:
        """The zone of naive cursor values (UTC unless the source was configured otherwise)."""
        ...


# --------------------------------------------------------------------------------------------
# Sinks: targets that commit the position with the batch's writes
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SinkMark:
    """The position record a transactional sink keeps for one poller (its ``PollerKey``).

    Written in the same transaction as a batch's writes, so it says exactly which batch the
    sink holds: ``sequence`` is the checkpoint's batch count once that batch is committed
    (``stats.batches + 1`` when it was read), ``before``/``after`` the positions it was read
    after and ends on, ``rows`` its size. A record that was only fenced has ``after=None``.
    """

    fence: int
    sequence: int
    before: Position | None
    after: Position | None
    rows: int = 0

    def holds(self, batch: Batch, sequence: int) -> bool:
        """Whether this is ``batch``'s own mark: the same sequence, read after and ending on the
        same positions (copies of positions the database returned, compared for equality only,
        never for order)."""
        return (
            self.sequence == sequence
            and self.before == batch.position_before
            and self.after == batch.position_after
        )


def refuse_older_fence(key: PollerKey, fence: int, mark: SinkMark | None) -> None:
    """Raise :class:`~azure_functions_db.errors.SinkFencedError` when ``mark`` holds a fence
    newer than ``fence``: the stale-rejection rule every sink applies, to a claim and to a
    batch alike."""
    if mark is not None and mark.fence > fence:
        raise SinkFencedError(key.poller, key.namespace, fence, mark.fence)


@runtime_checkable
class TransactionalSink(Protocol):
    """A target whose writes commit together with the poller's position, or not at all.

    The guarantees every adapter honours (``docs/guarantees.md``, proved by
    :class:`~azure_functions_db.testing.sink_contract.SinkContract`):

    1. isolation: a batch's writes and its :class:`SinkMark` commit in one transaction;
    2. idempotent commit: a batch whose mark is stored already is not written again;
    3. stale rejection: once :meth:`claim` stored a fence, a transaction of a lower fence
       commits nothing and raises :class:`~azure_functions_db.errors.SinkFencedError`.

    The engine calls :meth:`claim` after it fenced the checkpoint and advances the checkpoint
    to a mark that is one batch ahead of it (a crash between the sink's commit and the
    checkpoint's), so a batch is neither lost nor written twice.
    """

    def open(self, settings: Mapping[str, str]) -> None:
        """Resolve settings and connect (idempotent, and the only method that may be slow the
        first time). Never called at import or decoration."""
        ...

    def describe(self) -> str:
        """Where the sink writes, for logs and ``status`` (no secrets)."""
        ...

    def claim(self, key: PollerKey, fence: int) -> SinkMark | None:
        """Store ``fence`` in ``key``'s record (creating it) and return what the record held.

        From this call's commit on, a :meth:`transaction` of a lower fence commits nothing. A
        record that already holds a higher fence raises ``SinkFencedError``; an equal one is
        kept. ``None``: the sink held no record for ``key``.
        """
        ...

    def transaction(
        self, key: PollerKey, batch: Batch, sequence: int
    ) -> AbstractContextManager[Any | None]:
        """One transaction for ``batch``: yields the writer the handler writes through.

        Yields ``None`` (and writes nothing) when ``key``'s record is this batch's mark
        already (:meth:`SinkMark.holds`). The record is not locked while the handler runs, so
        a newer owner's :meth:`claim` is not held up by it. On a normal exit it locks the
        record and checks its fence (a higher one than ``batch.fence``: ``SinkFencedError``,
        nothing committed), writes ``SinkMark(batch.fence, sequence, batch.position_before,
        batch.position_after, len(batch))`` and commits; on an exception it rolls back.
        """
        ...

    def mark(self, key: PollerKey) -> SinkMark | None:
        """What ``key``'s record holds now (read-only: ``status``, tests); ``None`` if none."""
        ...
