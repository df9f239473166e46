"""Where a new poller starts: ``start="beginning"`` (every row already in the table) or
``start="now"`` (its first run records the newest row as the checkpoint and delivers only what
comes after it). Only a poller without a checkpoint is affected."""

from __future__ import annotations

import pytest

from azure_functions_db.core.checkpoint import Checkpoint
from azure_functions_db.core.config import PollerConfig
from azure_functions_db.errors import ConfigurationError, RecordExistsError
from azure_functions_db.state.memory import MemoryStateStore
from azure_functions_db.testing.clock import FakeClock
from tests.support.sqlite_orders import Orders
from tests.unit.test_engine import SETTINGS, Recorder, clock, make_engine, orders, store, stored

__all__ = ["clock", "orders", "store"]  # fixtures


def delivered(handler: Recorder) -> list[int]:
    return [c.pk for b in handler.batches for c in b]


def test_a_new_poller_starts_at_the_beginning_by_default(orders, store, clock):
    orders.insert(range(1, 6))
    handler = Recorder()
    make_engine(orders, store, handler, clock).run(SETTINGS)
    assert delivered(handler) == [1, 2, 3, 4, 5]


def test_start_now_skips_the_rows_already_there_and_delivers_the_later_ones(orders, store, clock):
    orders.insert(range(1, 6))
    handler = Recorder()
    report = make_engine(orders, store, handler, clock, start="now").run(SETTINGS)
    assert report.status == "caught_up"
    assert delivered(handler) == []
    first = stored(store)
    assert first.position is not None
    assert first.position.pk == (5,)
    assert first.seek is not None
    assert first.seek.by == 'start="now"'
    clock.advance(60)
    orders.insert(range(6, 9))
    make_engine(orders, store, handler, clock, start="now").run(SETTINGS)
    assert delivered(handler) == [6, 7, 8]


def test_start_now_on_an_empty_table_delivers_everything_that_comes(orders, store, clock):
    handler = Recorder()
    make_engine(orders, store, handler, clock, start="now").run(SETTINGS)
    assert stored(store).position is None
    orders.insert(range(1, 4))
    make_engine(orders, store, handler, clock, start="now").run(SETTINGS)
    assert delivered(handler) == [1, 2, 3]  # the poller exists now: nothing is skipped again


def test_start_now_leaves_an_existing_checkpoint_alone(orders, store, clock):
    orders.insert(range(1, 6))
    first = Recorder()
    make_engine(orders, store, first, clock, batch_size=2, time_budget=11).run(SETTINGS)
    assert delivered(first) == [1, 2, 3, 4, 5]
    orders.insert(range(6, 8))
    clock.advance(60)
    later = Recorder()
    make_engine(orders, store, later, clock, start="now").run(SETTINGS)
    assert delivered(later) == [6, 7]


class RacingStore(MemoryStateStore):
    """Another owner creates the first record (at an older head) just before this one does."""

    def __init__(self, clock: FakeClock, competitor: Checkpoint) -> None:
        super().__init__(clock)
        self.competitor: Checkpoint | None = competitor

    def create(self, checkpoint: Checkpoint) -> str:
        if self.competitor is not None:
            theirs, self.competitor = self.competitor, None
            super().create(theirs)
            raise RecordExistsError(checkpoint.key.poller, checkpoint.key.namespace)
        return super().create(checkpoint)


def test_a_concurrent_first_run_keeps_the_record_created_first(orders: Orders, clock: FakeClock):
    """Two first runs: the one that created the record at an older head wins, and the other
    delivers the rows after that head instead of skipping to its own."""
    orders.insert(range(1, 4))
    probe = MemoryStateStore(clock)
    make_engine(orders, probe, Recorder(), clock, start="now").run(SETTINGS)
    older = stored(probe)  # a record at id 3, as the competitor's first run made it
    orders.insert(range(4, 7))
    store = RacingStore(clock, Checkpoint(key=older.key, position=older.position))
    handler = Recorder()
    make_engine(orders, store, handler, clock, start="now").run(SETTINGS)
    assert delivered(handler) == [4, 5, 6]


def test_start_must_be_beginning_or_now():
    with pytest.raises(ConfigurationError, match="start='later'"):
        PollerConfig(name="orders", start="later")  # type: ignore[arg-type]
