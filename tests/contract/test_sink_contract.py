"""The sink contract (:class:`azure_functions_db.testing.sink_contract.SinkContract`) over every
tier: the in-memory fake, SqlSink on SQLite, PostgreSQL and MariaDB (InnoDB), natively and
through pyodbc on both servers, and DeltaSink on a local Delta Lake table."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from azure_functions_db.core.ports import TransactionalSink
from azure_functions_db.sinks.delta import DeltaSink, DeltaWriter
from azure_functions_db.sinks.memory import MemorySink
from azure_functions_db.sinks.sql import SqlSink
from azure_functions_db.testing.sink_contract import SinkContract
from devkit import dbservers
from devkit import odbc_dialects as odbc

ITEMS = "CREATE TABLE items (id integer PRIMARY KEY, name varchar(40) NOT NULL)"


class TestMemorySink(SinkContract):
    @pytest.fixture
    def sink(self) -> MemorySink:
        sink = MemorySink()
        sink.create_table("items", ["id"])
        return sink

    def stored(self, sink: MemorySink) -> dict[int, str]:
        return {row["id"]: row["name"] for row in sink.rows("items")}


class SqlSinkTier(SinkContract):
    """Runs the contract over a SqlSink on ``url`` (``setup_url`` creates ``items``)."""

    def made(self, url: str, setup_url: str, **options: object) -> Iterator[SqlSink]:
        engine = sa.create_engine(setup_url, poolclass=sa.NullPool, **options)  # type: ignore[arg-type]
        with engine.begin() as conn:
            conn.exec_driver_sql(ITEMS)
        self.reader = engine
        sink = SqlSink(url, engine_options=options)
        sink.open({})
        yield sink
        sink.close()
        engine.dispose()

    def stored(self, sink: SqlSink) -> dict[int, str]:
        with self.reader.connect() as conn:
            return {r.id: r.name for r in conn.execute(sa.text("SELECT id, name FROM items"))}


class TestSqliteSink(SqlSinkTier):
    claims_wait_for_running_batches = True

    @pytest.fixture
    def sink(self, tmp_path: Path) -> Iterator[TransactionalSink]:
        url = f"sqlite:///{tmp_path / 'target.db'}"
        yield from self.made(url, url)


def _search_path(schema: str) -> dict[str, object]:
    return {"connect_args": {"options": f"-c search_path={schema}"}}


@pytest.mark.postgres
class TestPostgresSink(SqlSinkTier):
    @pytest.fixture
    def sink(self, pg_schema: str) -> Iterator[TransactionalSink]:
        url = dbservers.pg_url()
        yield from self.made(url, url, **_search_path(pg_schema))


@pytest.mark.mysql
class TestMariaDbSink(SqlSinkTier):
    @pytest.fixture
    def sink(self, mysql_db: str) -> Iterator[TransactionalSink]:
        url = dbservers.mysql_url(mysql_db)
        yield from self.made(url, url)


@pytest.mark.postgres
@pytest.mark.odbc
class TestPostgresOdbcSink(SqlSinkTier):
    @pytest.fixture
    def sink(self, pg_schema: str, odbc_drivers: None) -> Iterator[TransactionalSink]:
        url = odbc.pg_odbc_url()
        engine = sa.create_engine(dbservers.pg_url(), poolclass=sa.NullPool)
        with engine.begin() as conn:
            conn.exec_driver_sql(f'SET search_path TO "{pg_schema}"')
            conn.exec_driver_sql(ITEMS)
        engine.dispose()
        sink = SqlSink(url, schema=pg_schema)
        self.schema = pg_schema
        self.reader = sa.create_engine(
            dbservers.pg_url(), poolclass=sa.NullPool, **_search_path(pg_schema)
        )
        sink.open({})
        yield sink
        sink.close()
        self.reader.dispose()


@pytest.mark.mysql
@pytest.mark.odbc
class TestMariaDbOdbcSink(SqlSinkTier):
    @pytest.fixture
    def sink(self, mysql_db: str, odbc_drivers: None) -> Iterator[TransactionalSink]:
        yield from self.made(odbc.mysql_odbc_url(mysql_db), dbservers.mysql_url(mysql_db))


def test_the_fake_and_the_sql_sink_are_transactional_sinks() -> None:
    assert isinstance(MemorySink(), TransactionalSink)
    assert isinstance(SqlSink("sqlite://"), TransactionalSink)


class TestDeltaSink(SinkContract):
    """Delta Lake on the local file system through deltalake (delta-rs)."""

    @pytest.fixture
    def sink(self, tmp_path: Path) -> DeltaSink:
        import pyarrow as pa

        schema = pa.schema([("id", pa.int64()), ("name", pa.string())])
        sink = DeltaSink(str(tmp_path / "items"), key=["id"], schema=schema)
        sink.open({})
        return sink

    def stored(self, sink: DeltaSink) -> dict[int, str]:
        from deltalake import DeltaTable

        rows = DeltaTable(sink.options.uri).to_pyarrow_table().to_pylist()
        return {row["id"]: row["name"] for row in rows}

    def write(self, writer: DeltaWriter, method: str, rows: object) -> int:
        return int(getattr(writer, method)(rows))
