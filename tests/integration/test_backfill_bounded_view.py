"""A backfill chunk reads its source exactly as a live poller does, up to the chunk's end.

``BoundedSource(inner, end)`` implements each optional read port ``inner`` implements, and no
other (never ``AcknowledgingSource``), and every read it forwards stops at ``end``, which the
database applies. Real PostgreSQL; the engine of a chunk reads ahead on its worker thread.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import pytest
import sqlalchemy as sa

from azure_functions_db.core.clock import SystemClock
from azure_functions_db.core.config import PollerConfig
from azure_functions_db.core.engine import Engine
from azure_functions_db.core.ports import (
    AcknowledgingSource,
    BacklogSource,
    ChangeSource,
    Horizon,
    Source,
    SourceRow,
    ZonedSource,
)
from azure_functions_db.core.position import Position
from azure_functions_db.core.reader import ReadAheadSource, SelectedRows
from azure_functions_db.sources.memory import MemorySource
from azure_functions_db.sources.outbox import OutboxSource
from azure_functions_db.sources.sqlalchemy import SqlSource
from azure_functions_db.spark.chunk import BoundedSource
from azure_functions_db.state.memory import MemoryStateStore
from tests.support.source_kit import Db

pytestmark = pytest.mark.postgres

ROWS = 100
#: A horizon without an end: each read of the view must add the chunk's own.
OPEN = Horizon(bound=None, method="none")


def _table(pg: Db) -> None:
    pg.table(
        "orders",
        [
            sa.Column("id", sa.Integer, primary_key=True),
            sa.Column("updated_at", sa.Integer, nullable=False),
        ],
        [{"id": i, "updated_at": i // 3} for i in range(1, ROWS + 1)],
        index=["updated_at", "id"],
    )


def _end(row: int) -> Position:
    return Position(cursor=(row // 3,), pk=(row,))


def _ids(rows: Sequence[Any]) -> list[int]:
    return [r.position.pk[0] for r in rows]


class _CountingSource(SqlSource):
    """A SqlSource that records on which thread each database read ran (a live poller's fast
    path stays on: ``fetch`` and ``fetch_changes`` are SqlSource's own)."""

    threads: list[str]

    def select(self, after: Position | None, limit: int, horizon: Horizon) -> SelectedRows:
        self.threads.append(threading.current_thread().name)
        return super().select(after, limit, horizon)


class _OwnFetch(SqlSource):
    """A subclass that reads its own way: never read ahead, for a live poller or a chunk."""

    def fetch(self, after: Position | None, limit: int, horizon: Horizon) -> Sequence[SourceRow]:
        return super().fetch(after, limit, horizon)


def _ports(source: object) -> set[str]:
    ports = {
        "change": ChangeSource,
        "read_ahead": ReadAheadSource,
        "backlog": BacklogSource,
        "zoned": ZonedSource,
        "acknowledging": AcknowledgingSource,
    }
    return {name for name, port in ports.items() if isinstance(source, port)}


def test_a_chunk_view_has_exactly_the_read_ports_of_its_source(pg: Db, opened: list[SqlSource]):
    _table(pg)
    sql = SqlSource(pg.url, "orders", "updated_at", "id", schema=pg.schema)
    outbox = OutboxSource(pg.url, "orders", "updated_at", "id", schema=pg.schema)
    outbox_deleting = OutboxSource(
        pg.url, "orders", "updated_at", "id", schema=pg.schema, delete_delivered=True
    )
    own = _OwnFetch(pg.url, "orders", "updated_at", "id", schema=pg.schema)
    for source in (sql, outbox, outbox_deleting, own):
        source.open({})
        opened.append(source)
    memory = MemorySource("orders", "updated_at", "id", [{"id": 1, "updated_at": 0}])
    end = _end(50)

    full = {"change", "read_ahead", "backlog", "zoned"}
    assert _ports(sql) == full
    assert _ports(BoundedSource(sql, end)) == full
    # An outbox's rows are the live poller's to delete: a backfill never acknowledges them.
    assert _ports(outbox_deleting) == full | {"acknowledging"}
    assert _ports(BoundedSource(outbox_deleting, end)) == full
    assert _ports(BoundedSource(outbox, end)) == full
    assert _ports(BoundedSource(memory, end)) == _ports(memory) == {"backlog"}
    assert isinstance(BoundedSource(memory, end), Source)
    # The view answers what its source answers (not a constant of its class).
    assert BoundedSource(sql, end).reads_from_any_thread is True  # type: ignore[attr-defined]
    assert BoundedSource(own, end).reads_from_any_thread is False  # type: ignore[attr-defined]
    zone = BoundedSource(sql, end).cursor_timezone  # type: ignore[attr-defined]
    assert zone is sql.cursor_timezone
    # One class per combination of ports, every one a BoundedSource.
    assert type(BoundedSource(sql, end)) is type(BoundedSource(outbox_deleting, end))
    assert type(BoundedSource(memory, end)) is not type(BoundedSource(sql, end))


def test_every_read_of_a_chunk_view_stops_at_its_end(pg: Db, opened: list[SqlSource]):
    _table(pg)
    source = SqlSource(pg.url, "orders", "updated_at", "id", schema=pg.schema)
    source.open({})
    opened.append(source)
    view: Any = BoundedSource(source, _end(40))
    after = Position(cursor=(10 // 3,), pk=(10,))
    expected = list(range(11, 41))

    assert _ids(view.fetch(after, 1000, OPEN)) == expected
    assert _ids(view.fetch_changes(after, 1000, OPEN, "orders")) == expected
    selected = view.select(after, 1000, OPEN)
    assert selected.last == _end(40)
    assert _ids(view.changes_of(selected, "orders")) == expected
    assert view.rows_after(after, OPEN, 1000) == len(expected)
    assert view.latest(OPEN) == _end(40)
    # The source itself, under the same open horizon, reads past the end: the view bounds it.
    assert _ids(source.fetch(after, 1000, OPEN))[-1] == ROWS


@pytest.mark.parametrize("end_row", [37, ROWS])
def test_a_chunk_reads_ahead_like_a_live_poller_and_stops_at_its_end(
    pg: Db, opened: list[SqlSource], end_row: int
):
    _table(pg)
    source = _CountingSource(pg.url, "orders", "updated_at", "id", schema=pg.schema)
    source.threads = []
    opened.append(source)
    seen: list[int] = []

    def handler(batch: Any) -> None:
        seen.extend(change.data["id"] for change in batch)

    config = PollerConfig(name="orders", batch_size=5, namespace="backfill", record="orders~r~0")
    engine = Engine(
        config,
        BoundedSource(source, _end(end_row)),
        MemoryStateStore(),
        handler,
        SystemClock(),
        owner="test",
    )
    report = engine.run({})

    assert report.status == "caught_up"
    assert seen == list(range(1, end_row + 1))  # each row of the range once, none after it
    # Every read went through the split read (the fast path), most of them read ahead.
    assert len(source.threads) >= end_row // 5
    ahead = sum(name.startswith("afdb-read") for name in source.threads)
    assert ahead >= len(source.threads) // 2
