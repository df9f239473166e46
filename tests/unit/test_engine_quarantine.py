"""The ``quarantine`` poison policy in the run loop (SQLite source, memory and local stores):
records written before the checkpoint moves, bisection to the bad rows, and what stays as it
was (``halt``, sinks' batch numbering)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from azure_functions_db.core.batch import Batch
from azure_functions_db.core.checkpoint import PollerKey
from azure_functions_db.core.engine_poison import ISOLATE_MAX_RECORDS
from azure_functions_db.core.ports import StateStore
from azure_functions_db.core.quarantine import QuarantineRecord
from azure_functions_db.errors import ConfigurationError, HandlerError, PoisonBatchError
from azure_functions_db.sinks.memory import MemorySink
from azure_functions_db.testing.clock import FakeClock
from tests.support.sqlite_orders import Orders
from tests.unit.test_engine import SETTINGS, clock, make_engine, orders, store, stored

__all__ = ["clock", "orders", "store"]  # fixtures
KEY = PollerKey("live", "orders")


class Picky:
    """Fails any batch holding one of ``bad`` (by id); records what it delivered."""

    def __init__(self, *bad: int) -> None:
        self.bad = set(bad)
        self.delivered: list[int] = []
        self.calls = 0

    def __call__(self, batch: Batch) -> None:
        self.calls += 1
        ids = [c.pk for c in batch]
        hit = self.bad.intersection(ids)
        if hit:
            raise ValueError(f"cannot take row {sorted(hit)}")
        self.delivered.extend(ids)


def records(store: StateStore) -> list[QuarantineRecord]:
    found = []
    for record_id in store.list_quarantined(KEY):
        got = store.read_quarantined(KEY, record_id)
        assert got is not None
        found.append(got.record)
    return sorted(found, key=lambda r: r.changes[0].pk)


def fail_until_quarantined(engine: Any, attempts: int) -> None:
    for _ in range(attempts - 1):
        with pytest.raises(HandlerError):
            engine.run(SETTINGS)


def test_bisection_delivers_the_good_rows_and_quarantines_only_the_bad_one(
    orders: Orders, store: StateStore, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    orders.insert(range(1, 41))
    handler = Picky(17)
    engine = make_engine(
        orders, store, handler, clock, batch_size=16, max_attempts=3, poison="quarantine"
    )
    fail_until_quarantined(engine, 3)
    assert stored(store).position.pk == (16,)
    assert stored(store).attempts == 2
    with caplog.at_level(logging.INFO):
        report = engine.run(SETTINGS)
    assert sorted(handler.delivered) == [i for i in range(1, 41) if i != 17]
    assert report.status == "caught_up"
    assert report.quarantined == 1
    assert len(report.records) == 1
    (record,) = records(store)
    assert [c.pk for c in record.changes] == [17]
    assert record.changes[0].data["id"] == 17
    assert record.error.startswith("ValueError: cannot take row [17]")
    assert record.attempts == 3
    assert record.state == "quarantined"
    assert record.id == report.records[0]
    cp = stored(store)
    assert cp.position is not None
    assert cp.position.pk == (40,)
    assert (cp.stats.rows, cp.stats.quarantined, cp.attempts) == (39, 1, 0)
    assert "action=batch_quarantined" in caplog.text
    assert record.id in caplog.text
    # Bisection costs about two calls per level, not one per row.
    assert handler.calls < 3 + 2 * 5 + 3


def test_without_bisection_the_whole_batch_is_one_record(
    orders: Orders, store: StateStore, clock: FakeClock
) -> None:
    orders.insert(range(1, 11))
    handler = Picky(2)
    engine = make_engine(
        orders,
        store,
        handler,
        clock,
        batch_size=4,
        max_attempts=2,
        poison="quarantine",
        bisect=False,
    )
    fail_until_quarantined(engine, 2)
    report = engine.run(SETTINGS)
    assert handler.delivered == [5, 6, 7, 8, 9, 10]
    (record,) = records(store)
    assert [c.pk for c in record.changes] == [1, 2, 3, 4]
    assert record.before is None
    assert record.after.pk == (4,)
    assert (report.quarantined, stored(store).stats.quarantined) == (4, 4)
    assert stored(store).stats.batches == 2  # quarantine is not a delivered batch


def test_two_bad_rows_in_one_batch_get_one_record_each(orders, store, clock) -> None:
    orders.insert(range(1, 33))
    handler = Picky(3, 30)
    engine = make_engine(
        orders, store, handler, clock, batch_size=32, max_attempts=1, poison="quarantine"
    )
    engine.run(SETTINGS)
    assert sorted(handler.delivered) == [i for i in range(1, 33) if i not in (3, 30)]
    assert [[c.pk for c in r.changes] for r in records(store)] == [[3], [30]]


def test_a_handler_failing_on_every_row_writes_a_bounded_number_of_records(
    orders, store, clock
) -> None:
    orders.insert(range(1, 101))
    handler = Picky(*range(1, 101))
    engine = make_engine(
        orders, store, handler, clock, batch_size=100, max_attempts=1, poison="quarantine"
    )
    report = engine.run(SETTINGS)
    found = records(store)
    assert sum(len(r) for r in found) == 100 == report.quarantined
    assert len(found) <= ISOLATE_MAX_RECORDS + 8
    assert stored(store).position is not None
    assert stored(store).position.pk == (100,)
    # Every row is in exactly one record: nothing passed without one.
    assert sorted(c.pk for r in found for c in r.changes) == list(range(1, 101))


def test_the_record_is_written_before_the_checkpoint_moves(orders, store, clock) -> None:
    """A store that fails the checkpoint write right after the record: the record exists,
    the checkpoint did not move, and the next run finds the same record by id."""
    orders.insert(range(1, 5))
    handler = Picky(2)
    engine = make_engine(
        orders,
        store,
        handler,
        clock,
        batch_size=4,
        max_attempts=1,
        poison="quarantine",
        bisect=False,
        infra_retries=0,
    )
    real_replace = store.replace
    calls: list[str] = []

    def failing_replace(checkpoint: Any, etag: str) -> str:
        if checkpoint.stats.quarantined and not calls:
            calls.append("refused")
            assert list(store.list_quarantined(KEY)), "checkpoint moved before the record"
            from azure_functions_db.errors import StateStoreError

            raise StateStoreError("storage down")
        return real_replace(checkpoint, etag)

    store.replace = failing_replace  # type: ignore[method-assign]
    with pytest.raises(Exception, match="storage down"):
        engine.run(SETTINGS)
    assert stored(store).position is None
    (first,) = records(store)
    engine.run(SETTINGS)  # fails again (attempts past max): quarantines the same rows again
    (again,) = records(store)
    assert again.id == first.id
    assert [e.action for e in again.history] == ["quarantined", "quarantined"]
    assert stored(store).position is not None
    assert stored(store).stats.quarantined == 4


def test_halt_is_unchanged_and_writes_no_record(orders, store, clock) -> None:
    orders.insert(range(1, 5))
    engine = make_engine(orders, store, Picky(1), clock, max_attempts=2)
    with pytest.raises(HandlerError):
        engine.run(SETTINGS)
    with pytest.raises(PoisonBatchError):
        engine.run(SETTINGS)
    assert list(store.list_quarantined(KEY)) == []
    assert stored(store).position is None


def test_with_a_sink_the_good_rows_land_once_and_batch_numbers_stay_aligned(
    orders, store, clock
) -> None:
    orders.insert(range(1, 21))
    sink = MemorySink()
    sink.create_table("out", ["id"])
    seen: list[int] = []

    def handler(batch: Batch, writer: Any) -> None:
        if any(c.pk == 7 for c in batch):
            raise ValueError("row 7")
        writer.insert("out", [{"id": c.pk} for c in batch])
        seen.extend(c.pk for c in batch)

    from azure_functions_db.core.engine import Engine, PollerConfig
    from azure_functions_db.sources.sqlalchemy import SqlSource

    source = SqlSource(url=orders.url, table="orders", cursor="updated_at", pk="id")
    cfg = PollerConfig(name="orders", batch_size=8, max_attempts=1, poison="quarantine")
    engine = Engine(cfg, source, store, handler, clock, owner="o", sink=sink)
    engine.run(SETTINGS)
    cp = stored(store)
    mark = sink.mark(KEY)
    assert mark is not None
    assert mark.sequence == cp.stats.batches
    assert sorted(seen) == [i for i in range(1, 21) if i != 7]
    assert sorted(r["id"] for r in sink.rows("out")) == sorted(seen)
    assert cp.stats.quarantined == 1


def test_unknown_policy_names_both_choices() -> None:
    from azure_functions_db.core.config import PollerConfig

    with pytest.raises(ConfigurationError, match='poison="quarantine"'):
        PollerConfig(name="orders", poison="skip")  # type: ignore[arg-type]


def test_records_survive_on_the_local_store_directory(orders, tmp_path: Path, clock) -> None:
    from azure_functions_db.state.local import LocalStateStore

    store = LocalStateStore(tmp_path / "state", clock=clock)
    orders.insert(range(1, 5))
    engine = make_engine(orders, store, Picky(3), clock, max_attempts=1, poison="quarantine")
    engine.run(SETTINGS)
    again = LocalStateStore(tmp_path / "state", clock=clock)
    (record,) = records(again)
    assert [c.pk for c in record.changes] == [3]
    assert store.quarantine_path(KEY, record.id).exists()


def test_the_report_shows_the_checkpoint_after_the_last_rows_were_quarantined(
    orders: Orders, store: StateStore, clock: FakeClock
) -> None:
    """The run's report line names the checkpoint, which moved past the parked rows."""
    orders.insert(range(1, 9))
    engine = make_engine(
        orders, store, Picky(8), clock, batch_size=4, max_attempts=1, poison="quarantine"
    )
    report = engine.run(SETTINGS)
    assert report.quarantined == 1
    assert report.position == stored(store).position
    assert report.position is not None
    assert report.position.pk == (8,)
