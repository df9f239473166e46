"""Liveness: how a poller's latest runs went, kept where its checkpoint is.

Every run that ends (delivering or failing, before or after it took the lease) updates one small
record by compare-and-set: when it ran, how it ended, the last success, the backlog it left, and
the state that follows from them:

- ``stalled``: no run succeeded for ``stall_after`` seconds (``stall_intervals`` schedule
  intervals);
- ``falling_behind``: runs succeed but the backlog grew over ``stall_runs`` runs in a row;
- ``healthy`` otherwise.

The record is a checkpoint record of its own key, ``<poller>~health`` in the poller's namespace
(so every store keeps it with no new port), written without the lease: it describes runs, it
does not steer them. Two instances that disagree (one reaches the database, one does not) leave
the poller healthy as long as one of them delivers, which is the truth. A run that finds the
lease held writes nothing: the holder's run will.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable

from azure_functions_db.core.checkpoint import Checkpoint, PollerKey, RunHealth
from azure_functions_db.core.ports import CheckpointStore, StoredCheckpoint
from azure_functions_db.errors import CheckpointConflictError, RecordExistsError

#: The suffix of a health record's name (``orders~health``); ``~`` is not allowed in poller names.
HEALTH_SUFFIX = "~health"


def health_key(key: PollerKey) -> PollerKey:
    """Where the health record of the poller ``key`` lives."""
    return PollerKey(key.namespace, key.poller + HEALTH_SUFFIX)


def read_health(store: CheckpointStore, key: PollerKey) -> RunHealth | None:
    """The poller's health record, or ``None`` when no run has written one."""
    stored = store.read(health_key(key))
    return stored.checkpoint.health if stored is not None else None


@dataclasses.dataclass(frozen=True)
class HealthWritten:
    """A health record written: the health before and after, and the record as stored now (to
    write the next one over without reading it first)."""

    before: RunHealth | None
    after: RunHealth
    stored: StoredCheckpoint


def write_health(
    store: CheckpointStore,
    key: PollerKey,
    update: Callable[[RunHealth | None], RunHealth],
    *,
    tries: int = 3,
    known: StoredCheckpoint | None = None,
) -> HealthWritten | None:
    """Apply ``update`` to the stored health by compare-and-set, retrying a lost race.

    ``known``: the record as this process last wrote it; the first try writes over it without
    reading (a warm worker's run saves a request), and if anyone wrote it since, the
    compare-and-set refuses it and the next try reads the record. ``None`` when every try lost
    a race to another writer.
    """
    where = health_key(key)
    stored = known
    for tried in range(tries):
        if stored is None or tried:
            stored = store.read(where)
        before = stored.checkpoint.health if stored is not None else None
        after = update(before)
        try:
            if stored is None:
                record = Checkpoint(key=where, health=after)
                etag = store.create(record)
            else:
                record = stored.checkpoint.with_health(after)
                etag = store.replace(record, stored.etag)
        except (CheckpointConflictError, RecordExistsError):
            continue
        return HealthWritten(before, after, StoredCheckpoint(checkpoint=record, etag=etag))
    return None


@dataclasses.dataclass(frozen=True)
class RunOutcome:
    """What one run tells the health record: how it ended and the backlog it left."""

    at: dt.datetime
    status: str
    ok: bool
    lag_rows: int | None = None
    lag_seconds: float | None = None
    error: str | None = None  # what it failed on, for people (no secrets: errors are scrubbed)
    manual: bool = False  # started by hand (`afdb run --once`), not by the schedule


def next_health(
    before: RunHealth | None,
    run: RunOutcome,
    *,
    stall_after: float | None,
    stall_runs: int,
) -> RunHealth:
    """The health after ``run``, from the health before it."""
    last_success = run.at if run.ok else (before.last_success_at if before else None)
    failing_since = None
    if not run.ok:
        failing_since = (before.failing_since if before else None) or run.at
    grew = 0
    if run.ok and before is not None and _grew(before, run):
        grew = before.lag_grew + 1
    state = before.state if before is not None else "healthy"
    if run.ok:
        state = "falling_behind" if grew >= stall_runs else "healthy"
    elif stall_after is not None:
        since = last_success or failing_since
        if since is not None and (run.at - since).total_seconds() >= stall_after:
            state = "stalled"
    return RunHealth(
        last_run_at=run.at,
        last_status=run.status,
        last_success_at=last_success,
        failing_since=failing_since,
        lag_rows=run.lag_rows,
        lag_seconds=run.lag_seconds,
        lag_grew=grew,
        state=state,
        last_error=None if run.ok else (run.error or run.status)[:500],
        manual=run.manual,
    )


def judged_now(
    health: RunHealth | None, now: dt.datetime, stall_after: float | None
) -> tuple[str, str]:
    """The state ``afdb status`` shows and why: the record's, unless time alone has made the
    poller stalled since (no run at all writes nothing: a stopped host, a disabled function)."""
    if health is None:
        return "unknown", "no run has recorded its health yet"
    since = health.last_success_at or health.failing_since or health.last_run_at
    quiet = (now - since).total_seconds()
    if health.manual and health.state != "stalled":
        # Run by hand: its schedule is not running here, so a missed fire means nothing.
        how = f"last run {health.last_status} at {health.last_run_at.isoformat()}"
        return health.state, f"{how}, by hand (`afdb run --once`): not judged by its schedule"
    if stall_after is not None and quiet >= stall_after and health.state != "stalled":
        what = "succeeded" if health.last_success_at else "ran"
        return "stalled", f"no successful run for {quiet:.0f}s (last {what} {since.isoformat()})"
    if health.state == "stalled":
        return "stalled", f"no successful run since {since.isoformat()} ({quiet:.0f}s)"
    if health.state == "falling_behind":
        return "falling_behind", (
            f"the backlog grew over {health.lag_grew} runs in a row ({health.lag_rows} rows behind)"
        )
    return "healthy", f"last run {health.last_status} at {health.last_run_at.isoformat()}"


def _grew(before: RunHealth, run: RunOutcome) -> bool:
    """Whether the backlog grew since the last run: more rows behind, or (a count that hit its
    cap) an older oldest undelivered row."""
    if not run.lag_rows or before.lag_rows is None:
        return False
    if run.lag_rows > before.lag_rows:
        return True
    return (
        run.lag_rows == before.lag_rows
        and run.lag_seconds is not None
        and before.lag_seconds is not None
        and run.lag_seconds > before.lag_seconds
    )
