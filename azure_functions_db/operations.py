"""Operator actions on pollers: inspect their state, move their checkpoint (audited)."""

from __future__ import annotations

import datetime as dt
import getpass
import logging
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from azure_functions_db.core.claim import Claimer
from azure_functions_db.core.logs import log_event
from azure_functions_db.core.ports import BacklogSource, Horizon, StateStore
from azure_functions_db.core.position import KeyValue, Position
from azure_functions_db.core.retry import Retrying
from azure_functions_db.errors import (
    AfdbError,
    CheckpointCorruptError,
    LeaseHeldError,
)
from azure_functions_db.poller import PollerDefinition

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PollerStatus:
    """What ``afdb status`` shows for one poller."""

    poller: str
    namespace: str
    store: str
    position: Position | None
    fence: int | None
    lease_state: str
    lease_holder: str | None
    lease_fence: int
    committed_at: dt.datetime | None
    attempts: int
    last_error: str | None
    batches: int
    rows: int
    error: str | None = None
    detail: str | None = None  # a backfill run: its phase, chunks and handoff bound
    lease_process: str | None = None  # the local store: "pid 4242, alive" / "..., dead"
    held_by: str | None = None  # an open transaction holding rows back behind the horizon
    held_seconds: float | None = None

    def to_json(self) -> dict[str, Any]:
        """A stable, JSON-ready form for scripts (keys never renamed, only added)."""
        doc: dict[str, Any] = {
            "poller": self.poller,
            "namespace": self.namespace,
            "store": self.store,
            "position": self.position.to_json() if self.position else None,
            "position_text": str(self.position) if self.position else None,
            "fence": self.fence,
            "lease": {
                "state": self.lease_state,
                "holder": self.lease_holder,
                "fence": self.lease_fence,
            },
            "committed_at": self.committed_at.isoformat() if self.committed_at else None,
            "attempts": self.attempts,
            "last_error": self.last_error,
            "stats": {"batches": self.batches, "rows": self.rows},
            "error": self.error,
        }
        if self.detail is not None:  # backfill runs only: pollers' documents keep their keys
            doc["detail"] = self.detail
        if self.lease_process is not None:  # the local store, when it can see the process
            doc["lease"]["process"] = self.lease_process
        if self.held_by is not None:  # only while rows wait behind the horizon
            doc["held"] = {"by": self.held_by, "seconds": self.held_seconds}
        return doc


def poller_status(definition: PollerDefinition, settings: Mapping[str, str]) -> PollerStatus:
    """Read a poller's checkpoint and lease without changing either."""
    store = definition.store(settings)
    key = definition.config.key
    lease = store.inspect(key)
    base: dict[str, Any] = {
        "poller": key.poller,
        "namespace": key.namespace,
        "store": store.describe(),
        "lease_state": lease.state,
        "lease_holder": lease.holder,
        "lease_process": lease.process,
        "lease_fence": lease.fence,
    }
    try:
        stored = store.read(key)
    except CheckpointCorruptError as exc:
        return PollerStatus(
            **base,
            position=None,
            fence=None,
            committed_at=None,
            attempts=0,
            last_error=None,
            batches=0,
            rows=0,
            error=str(exc),
        )
    cp = stored.checkpoint if stored else None
    held = live_hold(definition, settings, cp.position if cp else None)
    if held is not None:
        base["held_by"], base["held_seconds"] = held
    return PollerStatus(
        **base,
        position=cp.position if cp else None,
        fence=cp.fence if cp else None,
        committed_at=cp.committed_at if cp else None,
        attempts=cp.attempts if cp else 0,
        last_error=cp.last_error if cp else None,
        batches=cp.stats.batches if cp else 0,
        rows=cp.stats.rows if cp else 0,
    )


def live_hold(
    definition: PollerDefinition, settings: Mapping[str, str], position: Position | None
) -> tuple[str, float] | None:
    """Who holds rows back behind the horizon now, and for how long; ``None`` when nothing
    waits or the source cannot be asked (``afdb status`` works without a database)."""
    source = definition.source
    try:
        source.open(settings)
        horizon = source.horizon()
        if horizon.hold is None or not isinstance(source, BacklogSource):
            return None
        if source.rows_after(position, Horizon(bound=None, method="none"), 1) == 0:
            return None
    except AfdbError:
        return None
    finally:
        source.close()
    age = (definition.clock.now() - horizon.hold.since).total_seconds()
    return horizon.hold.holder, max(0.0, age)


def backfill_statuses(
    definition: PollerDefinition, settings: Mapping[str, str]
) -> list[PollerStatus]:
    """The backfill runs of a poller found in its state store (any namespace but its own)."""
    from azure_functions_db.spark.records import SEP, RunRecord

    store = definition.store(settings)
    prefix = definition.name + SEP
    statuses: list[PollerStatus] = []
    for key in store.list_keys():
        rest = key.poller.removeprefix(prefix)
        if key.namespace == definition.config.namespace or rest == key.poller or SEP in rest:
            continue
        stored = store.read(key)
        record = RunRecord.from_checkpoint(stored.checkpoint) if stored else None
        if stored is None or record is None:
            continue
        cp = stored.checkpoint
        statuses.append(
            PollerStatus(
                poller=key.poller,
                namespace=key.namespace,
                store=store.describe(),
                position=cp.position,
                fence=cp.fence,
                lease_state="free",
                lease_holder=None,
                lease_fence=0,
                committed_at=cp.committed_at,
                attempts=0,
                last_error=None,
                batches=cp.stats.batches,
                rows=cp.stats.rows,
                detail=record.describe(),
            )
        )
    return statuses


SeekTarget = Literal["beginning", "now", "cursor"]


@dataclass(frozen=True)
class SeekResult:
    poller: str
    namespace: str
    from_position: Position | None
    to_position: Position | None
    fence: int
    by: str


def operator_identity() -> str:
    """``user@host`` of whoever runs an operator command (recorded in the seek audit)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = f"uid{os.getuid()}"
    return f"{user}@{socket.gethostname()}"


def seek(
    definition: PollerDefinition,
    settings: Mapping[str, str],
    target: SeekTarget,
    *,
    cursor: tuple[KeyValue, ...] | None = None,
    reason: str = "",
    by: str | None = None,
) -> SeekResult:
    """Move a poller's checkpoint under its lease, by compare-and-set, with an audit record.

    ``beginning`` replays everything; ``now`` skips to the latest row currently visible;
    ``cursor`` restarts at the first row whose cursor is ``>= cursor`` (inclusive).
    Raises :class:`LeaseHeldError` while a run holds the lease.
    """
    by = by or operator_identity()
    store = definition.store(settings)
    cfg = definition.config
    source = definition.source
    source.open(settings)
    to: Position | None
    if target == "beginning":
        to = None
    elif target == "now":
        to = source.latest(source.horizon())
    else:
        if cursor is None:
            raise ValueError("seek to a cursor needs `cursor`")
        to = Position(cursor=cursor, pk=())
    fence, before, _ = move_checkpoint(
        definition, store, to, owner=f"afdb-seek:{by}", by=by, reason=reason
    )
    log_event(
        logger,
        logging.WARNING,
        "seek",
        poller=cfg.name,
        namespace=cfg.namespace,
        fence=fence,
        by=by,
        from_position=before,
        to_position=to,
        reason=reason or None,
    )
    return SeekResult(cfg.name, cfg.namespace, before, to, fence, by)


def move_checkpoint(
    definition: PollerDefinition,
    store: StateStore,
    to: Position | None,
    *,
    owner: str,
    by: str,
    reason: str,
    now: dt.datetime | None = None,
    unless_positioned: bool = False,
) -> tuple[int, Position | None, Position | None]:
    """Move the poller's checkpoint to ``to`` under its lease, by compare-and-set, audited.

    The same claim as a run (:class:`~azure_functions_db.core.claim.Claimer`): acquire the
    lease, fence the checkpoint (creating it if there is none), write by compare-and-set with
    the run's retries, release. With ``unless_positioned``, a record that already has a position
    keeps it. Returns the lease's fence, the position before and the position after. Raises
    :class:`LeaseHeldError` while a run holds the lease, and
    :class:`FenceBehindCheckpointError` when the record's fence is ahead of the lease's.
    """
    cfg, source = definition.config, definition.source

    def log(level: int, action: str, **fields: object) -> None:
        log_event(logger, level, action, poller=cfg.name, namespace=cfg.namespace, **fields)

    claimer = Claimer(
        store,
        cfg.key,
        owner=owner,
        duration=cfg.lease_duration,
        clock=definition.clock,
        retrying=Retrying(
            retries=cfg.infra_retries, delay=cfg.retry_delay, clock=definition.clock, log=log
        ),
        log=log,
    )
    with claimer.hold(source.description) as claim:
        if claim is None:
            raise LeaseHeldError(cfg.name, cfg.namespace, store.inspect(cfg.key).holder)
        current = claim.checkpoint
        before = current.position
        if unless_positioned and before is not None:
            return claim.fence, before, before
        at = now if now is not None else definition.clock.now()
        claim.write(
            current.sought(
                to, fence=claim.fence, by=by, at=at, reason=reason, source=source.description
            )
        )
        return claim.fence, before, to
