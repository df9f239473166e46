"""The writer's inserts and upserts go to the driver as SQLAlchemy compiled them, a tuple per row,
where SQLAlchemy would only hand the values on; a column whose type converts its values (JSON,
SQLite's dates) or a name SQLAlchemy escapes keeps SQLAlchemy's own executemany. The rows come
out the same either way, on SQLite, PostgreSQL and MariaDB."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from azure_functions_db.core.batch import Batch, Change
from azure_functions_db.core.position import Position
from azure_functions_db.sinks.sql import SqlSink
from azure_functions_db.sinks.writes import driver_statement
from azure_functions_db.testing.sink_contract import KEY
from tests.support import sink_targets

T0 = dt.datetime(2026, 1, 2, 3, 4, 5)
DOC = {"sqlite": "JSON", "postgres": "jsonb", "mysql": "JSON"}


@pytest.fixture(
    params=[
        "sqlite",
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("mysql", marks=pytest.mark.mysql),
    ]
)
def sink(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SqlSink]:
    """A sink on a database with ``plain (id, note, at)`` and ``mixed (id, "odd name", doc)``."""
    url, options = sink_targets.target(request, tmp_path)
    sink_targets.create_tables(
        url,
        options,
        lambda dialect: [
            "CREATE TABLE plain (id integer PRIMARY KEY, note varchar(20) NOT NULL, at timestamp)",
            f"CREATE TABLE mixed (id integer PRIMARY KEY, "
            f"{dialect.identifier_preparer.quote('odd name')} varchar(20), "
            f"doc {DOC[request.param]})",
        ],
    )
    with sink_targets.opened_sinks(url, options) as make:
        yield make()


def batch_of(rows: list[dict[str, object]], fence: int = 1) -> Batch:
    changes = tuple(Change(row, Position((i,), (i,)), KEY.poller) for i, row in enumerate(rows))
    return Batch(KEY.poller, KEY.namespace, fence, 1, None, changes[-1].position, changes)


def test_inserts_and_upserts_come_out_the_same_on_either_path(sink: SqlSink) -> None:
    sink.claim(KEY, 1)
    plain = [{"id": i, "note": f"n{i}", "at": T0 + dt.timedelta(seconds=i)} for i in (1, 2, 3)]
    with sink.transaction(KEY, batch_of(plain), 1) as writer:
        assert writer is not None
        dialect = writer.connection.dialect
        plain_table, mixed_table = writer.table("plain"), writer.table("mixed")
        # MariaDB's JSON is a LONGTEXT: the rows hold the JSON text there.
        converts = isinstance(mixed_table.c.doc.type, sa.JSON)
        doc = (lambda value: value) if converts else json.dumps
        mixed = [{"id": i, "odd name": f"o{i}", "doc": doc({"k": [i, "x"]})} for i in (1, 2)]
        assert writer.insert("plain", batch_of(plain)) == 3
        assert writer.insert("mixed", mixed) == 2
        assert writer.upsert("plain", [{"id": 2, "note": "again", "at": None}]) == 1
        assert writer.upsert("mixed", [{"id": 2, "odd name": "p2", "doc": doc({"k": 1})}]) == 1
    direct = driver_statement(dialect, sa.insert(plain_table), ("insert",), ("id", "note", "at"))
    # SQLite stores dates as text through a SQLAlchemy conversion: that path stays its own.
    assert (direct is None) == (dialect.name == "sqlite")
    with_doc = driver_statement(dialect, sa.insert(mixed_table), ("insert",), ("id", "doc"))
    assert (with_doc is None) == converts
    with sink._ready_engine().connect() as conn:
        notes = conn.execute(sa.select(plain_table.c.id, plain_table.c.note, plain_table.c.at))
        assert sorted((r.id, r.note, r.at) for r in notes) == [
            (1, "n1", T0 + dt.timedelta(seconds=1)),
            (2, "again", None),
            (3, "n3", T0 + dt.timedelta(seconds=3)),
        ]
        odd = conn.execute(sa.select(mixed_table)).all()
    docs = {r[0]: (r[1], r[2] if not isinstance(r[2], str) else json.loads(r[2])) for r in odd}
    assert docs == {1: ("o1", {"k": [1, "x"]}), 2: ("p2", {"k": 1})}
