"""Liveness: the health record's states, the one log line per change of state, and what
``afdb status`` judges from a record when no run writes any more."""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from pathlib import Path
from typing import Any

import pytest

from azure_functions_db.core.batch import Batch
from azure_functions_db.core.checkpoint import PollerKey
from azure_functions_db.core.liveness import (
    RunOutcome,
    health_key,
    judged_now,
    next_health,
    read_health,
    write_health,
)
from azure_functions_db.errors import HandlerError
from azure_functions_db.ops.status import poller_status
from azure_functions_db.runtime.poller import PollerDefinition, schedule_interval
from azure_functions_db.sources.sqlalchemy import SqlSource
from azure_functions_db.state.memory import MemoryStateStore
from azure_functions_db.testing.clock import FakeClock
from tests.support.sqlite_orders import Orders
from tests.unit.test_engine import SETTINGS, make_engine

KEY = PollerKey("live", "orders")
T = dt.datetime(2026, 11, 25, 12, 0, tzinfo=dt.UTC)


def run(at: float, *, ok: bool = True, lag: int | None = 0, age: float | None = 0.0) -> RunOutcome:
    status = "caught_up" if ok and not lag else ("budget_spent" if ok else "failed")
    return RunOutcome(T + dt.timedelta(seconds=at), status, ok, lag, age)


def test_a_poller_stalls_when_no_run_succeeded_for_stall_after_and_recovers_at_once() -> None:
    h = next_health(None, run(0), stall_after=150, stall_runs=5)
    assert h.state == "healthy"
    assert h.last_success_at == T
    for at in (30, 60, 120):
        h = next_health(h, run(at, ok=False, lag=None), stall_after=150, stall_runs=5)
        assert h.state == "healthy"
        assert h.failing_since == T + dt.timedelta(seconds=30)
    h = next_health(h, run(150, ok=False, lag=None), stall_after=150, stall_runs=5)
    assert h.state == "stalled"
    assert h.last_success_at == T
    h = next_health(h, run(180), stall_after=150, stall_runs=5)
    assert h.state == "healthy"
    assert h.failing_since is None


def test_a_poller_that_never_succeeded_stalls_from_its_first_failure() -> None:
    h = next_health(None, run(0, ok=False, lag=None), stall_after=60, stall_runs=5)
    assert (h.state, h.last_success_at) == ("healthy", None)
    h = next_health(h, run(59, ok=False, lag=None), stall_after=60, stall_runs=5)
    assert h.state == "healthy"
    h = next_health(h, run(60, ok=False, lag=None), stall_after=60, stall_runs=5)
    assert h.state == "stalled"


def test_a_growing_backlog_over_stall_runs_is_falling_behind() -> None:
    h = next_health(None, run(0, lag=100, age=10), stall_after=None, stall_runs=3)
    for i, lag in enumerate((200, 300)):
        h = next_health(h, run(30 * (i + 1), lag=lag, age=10), stall_after=None, stall_runs=3)
        assert h.state == "healthy"
    # A capped count that stays at the cap grows by the age of the oldest row instead.
    h = next_health(h, run(90, lag=300, age=40), stall_after=None, stall_runs=3)
    assert (h.state, h.lag_grew) == ("falling_behind", 3)
    h = next_health(h, run(120, lag=250, age=35), stall_after=None, stall_runs=3)
    assert (h.state, h.lag_grew) == ("healthy", 0)


def test_status_judges_a_record_that_nobody_updates_any_more() -> None:
    h = next_health(None, run(0), stall_after=150, stall_runs=5)
    now = T + dt.timedelta(seconds=100)
    assert judged_now(h, now, 150)[0] == "healthy"
    state, detail = judged_now(h, T + dt.timedelta(seconds=151), 150)
    assert state == "stalled"
    assert "no successful run for 151s" in detail
    assert judged_now(None, now, 150)[0] == "unknown"
    assert judged_now(h, T + dt.timedelta(days=9), None)[0] == "healthy"


def test_schedule_interval_is_the_longest_gap_of_the_next_fires() -> None:
    assert schedule_interval("*/30 * * * * *", T) == 30
    assert schedule_interval("0 0 9 * * 1-5", T) == 3 * 24 * 3600  # over a weekend


def test_the_engine_logs_one_line_per_change_of_state(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    orders = Orders(tmp_path / "orders.db")
    orders.insert(range(1, 5))
    clock = FakeClock()
    store = MemoryStateStore(clock)
    failing = {"on": True}

    def handler(batch: Batch) -> None:
        if failing["on"]:
            raise ValueError("down")

    engine = make_engine(
        orders, store, handler, clock, max_attempts=100, stall_after=60.0, stall_runs=3
    )
    caplog.set_level(logging.INFO)
    for _ in range(4):  # 0 s, 30 s, 60 s, 90 s: stalled at 60 s, once
        with pytest.raises(HandlerError):
            engine.run(SETTINGS)
        clock.advance(30)
    assert caplog.text.count("action=poller_stalled") == 1
    health = read_health(store, KEY)
    assert health is not None
    assert health.state == "stalled"
    assert health.lag_rows == 4
    failing["on"] = False
    report = engine.run(SETTINGS)
    assert report.health == "healthy"
    assert caplog.text.count("action=poller_recovered") == 1
    engine.run(SETTINGS)
    assert caplog.text.count("action=poller_recovered") == 1
    assert store.read(health_key(KEY)) is not None
    assert KEY in store.list_keys("live")
    orders.close()


def test_status_shows_a_stalled_poller_and_its_quarantined_rows(tmp_path: Path) -> None:
    orders = Orders(tmp_path / "orders.db")
    orders.insert(range(1, 5))
    clock = FakeClock()
    store = MemoryStateStore(clock)

    def handler(batch: Batch) -> None:
        if any(c.pk == 2 for c in batch):
            raise ValueError("row 2")

    definition = PollerDefinition(
        config=make_engine(
            orders, store, handler, clock, max_attempts=1, poison="quarantine"
        ).config,
        schedule="*/30 * * * * *",
        source=SqlSource(url=orders.url, table="orders", cursor="updated_at", pk="id"),
        handler=handler,
        state=store,
        clock=clock,
    )
    definition.run_once(SETTINGS)
    status = poller_status(definition, SETTINGS)
    assert status.health is not None
    assert status.health.state == "healthy"
    assert status.quarantined == (1, 1)
    assert status.to_json()["quarantine"] == {"records": 1, "rows": 1}
    clock.advance(5 * 30 * 2)  # no run for ten intervals: the host stopped calling it
    status = poller_status(definition, SETTINGS)
    assert status.health is not None
    assert status.health.state == "stalled"
    assert status.to_json()["health"]["stall_after_seconds"] == 150
    orders.close()


def test_a_run_by_hand_is_not_judged_by_its_schedule() -> None:
    """`afdb run --once` while the schedule runs nowhere: hours later the poller is not
    `stalled` for the fires it never had; a failed run still says what it failed on."""
    h = next_health(None, dataclasses.replace(run(0), manual=True), stall_after=150, stall_runs=5)
    state, detail = judged_now(h, T + dt.timedelta(hours=5), 150)
    assert state == "healthy"
    assert "by hand" in detail
    failed = RunOutcome(
        at=T + dt.timedelta(seconds=10),
        status="failed",
        ok=False,
        error="SourceError: Database open for table `orders` failed",
    )
    h2 = next_health(h, failed, stall_after=150, stall_runs=5)
    assert h2.last_error == "SourceError: Database open for table `orders` failed"
    assert next_health(h2, run(20), stall_after=150, stall_runs=5).last_error is None
    scheduled = next_health(None, run(0), stall_after=150, stall_runs=5)
    assert judged_now(scheduled, T + dt.timedelta(hours=5), 150)[0] == "stalled"


class ReadCounting(MemoryStateStore):
    """A memory store counting the reads of the health record."""

    health_reads = 0

    def read(self, key: PollerKey) -> Any:
        if key == health_key(KEY):
            self.health_reads += 1
        return super().read(key)


def test_a_warm_engine_writes_its_health_record_without_reading_it_first(
    tmp_path: Path,
) -> None:
    """The engine keeps the health record it wrote: its next run writes over it by
    compare-and-set without reading it (one storage request fewer a run in a warm worker). When
    another instance wrote the record meanwhile, the write over the old etag is refused and the
    record is read, then written."""
    orders = Orders(tmp_path / "orders.db")
    orders.insert(range(1, 5))
    clock = FakeClock()
    store = ReadCounting(clock)
    engine = make_engine(orders, store, lambda batch: None, clock, stall_after=60.0)
    engine.run(SETTINGS)
    assert store.health_reads == 1  # the first run reads (and creates) it
    clock.advance(10)
    engine.run(SETTINGS)
    assert store.health_reads == 1  # the second writes over what the first wrote
    # Another instance's failed run writes the record.
    other = write_health(
        store,
        KEY,
        lambda before: next_health(before, run(0, ok=False), stall_after=60.0, stall_runs=3),
    )
    assert other is not None
    assert other.after.last_status == "failed"
    clock.advance(10)
    reads = store.health_reads
    report = engine.run(SETTINGS)
    assert store.health_reads == reads + 1  # refused over the stale etag, read, written
    health = read_health(store, KEY)
    assert health is not None
    assert health.last_status == "caught_up"
    assert health.last_run_at == report_time(clock)
    assert report.status == "caught_up"
    orders.close()


def report_time(clock: FakeClock) -> dt.datetime:
    return clock.now()
