"""``afdb seek``: move a poller's checkpoint under its lease, audited; and the same move for the
backfill's live seed."""

from __future__ import annotations

import datetime as dt
import getpass
import logging
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from azure_functions_db.core.claim import Claimer
from azure_functions_db.core.logs import log_event
from azure_functions_db.core.ports import StateStore
from azure_functions_db.core.position import KeyValue, Position
from azure_functions_db.core.retry import Retrying
from azure_functions_db.errors import (
    LeaseHeldError,
)
from azure_functions_db.runtime.poller import PollerDefinition

logger = logging.getLogger(__name__)

SeekTarget = Literal["beginning", "now", "cursor"]


@dataclass(frozen=True)
class SeekResult:
    poller: str
    namespace: str
    from_position: Position | None
    to_position: Position | None
    fence: int
    by: str
    store: str = ""  # the state store written (or, dry run, read): `blob:<account>/<container>`
    dry_run: bool = False


def operator_identity() -> str:
    """``user@host`` of whoever runs an operator command (recorded in the seek audit)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        getuid = getattr(os, "getuid", None)  # POSIX only
        user = f"uid{getuid()}" if getuid is not None else "unknown"
    return f"{user}@{socket.gethostname()}"


def seek(
    definition: PollerDefinition,
    settings: Mapping[str, str],
    target: SeekTarget,
    *,
    cursor: tuple[KeyValue, ...] | None = None,
    reason: str = "",
    by: str | None = None,
    dry_run: bool = False,
) -> SeekResult:
    """Move a poller's checkpoint under its lease, by compare-and-set, with an audit record.

    ``beginning`` replays everything; ``now`` skips to the latest row currently visible;
    ``cursor`` restarts at the first row whose cursor is ``>= cursor`` (inclusive).
    Raises :class:`LeaseHeldError` while a run holds the lease. ``dry_run`` reads the
    checkpoint and works out the target, and writes nothing.
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
    if dry_run:
        stored = store.read(cfg.key)
        current = stored.checkpoint if stored is not None else None
        before, fence = (current.position, current.fence) if current else (None, 0)
        return SeekResult(cfg.name, cfg.namespace, before, to, fence, by, store.describe(), True)
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
    return SeekResult(cfg.name, cfg.namespace, before, to, fence, by, store.describe())


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
