"""SqlSink's connections go back to the pool without a ``ROLLBACK`` after a batch's commit
returned (PyMySQL sends one to the server even with nothing open: a round trip per batch), and
with one on every other way back: a handler's error, a commit that failed, a read. A failed
batch's rows never ride along with the next batch's commit, and a read leaves no snapshot open
(MariaDB's REPEATABLE READ would show the record as it was), on PostgreSQL and MariaDB."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import sqlalchemy as sa

from azure_functions_db.core.ports import SinkMark
from azure_functions_db.errors import SinkError
from azure_functions_db.sinks.sql import SqlSink
from azure_functions_db.testing.sink_contract import KEY, contract_batch
from tests.support import sink_targets

ITEMS = "CREATE TABLE items (id integer PRIMARY KEY, name varchar(40) NOT NULL)"

Sinks = Callable[..., SqlSink]


@pytest.fixture(
    params=[
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("mysql", marks=pytest.mark.mysql),
    ]
)
def sinks(request: pytest.FixtureRequest) -> Iterator[Sinks]:
    """Opened sinks on a target with an empty ``items`` table, each as another process would
    hold it; closed after."""
    url, options = sink_targets.target(request)
    sink_targets.create_tables(url, options, lambda dialect: [ITEMS])
    with sink_targets.opened_sinks(url, options) as make:
        yield make


def count(monkeypatch: pytest.MonkeyPatch, sink: SqlSink, method: str) -> list[object]:
    """Every call of the sink engine's dialect's ``do_rollback``/``do_commit`` (the pool's reset
    and SQLAlchemy's own transactions both go through it)."""
    dialect = sink._ready_engine().dialect
    calls: list[object] = []
    real = getattr(dialect, method)

    def counted(dbapi_connection: object) -> None:
        calls.append(dbapi_connection)
        real(dbapi_connection)

    monkeypatch.setattr(dialect, method, counted)
    return calls


def stored(sink: SqlSink) -> list[int]:
    with sink._ready_engine().connect() as conn:
        return sorted(conn.execute(sa.text("SELECT id FROM items")).scalars())


def test_committed_batches_send_no_rollback(sinks: Sinks, monkeypatch: pytest.MonkeyPatch) -> None:
    sink = sinks()
    sink.claim(KEY, 1)
    first = contract_batch(1, [1, 2])
    with sink.transaction(KEY, first, 1) as writer:  # reflects `items`
        assert writer is not None
        writer.insert("items", first)
    rollbacks = count(monkeypatch, sink, "do_rollback")
    before = first.position_after
    for sequence, ids in enumerate([[3], [4, 5], [6]], start=2):
        batch = contract_batch(1, ids, before=before)
        with sink.transaction(KEY, batch, sequence) as writer:
            assert writer is not None
            writer.insert("items", batch)
        before = batch.position_after
    assert rollbacks == []
    assert stored(sink) == [1, 2, 3, 4, 5, 6]


def failing_batch(sink: SqlSink, ids: list[int], error: Exception | None = None) -> None:
    """A batch's transaction whose handler inserts ``ids``, then raises ``error``."""
    batch = contract_batch(1, ids)
    with sink.transaction(KEY, batch, 1) as writer:
        assert writer is not None
        writer.insert("items", batch)
        if error is not None:
            raise error


def test_a_handlers_error_rolls_the_batch_back(
    sinks: Sinks, monkeypatch: pytest.MonkeyPatch
) -> None:
    sink = sinks()
    sink.claim(KEY, 1)
    rollbacks = count(monkeypatch, sink, "do_rollback")
    with pytest.raises(ValueError, match="the handler failed"):
        failing_batch(sink, [1, 2], ValueError("the handler failed"))
    assert rollbacks
    assert stored(sink) == []
    failing_batch(sink, [3])
    assert stored(sink) == [3]


def test_a_failed_commits_rows_do_not_ride_along_with_the_next_batch(
    sinks: Sinks, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One connection: the next batch gets the very connection whose commit failed.
    sink = sinks(pool_size=1, max_overflow=0)
    sink.claim(KEY, 1)
    dialect = sink._ready_engine().dialect
    real_commit = dialect.do_commit
    failures = [sa.exc.OperationalError("COMMIT", {}, Exception("the commit failed"))]

    def failing_commit(dbapi_connection: object) -> None:
        if failures:
            raise failures.pop()  # before the server commits: the transaction stays open
        real_commit(dbapi_connection)

    monkeypatch.setattr(dialect, "do_commit", failing_commit)
    with pytest.raises(SinkError, match="the commit failed"):
        failing_batch(sink, [1, 2])
    failing_batch(sink, [3])
    assert stored(sink) == [3]


def test_a_read_leaves_no_snapshot_behind(sinks: Sinks) -> None:
    old, new = sinks(pool_size=1, max_overflow=0), sinks()
    old.claim(KEY, 1)
    assert old.mark(KEY) == SinkMark(fence=1, sequence=0, before=None, after=None)
    new.claim(KEY, 2)
    assert old.mark(KEY) == SinkMark(fence=2, sequence=0, before=None, after=None)


def test_engine_options_may_choose_the_pools_reset(
    sinks: Sinks, monkeypatch: pytest.MonkeyPatch
) -> None:
    sink = sinks(pool_reset_on_return="rollback")
    sink.claim(KEY, 1)
    rollbacks = count(monkeypatch, sink, "do_rollback")
    batch = contract_batch(1, [1])
    with sink.transaction(KEY, batch, 1) as writer:
        assert writer is not None
        writer.insert("items", batch)
    assert len(rollbacks) == 1  # SQLAlchemy's own rollback-on-return, as configured
    assert stored(sink) == [1]
