"""Reading ahead (``core/reader.py``): while the handler takes a full batch, the next one is
selected on a worker thread and handed out when the run asks for exactly that read; dropped on a
handler failure or a spent budget, read again on the run's thread when it failed, never two reads
at a time. Forced interleavings on a real SQLite file (SQLAlchemy's ``QueuePool``)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import sqlalchemy as sa

from azure_functions_db.core.batch import Batch
from azure_functions_db.core.engine import Engine, PollerConfig
from azure_functions_db.core.ports import Horizon, StateStore
from azure_functions_db.core.position import Position
from azure_functions_db.core.reader import ReadAheadSource, SelectedRows
from azure_functions_db.errors import HandlerError, TransientSourceError
from azure_functions_db.sources import engines
from azure_functions_db.sources.sqlalchemy import SqlSource
from azure_functions_db.state.memory import MemoryStateStore
from azure_functions_db.testing.clock import FakeClock
from tests.support.sqlite_orders import Orders
from tests.unit.test_engine import SETTINGS, Recorder, orders, stored

__all__ = ["orders"]  # fixture
WAIT = 10.0
WORKER = "afdb-read"


class SpySource(SqlSource):
    """The real SQLite source, recording which thread ran each select and after what, failing
    when two reads overlap (a select, a horizon), and able to fail its next read ahead."""

    def __init__(self, url: str) -> None:
        super().__init__(url=url, table="orders", cursor="updated_at", pk="id")
        self.selects: list[tuple[str, Position | None]] = []
        self.selecting = threading.Event()  # set when a select on the worker begins
        self.fail_ahead: BaseException | None = None
        self._busy = threading.Lock()

    def select(self, after: Position | None, limit: int, horizon: Horizon) -> SelectedRows:
        assert self._busy.acquire(blocking=False), "two reads of the source at a time"
        try:
            name = threading.current_thread().name
            self.selects.append((name, after))
            if name.startswith(WORKER):
                self.selecting.set()
                if self.fail_ahead is not None:
                    failure, self.fail_ahead = self.fail_ahead, None
                    raise failure
            return super().select(after, limit, horizon)
        finally:
            self._busy.release()

    def horizon(self) -> Horizon:
        assert self._busy.acquire(blocking=False), "a horizon read during a select"
        try:
            return super().horizon()
        finally:
            self._busy.release()

    def threads(self) -> list[str]:
        return ["worker" if name.startswith(WORKER) else "run" for name, _ in self.selects]


def engine_for(source: SqlSource, store: StateStore, handler: Any, **config: Any) -> Engine:
    cfg = PollerConfig(name="orders", **{"batch_size": 4, **config})
    return Engine(cfg, source, store, handler, FakeClock(), owner="x", heartbeat_interval=3600)


def stored_pk(store: StateStore) -> tuple[Any, ...]:
    position = stored(store).position
    assert position is not None
    return tuple(position.pk)


def no_reader_thread_left() -> bool:
    return not any(t.name.startswith(WORKER) for t in threading.enumerate())


def test_the_next_full_batch_is_selected_while_the_handler_takes_this_one(orders: Orders) -> None:
    orders.insert(range(1, 11))  # batches of 4, 4, 2
    source = SpySource(orders.url)
    overlapped: list[bool] = []

    def handler(batch: Batch) -> None:
        if len(batch) == 4:  # a full batch: the next select is under way on the worker
            overlapped.append(source.selecting.wait(WAIT))
            source.selecting.clear()

    store = MemoryStateStore(FakeClock())
    report = engine_for(source, store, handler).run(SETTINGS)
    assert overlapped == [True, True]
    assert report.status == "caught_up"
    assert report.rows == 10
    # Each batch read once: the first on the run's thread, the two after full ones ahead.
    # Then, under a fresh horizon, the read that finds nothing more.
    assert source.threads() == ["run", "worker", "worker", "run"]
    assert stored_pk(store) == (10,)
    assert no_reader_thread_left()


def test_every_row_arrives_once_in_order_with_many_batches(orders: Orders) -> None:
    orders.insert(range(1, 98), tie_every=5)  # ties straddle the batch boundaries
    source = SpySource(orders.url)
    handler = Recorder()
    engine_for(source, MemoryStateStore(FakeClock()), handler, batch_size=7).run(SETTINGS)
    assert handler.ids == list(range(1, 98))  # ids ascend with their timestamps
    # 13 full batches and one of 6: every batch after a full one came from the read ahead.
    assert source.threads() == ["run"] + ["worker"] * 13 + ["run"]


def test_pipeline_false_reads_on_the_run_thread_only(orders: Orders) -> None:
    orders.insert(range(1, 11))
    source = SpySource(orders.url)
    handler = Recorder()
    engine_for(source, MemoryStateStore(FakeClock()), handler, pipeline=False).run(SETTINGS)
    assert handler.ids == list(range(1, 11))
    assert set(source.threads()) == {"run"}
    assert no_reader_thread_left()


def test_a_failed_read_ahead_is_read_again_on_the_run_thread_with_retries(
    orders: Orders,
) -> None:
    orders.insert(range(1, 11))
    source = SpySource(orders.url)
    source.fail_ahead = TransientSourceError("connection reset")
    handler = Recorder()
    store = MemoryStateStore(FakeClock())
    report = engine_for(source, store, handler).run(SETTINGS)
    assert handler.ids == list(range(1, 11))
    assert report.status == "caught_up"
    after_first = source.selects[1][1]
    assert source.threads()[:3] == ["run", "worker", "run"]
    assert source.selects[2][1] is after_first  # the same read, again, on the run's thread


def test_a_handler_failure_drops_the_read_ahead_and_acknowledges_nothing_after(
    orders: Orders,
) -> None:
    orders.insert(range(1, 11))
    source = SpySource(orders.url)
    store = MemoryStateStore(FakeClock())
    seen: list[int] = []

    def failing_second(batch: Batch) -> None:
        seen.extend(c.pk for c in batch)
        if len(seen) > 4:
            raise RuntimeError("downstream is down")

    with pytest.raises(HandlerError):
        engine_for(source, store, failing_second).run(SETTINGS)
    assert seen == list(range(1, 9))
    assert stored_pk(store) == (4,)
    assert no_reader_thread_left()  # the read ahead of rows 9-10 ended with the run
    handler = Recorder()
    engine_for(source, store, handler).run(SETTINGS)
    assert handler.ids == list(range(5, 11))  # the failed batch again, then the rest


def test_a_read_ahead_past_the_time_budget_is_not_delivered(orders: Orders) -> None:
    orders.insert(range(1, 11))
    source = SpySource(orders.url)
    clock = FakeClock()
    store = MemoryStateStore(clock)
    seen: list[int] = []

    def slow(batch: Batch) -> None:
        seen.extend(c.pk for c in batch)
        clock.advance(12)  # the run's budget is spent after this batch

    cfg = PollerConfig(name="orders", batch_size=4, time_budget=10, lease_duration=15)
    engine = Engine(cfg, source, store, slow, clock, owner="x", heartbeat_interval=3600)
    assert engine.run(SETTINGS).status == "budget_spent"
    assert seen == [1, 2, 3, 4]
    assert source.threads() == ["run", "worker"]  # read ahead, then dropped
    assert stored_pk(store) == (4,)
    assert no_reader_thread_left()
    statuses = [engine.run(SETTINGS).status for _ in range(2)]
    assert statuses == ["budget_spent", "caught_up"]
    assert seen == list(range(1, 11))  # rows 5-8 read again (the record's position) and on


def test_a_split_read_is_the_fetch_and_its_last_position_is_the_last_changes(
    orders: Orders,
) -> None:
    orders.insert(range(1, 11))
    source = SqlSource(url=orders.url, table="orders", cursor="updated_at", pk="id")
    source.open(SETTINGS)
    try:
        assert isinstance(source, ReadAheadSource)
        assert source.reads_from_any_thread
        horizon = source.horizon()
        selected = source.select(None, 4, horizon)
        changes = source.changes_of(selected, "orders")
        assert changes == source.fetch_changes(None, 4, horizon, "orders")
        assert changes[-1].position is selected.last
        assert source.select(selected.last, 100, horizon).rows[-1][0] == 10
        empty = source.select(source.latest(horizon), 4, horizon)
        assert empty.rows == []
        assert empty.last is None
    finally:
        source.close()


def test_only_sources_whose_threads_share_the_database_are_read_ahead(orders: Orders) -> None:
    assert engines.shared_across_threads(sa.create_engine(orders.url))  # QueuePool
    assert not engines.shared_across_threads(sa.create_engine("sqlite://"))  # per thread
    static = sa.create_engine("sqlite://", poolclass=sa.pool.StaticPool)
    assert not engines.shared_across_threads(static)

    class OwnFetch(SqlSource):
        def fetch(self, *args: Any) -> Any:
            return super().fetch(*args)

    for source, expected in [
        (SqlSource(url=orders.url, table="orders", cursor="updated_at", pk="id"), True),
        (OwnFetch(url=orders.url, table="orders", cursor="updated_at", pk="id"), False),
    ]:
        assert not source.reads_from_any_thread  # not before open: no engine yet
        source.open(SETTINGS)
        try:
            assert source.reads_from_any_thread is expected
        finally:
            source.close()
