"""The engine with a transactional sink (the in-memory fake, held to the sink contract): the
batch's writes and its mark commit together, a crash between the sink's commit and the
checkpoint's loses nothing and repeats nothing, a stale owner writes nothing."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from azure_functions_db.core.batch import Batch
from azure_functions_db.core.checkpoint import Checkpoint
from azure_functions_db.core.engine import Engine, PollerConfig
from azure_functions_db.errors import ConfigurationError, HandlerError, SinkFencedError
from azure_functions_db.sinks.memory import MemorySink, MemoryWriter
from azure_functions_db.sources.memory import MemorySource
from azure_functions_db.state.memory import MemoryStateStore
from azure_functions_db.testing.clock import FakeClock

CONFIG = PollerConfig(name="orders", batch_size=3)


class Crash(BaseException):
    """The process dies here (nothing after it runs, nothing is cleaned up)."""


class CrashingStore(MemoryStateStore):
    """Dies on the next checkpoint commit after a batch, once armed: after the sink committed."""

    armed = False

    def replace(self, new: Checkpoint, etag: str) -> str:
        if self.armed and new.stats.batches > 0 and new.committed_at is not None:
            stored = self.read(new.key)
            if stored is not None and new.stats.batches > stored.checkpoint.stats.batches:
                self.armed = False
                raise Crash
        return super().replace(new, etag)


def rows(n: int, version: int = 1) -> list[dict[str, Any]]:
    return [{"id": i, "v": i, "version": version} for i in range(1, n + 1)]


class Copier:
    def __init__(self) -> None:
        self.calls: list[list[int]] = []
        self.fail = False

    def __call__(self, batch: Batch, sink: MemoryWriter) -> None:
        self.calls.append([c.pk for c in batch])
        sink.upsert("copy", batch)
        if self.fail:
            raise RuntimeError("handler failed after writing")


def engine(
    source: MemorySource,
    store: MemoryStateStore,
    sink: MemorySink,
    clock: FakeClock,
    handler: Any,
    *,
    owner: str = "a",
) -> Engine:
    return Engine(CONFIG, source, store, handler, clock, owner=owner, sink=sink)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def sink() -> MemorySink:
    made = MemorySink()
    made.create_table("copy", ["id"])
    return made


def test_batches_and_their_marks_commit_together(clock: FakeClock, sink: MemorySink) -> None:
    source = MemorySource("orders", "v", "id", rows(7))
    store = MemoryStateStore(clock)
    copier = Copier()
    report = engine(source, store, sink, clock, copier).run({})
    assert (report.status, report.batches, report.rows) == ("caught_up", 3, 7)
    assert [r["id"] for r in sink.rows("copy")] == list(range(1, 8))
    cp = store.read(CONFIG.key)
    mark = sink.mark(CONFIG.key)
    assert cp is not None
    assert mark is not None
    assert (mark.sequence, mark.after, mark.rows) == (3, cp.checkpoint.position, 1)
    assert sink.opened == 1


def test_a_crash_between_the_sink_commit_and_the_checkpoint_commit_repeats_nothing(
    clock: FakeClock, sink: MemorySink, caplog: pytest.LogCaptureFixture
) -> None:
    source = MemorySource("orders", "v", "id", rows(7))
    store = CrashingStore(clock)
    copier = Copier()
    store.armed = True
    with pytest.raises(Crash):
        engine(source, store, sink, clock, copier).run({})
    # Batch 2's handler ran while batch 1's checkpoint commit was in flight; that commit failed
    # before batch 2's sink transaction could commit, so it rolled back: the sink holds batch 1.
    assert copier.calls == [[1, 2, 3], [4, 5, 6]]
    assert [r["id"] for r in sink.rows("copy")] == [1, 2, 3]
    mark = sink.mark(CONFIG.key)
    assert mark is not None
    assert mark.sequence == 1
    stored = store.read(CONFIG.key)
    assert stored is not None
    assert stored.checkpoint.position is None  # the checkpoint never moved
    copier.calls.clear()
    clock.advance(CONFIG.lease_duration + 1)  # the dead owner's lease runs out
    with caplog.at_level(logging.WARNING, logger="azure_functions_db"):
        report = engine(source, store, sink, clock, copier, owner="b").run({})
    assert "action=checkpoint_caught_up_with_sink" in caplog.text
    assert copier.calls == [[4, 5, 6], [7]]  # batch 1 was not handed over again
    assert report.rows == 4
    stored = store.read(CONFIG.key)
    assert stored is not None
    assert stored.checkpoint.stats.batches == 3
    assert [r["id"] for r in sink.rows("copy")] == list(range(1, 8))


def test_a_failing_handler_leaves_the_sink_untouched_and_counts_the_attempt(
    clock: FakeClock, sink: MemorySink
) -> None:
    source = MemorySource("orders", "v", "id", rows(2))
    store = MemoryStateStore(clock)
    copier = Copier()
    copier.fail = True
    with pytest.raises(HandlerError):
        engine(source, store, sink, clock, copier).run({})
    assert sink.rows("copy") == []
    stored = store.read(CONFIG.key)
    assert stored is not None
    assert stored.checkpoint.attempts == 1
    mark = sink.mark(CONFIG.key)
    assert mark is not None
    assert mark.sequence == 0


def test_a_stale_owner_writes_nothing_and_is_not_counted_as_a_failure(
    clock: FakeClock, sink: MemorySink
) -> None:
    source = MemorySource("orders", "v", "id", rows(2))
    store = MemoryStateStore(clock)

    def handler(batch: Batch, writer: MemoryWriter) -> None:
        writer.upsert("copy", batch)
        sink.claim(CONFIG.key, 99)  # a newer owner claims the sink while this handler runs

    with pytest.raises(SinkFencedError):
        engine(source, store, sink, clock, handler).run({})
    assert sink.rows("copy") == []
    stored = store.read(CONFIG.key)
    assert stored is not None
    assert stored.checkpoint.attempts == 0


def test_a_handler_must_take_the_sink(sink: MemorySink, clock: FakeClock) -> None:
    source = MemorySource("orders", "v", "id", rows(1))

    def one_argument(batch: Batch) -> None: ...

    with pytest.raises(ConfigurationError, match=r"two positional arguments.*\(batch, sink\)"):
        engine(source, MemoryStateStore(clock), sink, clock, one_argument)


def test_an_async_handler_writes_through_the_sink(clock: FakeClock, sink: MemorySink) -> None:
    source = MemorySource("orders", "v", "id", rows(4))

    async def handler(batch: Batch, writer: MemoryWriter) -> None:
        writer.upsert("copy", batch)

    engine(source, MemoryStateStore(clock), sink, clock, handler).run({})
    assert len(sink.rows("copy")) == 4


def test_a_sink_that_cannot_commit_is_not_counted_toward_poison_until_it_repeats(
    clock: FakeClock, sink: MemorySink, caplog: pytest.LogCaptureFixture
) -> None:
    """A transient sink error is infrastructure, not the batch: the first `max_attempts` in a
    row at one position are not attempts. From then on each one counts, so an error no retry
    fixes (taken for a transient one) reaches the poison alert instead of stalling unreported."""
    from azure_functions_db.errors import HandlerError, PoisonBatchError, TransientSinkError

    source = MemorySource("orders", "v", "id", rows(2))
    store = MemoryStateStore(clock)

    def handler(batch: Batch, writer: MemoryWriter) -> None:
        raise TransientSinkError("SqlSink could not write the batch: connection lost")

    for n in range(1, CONFIG.max_attempts + 1):
        with caplog.at_level(logging.WARNING), pytest.raises(TransientSinkError):
            engine(source, store, sink, clock, handler).run({})
        stored = store.read(CONFIG.key)
        assert stored is not None
        assert (stored.checkpoint.attempts, stored.checkpoint.transient_failures) == (0, n)
    assert "action=sink_unavailable" in caplog.text
    for n in range(1, CONFIG.max_attempts):
        with pytest.raises(HandlerError):
            engine(source, store, sink, clock, handler).run({})
        stored = store.read(CONFIG.key)
        assert stored is not None
        assert stored.checkpoint.attempts == n
    assert "action=sink_error_repeats" in caplog.text
    with pytest.raises(PoisonBatchError):
        engine(source, store, sink, clock, handler).run({})
    # A batch that gets through resets both counts.
    engine(source, store, sink, clock, lambda batch, writer: None).run({})
    stored = store.read(CONFIG.key)
    assert stored is not None
    assert (stored.checkpoint.attempts, stored.checkpoint.transient_failures) == (0, 0)


def test_a_sink_ahead_whose_positions_are_unknown_is_reported_not_trusted(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A mark one batch ahead without positions (a Delta log cleaned up past it) cannot move
    the checkpoint: the run says the batches are written again, and goes on."""
    from azure_functions_db.core.ports import SinkMark

    class Forgetful(MemorySink):
        def claim(self, key: Any, fence: int) -> SinkMark | None:
            super().claim(key, fence)
            return SinkMark(fence=1, sequence=1, before=None, after=None)

    sink = Forgetful()
    sink.create_table("copy", ["id"])
    source = MemorySource("orders", "v", "id", rows(2))
    store = MemoryStateStore(clock)
    with caplog.at_level(logging.WARNING, logger="azure_functions_db"):
        report = engine(source, store, sink, clock, Copier()).run({})
    assert report.rows == 2
    assert "action=sink_ahead_of_checkpoint" in caplog.text
    assert "checkpoint_caught_up_with_sink" not in caplog.text
