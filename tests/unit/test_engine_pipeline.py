"""Commits off the critical path (``core/commits.py``): the next batch is read and handled while
the previous batch's checkpoint commit is in flight, at most one, in order; a failed or fenced
commit ends the run and acknowledges nothing after it. The store here holds each commit at a
gate the test opens, so every interleaving below is forced, not hoped for."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from azure_functions_db.core.batch import Batch
from azure_functions_db.core.checkpoint import Checkpoint
from azure_functions_db.core.engine import Engine, PollerConfig
from azure_functions_db.core.observe import NullObserver
from azure_functions_db.errors import (
    CheckpointConflictError,
    HandlerError,
    StateStoreError,
    TransientStoreError,
)
from azure_functions_db.sinks.memory import MemorySink
from azure_functions_db.sources.sqlalchemy import SqlSource
from azure_functions_db.state.memory import MemoryStateStore
from azure_functions_db.testing.clock import FakeClock
from tests.support.sqlite_orders import Orders
from tests.unit.test_engine import SETTINGS, make_engine, orders, stored

__all__ = ["orders"]  # fixture
WAIT = 10.0


class GatedStore(MemoryStateStore):
    """A memory store whose first batch commit (a replace that moves the position) waits at a
    gate until the test opens it; later commits pass.

    ``entered`` is set while that commit waits; ``fail`` makes the first commit raise instead of
    writing (``land``: after writing).
    """

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock)
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.fail: BaseException | None = None
        self.land = False
        self.commits: list[Any] = []
        self.threads: set[str] = set()

    def replace(self, checkpoint: Checkpoint, etag: str) -> str:
        current = self.read(checkpoint.key)
        moving = current is not None and checkpoint.position != current.checkpoint.position
        if moving:
            self.threads.add(threading.current_thread().name)
            if not self.gate.is_set():
                self.entered.set()
                assert self.gate.wait(WAIT), "the test never opened the gate"
                self.entered.clear()
            if self.fail is not None:
                error, self.fail = self.fail, None
                if self.land:
                    super().replace(checkpoint, etag)
                raise error
            self.commits.append(checkpoint.position.pk if checkpoint.position else None)
        return super().replace(checkpoint, etag)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(clock: FakeClock) -> GatedStore:
    return GatedStore(clock)


class Handler:
    """Records the ids it saw, and whether a commit was waiting at the gate when it started."""

    def __init__(self, store: GatedStore, *, hold_first: bool = True) -> None:
        self.store = store
        self.ids: list[list[int]] = []
        self.overlapped: list[bool] = []
        self.fail_on: int | None = None
        self.hold_first = hold_first

    def __call__(self, batch: Batch) -> None:
        call = len(self.ids)
        if call == 1 and self.hold_first:
            # The first batch's commit must be in flight, held at the gate, right now.
            self.overlapped.append(self.store.entered.wait(WAIT))
        else:
            self.overlapped.append(self.store.entered.is_set())
        self.ids.append([c.pk for c in batch])
        if call >= 1:
            self.store.gate.set()  # let the commit in flight land
        if call == self.fail_on:
            raise ValueError("handler failed")


def test_the_next_batch_is_handled_while_the_previous_commit_is_in_flight(
    orders: Orders, store: GatedStore, clock: FakeClock
) -> None:
    orders.insert(range(1, 11))
    handler = Handler(store)
    report = make_engine(orders, store, handler, clock, pipeline=True).run(SETTINGS)
    assert handler.ids == [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10]]
    assert handler.overlapped[1] is True  # batch 2 ran while commit 1 waited at the gate
    # In order, each over the previous etag; batch 2 went alone, or with batch 3 when commit 1
    # had not landed yet as it was handed over (group commit).
    assert store.commits in ([(4,), (8,), (10,)], [(4,), (10,)])
    assert (report.status, report.batches, report.rows) == ("caught_up", 3, 10)
    assert stored(store).position.pk == (10,)
    assert store.threads == {"afdb-commit_0"}  # commits on the one commit thread
    assert not any(t.name.startswith("afdb-commit") for t in threading.enumerate())


def test_unpipelined_commits_land_before_the_next_batch(
    orders: Orders, store: GatedStore, clock: FakeClock
) -> None:
    orders.insert(range(1, 9))
    store.gate.set()
    handler = Handler(store, hold_first=False)
    make_engine(orders, store, handler, clock, pipeline=False).run(SETTINGS)
    assert handler.overlapped == [False, False]
    assert store.commits == [(4,), (8,)]
    assert store.threads == {threading.current_thread().name}


@pytest.mark.parametrize(
    "error",
    [StateStoreError("disk full"), TransientStoreError("timeout")],
    ids=["failed", "unknown outcome"],
)
def test_a_commit_failing_while_the_next_handler_runs_acknowledges_nothing_after_it(
    orders: Orders,
    store: GatedStore,
    clock: FakeClock,
    error: Exception,
    caplog: pytest.LogCaptureFixture,
) -> None:
    orders.insert(range(1, 13))
    store.fail = error
    handler = Handler(store)
    committed: list[int] = []

    class Counting(NullObserver):
        def batch_committed(self, batch: Batch, duration: float) -> None:
            committed.append(len(batch))

    engine = make_engine(orders, store, handler, clock, pipeline=True)
    engine.observer = Counting()
    with caplog.at_level(logging.INFO), pytest.raises(type(error)):
        engine.run(SETTINGS)
    # Batch 2 was handed over while commit 1 was failing; the run stopped there, or (group
    # commit: batch 2 waited for a later commit) after batch 3, when commit 1 had not failed
    # yet as batch 3 was handed over.
    assert handler.ids in (
        [[1, 2, 3, 4], [5, 6, 7, 8]],
        [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]],
    )
    assert handler.overlapped[1] is True
    assert stored(store).position is None  # neither batch acknowledged
    assert committed == []
    assert "action=batch_committed" not in caplog.text
    # The next run delivers both again (at-least-once), then the rest.
    store.gate.set()
    again = Handler(store, hold_first=False)
    make_engine(orders, store, again, clock, pipeline=True).run(SETTINGS)
    assert again.ids == [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]]
    assert stored(store).position.pk == (12,)


def test_a_commit_that_landed_unanswered_is_recognised_in_flight(
    orders: Orders, store: GatedStore, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    orders.insert(range(1, 9))
    store.fail, store.land = TransientStoreError("timeout"), True
    handler = Handler(store)
    with caplog.at_level(logging.WARNING):
        report = make_engine(orders, store, handler, clock, pipeline=True).run(SETTINGS)
    assert "action=commit_ambiguous_landed" in caplog.text
    assert handler.ids == [[1, 2, 3, 4], [5, 6, 7, 8]]
    assert report.rows == 8
    assert stored(store).position.pk == (8,)


def test_a_fenced_commit_in_flight_ends_the_run_with_the_conflict(
    orders: Orders, store: GatedStore, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Another owner fences the record while commit 1 waits: commit 1 loses compare-and-set,
    and batch 2, handled meanwhile, is not acknowledged either."""
    orders.insert(range(1, 9))
    handler = Handler(store)
    a_clock = FakeClock()  # A's monotonic clock stands still: it believes it holds the lease
    engine = make_engine(orders, store, handler, a_clock, pipeline=True)

    def take_over() -> None:
        assert store.entered.wait(WAIT)
        # The store's clock: A's lease expires; B acquires and fences the record.
        clock.advance(31)
        grant = store.acquire(engine.config.key, "B", 30)
        assert grant is not None
        current = store.read(engine.config.key)
        assert current is not None
        MemoryStateStore.replace(store, current.checkpoint.fenced(grant.fence), current.etag)

    store.gate.set = lambda: None  # type: ignore[method-assign] # the thief opens it
    opened = threading.Event.set

    def take_over_then_open() -> None:
        take_over()
        opened(store.gate)

    thief = threading.Thread(target=take_over_then_open)
    thief.start()
    # The conflict itself, even when the run first meets the lease it marked lost (the commit
    # thread marks it; the run's thread then waits for that commit and raises its error).
    with caplog.at_level(logging.WARNING), pytest.raises(CheckpointConflictError):
        engine.run(SETTINGS)
    thief.join(WAIT)
    assert "action=commit_rejected" in caplog.text
    assert stored(store).position is None
    assert stored(store).fence == 2


def test_a_handler_failing_while_a_commit_is_in_flight_counts_its_attempt_after_it_lands(
    orders: Orders, store: GatedStore, clock: FakeClock
) -> None:
    orders.insert(range(1, 9))
    handler = Handler(store)
    handler.fail_on = 1
    with pytest.raises(HandlerError):
        make_engine(orders, store, handler, clock, pipeline=True).run(SETTINGS)
    cp = stored(store)
    assert cp.position.pk == (4,)  # commit 1 landed
    assert (cp.attempts, cp.stats.batches) == (1, 1)  # batch 2's failure counted after it
    assert cp.last_error is not None
    assert "handler failed" in cp.last_error


def test_with_a_sink_the_commit_before_lands_before_the_sink_transaction_commits(
    orders: Orders, store: GatedStore, clock: FakeClock
) -> None:
    """The next sink batch's handler runs while the checkpoint commit of the batch before is in
    flight, but its sink transaction commits only after that commit landed: the sink never
    holds more than one batch the checkpoint does not."""
    orders.insert(range(1, 11))
    key = PollerConfig(name="orders").key
    at_sink_commit: list[tuple[int, int]] = []

    class Watched(MemorySink):
        @contextmanager
        def transaction(self, key: Any, batch: Batch, sequence: int) -> Iterator[Any]:
            with super().transaction(key, batch, sequence) as writer:
                yield writer
                cp = store.read(key)
                at_sink_commit.append((sequence, cp.checkpoint.stats.batches if cp else 0))

    sink = Watched()
    sink.create_table("out", ["id"])
    overlapped: list[bool] = []

    def handler(batch: Batch, writer: Any) -> None:
        overlapped.append(store.entered.is_set())
        writer.insert("out", [{"id": c.pk} for c in batch])
        if len(overlapped) == 2:
            threading.Timer(0.2, store.gate.set).start()

    source = SqlSource(url=orders.url, table="orders", cursor="updated_at", pk="id")
    cfg = PollerConfig(name="orders", batch_size=4, pipeline=True)
    Engine(cfg, source, store, handler, clock, owner="o", sink=sink).run(SETTINGS)
    assert overlapped[:2] == [False, True]  # batch 2 was handled while commit 1 waited
    # When each batch's sink transaction committed, the checkpoint held every batch before it.
    assert at_sink_commit == [(1, 0), (2, 1), (3, 2)]
    assert sorted(r["id"] for r in sink.rows("out")) == list(range(1, 11))
    assert sink.mark(key) is not None


def test_with_a_sink_every_checkpoint_commit_starts_before_the_next_handler(
    orders: Orders, clock: FakeClock
) -> None:
    """With a sink each batch's checkpoint commit goes as soon as the batch is handed over (no
    pace): it runs while the next batch is read and handled, and the next sink transaction
    waits only for what is left of it. Held back for the pace, batch 2's commit would start only
    when batch 3's transaction waits for it, and batch 3's handler would not see it begin. The
    store takes 0.03 s a write (a store far away: not rested yet when the next batch comes)."""
    orders.insert(range(1, 13))  # three batches of 4
    key = PollerConfig(name="orders").key
    started: dict[int, threading.Event] = {4: threading.Event(), 8: threading.Event()}

    class Watching(MemoryStateStore):
        def replace(self, checkpoint: Checkpoint, etag: str) -> str:
            if checkpoint.key == key and checkpoint.position is not None:
                event = started.get(checkpoint.position.pk[0])
                if event is not None:
                    event.set()
                clock.advance(0.03)
            return super().replace(checkpoint, etag)

    store = Watching(clock)
    sink = MemorySink()
    sink.create_table("out", ["id"])
    seen: list[bool] = []

    def handler(batch: Batch, writer: Any) -> None:
        if batch[0].pk > 1:  # batches 2 and 3: the commit of the batch before has begun
            seen.append(started[batch[0].pk - 1].wait(WAIT / 4))
        writer.insert("out", [{"id": c.pk} for c in batch])

    source = SqlSource(url=orders.url, table="orders", cursor="updated_at", pk="id")
    cfg = PollerConfig(name="orders", batch_size=4, pipeline=True)
    Engine(cfg, source, store, handler, clock, owner="o", sink=sink).run(SETTINGS)
    assert seen == [True, True]
    assert stored(store).stats.batches == 3


def test_with_a_sink_a_failed_commit_before_rolls_the_next_batch_back_and_is_the_error(
    orders: Orders, store: GatedStore, clock: FakeClock
) -> None:
    """The commit of batch 1 fails while batch 2's handler runs in its sink transaction: the
    run ends with the commit's error (not a handler failure: no attempt is counted), and batch
    2's rows never reach the sink."""
    orders.insert(range(1, 9))
    store.fail = CheckpointConflictError("orders", "live", expected_etag="a", found_etag="b")
    sink = MemorySink()
    sink.create_table("out", ["id"])

    def handler(batch: Batch, writer: Any) -> None:
        writer.insert("out", [{"id": c.pk} for c in batch])
        if batch[0].pk == 5:
            store.gate.set()

    source = SqlSource(url=orders.url, table="orders", cursor="updated_at", pk="id")
    cfg = PollerConfig(name="orders", batch_size=4, pipeline=True)
    with pytest.raises(CheckpointConflictError):
        Engine(cfg, source, store, handler, clock, owner="o", sink=sink).run(SETTINGS)
    assert sorted(r["id"] for r in sink.rows("out")) == [1, 2, 3, 4]
    cp = stored(store)
    assert (cp.attempts, cp.position) == (0, None)


def test_a_run_that_spends_its_budget_waits_for_its_last_commit(
    orders: Orders, store: GatedStore, clock: FakeClock
) -> None:
    orders.insert(range(1, 17))
    store.gate.set()

    def slow(batch: Batch) -> None:
        clock.advance(8)  # the run's monotonic clock: a 20 s budget goes in 3 batches

    report = make_engine(orders, store, slow, clock, time_budget=20, pipeline=True).run(SETTINGS)
    assert report.status == "budget_spent"
    assert report.batches == 3
    assert stored(store).position.pk == (12,)


# -- coalesced commits -------------------------------------------------------------------------


def test_coalesced_commits_write_once_per_checkpoint_every_rows_and_at_the_end(
    orders: Orders, store: GatedStore, clock: FakeClock
) -> None:
    orders.insert(range(1, 23))
    store.gate.set()
    seen: list[int] = []
    report = make_engine(
        orders,
        store,
        lambda b: seen.extend(c.pk for c in b),
        clock,
        checkpoint_every=8,
        pipeline=False,  # the cadence alone: no commit still in flight when the next is due
    ).run(SETTINGS)
    assert seen == list(range(1, 23))
    # Batches of 4: a commit after every 8 rows, and the last (short) ones at the end.
    assert store.commits == [(8,), (16,), (22,)]
    assert (report.batches, report.rows, report.status) == (6, 22, "caught_up")
    cp = stored(store)
    assert (cp.stats.batches, cp.stats.rows) == (6, 22)


def test_a_crash_with_coalesced_batches_held_back_delivers_them_again(
    orders: Orders, store: GatedStore, clock: FakeClock
) -> None:
    orders.insert(range(1, 17))
    store.gate.set()
    calls: list[list[int]] = []

    def dies_on_the_fourth(batch: Batch) -> None:
        calls.append([c.pk for c in batch])
        if len(calls) == 4:
            raise KeyboardInterrupt  # the process goes away

    with pytest.raises(KeyboardInterrupt):
        make_engine(
            orders, store, dies_on_the_fourth, clock, checkpoint_every=12, pipeline=True
        ).run(SETTINGS)
    # Batches 1-3 (12 rows) were due: committed before the interrupted attempt was counted.
    assert stored(store).position.pk == (12,)
    again: list[int] = []
    make_engine(orders, store, lambda b: again.extend(c.pk for c in b), clock).run(SETTINGS)
    assert again == [13, 14, 15, 16]


def test_coalescing_also_commits_every_checkpoint_seconds(
    orders: Orders, store: GatedStore, clock: FakeClock
) -> None:
    orders.insert(range(1, 17))
    store.gate.set()

    def slow(batch: Batch) -> None:
        clock.advance(4)

    make_engine(
        orders, store, slow, clock, checkpoint_every=1000, checkpoint_seconds=7, pipeline=True
    ).run(SETTINGS)
    # Held since batch 1 (t=4 after its handler): due at batch 3 (t=12 >= 4 + 7), then at the end.
    assert store.commits == [(12,), (16,)]


def test_batches_due_while_the_commit_before_is_in_flight_are_held_not_waited_for(
    orders: Orders, store: GatedStore, clock: FakeClock
) -> None:
    orders.insert(range(1, 19))  # batches of 4, 4, 4, 4, 2; each one due (checkpoint_every=4)
    overlapped: list[bool] = []

    def run_on(batch: Batch) -> None:
        overlapped.append(store.entered.is_set())
        if len(batch) < 4:
            store.gate.set()  # the first commit lands only now

    report = make_engine(orders, store, run_on, clock, checkpoint_every=4).run(SETTINGS)
    # Batches 2-5 were handled while the first commit waited at the gate: held on, not waited
    # for; they went in the one commit after it.
    assert overlapped == [False, True, True, True, True]
    assert store.commits == [(4,), (18,)]
    assert (report.batches, report.rows, report.status) == (5, 18, "caught_up")


def test_batches_held_on_behind_a_commit_in_flight_wait_for_it_at_half_the_lease(
    orders: Orders, store: GatedStore, clock: FakeClock
) -> None:
    orders.insert(range(1, 29))  # seven batches of 4
    calls: list[int] = []

    def slow(batch: Batch) -> None:
        calls.append(len(batch))
        clock.advance(8)
        if len(calls) == 6:  # held since batch 2 (t=16): 32 s >= 30 after this one
            threading.Timer(0.2, store.gate.set).start()

    make_engine(
        orders, store, slow, clock, checkpoint_every=4, lease_duration=60, time_budget=200
    ).run(SETTINGS)
    # The first commit waited at the gate until batch 6: batches 2-6 were held on behind it
    # until half the lease went by, then waited for it and went as one commit; then batch 7.
    assert store.commits == [(4,), (24,), (28,)]


def test_group_commit_sends_the_batches_handed_over_during_a_commit_with_the_next_one(
    orders: Orders, store: GatedStore, clock: FakeClock
) -> None:
    """No knob set: while the first commit waits at the gate, batches 2-5 are handled, not
    waited for one at a time; they go in one commit once it landed."""
    orders.insert(range(1, 19))  # batches of 4, 4, 4, 4, 2
    overlapped: list[bool] = []

    def run_on(batch: Batch) -> None:
        overlapped.append(store.entered.is_set())
        if len(batch) < 4:
            store.gate.set()

    report = make_engine(orders, store, run_on, clock).run(SETTINGS)
    assert overlapped == [False, True, True, True, True]
    assert store.commits == [(4,), (18,)]
    assert (report.batches, report.rows, report.status) == (5, 18, "caught_up")
    cp = stored(store)
    assert (cp.stats.batches, cp.stats.rows) == (5, 18)


def test_group_commit_waits_for_the_commit_in_flight_at_ten_batches_unacknowledged(
    orders: Orders, store: GatedStore, clock: FakeClock
) -> None:
    """Handlers taking 0.2 s each (more than a second of work before ten batches): the run
    hands over batches while the first commit is stuck until ten batches would be
    unacknowledged, the one in the handler included; then it waits for the commit."""
    orders.insert(range(1, 53))  # thirteen batches of 4
    calls: list[tuple[int, bool]] = []

    def slow(batch: Batch) -> None:
        calls.append((batch[0].pk, store.entered.is_set()))
        clock.advance(0.2)
        if len(calls) == 10:  # the tenth batch: unacknowledged 1 + 8 held + this one
            threading.Timer(0.3, store.gate.set).start()

    make_engine(orders, store, slow, clock, lease_duration=60).run(SETTINGS)
    # Batches 2-10 were handled while commit 1 waited; the run waited for it after batch 10 (10
    # batches unacknowledged): batch 11 started after it landed.
    assert [waiting for _, waiting in calls[:11]] == [False] + [True] * 9 + [False]
    assert store.commits[:2] == [(4,), (40,)]
    assert store.commits[-1] == (52,)
    assert stored(store).stats.rows == 52


def test_group_commit_lets_one_second_of_work_wait_when_it_is_more_than_ten_batches(
    orders: Orders, store: GatedStore, clock: FakeClock
) -> None:
    """Fast handlers: 15 batches handed over within 0.15 s while the first commit waits; all of
    them go with the next commit, none waits (the window is ten batches or one second of work,
    whichever is more)."""
    orders.insert(range(1, 65))  # sixteen batches of 4
    waited: list[bool] = []

    def quick(batch: Batch) -> None:
        waited.append(store.entered.is_set())
        clock.advance(0.01)
        if len(waited) == 16:
            store.gate.set()

    make_engine(orders, store, quick, clock).run(SETTINGS)
    assert waited == [False] + [True] * 15
    assert store.commits == [(4,), (64,)]


def test_group_commit_is_off_with_a_transactional_sink_and_without_the_pipeline(
    orders: Orders, store: GatedStore, clock: FakeClock
) -> None:
    orders.insert(range(1, 13))
    store.gate.set()
    make_engine(orders, store, lambda b: None, clock, pipeline=False).run(SETTINGS)
    assert store.commits == [(4,), (8,), (12,)]


class SlowStore(MemoryStateStore):
    """A memory store whose checkpoint writes take 30 ms of real time."""

    def replace(self, checkpoint: Checkpoint, etag: str) -> str:
        time.sleep(0.03)
        return super().replace(checkpoint, etag)


def test_group_commit_never_leaves_more_than_ten_batches_unacknowledged(
    orders: Orders, clock: FakeClock
) -> None:
    """Whatever the commit thread's timing, when a handler starts, the rows handed over before
    its batch and not committed yet are at most nine batches (ten with its own): what a crash
    at that moment delivers again. Handlers take 0.2 s of the engine's clock each, so one second
    of work is five batches and the ten-batch bound is the one that holds."""
    orders.insert(range(1, 201))  # fifty batches of 4
    store = SlowStore(clock)
    exposed: list[int] = []

    def check(batch: Batch) -> None:
        position = stored(store).position
        committed = position.pk[0] if position is not None else 0
        exposed.append(batch[-1].pk - committed)
        clock.advance(0.2)

    report = make_engine(orders, store, check, clock, lease_duration=60).run(SETTINGS)
    assert report.rows == 200
    assert max(exposed) <= 10 * 4
    assert max(exposed) > 2 * 4  # batches did wait for a later commit (else no teeth)
    assert stored(store).stats.batches == 50


class CountingStore(MemoryStateStore):
    """A memory store recording the position of every batch commit (a replace that moves it)."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock)
        self.commits: list[int] = []

    def replace(self, checkpoint: Checkpoint, etag: str) -> str:
        current = self.read(checkpoint.key)
        if current is not None and checkpoint.position != current.checkpoint.position:
            assert checkpoint.position is not None
            self.commits.append(checkpoint.position.pk[0])
        return super().replace(checkpoint, etag)


def test_group_commit_paces_a_fast_store_at_four_batches_a_commit(
    orders: Orders, clock: FakeClock
) -> None:
    """No commit in flight and a store that answers at once: the run's first batch is committed
    at once, later ones wait until four batches' worth (PACE_BATCHES) are waiting, so a fast
    drain writes a commit per four batches, not one per batch; the last ones go at the end."""
    orders.insert(range(1, 51))  # twelve batches of 4, then one of 2
    store = CountingStore(clock)
    report = make_engine(orders, store, lambda b: None, clock).run(SETTINGS)
    assert report.rows == 50
    assert store.commits[0] == 4
    assert store.commits[-1] == 50
    steps = [b - a for a, b in zip([0, *store.commits], store.commits, strict=False)]
    # Every commit but the first and the last acknowledges at least four batches (more when it
    # also took the batches handed over while the one before was in flight).
    assert all(step >= 4 * 4 for step in steps[1:-1]), store.commits
    assert len(store.commits) <= 5, store.commits
    assert stored(store).stats.batches == 13


def test_group_commit_paces_slow_handlers_by_a_tenth_of_a_second(
    orders: Orders, clock: FakeClock
) -> None:
    """Handlers taking 0.06 s each: a batch handed over waits for a commit at most PACE_SECONDS
    (0.1 s) plus the handler call during which that time ran out, so a commit goes every third
    batch, not every fourth (PACE_BATCHES): a crash delivers again the rows of about the last
    tenth of a second, plus the batch in the handler."""
    orders.insert(range(1, 41))  # ten batches of 4
    store = CountingStore(clock)

    def slow(batch: Batch) -> None:
        clock.advance(0.06)

    make_engine(orders, store, slow, clock).run(SETTINGS)
    steps = [b - a for a, b in zip([0, *store.commits], store.commits, strict=False)]
    assert store.commits[-1] == 40
    assert max(steps) <= 3 * 4, store.commits  # never more than three batches a commit
    assert 3 * 4 in steps, store.commits  # and batches did wait for a later commit


class FarStore(MemoryStateStore):
    """A memory store whose batch commits take ``took`` seconds of the fake clock (a store far
    away, like Azure Storage); records when each began and landed."""

    def __init__(self, clock: FakeClock, took: float) -> None:
        super().__init__(clock)
        self.clock, self.took = clock, took
        self.writes: list[tuple[float, float]] = []  # (began, landed) of each batch commit

    def replace(self, checkpoint: Checkpoint, etag: str) -> str:
        current = self.read(checkpoint.key)
        if current is None or checkpoint.position == current.checkpoint.position:
            return super().replace(checkpoint, etag)
        began = self.clock.monotonic()
        self.clock.advance(self.took)
        etag = super().replace(checkpoint, etag)
        self.writes.append((began, self.clock.monotonic()))
        return etag


def test_group_commit_rests_a_slow_store_as_long_as_its_last_commit_took(
    orders: Orders, clock: FakeClock
) -> None:
    """Commits taking 0.03 s (Azure Storage's order), batches every 0.005 s: once a commit
    landed, the next one starts only after the store rested as long (the commit thread is busy
    at most about half the time: half the requests of back-to-back commits, each with more
    batches), not as soon as four batches are waiting. The commit of the run's end goes at
    once."""
    orders.insert(range(1, 241))  # sixty batches of 4
    store = FarStore(clock, took=0.03)

    def handler(batch: Batch) -> None:
        clock.advance(0.005)
        time.sleep(0.0005)  # let the commit thread run

    report = make_engine(orders, store, handler, clock).run(SETTINGS)
    assert report.rows == 240
    assert stored(store).stats.batches == 60
    assert len(store.writes) >= 3, store.writes
    for (began, landed), (next_began, _) in zip(store.writes, store.writes[1:-1], strict=False):
        assert next_began - landed >= min(landed - began, 0.1) - 1e-9, store.writes


def test_coalescing_is_refused_with_a_transactional_sink(orders: Orders, clock: FakeClock) -> None:
    from azure_functions_db.core.engine import Engine, PollerConfig
    from azure_functions_db.errors import ConfigurationError
    from azure_functions_db.sources.sqlalchemy import SqlSource

    source = SqlSource(url=orders.url, table="orders", cursor="updated_at", pk="id")
    cfg = PollerConfig(name="orders", checkpoint_every=5000)
    with pytest.raises(ConfigurationError, match="checkpoint must follow every batch"):
        Engine(
            cfg,
            source,
            MemoryStateStore(clock),
            lambda b, s: None,
            clock,
            owner="o",
            sink=MemorySink(),
        )


# -- low-latency mode --------------------------------------------------------------------------


def test_low_latency_mode_keeps_polling_under_one_lease_until_the_budget_is_spent(
    orders: Orders, store: GatedStore, clock: FakeClock
) -> None:
    orders.insert(range(1, 5))
    store.gate.set()
    seen: list[list[int]] = []
    waits: list[float] = []
    real_sleep = clock.sleep

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        if len(waits) == 3:  # a writer commits new rows while the run waits
            orders.insert(range(5, 8), base=orders_base(2))
        real_sleep(seconds)

    clock.sleep = sleep  # type: ignore[method-assign]
    acquired = 0
    real_acquire = store.acquire

    def counting_acquire(*args: Any) -> Any:
        nonlocal acquired
        acquired += 1
        return real_acquire(*args)

    store.acquire = counting_acquire  # type: ignore[method-assign]
    engine = make_engine(
        orders,
        store,
        lambda b: seen.append([c.pk for c in b]),
        clock,
        poll_interval=2.0,
        time_budget=12.0,
        pipeline=True,
    )
    report = engine.run(SETTINGS)
    assert seen == [[1, 2, 3, 4], [5, 6, 7]]  # the later rows came in the same run
    assert acquired == 1  # one lease for the whole run
    assert waits == [2.0] * 5  # polled every 2 s until the 12 s budget would be spent
    assert report.status == "caught_up"
    assert (report.batches, report.rows) == (2, 7)
    assert stored(store).position.pk == (7,)
    assert store.commits == [(4,), (7,)]  # no checkpoint write while idle


def test_poll_interval_must_fit_in_the_budget() -> None:
    from azure_functions_db.core.config import PollerConfig
    from azure_functions_db.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="poll_interval"):
        PollerConfig(name="orders", poll_interval=300, time_budget=240)


def orders_base(hours: int) -> Any:
    import datetime as dt

    from tests.support.sqlite_orders import T0

    return T0 + dt.timedelta(hours=hours)
