"""The run loop against a real SQLite source and the memory/local state stores.

Covers the delivery contract and failure-matrix cases A, B, G, H, I, L at unit speed; the crash
cases E and F with real killed processes live in ``test_crash_cases.py``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from azure_functions_db.core.batch import Batch, RowChanges
from azure_functions_db.core.checkpoint import Checkpoint
from azure_functions_db.core.engine import Engine, PollerConfig
from azure_functions_db.core.ports import Horizon, StateStore
from azure_functions_db.errors import (
    CheckpointConflictError,
    CheckpointCorruptError,
    ConfigurationError,
    FenceBehindCheckpointError,
    HandlerError,
    LeaseLostError,
    PoisonBatchError,
    SourceDefinitionError,
    StateStoreError,
    TransientSourceError,
    TransientStoreError,
)
from azure_functions_db.ops.seek import seek
from azure_functions_db.runtime.poller import PollerDefinition
from azure_functions_db.sources.sqlalchemy import SqlSource
from azure_functions_db.state.local import LocalStateStore
from azure_functions_db.state.memory import MemoryStateStore
from azure_functions_db.testing.clock import FakeClock
from tests.support.sqlite_orders import T0, Orders

SETTINGS: dict[str, str] = {}


class Recorder:
    """A handler that records what it saw and can be told to fail."""

    def __init__(self) -> None:
        self.batches: list[Batch] = []
        self.fail_with: BaseException | None = None

    def __call__(self, batch: Batch) -> None:
        self.batches.append(batch)
        if self.fail_with is not None:
            raise self.fail_with

    @property
    def ids(self) -> list[int]:
        return [c.pk for b in self.batches for c in b]


@pytest.fixture
def orders(tmp_path: Path) -> Iterator[Orders]:
    table = Orders(tmp_path / "orders.db")
    yield table
    table.close()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(params=["memory", "local"])
def store(request: pytest.FixtureRequest, clock: FakeClock, tmp_path: Path) -> StateStore:
    if request.param == "memory":
        return MemoryStateStore(clock)
    return LocalStateStore(tmp_path / "state", clock=clock)


def make_engine(
    orders: Orders,
    store: StateStore,
    handler: Any,
    clock: FakeClock,
    *,
    batch_size: int = 4,
    owner: str = "test-owner",
    **config: Any,
) -> Engine:
    source = SqlSource(url=orders.url, table="orders", cursor="updated_at", pk="id")
    cfg = PollerConfig(name="orders", batch_size=batch_size, **config)
    return Engine(cfg, source, store, handler, clock, owner=owner, heartbeat_interval=3600)


def stored(store: StateStore) -> Checkpoint:
    record = store.read(PollerConfig(name="orders").key)
    assert record is not None
    return record.checkpoint


# -- the happy path ---------------------------------------------------------------------------


def test_drains_every_row_in_keyset_order_across_tied_batches(orders, store, clock):
    orders.insert(range(1, 24), tie_every=5)  # ties straddle every 4-row batch boundary
    handler = Recorder()
    report = make_engine(orders, store, handler, clock).run(SETTINGS)
    assert handler.ids == list(range(1, 24))
    assert [len(b) for b in handler.batches] == [4, 4, 4, 4, 4, 3]
    assert report.status == "caught_up"
    assert (report.batches, report.rows) == (6, 23)
    cp = stored(store)
    assert cp.position is not None
    assert cp.position.pk == (23,)
    assert cp.stats.rows == 23


def test_idle_run_delivers_nothing_and_new_rows_come_next(orders, store, clock):
    orders.insert(range(1, 6))
    handler = Recorder()
    engine = make_engine(orders, store, handler, clock)
    engine.run(SETTINGS)
    handler.batches.clear()
    assert engine.run(SETTINGS).rows == 0
    assert handler.batches == []
    orders.insert([6, 7], base=T0 + dt.timedelta(hours=1))
    orders.touch([2], T0 + dt.timedelta(hours=2))
    engine.run(SETTINGS)
    assert handler.ids == [6, 7, 2]
    assert [c.data["note"] for c in handler.batches[0]] == ["n6", "n7", "upd"]


def test_batch_metadata_and_stable_event_ids(orders, store, clock):
    orders.insert(range(1, 4))
    first, second = Recorder(), Recorder()
    make_engine(orders, store, first, clock).run(SETTINGS)
    batch = first.batches[0]
    assert (batch.poller, batch.namespace, batch.attempt) == ("orders", "live", 1)
    assert batch.position_before is None
    assert batch.position_after == batch[-1].position
    assert batch.fence >= 1
    # A replay from the beginning yields the same event ids (idempotency keys).
    seek_store_to_beginning(orders, store, clock)
    make_engine(orders, store, second, clock).run(SETTINGS)
    assert [c.event_id for c in second.batches[0]] == [c.event_id for c in batch]
    assert len({c.event_id for c in batch}) == 3


def seek_store_to_beginning(orders: Orders, store: StateStore, clock: FakeClock) -> None:
    definition = PollerDefinition(
        config=PollerConfig(name="orders"),
        schedule="0 * * * * *",
        source=SqlSource(url=orders.url, table="orders", cursor="updated_at", pk="id"),
        handler=Recorder(),
        state=store,
        clock=clock,
    )
    seek(definition, SETTINGS, "beginning", reason="test replay", by="tester")


def test_async_handler(orders, store, clock):
    orders.insert(range(1, 6))
    seen: list[int] = []

    async def handler(batch: Batch) -> None:
        await asyncio.sleep(0)
        seen.extend(c.pk for c in batch)

    make_engine(orders, store, handler, clock).run(SETTINGS)
    assert seen == [1, 2, 3, 4, 5]


def test_time_budget_ends_the_run_and_the_next_run_continues(orders, store, clock):
    orders.insert(range(1, 21))
    handler = Recorder()

    def slow(batch: Batch) -> None:
        handler(batch)
        clock.advance(4)

    engine = make_engine(orders, store, slow, clock, time_budget=10, lease_duration=15)
    report = engine.run(SETTINGS)
    assert report.status == "budget_spent"
    assert report.batches == 3
    engine.run(SETTINGS)
    engine.run(SETTINGS)
    assert handler.ids == list(range(1, 21))


def test_lease_held_elsewhere_is_a_clean_no_op(orders, store, clock, caplog):
    orders.insert(range(1, 3))
    other = store.acquire(PollerConfig(name="orders").key, "someone-else", 30)
    assert other is not None
    handler = Recorder()
    with caplog.at_level(logging.INFO, logger="azure_functions_db"):
        report = make_engine(orders, store, handler, clock).run(SETTINGS)
    assert report.status == "lease_held"
    assert report.holder == "someone-else"
    assert handler.batches == []
    assert "action=lease_held" in caplog.text
    assert "someone-else" in caplog.text


class ScriptedHorizonSource(SqlSource):
    """A real SQLite source whose horizon bounds the test gives in turn (the last one repeats);
    it counts the horizon calls and records the horizon each fetch was made under."""

    def __init__(self, url: str, bounds: list[dt.datetime]) -> None:
        super().__init__(url=url, table="orders", cursor="updated_at", pk="id")
        self.bounds = bounds
        self.taken: list[Horizon] = []
        self.fetched_under: list[Horizon] = []

    def horizon(self) -> Horizon:
        bound = self.bounds[min(len(self.taken), len(self.bounds) - 1)]
        self.taken.append(Horizon(bound=bound, method="scripted"))
        return self.taken[-1]

    def fetch(self, after: Any, limit: int, horizon: Horizon) -> Any:
        self.fetched_under.append(horizon)
        return super().fetch(after, limit, horizon)


def test_backlog_drain_takes_the_horizon_once_per_catch_up_not_per_batch(orders, store, clock):
    orders.insert(range(1, 201), tie_every=7)
    source = ScriptedHorizonSource(orders.url, [T0 + dt.timedelta(hours=1)])
    handler = Recorder()
    engine = Engine(
        PollerConfig(name="orders", batch_size=4), source, store, handler, clock, owner="x"
    )
    report = engine.run(SETTINGS)
    assert handler.ids == list(range(1, 201))
    assert report.status == "caught_up"
    # 50 full batches under the first bound; the empty read after them was under that kept bound,
    # so a fresh one is taken and read under before the run calls itself caught up.
    assert len(source.taken) == 2
    assert len(source.fetched_under) == 52
    assert all(h is source.taken[0] for h in source.fetched_under[:51])
    assert source.fetched_under[51] is source.taken[1]


def test_short_batch_under_a_kept_bound_takes_a_fresh_one_and_the_run_goes_on(orders, store, clock):
    orders.insert(range(1, 11), tie_every=1)  # row i has cursor T0 + i s
    # The first bound lets rows 1-6 through; by the time it is taken again, every row may go.
    first, later = T0 + dt.timedelta(seconds=7), T0 + dt.timedelta(hours=1)
    source = ScriptedHorizonSource(orders.url, [first, later])
    handler = Recorder()
    engine = Engine(
        PollerConfig(name="orders", batch_size=4), source, store, handler, clock, owner="x"
    )
    report = engine.run(SETTINGS)
    # Batch 2 came back short (rows 5-6) under the kept first bound: not caught up, since rows
    # 7-10 were waiting above it. Only the empty read under a fresh bound ends the run.
    assert [len(b) for b in handler.batches] == [4, 2, 4]
    assert handler.ids == list(range(1, 11))
    assert report.status == "caught_up"
    assert [h.bound for h in source.fetched_under] == [first, first, later, later, later]
    t = source.taken  # each read under the horizon taken last before it, none taken per batch
    assert [id(h) for h in source.fetched_under] == [id(x) for x in (t[0], t[0], t[1], t[1], t[2])]
    assert stored(store).position.pk == (10,)


def test_short_batch_under_a_fresh_bound_ends_the_run(orders, store, clock):
    orders.insert(range(1, 11), tie_every=1)
    source = ScriptedHorizonSource(orders.url, [T0 + dt.timedelta(seconds=3)])
    handler = Recorder()
    engine = Engine(
        PollerConfig(name="orders", batch_size=4), source, store, handler, clock, owner="x"
    )
    report = engine.run(SETTINGS)
    assert handler.ids == [1, 2]  # rows at or above the bound wait for a later run
    assert report.status == "caught_up"
    assert len(source.taken) == 1


class SpyChangeSource(SqlSource):
    """A real SQLite source that keeps the Change objects it built for the engine."""

    def __init__(self, url: str) -> None:
        super().__init__(url=url, table="orders", cursor="updated_at", pk="id")
        self.built: list[Any] = []

    def fetch_changes(self, *args: Any) -> Any:
        changes = super().fetch_changes(*args)
        self.built.append(changes)
        return changes


def test_the_handler_gets_the_change_objects_the_source_built(orders, store, clock):
    orders.insert(range(1, 11))
    source = SpyChangeSource(orders.url)
    handler = Recorder()
    engine = Engine(
        PollerConfig(name="orders", batch_size=4), source, store, handler, clock, owner="x"
    )
    engine.run(SETTINGS)
    delivered = [c for b in handler.batches for c in b]
    assert [c.pk for c in delivered] == list(range(1, 11))
    # Each batch holds the very sequence the source built (no copy into a tuple of objects).
    assert [b.changes for b in handler.batches] == source.built[: len(handler.batches)]
    assert all(b.changes is s for b, s in zip(handler.batches, source.built, strict=False))
    assert [type(b.changes) for b in handler.batches] == [RowChanges] * 3
    assert {c.poller for c in delivered} == {"orders"}


def test_a_source_subclass_that_overrides_fetch_is_still_read_through_it(orders, store, clock):
    orders.insert(range(1, 11))

    class EvenOnly(SqlSource):
        def fetch(self, *args: Any) -> Any:
            return [r for r in super().fetch(*args) if r.position.pk[0] % 2 == 0]

    source = EvenOnly(url=orders.url, table="orders", cursor="updated_at", pk="id")
    handler = Recorder()
    engine = Engine(PollerConfig(name="orders"), source, store, handler, clock, owner="x")
    engine.run(SETTINGS)
    assert handler.ids == [2, 4, 6, 8, 10]


# -- failure matrix -------------------------------------------------------------------------


def test_case_a_handler_failure_keeps_checkpoint_and_redelivers(orders, store, clock, caplog):
    orders.insert(range(1, 10))
    handler = Recorder()
    engine = make_engine(orders, store, handler, clock)
    handler.fail_with = RuntimeError("downstream is down")
    with caplog.at_level(logging.ERROR), pytest.raises(HandlerError) as info:
        engine.run(SETTINGS)
    assert info.value.attempts == 1
    assert "action=handler_failed" in caplog.text
    cp = stored(store)
    assert cp.position is None
    assert cp.attempts == 1
    assert cp.last_error is not None
    assert "downstream is down" in cp.last_error
    handler.fail_with = None
    engine.run(SETTINGS)
    assert [c.pk for c in handler.batches[1]] == [c.pk for c in handler.batches[0]]
    assert handler.batches[1].attempt == 2
    assert handler.ids[4:] == list(range(1, 10))
    assert stored(store).attempts == 0


def test_case_a_failure_after_progress_resumes_at_failed_batch(orders, store, clock):
    orders.insert(range(1, 13))
    calls = {"n": 0}
    seen: list[list[int]] = []

    def handler(batch: Batch) -> None:
        calls["n"] += 1
        seen.append([c.pk for c in batch])
        if calls["n"] == 2:
            raise ValueError("bad row")

    engine = make_engine(orders, store, handler, clock)
    with pytest.raises(HandlerError):
        engine.run(SETTINGS)
    position = stored(store).position
    assert position is not None
    assert position.pk == (4,)
    engine.run(SETTINGS)
    assert seen == [[1, 2, 3, 4], [5, 6, 7, 8], [5, 6, 7, 8], [9, 10, 11, 12]]


class FlakyStore:
    """Wraps a real store; the Nth ``replace`` fails (before or after writing)."""

    def __init__(self, inner: StateStore, fail_on: int, *, land: bool, error: Exception) -> None:
        self.inner = inner
        self.fail_on = fail_on
        self.land = land
        self.error = error
        self.replaces = 0

    def replace(self, checkpoint: Checkpoint, etag: str) -> str:
        self.replaces += 1
        if self.replaces == self.fail_on:
            if self.land:
                self.inner.replace(checkpoint, etag)
            raise self.error
        return self.inner.replace(checkpoint, etag)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def first_commit_fails_then_rerun(
    orders: Orders, store: StateStore, clock: FakeClock, error: Exception
) -> Recorder:
    """Run with the first commit failing (not landing) with ``error``, then run again.

    Commits are not pipelined here, so the run ends right at the failed commit; with a commit
    in flight the next batch is handled first (``tests/unit/test_engine_pipeline.py``)."""
    orders.insert(range(1, 9))
    handler = Recorder()
    # A fresh poller's fencing write is a create, so replace #1 is the first commit.
    flaky = FlakyStore(store, 1, land=False, error=error)
    with pytest.raises(type(error)):
        make_engine(orders, flaky, handler, clock, pipeline=False).run(SETTINGS)  # type: ignore[arg-type]
    assert stored(store).position is None
    make_engine(orders, store, handler, clock).run(SETTINGS)
    return handler


def test_case_b_commit_failure_redelivers_the_batch(orders, store, clock):
    handler = first_commit_fails_then_rerun(orders, store, clock, StateStoreError("disk full"))
    assert handler.ids == [1, 2, 3, 4, 1, 2, 3, 4, 5, 6, 7, 8]


def test_case_d_row_updated_again_before_it_was_polled_delivers_its_latest_state(
    orders, store, clock
):
    orders.insert(range(1, 5))
    handler = Recorder()
    engine = make_engine(orders, store, handler, clock)
    engine.run(SETTINGS)
    orders.touch([2], T0 + dt.timedelta(hours=1))
    with orders.engine.begin() as conn:  # a second update before the next poll
        conn.execute(
            orders.table.update()
            .where(orders.table.c.id == 2)
            .values(note="second", updated_at=T0 + dt.timedelta(hours=2))
        )
    handler.batches.clear()
    engine.run(SETTINGS)
    assert [(c.pk, c.data["note"]) for c in handler.batches[0]] == [(2, "second")]


def test_case_g_ambiguous_commit_that_landed_is_recognised(orders, store, clock, caplog):
    orders.insert(range(1, 9))
    handler = Recorder()
    flaky = FlakyStore(store, 1, land=True, error=TransientStoreError("timeout"))
    with caplog.at_level(logging.WARNING):
        make_engine(orders, flaky, handler, clock).run(SETTINGS)  # type: ignore[arg-type]
    assert "action=commit_ambiguous_landed" in caplog.text
    assert handler.ids == list(range(1, 9))
    assert stored(store).stats.rows == 8


class ForgetfulStore(FlakyStore):
    """The first commit lands, then the store forgets the live lease (as an emulator does when it
    restarts) and the caller never hears the answer."""

    def __init__(self, inner: StateStore) -> None:
        super().__init__(inner, 1, land=True, error=TransientStoreError("connection reset"))
        self.grant: Any = None

    def acquire(self, *args: Any) -> Any:
        self.grant = self.inner.acquire(*args)
        return self.grant

    def replace(self, checkpoint: Checkpoint, etag: str) -> str:
        self.replaces += 1
        if self.replaces != self.fail_on:
            return self.inner.replace(checkpoint, etag)
        self.inner.replace(checkpoint, etag)
        self.inner.release(self.grant)  # the lease is gone, though within its term
        raise self.error


def test_case_g_after_an_unanswered_commit_the_lease_is_confirmed_before_the_next_batch(
    orders, store, clock
):
    """A store that lost its answer may have lost more: before another handler call, the
    engine renews the lease, and a lease the store forgot ends the run (no second call).
    Unpipelined: with a commit in flight the next call may start before the answer is lost
    (``tests/unit/test_engine_pipeline.py``); the lease check still ends the run."""
    orders.insert(range(1, 9))
    handler = Recorder()
    forgetful = ForgetfulStore(store)
    with pytest.raises(LeaseLostError):
        make_engine(orders, forgetful, handler, clock, pipeline=False).run(SETTINGS)  # type: ignore[arg-type]
    assert handler.ids == [1, 2, 3, 4]
    assert stored(store).position is not None


def test_case_g_ambiguous_commit_that_did_not_land_redelivers(orders, store, clock):
    handler = first_commit_fails_then_rerun(orders, store, clock, TransientStoreError("timeout"))
    assert handler.ids == [1, 2, 3, 4, 1, 2, 3, 4, 5, 6, 7, 8]


def test_case_h_lease_lost_during_handler_discards_the_result(orders, store, clock, caplog):
    orders.insert(range(1, 9))

    def outlives_lease(batch: Batch) -> None:
        clock.advance(31)  # longer than the 30 s lease, and no heartbeat got through

    with caplog.at_level(logging.WARNING), pytest.raises(LeaseLostError) as info:
        make_engine(orders, store, outlives_lease, clock).run(SETTINGS)
    assert stored(store).position is None
    assert "action=lease_lost" in caplog.text
    assert str(info.value).count("was lost") == 1


def test_case_c_stale_owner_commit_is_rejected_by_the_fence(orders, store, clock, tmp_path):
    """Owner A's own clock says its lease is fine, but the store expired it; B took over."""
    orders.insert(range(1, 9))
    a_clock = FakeClock()  # A's monotonic clock does not move: it believes it holds the lease
    b_handler = Recorder()

    def a_handler(batch: Batch) -> None:
        clock.advance(31)  # the store's clock: A's lease expires
        make_engine(orders, store, b_handler, clock, owner="B").run(SETTINGS)

    # Unpipelined: A's run ends at its rejected commit (tests/unit/test_engine_pipeline.py has
    # the same case with the commit in flight while A handles its next batch).
    engine_a = make_engine(orders, store, a_handler, a_clock, owner="A", pipeline=False)
    with pytest.raises(CheckpointConflictError) as info:
        engine_a.run(SETTINGS)
    assert "orders" in str(info.value)
    cp = stored(store)
    assert b_handler.ids == list(range(1, 9))
    assert cp.position is not None
    assert cp.position.pk == (8,)
    assert cp.fence == 2


def test_case_i_poison_batch_halts_without_skipping(orders, store, clock, caplog):
    orders.insert(range(1, 9))
    handler = Recorder()
    handler.fail_with = KeyError("poison")
    engine = make_engine(orders, store, handler, clock, max_attempts=3)
    for attempt in (1, 2):
        with pytest.raises(HandlerError) as info:
            engine.run(SETTINGS)
        assert not isinstance(info.value, PoisonBatchError)
        assert info.value.attempts == attempt
    for attempt in (3, 4):
        with caplog.at_level(logging.CRITICAL), pytest.raises(PoisonBatchError) as poison:
            engine.run(SETTINGS)
        assert "action=poison_batch" in caplog.text
        assert poison.value.attempts == attempt
        assert "afdb seek" in str(poison.value)
    assert stored(store).position is None
    assert all([c.pk for c in b] == [1, 2, 3, 4] for b in handler.batches)
    # The operator moves past the poison batch explicitly; delivery resumes after it.
    definition = PollerDefinition(
        config=PollerConfig(name="orders"),
        schedule="0 * * * * *",
        source=SqlSource(url=orders.url, table="orders", cursor="updated_at", pk="id"),
        handler=handler,
        state=store,
        clock=clock,
    )
    cursor = (T0 + dt.timedelta(seconds=2),)  # rows 1-5 have cursors below this
    result = seek(definition, SETTINGS, "cursor", cursor=cursor, reason="skip poison", by="ops")
    assert result.from_position is None
    handler.fail_with = None
    handler.batches.clear()
    engine.run(SETTINGS)
    assert handler.ids == [6, 7, 8]
    audit = stored(store).seek
    assert audit is not None
    assert (audit.by, audit.reason) == ("ops", "skip poison")


def test_case_l_changed_cursor_column_stops_with_a_way_out(orders, store, clock):
    orders.insert(range(1, 5))
    make_engine(orders, store, Recorder(), clock).run(SETTINGS)
    source = SqlSource(url=orders.url, table="orders", cursor="id", pk="id")
    engine = Engine(PollerConfig(name="orders"), source, store, Recorder(), clock, owner="x")
    with pytest.raises(SourceDefinitionError) as info:
        engine.run(SETTINGS)
    message = str(info.value)
    assert "afdb seek" in message
    assert "new name" in message
    # The way out the message names works: seek adopts the new definition.
    handler = Recorder()
    definition = PollerDefinition(
        config=PollerConfig(name="orders"),
        schedule="0 * * * * *",
        source=source,
        handler=handler,
        state=store,
        clock=clock,
    )
    seek(definition, SETTINGS, "beginning", reason="cursor is now id", by="ops")
    engine = Engine(PollerConfig(name="orders"), source, store, handler, clock, owner="x")
    engine.run(SETTINGS)
    assert handler.ids == [1, 2, 3, 4]
    assert stored(store).source == source.description


def test_case_l_changed_filter_continues_with_a_warning(orders, store, clock, caplog):
    orders.insert(range(1, 5))
    make_engine(orders, store, Recorder(), clock).run(SETTINGS)
    orders.insert([5, 6], base=T0 + dt.timedelta(hours=1))
    source = SqlSource(
        url=orders.url,
        table="orders",
        cursor="updated_at",
        pk="id",
        where=sa.column("id") != 5,
    )
    handler = Recorder()
    engine = Engine(PollerConfig(name="orders"), source, store, handler, clock, owner="x")
    with caplog.at_level(logging.WARNING):
        engine.run(SETTINGS)
    assert "action=source_filter_changed" in caplog.text
    assert handler.ids == [6]
    # The fencing write adopted the new filter: the warning is not repeated on every run.
    assert stored(store).source == source.description
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        engine.run(SETTINGS)
    assert "source_filter_changed" not in caplog.text


def test_corrupt_checkpoint_is_never_overwritten(orders, clock, tmp_path):
    orders.insert(range(1, 5))
    store = LocalStateStore(tmp_path / "state", clock=clock)
    make_engine(orders, store, Recorder(), clock).run(SETTINGS)
    files = list((tmp_path / "state").rglob("*.checkpoint*"))
    assert files
    for f in files:
        f.write_bytes(b"\x00garbage")
    handler = Recorder()
    with pytest.raises(CheckpointCorruptError):
        make_engine(orders, store, handler, clock).run(SETTINGS)
    assert handler.batches == []
    assert all(f.read_bytes() == b"\x00garbage" for f in files)


class FlakySource(SqlSource):
    """A real SQLite source whose first ``fetch`` calls fail transiently."""

    failures = 0

    def fetch(self, *args: Any, **kwargs: Any) -> Any:
        if self.failures > 0:
            self.failures -= 1
            raise TransientSourceError("connection reset")
        return super().fetch(*args, **kwargs)


def test_transient_source_errors_are_retried_with_backoff(orders, store, clock):
    orders.insert(range(1, 4))
    source = FlakySource(url=orders.url, table="orders", cursor="updated_at", pk="id")
    source.failures = 2
    handler = Recorder()
    start = clock.monotonic()
    engine = Engine(PollerConfig(name="orders"), source, store, handler, clock, owner="x")
    engine.run(SETTINGS)
    assert handler.ids == [1, 2, 3]
    assert clock.monotonic() - start >= 0.5 + 1.0  # two backoff sleeps: 0.5 s, then 1 s


def test_persistent_source_errors_end_the_run_unacknowledged(orders, store, clock):
    orders.insert(range(1, 4))
    source = FlakySource(url=orders.url, table="orders", cursor="updated_at", pk="id")
    source.failures = 100
    engine = Engine(PollerConfig(name="orders"), source, store, Recorder(), clock, owner="x")
    with pytest.raises(TransientSourceError):
        engine.run(SETTINGS)
    assert stored(store).position is None
    assert store.inspect(PollerConfig(name="orders").key).state == "free"


def test_lease_is_released_after_every_run(orders, store, clock):
    orders.insert(range(1, 4))
    handler = Recorder()
    handler.fail_with = RuntimeError("x")
    key = PollerConfig(name="orders").key
    with pytest.raises(HandlerError):
        make_engine(orders, store, handler, clock).run(SETTINGS)
    assert store.inspect(key).state == "free"
    handler.fail_with = None
    make_engine(orders, store, handler, clock).run(SETTINGS)
    assert store.inspect(key).state == "free"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("batch_size", 0),
        ("batch_size", -5),
        ("batch_size", 2.5),
        ("lease_duration", 0),
        ("time_budget", -1),
        ("max_attempts", 0),
        ("name", "has space"),
        ("namespace", ""),
    ],
)
def test_config_errors_name_the_value(field, value):
    kwargs: dict[str, Any] = {"name": "orders", field: value}
    with pytest.raises(ConfigurationError) as info:
        PollerConfig(**kwargs)
    assert repr(value) in str(info.value) or str(value) in str(info.value)


def test_case_g_conflict_from_a_retried_write_that_had_landed_is_recognised(
    orders, store, clock, caplog
):
    """An SDK retry of a commit whose first attempt landed sees 412: read back, not redeliver."""
    orders.insert(range(1, 9))
    handler = Recorder()
    flaky = FlakyStore(
        store,
        1,
        land=True,
        error=CheckpointConflictError("orders", "live", expected_etag="a", found_etag="b"),
    )
    with caplog.at_level(logging.WARNING):
        make_engine(orders, flaky, handler, clock).run(SETTINGS)  # type: ignore[arg-type]
    assert "action=commit_ambiguous_landed" in caplog.text
    assert "commit_rejected" not in caplog.text
    assert handler.ids == list(range(1, 9))


def test_lost_lease_counter_gives_a_clear_error_and_the_documented_repair_works(
    orders, clock, tmp_path
):
    """A deleted lease record restarts its fence below the checkpoint's: refuse, explain."""
    orders.insert(range(1, 5))
    store = LocalStateStore(tmp_path / "state", clock=clock)
    key = PollerConfig(name="orders").key
    make_engine(orders, store, Recorder(), clock).run(SETTINGS)
    make_engine(orders, store, Recorder(), clock).run(SETTINGS)
    assert stored(store).fence == 2
    store.lease_path(key).unlink()  # an operator deletes the lease record
    handler = Recorder()
    with pytest.raises(FenceBehindCheckpointError) as info:
        make_engine(orders, store, handler, clock).run(SETTINGS)
    assert info.value.stored == 2
    assert "set the lease's `fence` to 2 or more" in str(info.value)
    assert handler.batches == []
    definition = PollerDefinition(
        config=PollerConfig(name="orders"),
        schedule="0 * * * * *",
        source=SqlSource(url=orders.url, table="orders", cursor="updated_at", pk="id"),
        handler=handler,
        state=store,
        clock=clock,
    )
    with pytest.raises(FenceBehindCheckpointError):
        seek(definition, SETTINGS, "beginning", by="ops")
    # The repair the message names: raise the lease's fence to the checkpoint's.
    lease = json.loads(store.lease_path(key).read_text())
    store.lease_path(key).write_text(json.dumps({**lease, "fence": 2}))
    orders.insert([5], base=T0 + dt.timedelta(hours=1))
    make_engine(orders, store, handler, clock).run(SETTINGS)
    assert handler.ids == [5]
    assert stored(store).fence == 3
