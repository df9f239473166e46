"""SqlSink's one-statement mark, on SQLite, PostgreSQL and MariaDB: a batch's transaction reads no
record while the sink remembers what its own last commit left there, and writes the mark with one
compare-and-set ``UPDATE``. Another process (a second ``SqlSink`` on the same database) that
changed the record meanwhile makes that statement update nothing, and the batch commits nothing:
a newer fence as ``SinkFencedError``, the same fence (two processes sharing one lease) as
``SinkError``; the next transaction reads the record again."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from azure_functions_db.core.ports import SinkMark
from azure_functions_db.errors import SinkError, SinkFencedError
from azure_functions_db.sinks.sql import SqlSink
from azure_functions_db.testing.sink_contract import KEY, contract_batch
from tests.support import sink_targets

ITEMS = "CREATE TABLE items (id integer PRIMARY KEY, name varchar(40) NOT NULL)"

Sinks = Callable[[], SqlSink]


@pytest.fixture(
    params=[
        "sqlite",
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("mysql", marks=pytest.mark.mysql),
    ]
)
def target(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, dict[str, object]]:
    """The target's URL and engine options, with an empty ``items`` table."""
    url, options = sink_targets.target(request, tmp_path)
    sink_targets.create_tables(url, options, lambda dialect: [ITEMS])
    return url, options


@pytest.fixture
def sinks(target: tuple[str, dict[str, object]]) -> Iterator[Sinks]:
    """Opened sinks on the target, each as another process would hold it; closed after."""
    with sink_targets.opened_sinks(*target) as make:
        yield make


def stored(sink: SqlSink) -> list[int]:
    with sink._ready_engine().connect() as conn:
        return sorted(conn.execute(sa.text("SELECT id FROM items")).scalars())


def test_a_batch_sends_its_writes_one_mark_statement_and_the_commit(sinks: Sinks) -> None:
    sink = sinks()
    sink.claim(KEY, 1)
    batches = [contract_batch(1, [1, 2])]
    batches += [contract_batch(1, [3], before=batches[0].position_after)]
    batches += [contract_batch(1, [4, 5], before=batches[1].position_after)]
    statements: list[str] = []

    def seen(conn: object, cursor: object, statement: str, *args: object) -> None:
        statements.append(statement.split(maxsplit=1)[0].upper())

    engine = sink._ready_engine()
    for sequence, batch in enumerate(batches, start=1):
        if sequence == 2:  # after the first, which reflected `items`
            sa.event.listen(engine, "before_cursor_execute", seen)
        with sink.transaction(KEY, batch, sequence) as writer:
            assert writer is not None
            writer.insert("items", batch)
    sa.event.remove(engine, "before_cursor_execute", seen)
    if engine.dialect.name == "sqlite":
        statements = [s for s in statements if s not in ("BEGIN", "COMMIT")]
    assert statements == ["INSERT", "UPDATE", "INSERT", "UPDATE"]
    last = batches[-1]
    assert sink.mark(KEY) == SinkMark(1, 3, last.position_before, last.position_after, 2)
    assert stored(sink) == [1, 2, 3, 4, 5]


def test_a_claim_by_another_process_refuses_the_stale_batch_at_its_mark(sinks: Sinks) -> None:
    old, new = sinks(), sinks()
    old.claim(KEY, 1)
    new.claim(KEY, 2)  # the old owner does not know: it remembers fence 1
    batch = contract_batch(1, [1])
    ran: list[bool] = []

    def stale_batch() -> None:
        with old.transaction(KEY, batch, 1) as writer:
            assert writer is not None
            ran.append(True)
            writer.insert("items", batch)

    with pytest.raises(SinkFencedError) as raised:
        stale_batch()
    assert ran == [True]  # refused by the mark's statement, not by a read before the handler
    assert (raised.value.fence, raised.value.stored) == (1, 2)
    assert stored(new) == []
    assert new.mark(KEY) == SinkMark(fence=2, sequence=0, before=None, after=None)
    # From then on it reads the record first: refused before the handler.
    with pytest.raises(SinkFencedError), old.transaction(KEY, batch, 1):
        raise AssertionError("the handler ran")


def test_two_processes_with_one_fence_commit_one_batch(sinks: Sinks) -> None:
    one, two = sinks(), sinks()
    one.claim(KEY, 1)
    two.claim(KEY, 1)  # an equal fence is kept: two processes share one lease
    batch = contract_batch(1, [1, 2])
    with one.transaction(KEY, batch, 1) as writer:
        assert writer is not None
        writer.insert("items", batch)
    other = contract_batch(1, [1, 2, 3], name="w")  # the other one read a batch of its own

    def second_batch() -> None:
        with two.transaction(KEY, other, 1) as writer:
            assert writer is not None
            writer.upsert("items", other)

    with pytest.raises(SinkError, match="two processes share one lease") as raised:
        second_batch()
    assert not isinstance(raised.value, SinkFencedError)
    assert stored(one) == [1, 2]
    assert one.mark(KEY) == SinkMark(1, 1, None, batch.position_after, 2)
    # Its next transaction reads the record: the first one's batch is found stored.
    with two.transaction(KEY, batch, 1) as writer:
        assert writer is None
