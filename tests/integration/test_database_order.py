"""The database decides order: collations and key types Python orders differently.

MariaDB's default collation orders a varchar key `a, B, c, D`; Python orders `B, D, a, c`.
PostgreSQL ICU collations, SQLite's NOCASE and MariaDB's UUID type (compared by its last
segment first) differ from Python the same way. With rows tied on the cursor and a batch or
chunk edge between them, every decision about "after" and "up to" must be the database's:
live polling drains every row exactly once, and a backfill chunk ending inside the tie group
delivers every row up to its end.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from azure_functions_db.core.batch import Batch
from azure_functions_db.core.engine import Engine, PollerConfig
from azure_functions_db.core.ports import Source
from azure_functions_db.core.position import Position
from azure_functions_db.sources.sqlalchemy import SqlSource
from azure_functions_db.spark.chunk import BoundedSource
from azure_functions_db.state.memory import MemoryStateStore
from azure_functions_db.testing.clock import FakeClock
from devkit import dbservers

TEXT_KEYS = ["a", "B", "c", "D", "e", "F"]


def _uuids() -> list[uuid.UUID]:
    """Ascending in the first segment, descending in the last: MariaDB's UUID type compares
    the last segment first, so it orders these the other way round from Python."""
    return [uuid.UUID(f"0000000{i}-0000-1000-8000-00000000000{9 - i}") for i in range(1, 7)]


@dataclass
class Case:
    url: str
    schema: str | None
    keys: list[Any]
    differs: bool = True  # the database orders the keys unlike Python (else: a control case)


def _sqlite(tmp_path: Path, request: pytest.FixtureRequest) -> Case:
    url = f"sqlite:///{tmp_path / 'order.db'}"
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "CREATE TABLE t (id TEXT COLLATE NOCASE PRIMARY KEY, updated_at INTEGER NOT NULL)"
        )
        conn.exec_driver_sql("CREATE INDEX ix_t ON t (updated_at, id)")
    engine.dispose()
    return Case(url, None, TEXT_KEYS)


def _maria_text(tmp_path: Path, request: pytest.FixtureRequest) -> Case:
    database = request.getfixturevalue("mysql_db")
    url = dbservers.mysql_url(database)
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    with engine.begin() as conn:  # the database's default collation, as users get it
        conn.exec_driver_sql(
            "CREATE TABLE t (id VARCHAR(20) PRIMARY KEY, updated_at INT NOT NULL, "
            "KEY ix_t (updated_at, id))"
        )
        assert conn.exec_driver_sql("SELECT 'a' = 'A'").scalar() == 1, "not case-insensitive"
    engine.dispose()
    return Case(url, None, TEXT_KEYS)


def _maria_uuid(tmp_path: Path, request: pytest.FixtureRequest) -> Case:
    database = request.getfixturevalue("mysql_db")
    url = dbservers.mysql_url(database)
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "CREATE TABLE t (id UUID PRIMARY KEY, updated_at INT NOT NULL, "
            "KEY ix_t (updated_at, id))"
        )
    engine.dispose()
    return Case(url, None, [str(u) for u in _uuids()])


def _pg_icu(tmp_path: Path, request: pytest.FixtureRequest) -> Case:
    schema = request.getfixturevalue("pg_schema")
    url = dbservers.pg_url()
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            f'CREATE TABLE "{schema}".t (id text COLLATE "en-x-icu" PRIMARY KEY, '
            "updated_at int NOT NULL)"
        )
        conn.exec_driver_sql(f'CREATE INDEX ix_t ON "{schema}".t (updated_at, id)')
    engine.dispose()
    return Case(url, schema, TEXT_KEYS)


def _pg_uuid(tmp_path: Path, request: pytest.FixtureRequest) -> Case:
    schema = request.getfixturevalue("pg_schema")
    url = dbservers.pg_url()
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            f'CREATE TABLE "{schema}".t (id uuid PRIMARY KEY, updated_at int NOT NULL)'
        )
    engine.dispose()
    return Case(url, schema, _uuids(), differs=False)  # PostgreSQL's uuid orders by bytes


CASES: dict[str, Callable[[Path, pytest.FixtureRequest], Case]] = {
    "sqlite-nocase": _sqlite,
    "mariadb-default-collation": _maria_text,
    "mariadb-uuid": _maria_uuid,
    "postgres-icu": _pg_icu,
    "postgres-uuid": _pg_uuid,
}


@pytest.fixture(
    params=[
        pytest.param("sqlite-nocase"),
        pytest.param("mariadb-default-collation", marks=pytest.mark.mysql),
        pytest.param("mariadb-uuid", marks=pytest.mark.mysql),
        pytest.param("postgres-icu", marks=pytest.mark.postgres),
        pytest.param("postgres-uuid", marks=pytest.mark.postgres),
    ]
)
def case(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Case, list[Any]]:
    """A table ``t(id, updated_at)`` whose rows all tie on the cursor, and their ids in the
    database's own order (which is not Python's)."""
    made = CASES[request.param](tmp_path, request)
    engine = sa.create_engine(made.url, poolclass=sa.NullPool)
    table = f'"{made.schema}".t' if made.schema else "t"
    with engine.begin() as conn:
        for key in made.keys:
            insert = sa.text(f"INSERT INTO {table} (id, updated_at) VALUES (:id, 7)")
            conn.execute(insert, {"id": key})
        ordered = list(
            conn.execute(sa.text(f"SELECT id FROM {table} ORDER BY updated_at, id")).scalars()
        )
    engine.dispose()
    python_order = sorted(ordered, key=str)  # str(UUID) sorts like the UUID itself
    assert (ordered != python_order) == made.differs, f"{request.param}: {ordered}"
    return made, ordered


def _engine(source: Source, store: MemoryStateStore, seen: list[Any], batch_size: int) -> Engine:
    def handler(batch: Batch) -> None:
        seen.extend(change.pk for change in batch)

    return Engine(
        PollerConfig(name="orders", batch_size=batch_size),
        source,
        store,
        handler,
        FakeClock(),
        owner="test",
        heartbeat_interval=3600,
    )


def _source(made: Case) -> SqlSource:
    return SqlSource(made.url, "t", "updated_at", "id", schema=made.schema, horizon="none")


@pytest.mark.parametrize("batch_size", [1, 2, 4])
def test_live_polling_drains_ties_across_batch_edges_in_the_database_order(case, batch_size):
    made, ordered = case
    source = _source(made)
    store = MemoryStateStore(FakeClock())
    seen: list[Any] = []
    try:
        report = _engine(source, store, seen, batch_size).run({})
        again = _engine(source, store, seen, batch_size).run({})
    finally:
        source.close()
    assert report.status == "caught_up"
    assert [str(k) for k in seen] == [str(k) for k in ordered]  # each row once, database order
    assert again.rows == 0


@pytest.mark.parametrize("end_index", [1, 3, 4])
def test_a_backfill_chunk_ending_inside_a_tie_group_delivers_up_to_its_end(case, end_index):
    """The chunk's end is the database's: rows `a, B, c, D` up to `D`, never just `a, B`."""
    made, ordered = case
    source = _source(made)
    end = Position(cursor=(7,), pk=(ordered[end_index],))
    store = MemoryStateStore(FakeClock())
    seen: list[Any] = []
    try:
        report = _engine(BoundedSource(source, end), store, seen, 2).run({})
    finally:
        source.close()
    assert report.status == "caught_up"
    assert [str(k) for k in seen] == [str(k) for k in ordered[: end_index + 1]]
