"""OpenTelemetry metrics of real engine runs on SQLite, read back with the SDK's in-memory reader.

Every test uses a private ``MeterProvider`` (the global one can be set only once per process).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from azure_functions_db.core.batch import Batch
from azure_functions_db.core.engine import Engine, PollerConfig
from azure_functions_db.core.observe import NullObserver, RunReport
from azure_functions_db.core.ports import Horizon, StateStore
from azure_functions_db.core.position import Position
from azure_functions_db.errors import CheckpointConflictError, HandlerError, PoisonBatchError
from azure_functions_db.observers.telemetry import (
    METER_NAME,
    OtelMetrics,
    metrics_enabled,
    metrics_observer,
    run_status,
)
from azure_functions_db.observers.tracing import FanOut, OtelTraces
from azure_functions_db.runtime.poller import PollerDefinition
from azure_functions_db.sources.sqlalchemy import SqlSource
from azure_functions_db.state.memory import MemoryStateStore
from azure_functions_db.testing.clock import FakeClock
from tests.support.source_kit import NO_HORIZON, open_source
from tests.support.sqlite_orders import T0, Orders

from .test_pg_mysql_source import MID, ROWS, big_table, maria_plan, pg_plan

SETTINGS: dict[str, str] = {}
NOW = dt.datetime(2026, 1, 1, 12, 5, tzinfo=dt.UTC)  # five minutes after the first row (T0, UTC)
ORDERS = {"afdb.poller": "orders", "afdb.namespace": "live"}
ALLOWED_ATTRIBUTES = {
    "afdb.poller",
    "afdb.namespace",
    "afdb.status",
    "error.type",
}


class Metrics:
    """A private meter provider with an in-memory reader, and lookups by name and attributes."""

    def __init__(self) -> None:
        self.reader = InMemoryMetricReader()
        self.provider = MeterProvider(metric_readers=[self.reader])
        self._points: dict[str, list[Any]] = {}

    def collect(self) -> Metrics:
        self._points = {}
        data = self.reader.get_metrics_data()
        for resource in data.resource_metrics if data else ():
            for scope in resource.scope_metrics:
                assert scope.scope.name == METER_NAME
                for metric in scope.metrics:
                    self._points[metric.name] = list(metric.data.data_points)
        return self

    def names(self) -> set[str]:
        return set(self._points)

    def points(self, name: str, **attributes: str) -> list[Any]:
        wanted = {k.replace("_", "."): v for k, v in attributes.items()}
        return [
            p
            for p in self._points.get(name, [])
            if all(p.attributes.get(k) == v for k, v in wanted.items())
        ]

    def value(self, name: str, **attributes: str) -> float:
        """Sum of a counter (or the value of a gauge) over the matching points; 0 if none."""
        return sum(p.value for p in self.points(name, **attributes))

    def histogram(self, name: str, **attributes: str) -> tuple[int, float]:
        """``(count, sum)`` of a histogram over the matching points."""
        points = self.points(name, **attributes)
        return sum(p.count for p in points), sum(p.sum for p in points)

    def all_attribute_keys(self) -> set[str]:
        return {k for points in self._points.values() for p in points for k in p.attributes}


@pytest.fixture
def orders(tmp_path: Path) -> Iterator[Orders]:
    table = Orders(tmp_path / "orders.db")
    yield table
    table.close()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(NOW)


@pytest.fixture
def store(clock: FakeClock) -> StateStore:
    return MemoryStateStore(clock)


@pytest.fixture
def metrics() -> Iterator[Metrics]:
    kit = Metrics()
    yield kit
    kit.provider.shutdown()


def make_engine(
    orders: Orders,
    store: StateStore,
    handler: Any,
    clock: FakeClock,
    metrics: Metrics | None,
    *,
    batch_size: int = 4,
    owner: str = "test-owner",
    rows_behind_cap: int = 10_000,
    **config: Any,
) -> Engine:
    source = SqlSource(url=orders.url, table="orders", cursor="updated_at", pk="id")
    observer = (
        None
        if metrics is None
        else OtelMetrics(
            source, meter_provider=metrics.provider, clock=clock, rows_behind_cap=rows_behind_cap
        )
    )
    cfg = PollerConfig(name="orders", batch_size=batch_size, **config)
    return Engine(
        cfg, source, store, handler, clock, owner=owner, heartbeat_interval=3600, observer=observer
    )


def cursor_of(row_id: int, tie_every: int = 3) -> dt.datetime:
    """The cursor ``Orders.insert`` gives row ``row_id`` (UTC)."""
    return (T0 + dt.timedelta(seconds=row_id // tie_every)).replace(tzinfo=dt.UTC)


# -- a drain ----------------------------------------------------------------------------------


@pytest.mark.parametrize("pipeline", [False, True])
def test_a_drain_counts_every_row_and_batch_and_ends_with_no_lag(
    orders, store, clock, metrics, pipeline
):
    orders.insert(range(1, 24))

    def handler(batch: Batch) -> None:
        clock.advance(0.5)

    engine = make_engine(orders, store, handler, clock, metrics, pipeline=pipeline)
    report = engine.run(SETTINGS)
    assert (report.status, report.rows, report.batches) == ("caught_up", 23, 6)
    m = metrics.collect()
    assert m.value("afdb.rows.delivered", **ORDERS) == 23
    assert m.value("afdb.batches.committed", **ORDERS) == 6
    count, total = m.histogram("afdb.batch.duration", **ORDERS)
    if pipeline:
        # A batch lasts until its commit landed: on the commit thread, while the next batch's
        # handler runs (this clock moves in the handler), so 0.5 s to 1 s each.
        assert count == 6
        assert 3.0 <= total <= 5.5
    else:
        assert (count, total) == (6, pytest.approx(3.0))
    assert m.value("afdb.lease.acquired", **ORDERS) == 1
    assert m.value("afdb.runs", **ORDERS, afdb_status="caught_up") == 1
    assert m.histogram("afdb.run.duration", afdb_status="caught_up") == (1, pytest.approx(3.0))
    assert m.value("afdb.lag.rows_behind", **ORDERS) == 0
    # The last batch committed at NOW + 3 s; its last row (23) has the cursor T0 + 7 s.
    expected_age = (NOW + dt.timedelta(seconds=3) - cursor_of(23)).total_seconds()
    assert m.value("afdb.lag.cursor_age", **ORDERS) == pytest.approx(expected_age)
    for absent in ("afdb.handler.failures", "afdb.lease.lost", "afdb.commits.rejected"):
        assert m.value(absent) == 0
    assert m.all_attribute_keys() <= ALLOWED_ATTRIBUTES


def test_counters_add_up_over_runs_and_an_idle_run_changes_only_the_run_count(
    orders, store, clock, metrics
):
    orders.insert(range(1, 6))
    engine = make_engine(orders, store, lambda batch: None, clock, metrics)
    engine.run(SETTINGS)
    engine.run(SETTINGS)  # nothing new
    orders.insert([6, 7], base=T0 + dt.timedelta(minutes=1))
    engine.run(SETTINGS)
    m = metrics.collect()
    assert m.value("afdb.rows.delivered", **ORDERS) == 7
    assert m.value("afdb.batches.committed", **ORDERS) == 3
    assert m.value("afdb.runs", afdb_status="caught_up") == 3
    assert m.value("afdb.lease.acquired") == 3


def test_naive_cursors_are_read_in_the_sources_cursor_timezone(orders, store, clock, metrics):
    orders.insert(range(1, 3))
    source = SqlSource(
        url=orders.url,
        table="orders",
        cursor="updated_at",
        pk="id",
        cursor_timezone="Europe/Paris",  # UTC+1 in January: T0 there is 11:00 UTC
    )
    observer = OtelMetrics(source, meter_provider=metrics.provider, clock=clock)
    cfg = PollerConfig(name="orders", batch_size=10)
    Engine(cfg, source, store, lambda b: None, clock, owner="o", observer=observer).run(SETTINGS)
    age = metrics.collect().value("afdb.lag.cursor_age", **ORDERS)
    assert age == pytest.approx((NOW - cursor_of(2)).total_seconds() + 3600)


# -- runs that stop short -------------------------------------------------------------------


def test_a_spent_budget_reports_the_rows_still_to_read(orders, store, clock, metrics):
    orders.insert(range(1, 21))

    def slow(batch: Batch) -> None:
        clock.advance(4)

    engine = make_engine(orders, store, slow, clock, metrics, time_budget=10, lease_duration=15)
    assert engine.run(SETTINGS).status == "budget_spent"
    m = metrics.collect()
    assert m.value("afdb.rows.delivered") == 12
    assert m.value("afdb.runs", afdb_status="budget_spent") == 1
    assert m.value("afdb.lag.rows_behind", **ORDERS) == 8
    engine.run(SETTINGS)
    engine.run(SETTINGS)
    m = metrics.collect()
    assert m.value("afdb.rows.delivered") == 20
    assert m.value("afdb.lag.rows_behind", **ORDERS) == 0


def test_the_backlog_count_stops_at_its_cap(orders, store, clock, metrics):
    orders.insert(range(1, 21))

    def slow(batch: Batch) -> None:
        clock.advance(4)

    engine = make_engine(
        orders, store, slow, clock, metrics, time_budget=10, lease_duration=15, rows_behind_cap=5
    )
    engine.run(SETTINGS)
    assert metrics.collect().value("afdb.lag.rows_behind", **ORDERS) == 5


def test_a_failing_handler_counts_failures_then_poison_and_the_lag_grows(
    orders, store, clock, metrics
):
    orders.insert(range(1, 11))
    calls = {"n": 0}

    def handler(batch: Batch) -> None:
        calls["n"] += 1
        if calls["n"] >= 2:  # the first batch passes, the second never does
            raise RuntimeError("downstream is down")

    engine = make_engine(orders, store, handler, clock, metrics, max_attempts=2)
    with pytest.raises(HandlerError) as first:
        engine.run(SETTINGS)
    assert not isinstance(first.value, PoisonBatchError)
    m = metrics.collect()
    assert m.value("afdb.rows.delivered") == 4
    assert m.value("afdb.handler.failures", **ORDERS) == 1
    assert m.value("afdb.runs", afdb_status="handler_failed", error_type="HandlerError") == 1
    assert m.value("afdb.lag.rows_behind", **ORDERS) == 6  # rows 5-10, the stuck batch included
    assert m.value("afdb.lag.cursor_age", **ORDERS) == (NOW - cursor_of(4)).total_seconds()

    clock.advance(60)
    with pytest.raises(PoisonBatchError):
        engine.run(SETTINGS)
    m = metrics.collect()
    assert m.value("afdb.handler.failures", **ORDERS) == 2
    assert m.value("afdb.runs", afdb_status="poison", error_type="PoisonBatchError") == 1
    assert m.value("afdb.rows.delivered") == 4
    # While the batch is stuck the checkpoint gets older on every run.
    assert m.value("afdb.lag.cursor_age", **ORDERS) == (NOW - cursor_of(4)).total_seconds() + 60
    assert m.all_attribute_keys() <= ALLOWED_ATTRIBUTES


# -- leases -----------------------------------------------------------------------------------


def test_a_lease_held_elsewhere_counts_a_lease_held_run_and_nothing_else(
    orders, store, clock, metrics
):
    orders.insert(range(1, 3))
    assert store.acquire(PollerConfig(name="orders").key, "someone-else", 30) is not None
    report = make_engine(orders, store, lambda b: None, clock, metrics).run(SETTINGS)
    assert report.status == "lease_held"
    m = metrics.collect()
    assert m.value("afdb.runs", **ORDERS, afdb_status="lease_held") == 1
    assert m.value("afdb.lease.acquired") == 0
    assert m.value("afdb.rows.delivered") == 0
    assert m.points("afdb.lag.rows_behind") == []  # the holder reports the lag, not this run


def test_a_stale_owner_counts_a_rejected_commit_and_a_lost_lease(orders, store, clock, metrics):
    """Owner A's own clock says its lease is fine, but the store expired it and B took over."""
    orders.insert(range(1, 9))
    a_clock = FakeClock(NOW)  # never moves: A believes it holds the lease

    def a_handler(batch: Batch) -> None:
        clock.advance(31)  # the store's clock: A's lease expires, B takes over and drains
        make_engine(orders, store, lambda b: None, clock, None, owner="B").run(SETTINGS)

    engine_a = make_engine(orders, store, a_handler, a_clock, metrics, owner="A")
    with pytest.raises(CheckpointConflictError):
        engine_a.run(SETTINGS)
    m = metrics.collect()
    assert m.value("afdb.commits.rejected", **ORDERS) == 1
    assert m.value("afdb.lease.lost", **ORDERS) == 1
    assert m.value("afdb.runs", afdb_status="lease_lost", error_type="CheckpointConflictError") == 1
    assert m.value("afdb.rows.delivered") == 0


@pytest.mark.parametrize(
    ("status", "error", "expected"),
    [
        ("budget_spent", None, "budget_spent"),
        ("caught_up", PoisonBatchError("orders", "live", 5, 4), "poison"),
        ("caught_up", HandlerError("orders", "live", 1, 4), "handler_failed"),
        (
            "caught_up",
            CheckpointConflictError("orders", "live", expected_etag="a", found_etag="b"),
            "lease_lost",
        ),
        ("caught_up", OSError("disk"), "failed"),
    ],
)
def test_run_status(status, error, expected):
    report = RunReport(poller="orders", namespace="live", status=status)
    assert run_status(report, error) == expected


# -- the source's bounded count ---------------------------------------------------------------


def test_rows_after_counts_after_a_position_below_the_horizon_up_to_the_cap(orders):
    orders.insert(range(1, 13))  # cursors T0+0 s (ids 1, 2), +1 s (3-5), +2 s (6-8), ...
    source = SqlSource(url=orders.url, table="orders", cursor="updated_at", pk="id")
    source.open(SETTINGS)
    try:
        open_ended = Horizon(bound=None, method="none")
        assert source.rows_after(None, open_ended, 100) == 12
        assert source.rows_after(None, open_ended, 5) == 5
        after_4 = source.fetch(None, 4, open_ended)[-1].position
        assert source.rows_after(after_4, open_ended, 100) == 8
        below = Horizon(bound=T0 + dt.timedelta(seconds=2), method="test")
        assert source.rows_after(after_4, below, 100) == 1  # only row 5 is below T0 + 2 s
        at_cursor = source.fetch(None, 3, open_ended)[-1].position  # row 3, at T0 + 1 s
        assert source.rows_after(type(at_cursor)(cursor=at_cursor.cursor, pk=()), below, 100) == 3
    finally:
        source.close()


# -- observers never break a run; no OpenTelemetry, no problem ----------------------------------


class Broken:
    def __getattr__(self, name: str) -> Any:
        def fail(*args: Any) -> None:
            raise RuntimeError(f"observer bug in {name}")

        return fail


def test_an_observer_that_raises_does_not_change_the_run(orders, store, clock, caplog):
    orders.insert(range(1, 10))
    source = SqlSource(url=orders.url, table="orders", cursor="updated_at", pk="id")
    engine = Engine(
        PollerConfig(name="orders", batch_size=4),
        source,
        store,
        lambda b: None,
        clock,
        owner="o",
        observer=Broken(),  # type: ignore[arg-type]
    )
    with caplog.at_level(logging.DEBUG, logger="azure_functions_db"):
        report = engine.run(SETTINGS)
    assert (report.status, report.rows) == ("caught_up", 9)
    warnings = [r for r in caplog.records if "observer_failed" in r.getMessage()]
    assert [r.levelno for r in warnings][:2] == [logging.WARNING, logging.DEBUG]


def test_without_opentelemetry_pollers_run_with_no_observer(orders, store, clock, monkeypatch):
    monkeypatch.setitem(sys.modules, "opentelemetry", None)  # `import opentelemetry` now fails
    assert metrics_observer(None, {}) is None
    orders.insert(range(1, 6))
    seen: list[int] = []
    definition = PollerDefinition(
        config=PollerConfig(name="orders", batch_size=2),
        schedule="0 * * * * *",
        source=SqlSource(url=orders.url, table="orders", cursor="updated_at", pk="id"),
        handler=lambda batch: seen.extend(c.pk for c in batch),
        state=store,
        clock=clock,
    )
    report = definition.run_once({})
    assert (report.status, seen) == ("caught_up", [1, 2, 3, 4, 5])
    assert isinstance(definition.engine().observer, NullObserver)


def test_pollers_get_the_metrics_observer_unless_the_setting_turns_it_off(orders, store, clock):
    def definition() -> PollerDefinition:
        return PollerDefinition(
            config=PollerConfig(name="orders"),
            schedule="0 * * * * *",
            source=SqlSource(url=orders.url, table="orders", cursor="updated_at", pk="id"),
            handler=lambda batch: None,
            state=store,
            clock=clock,
        )

    both = definition().engine({}).observer
    inner = getattr(both, "inner", None)
    assert isinstance(inner, FanOut)
    assert {type(o.inner) for o in inner._all} == {OtelMetrics, OtelTraces}
    metrics = definition().engine({"AFDB_OTEL_TRACES": "false"}).observer
    assert isinstance(getattr(metrics, "inner", None), OtelMetrics)
    traces = definition().engine({"AFDB_OTEL_METRICS": "false"}).observer
    assert isinstance(getattr(traces, "inner", None), OtelTraces)
    off = definition().engine({"AFDB_OTEL_METRICS": "false", "AFDB_OTEL_TRACES": "0"}).observer
    assert isinstance(off, NullObserver)


@pytest.mark.parametrize(
    ("value", "enabled"),
    [("", True), ("true", True), ("1", True), ("false", False), ("0", False), (" OFF ", False)],
)
def test_the_metrics_setting(value, enabled):
    assert metrics_enabled({"AFDB_OTEL_METRICS": value}) is enabled
    assert metrics_enabled({}) is True


def test_an_unreadable_metrics_setting_keeps_metrics_on_and_says_so(caplog):
    with caplog.at_level(logging.WARNING, logger="azure_functions_db"):
        assert metrics_enabled({"AFDB_OTEL_METRICS": "flase"}) is True
    assert "action=metrics_setting_invalid" in caplog.text
    assert "flase" not in caplog.text


# -- the bounded count on PostgreSQL and MariaDB: exact, capped, and an index range ------------


def captured_count(source: SqlSource, after: Position, horizon: Horizon, cap: int) -> Any:
    """``rows_after(...)`` and the exact SQL and parameters it sent."""
    seen: list[tuple[str, Any]] = []

    def capture(*args: Any) -> None:  # (conn, cursor, statement, parameters, context, many)
        seen.append((args[2], args[3]))

    sa.event.listen(source.engine, "before_cursor_execute", capture)
    try:
        count = source.rows_after(after, horizon, cap)
    finally:
        sa.event.remove(source.engine, "before_cursor_execute", capture)
    statement, parameters = next((s, p) for s, p in seen if "count(" in s.lower())
    return count, statement, parameters


@pytest.mark.parametrize("bounded", [False, True], ids=["no-horizon", "horizon"])
def test_the_backlog_count_is_exact_capped_and_an_index_range(db, opened, bounded):
    big_table(db)  # ids 1-100,000, cursor 2026-01-01 + id // 10 seconds, index on (updated_at, id)
    source = open_source(opened, db, "big", "updated_at", "id")
    bound = dt.datetime(2026, 1, 1, 2)  # ids 1-71,999 have a cursor below it
    horizon = Horizon(bound=bound, method="lag") if bounded else NO_HORIZON
    last = 71_999 if bounded else ROWS
    count, statement, parameters = captured_count(source, MID, horizon, 10_000)
    assert count == 10_000  # more rows than that follow MID (id 50,005): the cap
    assert source.rows_after(MID, horizon, ROWS) == last - MID.pk[0]
    near_end = Position(
        cursor=(dt.datetime(2026, 1, 1) + dt.timedelta(seconds=(last - 100) // 10),),
        pk=(last - 100,),
    )
    assert source.rows_after(near_end, horizon, 10_000) == 100
    if db.dialect == "postgres":
        nodes = pg_plan(db, statement, parameters)
        shown = json.dumps(nodes, default=str)[:3000]
        scans = [n for n in nodes if n["Node Type"] in ("Index Scan", "Index Only Scan")]
        assert [n["Index Name"] for n in scans] == ["ix_big_keyset"], shown
        assert not [n for n in nodes if n["Node Type"] in ("Seq Scan", "Sort")], shown
    else:
        plan = maria_plan(db, statement, parameters)
        assert [(r["type"], r["key"]) for r in plan if r["key"]] == [("range", "ix_big_keyset")], (
            plan
        )
        assert not any("filesort" in (r["Extra"] or "") for r in plan), plan


def test_quarantined_rows_and_the_health_gauges(orders, store, clock, metrics):
    orders.insert(range(1, 9))
    state = {"down": True, "poison": 0}

    def handler(batch: Batch) -> None:
        if state["down"] or any(c.pk == state["poison"] for c in batch):
            raise RuntimeError("cannot take it")

    engine = make_engine(orders, store, handler, clock, metrics, max_attempts=100, stall_after=60.0)
    for _ in range(3):  # 0 s, 30 s, 60 s: stalled at the third failure
        with pytest.raises(HandlerError):
            engine.run(SETTINGS)
        clock.advance(30)
    m = metrics.collect()
    assert m.value("afdb.health.stalled", **ORDERS) == 1
    assert m.value("afdb.health.falling_behind", **ORDERS) == 0
    state["down"] = False
    engine.run(SETTINGS)
    m = metrics.collect()
    assert m.value("afdb.health.stalled", **ORDERS) == 0  # the same series, back to 0
    assert m.value("afdb.health.success_age", **ORDERS) == 0
    assert m.value("afdb.rows.quarantined", **ORDERS) == 0
    orders.insert(range(9, 17), base=T0 + dt.timedelta(minutes=1))
    state["poison"] = 13
    quarantining = make_engine(
        orders, store, handler, clock, metrics, max_attempts=1, poison="quarantine"
    )
    quarantining.run(SETTINGS)
    m = metrics.collect()
    assert m.value("afdb.rows.quarantined", **ORDERS) == 1
    assert m.value("afdb.rows.delivered", **ORDERS) == 15
    assert m.all_attribute_keys() <= ALLOWED_ATTRIBUTES
