"""``afdb status``: each poller's checkpoint and lease, and its backfills, as data."""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from azure_functions_db.core.liveness import judged_now, read_health
from azure_functions_db.core.ports import BacklogSource, Horizon
from azure_functions_db.core.position import Position
from azure_functions_db.core.retirement import Retirement
from azure_functions_db.errors import (
    AfdbError,
    CheckpointCorruptError,
)
from azure_functions_db.runtime.poller import PollerDefinition

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
    sink: SinkStatus | None = None  # a poller with a transactional sink
    health: HealthStatus | None = None  # live pollers: liveness, judged now
    quarantined: tuple[int, int] | None = None  # records still quarantined, and their rows
    retired: Retirement | None = None  # ``afdb reshard`` handed its rows to other pollers

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
        if self.sink is not None:
            doc["sink"] = self.sink.to_json()
        if self.health is not None:
            doc["health"] = self.health.to_json()
        if self.quarantined is not None:
            doc["quarantine"] = {"records": self.quarantined[0], "rows": self.quarantined[1]}
        if self.retired is not None:
            retired = self.retired.to_json()
            doc["retired"] = {**retired, "when": self.retired.when.isoformat()}
        return doc

    @property
    def sink_ahead(self) -> bool:
        """The sink holds a batch the checkpoint does not (the next run catches it up)."""
        return self.sink is not None and (self.sink.sequence or 0) > self.batches


@dataclass(frozen=True)
class HealthStatus:
    """A poller's liveness as ``afdb status`` judges it now (from its health record)."""

    state: str  # healthy, stalled, falling_behind, unknown, retired
    detail: str
    last_run_at: dt.datetime | None = None
    last_success_at: dt.datetime | None = None
    lag_rows: int | None = None
    lag_seconds: float | None = None
    stall_after: float | None = None
    last_error: str | None = None  # what the latest run failed on

    def to_json(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "detail": self.detail,
            "last_error": self.last_error,
            "last_run_at": self.last_run_at.isoformat() if self.last_run_at else None,
            "last_success_at": self.last_success_at.isoformat() if self.last_success_at else None,
            "lag_rows": self.lag_rows,
            "lag_seconds": self.lag_seconds,
            "stall_after_seconds": self.stall_after,
        }


def health_status(definition: PollerDefinition, settings: Mapping[str, str]) -> HealthStatus:
    """The poller's health record, judged at this moment: a poller whose host stopped running
    it writes nothing, so time alone can make it stalled."""
    stall_after = definition.stall_after(settings)
    health = read_health(definition.store(settings), definition.config.key)
    state, detail = judged_now(health, definition.clock.now(), stall_after)
    if health is None:
        return HealthStatus(state, detail, stall_after=stall_after)
    return HealthStatus(
        state,
        detail,
        last_run_at=health.last_run_at,
        last_success_at=health.last_success_at,
        lag_rows=health.lag_rows,
        lag_seconds=health.lag_seconds,
        stall_after=stall_after,
        last_error=health.last_error,
    )


def quarantine_count(definition: PollerDefinition, settings: Mapping[str, str]) -> tuple[int, int]:
    """How many records of the poller are still quarantined, and how many rows they hold (an
    unreadable record counts, with no rows)."""
    store, key = definition.store(settings), definition.config.key
    records = rows = 0
    for record_id in store.list_quarantined(key):
        try:
            stored = store.read_quarantined(key, record_id)
        except CheckpointCorruptError:
            records += 1
            continue
        if stored is not None and stored.record.state == "quarantined":
            records, rows = records + 1, rows + len(stored.record)
    return records, rows


@dataclass(frozen=True)
class SinkStatus:
    """What a poller's transactional sink holds for it (``afdb status``)."""

    sink: str
    sequence: int | None = None
    position: Position | None = None
    fence: int | None = None
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "describe": self.sink,
            "sequence": self.sequence,
            "position": self.position.to_json() if self.position else None,
            "position_text": str(self.position) if self.position else None,
            "fence": self.fence,
            "error": self.error,
        }


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
    retired = cp.retired if cp else None
    # A retired poller's rows after its end belong to other pollers: none is held for it.
    held = None if retired else live_hold(definition, settings, cp.position if cp else None)
    if held is not None:
        base["held_by"], base["held_seconds"] = held
    base["sink"] = sink_status(definition, settings)
    health = health_status(definition, settings)
    if retired is not None:  # no timer runs it: its liveness is not judged, its last error kept
        base["retired"] = retired
        health = dataclasses.replace(
            health,
            state="retired",
            detail="retired by `afdb reshard`: no timer runs it, so its liveness is not judged",
        )
    base["health"] = health
    base["quarantined"] = quarantine_count(definition, settings)
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


def sink_status(definition: PollerDefinition, settings: Mapping[str, str]) -> SinkStatus | None:
    """What the poller's sink holds, read without writing to it beyond what its first run does
    (opening a SqlSink creates its position table if it is missing); an unreachable sink is
    shown, not raised (``afdb status`` works without the target)."""
    sink = definition.sink
    if sink is None:
        return None
    try:
        sink.open(settings)
        mark = sink.mark(definition.config.key)
    except AfdbError as exc:
        return SinkStatus(sink=sink.describe(), error=str(exc))
    if mark is None:
        return SinkStatus(sink=sink.describe())
    return SinkStatus(
        sink=sink.describe(), sequence=mark.sequence, position=mark.after, fence=mark.fence
    )


def backfill_statuses(
    definition: PollerDefinition, settings: Mapping[str, str]
) -> list[PollerStatus]:
    """The backfill runs of a poller found in its state store (any namespace but its own)."""
    from azure_functions_db.spark.records import run_records

    store = definition.store(settings)
    statuses: list[PollerStatus] = []
    for cp, record in run_records(store, definition.name):
        key = cp.key
        if key.namespace == definition.config.namespace:
            continue
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


def status_notes(s: PollerStatus, app: str) -> list[tuple[str, str | None]]:
    """The lines ``afdb status`` prints under its table for one poller, with a style (``None``,
    ``yellow``, ``red``): rows held by the horizon, the sink, liveness, quarantined batches."""
    notes: list[tuple[str, str | None]] = []
    if s.retired is not None:
        notes.append(
            (f"{s.poller}: retired by `afdb reshard` {s.retired}; its records stay here", None)
        )
    if s.held_by is not None:
        notes.append(
            (
                f"{s.poller}: rows held back by the horizon for {s.held_seconds or 0:.0f}s "
                f"by {s.held_by}: they wait for that transaction to end",
                "yellow",
            )
        )
    if s.sink is not None:
        notes.append((sink_line(s), None))
    if s.health is not None and s.health.state not in ("healthy", "retired"):
        style = "red" if s.health.state == "stalled" else "yellow"
        notes.append((f"{s.poller}: {s.health.state}: {s.health.detail}", style))
    if s.health is not None and s.health.last_error:
        notes.append((f"{s.poller}: the latest run failed: {s.health.last_error}", "red"))
    if s.quarantined and s.quarantined[0]:
        notes.append(
            (
                f"{s.poller}: {s.quarantined[0]} quarantined batch(es), {s.quarantined[1]} "
                f"row(s): `afdb quarantine list {app} --poller {s.poller}`",
                "yellow",
            )
        )
    return notes


def sink_line(s: PollerStatus) -> str:
    """One line on what a poller's sink holds (``afdb status``)."""
    sink = s.sink
    if sink is None:
        return f"{s.poller}: no sink"
    if sink.error is not None:
        return f"{s.poller}: {sink.sink}: ERROR: {sink.error}"
    if sink.sequence is None:
        return f"{s.poller}: {sink.sink}: no batch yet"
    line = (
        f"{s.poller}: {sink.sink}: batch {sink.sequence} ending at "
        f"{sink.position or '(unknown)'} (fence {sink.fence})"
    )
    if s.sink_ahead:
        line += "; one batch ahead of the checkpoint: the next run catches the checkpoint up"
    return line


#: ``afdb status`` as a table from this many columns; narrower, or piped, one block a poller.
WIDE = 120
STATUS_COLUMNS = (
    "poller",
    "namespace",
    "position",
    "fence",
    "lease",
    "last commit",
    "attempts",
    "rows",
)


def status_cells(s: PollerStatus) -> tuple[str, ...]:
    """The cells of one row of ``afdb status`` (``STATUS_COLUMNS``)."""
    lease = s.lease_state if s.lease_holder is None else f"{s.lease_state} by {s.lease_holder}"
    if s.lease_process:  # "held by X (pid 4242, alive)"; "free (pid 4242, dead)"
        lease += f" ({s.lease_process})"
    return (
        s.poller,
        s.namespace,
        "ERROR: " + s.error if s.error else s.detail or str(s.position or "(beginning)"),
        "-" if s.fence is None else str(s.fence),
        lease,
        s.committed_at.isoformat(timespec="seconds") if s.committed_at else "-",
        str(s.attempts) + (f" ({s.last_error})" if s.last_error else ""),
        str(s.rows),
    )


def group_notes(
    definitions: Sequence[PollerDefinition], statuses: Sequence[PollerStatus]
) -> list[tuple[str, str | None]]:
    """One line per sharded poller shown: its shards together (rows, failing runs, leases)."""
    live = {s.poller: s for s in statuses if s.namespace == "live"}
    groups: dict[str, list[PollerStatus]] = {}
    for definition in definitions:
        group = definition.group
        if group is not None and group.name != definition.name and definition.name in live:
            groups.setdefault(group.name, []).append(live[definition.name])
    notes: list[tuple[str, str | None]] = []
    for name, shown in groups.items():
        failing = [s.poller for s in shown if s.error or (s.health and s.health.last_error)]
        held = sum(1 for s in shown if s.lease_state == "held")
        line = (
            f"{name}: {len(shown)} shard(s), {sum(s.rows for s in shown)} row(s) delivered in "
            f"all, {held} lease(s) held"
        )
        notes.append(
            (
                line + (f"; failing: {', '.join(failing)}" if failing else ""),
                "red" if failing else None,
            )
        )
    return notes
