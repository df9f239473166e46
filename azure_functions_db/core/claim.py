"""Holding a poller: lease -> fence the checkpoint -> compare-and-set writes -> release.

The one implementation of the state protocol (SPEC §4), shared by the engine's runs, ``afdb
seek`` and the backfill's live seed:

1. Acquire the poller's lease; the grant carries a fence above every earlier one.
2. Keep it alive with a heartbeat (:class:`~azure_functions_db.core.lease.LeaseKeeper`).
3. Fence the checkpoint: rewrite it with the new fence by compare-and-set (create it if there is
   none), so any write still pending from an older owner fails on the etag.
4. Write only by compare-and-set over the etag last seen, and only while the lease is held; a
   write whose outcome is unknown is resolved by reading the record back (case G).
5. Release the lease, whatever happened.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any, TypeVar

from azure_functions_db.core.checkpoint import Checkpoint, PollerKey, SourceDescription
from azure_functions_db.core.clock import Clock
from azure_functions_db.core.lease import LeaseKeeper
from azure_functions_db.core.ports import LeaseGrant, Source, StateStore
from azure_functions_db.errors import (
    CheckpointConflictError,
    FenceBehindCheckpointError,
    RecordExistsError,
    StaleFenceError,
    TransientStoreError,
)

T = TypeVar("T")
#: Calls a store operation, retrying transient errors as the caller's policy says.
Retrying = Callable[..., Any]
#: Logs one structured event: ``log(level, action, **fields)``.
LogEvent = Callable[..., None]


def _direct(call: Callable[..., T], *args: object) -> T:
    return call(*args)


def _silent(level: int, action: str, **fields: object) -> None:
    del level, action, fields


class Claim:
    """A held poller: the grant, its heartbeat, and the checkpoint as this owner last wrote it.

    Every write goes through :meth:`write` (or :meth:`try_write`): compare-and-set over the etag
    of the record this claim last read or wrote, only while the lease is held.
    """

    def __init__(
        self,
        store: StateStore,
        grant: LeaseGrant,
        keeper: LeaseKeeper,
        checkpoint: Checkpoint,
        etag: str,
        *,
        retrying: Retrying,
        log: LogEvent,
    ) -> None:
        self.store = store
        self.grant = grant
        self.keeper = keeper
        self.checkpoint = checkpoint
        self.etag = etag
        self._retrying = retrying
        self._log = log

    @property
    def fence(self) -> int:
        return self.grant.fence

    def write(self, new: Checkpoint) -> None:
        """Replace the checkpoint with ``new`` by compare-and-set; on success it is the claim's.

        A conflict marks the lease lost (another writer changed the record) and raises
        :class:`CheckpointConflictError`; an unknown outcome that reading back cannot confirm
        raises the :class:`TransientStoreError`. Either way the write did not take effect for
        this owner.
        """
        self.keeper.ensure_held()
        try:
            etag = self.store.replace(new, self.etag)
        except (CheckpointConflictError, TransientStoreError) as exc:
            # Ambiguous: a timeout, or a conflict the SDK's own retry of a write that had in fact
            # landed produced. Look, rather than guess.
            landed = self._landed(new, exc)
            if landed is None:
                if isinstance(exc, CheckpointConflictError):
                    self.keeper.mark_lost("checkpoint changed by another writer")
                raise
            etag = landed
            # The store misbehaved (a restart, a failover): before any further handler call,
            # make sure it still knows this lease. A store that lost it refuses the renewal and
            # the lease counts as lost; an Azure lease is never dropped early, an emulator's
            # restart can drop one.
            self.keeper.renew_now()
        self.checkpoint, self.etag = new, etag

    def try_write(self, new: Checkpoint) -> bool:
        """Best effort (the attempt counter after a failed handler): one compare-and-set unless
        the lease is lost; ``False``, logged, when it did not take."""
        if self.keeper.lost_reason() is not None:
            return False
        try:
            etag = self.store.replace(new, self.etag)
        except Exception as exc:  # noqa: BLE001 - the caller's own error is the one to report
            self._log(logging.WARNING, "attempt_count_failed", error=repr(exc))
            return False
        self.checkpoint, self.etag = new, etag
        return True

    def _landed(self, new: Checkpoint, exc: Exception) -> str | None:
        """Case G: the etag if the stored record is exactly the one this write sent (same fence,
        position, stats and commit time: no other writer produces that), else ``None``."""
        stored = self._retrying(self.store.read, new.key)
        if stored is not None and stored.checkpoint == new:
            self._log(
                logging.WARNING,
                "commit_ambiguous_landed",
                fence=new.fence,
                error=type(exc).__name__,
            )
            return str(stored.etag)
        return None


class Claimer:
    """Acquires and holds one poller (see the module docstring); one per poller and owner.

    Args:
        store: Where the lease and checkpoint live.
        key: The poller.
        owner: Recorded as the lease's holder.
        duration: Lease duration in seconds.
        clock: For the lease keeper's local expiry.
        heartbeat_interval: Seconds between renewals (default duration/2.5).
        retrying: Wraps store calls with the caller's retry policy (default: no retries).
        log: Receives the claim's structured events (default: none).
    """

    def __init__(
        self,
        store: StateStore,
        key: PollerKey,
        *,
        owner: str,
        duration: float,
        clock: Clock,
        heartbeat_interval: float | None = None,
        retrying: Retrying = _direct,
        log: LogEvent = _silent,
    ) -> None:
        self.store = store
        self.key = key
        self.owner = owner
        self.duration = duration
        self.clock = clock
        self.heartbeat_interval = heartbeat_interval
        self._retrying = retrying
        self._log = log

    @contextlib.contextmanager
    def hold(
        self,
        source: SourceDescription | None,
        *,
        check_source: Callable[[SourceDescription | None], None] | None = None,
        on_acquired: Callable[[LeaseGrant], None] | None = None,
        initial: Callable[[], Checkpoint] | None = None,
    ) -> Iterator[Claim | None]:
        """Acquire, keep alive and fence; yield the :class:`Claim`, or ``None`` when another
        owner holds the lease. The lease is released on the way out, whatever happened.

        ``check_source`` sees the stored source description before the fencing write records
        ``source`` (``None`` keeps the stored one); it raises to refuse a change. ``on_acquired``
        runs right after the grant, before the checkpoint is touched. ``initial`` makes the record
        of a poller that has none (by default one at the beginning): called under the lease,
        and created only if no other owner created one first (``If-None-Match``).
        """
        acquired_at = self.clock.monotonic()
        grant = self._retrying(self.store.acquire, self.key, self.owner, self.duration)
        if grant is None:
            yield None
            return
        keeper = LeaseKeeper(
            self.store,
            grant,
            self.clock,
            interval=self.heartbeat_interval,
            acquired_at=acquired_at,
        )
        keeper.start()
        try:
            if on_acquired is not None:
                on_acquired(grant)
            checkpoint, etag = self._fence(grant, keeper, source, check_source, initial)
            yield Claim(
                self.store,
                grant,
                keeper,
                checkpoint,
                etag,
                retrying=self._retrying,
                log=self._log,
            )
        finally:
            keeper.stop()
            try:
                self.store.release(grant)
            except Exception as exc:  # noqa: BLE001 - the lease expires anyway; keep the cause
                self._log(logging.WARNING, "lease_release_failed", error=repr(exc))

    def _fence(
        self,
        grant: LeaseGrant,
        keeper: LeaseKeeper,
        source: SourceDescription | None,
        check_source: Callable[[SourceDescription | None], None] | None,
        initial: Callable[[], Checkpoint] | None = None,
    ) -> tuple[Checkpoint, str]:
        """Load the checkpoint and rewrite it with our fence, so older owners' writes fail."""
        stored = self._retrying(self.store.read, self.key)
        if stored is None:
            first = initial() if initial is not None else Checkpoint(key=self.key)
            fresh = replace(first, fence=grant.fence, source=source)
            try:
                etag = self.store.create(fresh)
            except RecordExistsError:
                stored = self._retrying(self.store.read, self.key)
            else:
                self._log(
                    logging.INFO, "checkpoint_created", fence=grant.fence, position=fresh.position
                )
                return fresh, etag
        assert stored is not None
        if check_source is not None:
            check_source(stored.checkpoint.source)
        try:
            claimed = stored.checkpoint.fenced(grant.fence, source)
        except StaleFenceError as exc:
            keeper.mark_lost(f"checkpoint already fenced by {exc.stored}")
            raise FenceBehindCheckpointError(
                self.key.poller, self.key.namespace, grant.fence, exc.stored
            ) from exc
        return claimed, self.store.replace(claimed, stored.etag)


def start_now(
    source: Source, key: PollerKey, clock: Clock, retrying: Retrying, log: LogEvent
) -> Checkpoint:
    """The first record of a ``start="now"`` poller: at the newest row below the source's
    horizon (rows above it, and rows committed later, come after it), the move recorded as a
    seek. Called under the lease, for a poller that has no record yet."""
    head = retrying(source.latest, retrying(source.horizon))
    log(logging.INFO, "start_now", position=head)
    return Checkpoint(key=key).sought(
        head,
        fence=0,
        by='start="now"',
        at=clock.now(),
        reason="a new poller starts after the rows already in the table",
    )
