"""A batch from a SQL source hands the sinks read-only views over the driver's rows
(``change.data``, one name -> index map per source). ``SqlWriter`` and ``DeltaSink`` read the
values of such a batch straight from the driver rows, one index getter per source, and check the
columns once per source: the rows they store are the ones ``dict(change.data)`` would store
(columns in any order, a repeated name keeping its last value; in SQL a subset of the table's), on
SQLite, PostgreSQL, MariaDB and Delta; rows of several sources, or views mixed with dicts, are
still checked row by row."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import sqlalchemy as sa
from deltalake import DeltaTable

from azure_functions_db.core.batch import Batch, RowData
from azure_functions_db.errors import ConfigurationError
from azure_functions_db.sinks.delta import DeltaSink
from azure_functions_db.sinks.sql import SqlSink
from azure_functions_db.sinks.writes import driver_statement
from azure_functions_db.sources._rows import RowShape
from azure_functions_db.sources.keyset import picker
from azure_functions_db.testing.sink_contract import KEY
from tests.support import sink_targets

T0 = dt.datetime(2026, 1, 2, 3, 4, 5)


def source_batch(names: Sequence[str], rows: list[tuple[Any, ...]], fence: int = 1) -> Batch:
    """A batch as a SQL source hands it over: changes over the driver's ``rows`` (the key and
    the cursor: the column ``id``, the last of that name)."""
    at = len(names) - 1 - list(reversed(names)).index("id")
    changes = RowShape(tuple(names), cursor_of=picker([at]), pk_of=picker([at])).changes(
        rows, KEY.poller
    )
    return Batch(KEY.poller, KEY.namespace, fence, 1, None, changes[-1].position, changes)


PLAIN = "CREATE TABLE plain (id integer PRIMARY KEY, note varchar(20) NOT NULL, at timestamp)"


def as_dicts(batch: Batch) -> list[dict[str, Any]]:
    return [dict(change.data) for change in batch]


@pytest.fixture(
    params=[
        "sqlite",
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("mysql", marks=pytest.mark.mysql),
    ]
)
def sink(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SqlSink]:
    """A claimed sink on a database with ``plain (id, note, at)``."""
    url, options = sink_targets.target(request, tmp_path)
    sink_targets.create_tables(url, options, lambda dialect: [PLAIN])
    with sink_targets.opened_sinks(url, options) as make:
        made = make()
        made.claim(KEY, 1)
        yield made


def stored(sink: SqlSink) -> list[tuple[Any, ...]]:
    with sink._ready_engine().connect() as conn:
        plain = sa.Table("plain", sa.MetaData(), autoload_with=conn)  # SQLite: dates as dates
        rows = conn.execute(sa.select(plain.c.id, plain.c.note, plain.c.at).order_by("id"))
        return [(r[0], r[1], r[2]) for r in rows]


def test_sql_writer_stores_a_sources_batch_as_its_dicts(sink: SqlSink) -> None:
    # The source's columns in another order than the table's; a repeated name: the last wins.
    first = source_batch(("at", "note", "id"), [(T0, "a", 1), (None, "b", 2)])
    again = source_batch(
        ("id", "note", "at", "note"), [(2, "old", T0, "new"), (3, "old", None, "three")]
    )
    assert as_dicts(again)[0] == {"id": 2, "note": "new", "at": T0}
    with sink.transaction(KEY, first, 1) as writer:
        assert writer is not None
        assert writer.insert("plain", first) == 2
        assert writer.upsert("plain", again) == 2
        plain = writer.table("plain")
        dialect = writer.connection.dialect
    assert stored(sink) == [(1, "a", T0), (2, "new", T0), (3, "three", None)]
    # The driver's rows under the views give the values the views give, in bind order.
    plan = driver_statement(dialect, sa.insert(plain), ("insert",), ("id", "note", "at"))
    if plan is not None:  # SQLite converts its dates in SQLAlchemy: no driver statement there
        views = [change.data for change in again]
        assert isinstance(views[0], RowData)
        assert (
            plan.rows(views, type(views[0]))
            == plan.rows(views)
            == [
                (2, "new", T0),
                (3, "three", None),
            ]
        )


def test_sql_writer_checks_rows_of_several_sources_one_by_one(sink: SqlSink) -> None:
    one = source_batch(("id", "note"), [(1, "a")])
    other = source_batch(("note", "id"), [("b", 2)])  # another source, the same columns
    wider = source_batch(("id", "note", "extra"), [(3, "c", 0)])
    with sink.transaction(KEY, one, 1) as writer:
        assert writer is not None
        assert writer.insert("plain", [*one, *other]) == 2
        with pytest.raises(ConfigurationError, match="must all have the same columns"):
            writer.insert("plain", [*one, {"id": 9, "note": "x", "at": None}])
        with pytest.raises(ConfigurationError, match="has no column `extra`"):
            writer.insert("plain", wider)
    assert stored(sink) == [(1, "a", None), (2, "b", None)]


DELTA_SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("at", pa.timestamp("us"))])


def delta_sink(path: Path) -> DeltaSink:
    sink = DeltaSink(str(path), schema=DELTA_SCHEMA)
    sink.open({})
    sink.claim(KEY, 1)
    return sink


def test_delta_sink_stores_a_sources_batch_as_its_dicts(tmp_path: Path) -> None:
    # Another order than the table's, a repeated name (the last wins).
    batch = source_batch(
        ("name", "at", "id", "name"),
        [("x", T0, 1, "one"), ("y", None, 2, None), ("z", T0, 3, "three")],
    )
    sink = delta_sink(tmp_path / "t")
    with sink.transaction(KEY, batch, 1) as writer:
        assert writer is not None
        writer.insert(batch)
    table = DeltaTable(str(tmp_path / "t")).to_pyarrow_table().sort_by("id")
    assert table.to_pylist() == sorted(as_dicts(batch), key=lambda row: row["id"])
    assert table.to_pylist()[0] == {"id": 1, "name": "one", "at": T0}
    assert table.schema == DELTA_SCHEMA


def test_delta_sink_checks_rows_of_several_sources_one_by_one(tmp_path: Path) -> None:
    sink = delta_sink(tmp_path / "t")
    one = source_batch(("id", "name", "at"), [(1, "a", T0)])
    other = source_batch(("at", "id"), [(T0, 2)])  # another source, fewer columns: null there
    with sink.transaction(KEY, one, 1) as writer:
        assert writer is not None
        writer.insert([*one, *other])
    rows = DeltaTable(str(tmp_path / "t")).to_pyarrow_table().sort_by("id").to_pylist()
    assert rows == [{"id": 1, "name": "a", "at": T0}, {"id": 2, "name": None, "at": T0}]

    wider = source_batch(("id", "name", "at", "extra"), [(3, "c", T0, 0)])

    def insert_wider() -> None:
        with sink.transaction(KEY, wider, 2) as writer:
            assert writer is not None
            writer.insert(wider)

    with pytest.raises(ConfigurationError, match="has no column `extra`"):
        insert_wider()


def test_delta_writer_converts_each_insert_in_the_handler(tmp_path: Path) -> None:
    """The Arrow table of an ``insert`` is built when the handler calls it (the commit after
    the engine's wait has only the write left): a column the table lacks is refused by that
    call, and inserts of other columns commit as one table, null where a row has none."""
    sink = delta_sink(tmp_path / "t")
    one = source_batch(("id", "name", "at"), [(1, "a", T0), (2, "b", None)])
    fewer = source_batch(("at", "id"), [(T0, 3)])
    plain = [{"id": 4, "name": "d"}]
    wider = source_batch(("id", "name", "at", "extra"), [(5, "e", T0, 0)])
    with sink.transaction(KEY, one, 1) as writer:
        assert writer is not None
        writer.insert(one)
        writer.insert(fewer)
        with pytest.raises(ConfigurationError, match="has no column `extra`"):
            writer.insert(wider)
        writer.insert(plain)
    table = DeltaTable(str(tmp_path / "t")).to_pyarrow_table()
    assert table.schema == DELTA_SCHEMA
    assert table.sort_by("id").to_pylist() == [
        {"id": 1, "name": "a", "at": T0},
        {"id": 2, "name": "b", "at": None},
        {"id": 3, "name": None, "at": T0},
        {"id": 4, "name": "d", "at": None},
    ]
