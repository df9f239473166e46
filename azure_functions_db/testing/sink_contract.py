"""The contract suite of :class:`~azure_functions_db.core.ports.TransactionalSink`.

Every transactional sink passes :class:`SinkContract` unchanged, the in-memory fake included.
Subclass it in a test module and provide two hooks: the ``sink`` fixture (an opened sink whose
target database has an empty table ``items (id integer primary key, name text)``) and
:meth:`SinkContract.stored` (the committed rows of ``items``, read outside the sink); a sink
whose writer does not name tables overrides :meth:`SinkContract.write`::

    class TestMySink(SinkContract):
        @pytest.fixture
        def sink(self) -> Iterator[TransactionalSink]: ...

        def stored(self, sink) -> dict[int, str]: ...
"""

from __future__ import annotations

import datetime as dt
import threading
import uuid
from decimal import Decimal
from typing import Any

import pytest

from azure_functions_db.core.batch import Batch, Change
from azure_functions_db.core.checkpoint import PollerKey
from azure_functions_db.core.ports import SinkMark, TransactionalSink
from azure_functions_db.core.position import Position
from azure_functions_db.errors import SinkFencedError

__all__ = ["SinkContract", "contract_batch"]

KEY = PollerKey("live", "sink-contract")


def contract_batch(
    fence: int, ids: list[int], *, before: Position | None = None, name: str = "v"
) -> Batch:
    """A batch of rows ``{"id": i, "name": f"{name}{i}"}`` read after ``before``."""
    changes = tuple(
        Change({"id": i, "name": f"{name}{i}"}, Position((i,), (i,)), KEY.poller) for i in ids
    )
    return Batch(KEY.poller, KEY.namespace, fence, 1, before, changes[-1].position, changes)


class _Failed(Exception):
    pass


class SinkContract:
    """Isolation, idempotent commit and stale-fence rejection, over a real adapter."""

    #: True for a sink whose batch locks the whole database (SQLite): a claim then waits.
    claims_wait_for_running_batches = False

    def stored(self, sink: Any) -> dict[int, str]:  # pragma: no cover - every subclass defines it
        raise NotImplementedError

    def write(self, writer: Any, method: str, rows: Any) -> int:
        """Call the writer's ``insert``/``upsert``/``delete``/``apply`` on ``items`` (a sink of
        one table, like Delta, overrides this to leave out the table's name)."""
        return int(getattr(writer, method)("items", rows))

    # -- claim -------------------------------------------------------------------------------

    def test_a_first_claim_finds_no_record_and_creates_it(self, sink: TransactionalSink) -> None:
        assert sink.claim(KEY, 1) is None
        assert sink.mark(KEY) == SinkMark(fence=1, sequence=0, before=None, after=None)
        assert sink.claim(KEY, 2) == SinkMark(fence=1, sequence=0, before=None, after=None)
        assert sink.mark(KEY) == SinkMark(fence=2, sequence=0, before=None, after=None)

    def test_a_claim_below_the_stored_fence_is_refused(self, sink: TransactionalSink) -> None:
        sink.claim(KEY, 5)
        with pytest.raises(SinkFencedError) as caught:
            sink.claim(KEY, 4)
        assert (caught.value.fence, caught.value.stored) == (4, 5)
        assert sink.claim(KEY, 5) is not None  # the same owner again is not refused

    # -- isolation ---------------------------------------------------------------------------

    def test_a_batch_commits_with_its_mark(self, sink: TransactionalSink) -> None:
        sink.claim(KEY, 1)
        batch = contract_batch(1, [1, 2, 3])
        with sink.transaction(KEY, batch, 1) as writer:
            assert writer is not None
            self.write(writer, "upsert", batch)
        assert self.stored(sink) == {1: "v1", 2: "v2", 3: "v3"}
        assert sink.mark(KEY) == SinkMark(1, 1, None, batch.position_after, 3)

    def test_a_failing_handler_commits_nothing(self, sink: TransactionalSink) -> None:
        sink.claim(KEY, 1)
        first = contract_batch(1, [1])
        with sink.transaction(KEY, first, 1) as writer:
            assert writer is not None
            self.write(writer, "upsert", first)
        before = sink.mark(KEY)
        second = contract_batch(1, [2, 3], before=first.position_after)

        def failing_handler() -> None:
            with sink.transaction(KEY, second, 2) as writer:
                assert writer is not None
                self.write(writer, "upsert", second)
                raise _Failed

        with pytest.raises(_Failed):
            failing_handler()
        assert self.stored(sink) == {1: "v1"}
        assert sink.mark(KEY) == before

    # -- idempotent commit -------------------------------------------------------------------

    def test_a_stored_batch_is_not_written_again(self, sink: TransactionalSink) -> None:
        sink.claim(KEY, 1)
        batch = contract_batch(1, [1, 2])
        with sink.transaction(KEY, batch, 1) as writer:
            assert writer is not None
            self.write(writer, "insert", batch)
        sink.claim(KEY, 2)  # e.g. the next owner, after the checkpoint commit was lost
        again = contract_batch(2, [1, 2])
        with sink.transaction(KEY, again, 1) as writer:
            assert writer is None  # the insert would fail on the duplicate keys otherwise
        assert self.stored(sink) == {1: "v1", 2: "v2"}
        assert sink.mark(KEY) == SinkMark(2, 1, None, batch.position_after, 2)

    def test_a_batch_that_grew_is_not_taken_for_the_stored_one(
        self, sink: TransactionalSink
    ) -> None:
        sink.claim(KEY, 1)
        with sink.transaction(KEY, contract_batch(1, [1, 2]), 1) as writer:
            assert writer is not None
            self.write(writer, "upsert", contract_batch(1, [1, 2]))
        grown = contract_batch(1, [1, 2, 3], name="w")
        with sink.transaction(KEY, grown, 1) as writer:
            assert writer is not None
            self.write(writer, "upsert", grown)
        assert self.stored(sink) == {1: "w1", 2: "w2", 3: "w3"}

    # -- stale rejection ---------------------------------------------------------------------

    def test_a_stale_owner_commits_nothing(self, sink: TransactionalSink) -> None:
        sink.claim(KEY, 1)
        sink.claim(KEY, 2)  # a newer owner claimed the poller
        batch = contract_batch(1, [1])
        handler_ran: list[bool] = []

        def stale_batch() -> None:
            with sink.transaction(KEY, batch, 1) as writer:
                handler_ran.append(True)  # refused before the handler, as it can be
                assert writer is not None
                self.write(writer, "upsert", batch)

        with pytest.raises(SinkFencedError):
            stale_batch()
        assert handler_ran == []
        assert self.stored(sink) == {}
        assert sink.mark(KEY) == SinkMark(fence=2, sequence=0, before=None, after=None)

    def test_a_claim_during_a_running_batch(self, sink: TransactionalSink) -> None:
        """The stale owner resumed: its lease was taken while its handler ran (a frozen
        instance). The new owner's claim does not wait for it, and the old batch, when its
        handler returns, finds the newer fence and writes nothing. A sink whose batch locks the
        whole database (SQLite) makes the claim wait instead: the batch commits first, and the
        claim sees it (``claims_wait_for_running_batches``)."""
        sink.claim(KEY, 1)
        batch = contract_batch(1, [1])
        inside, release = threading.Event(), threading.Event()
        outcome: list[BaseException | None] = []
        claimed: list[SinkMark | None] = []

        def old_owner() -> None:
            try:
                with sink.transaction(KEY, batch, 1) as writer:
                    assert writer is not None
                    self.write(writer, "upsert", batch)
                    inside.set()
                    release.wait(10)
            except BaseException as exc:  # noqa: BLE001 - handed to the test thread
                outcome.append(exc)
            else:
                outcome.append(None)

        worker = threading.Thread(target=old_owner)
        worker.start()
        assert inside.wait(10)
        claimer = threading.Thread(target=lambda: claimed.append(sink.claim(KEY, 2)))
        claimer.start()
        claimer.join(0.5)
        if self.claims_wait_for_running_batches:
            assert not claimed, "a claim went through while the batch held the database"
        else:
            assert claimed == [SinkMark(fence=1, sequence=0, before=None, after=None)]
        release.set()
        worker.join(10)
        claimer.join(10)
        if self.claims_wait_for_running_batches:
            assert outcome == [None]
            assert claimed == [SinkMark(1, 1, None, batch.position_after, 1)]
            assert self.stored(sink) == {1: "v1"}
        else:
            assert len(outcome) == 1
            assert isinstance(outcome[0], SinkFencedError)
            assert self.stored(sink) == {}
            assert sink.mark(KEY) == SinkMark(fence=2, sequence=0, before=None, after=None)

    # -- positions ---------------------------------------------------------------------------

    def test_positions_of_every_key_type_come_back_equal(self, sink: TransactionalSink) -> None:
        before = Position(
            (dt.datetime(2026, 1, 1, 12, 0, 0, 123456, tzinfo=dt.UTC), Decimal("1.10")),
            ("Ab", uuid.UUID(int=7)),
        )
        after = Position((dt.datetime(2026, 1, 1, 12, 0, 1), 2**60), (b"\x00\xff",))
        change = Change({"id": 1, "name": "x"}, after, KEY.poller)
        batch = Batch(KEY.poller, KEY.namespace, 1, 1, before, after, (change,))
        sink.claim(KEY, 1)
        with sink.transaction(KEY, batch, 7) as writer:
            assert writer is not None
            self.write(writer, "upsert", [{"id": 1, "name": "x"}])
        mark = sink.mark(KEY)
        assert mark == SinkMark(1, 7, before, after, 1)
        assert mark is not None
        assert mark.before is not None
        assert mark.after is not None
        assert mark.before.to_json() == before.to_json()
        assert mark.after.to_json() == after.to_json()

    # -- the writer --------------------------------------------------------------------------

    def test_the_writer_inserts_upserts_deletes_and_applies(self, sink: TransactionalSink) -> None:
        sink.claim(KEY, 1)
        first = contract_batch(1, [1, 2, 3])
        with sink.transaction(KEY, first, 1) as writer:
            assert writer is not None
            assert self.write(writer, "insert", first) == 3
            assert (
                self.write(writer, "upsert", [{"id": 2, "name": "two"}, {"id": 4, "name": "v4"}])
                == 2
            )
            assert self.write(writer, "delete", [{"id": 1}]) == 1
        assert self.stored(sink) == {2: "two", 3: "v3", 4: "v4"}
        gone = Change({"id": 3, "name": "v3"}, Position((9,), (3,)), KEY.poller, "delete")
        kept = Change({"id": 5, "name": "v5"}, Position((9,), (5,)), KEY.poller)
        second = Batch(
            KEY.poller, KEY.namespace, 1, 1, first.position_after, kept.position, (gone, kept)
        )
        with sink.transaction(KEY, second, 2) as writer:
            assert writer is not None
            self.write(writer, "apply", second)
        assert self.stored(sink) == {2: "two", 4: "v4", 5: "v5"}
