"""A chunk reads ahead only from a database across the network (one on this machine shares the
cores the chunks run on); everything else it reads the way a live poller does."""

from __future__ import annotations

import datetime as dt
import threading
from pathlib import Path

import pytest
import sqlalchemy as sa

from azure_functions_db.core.batch import Batch
from azure_functions_db.core.config import PollerConfig
from azure_functions_db.core.ports import ChangeSource
from azure_functions_db.core.position import Position
from azure_functions_db.core.reader import ReadAheadSource
from azure_functions_db.runtime.poller import PollerDefinition
from azure_functions_db.sources import SqlSource
from azure_functions_db.sources.memory import MemorySource
from azure_functions_db.spark.chunk import BoundedSource, on_this_machine, reads_ahead, run_chunk
from azure_functions_db.spark.plan import prepare_run
from azure_functions_db.state.memory import MemoryStateStore
from tests.support.sqlite_orders import Orders


@pytest.mark.parametrize(
    "url",
    [
        "sqlite:///orders.db",
        "postgresql+psycopg://u@localhost/db",
        "postgresql+psycopg://u@127.0.0.1:5432/db",
        "postgresql+psycopg://u@[::1]:5432/db",
        "postgresql+psycopg:///db",  # libpq's default socket
        "postgresql+psycopg://u@/db?host=/var/run/postgresql",
        "mysql+pymysql://u@localhost/db",
    ],
)
def test_a_database_on_this_machine(url):
    assert on_this_machine(sa.make_url(url))


@pytest.mark.parametrize(
    "url",
    [
        "postgresql+psycopg://u@db.example.com/db",
        "postgresql+psycopg://u@10.1.2.3:5432/db",
        "mssql+pyodbc://u@orders.database.windows.net/db?driver=ODBC+Driver+18",
        "postgresql+psycopg://u@localhost/db?host=db.example.com",
    ],
)
def test_a_database_across_the_network(url):
    assert not on_this_machine(sa.make_url(url))


@pytest.fixture
def orders(tmp_path: Path) -> Orders:
    table = Orders(tmp_path / "orders.db")
    table.insert(range(1, 101))
    return table


def _source(orders: Orders) -> SqlSource:
    source = SqlSource(orders.url, table="orders", cursor="updated_at", pk="id")
    source.open({})
    return source


def test_only_a_source_known_to_be_on_this_machine_is_not_read_ahead(orders):
    source = _source(orders)
    try:
        assert reads_ahead(source) is False  # SQLite: on this machine
    finally:
        source.close()
    assert reads_ahead(source) is True  # not open: as a remote database
    assert reads_ahead(MemorySource("orders", cursor="updated_at", pk="id")) is True


def test_a_view_without_read_ahead_keeps_the_other_read_ports(orders):
    source = _source(orders)
    end = Position(cursor=(dt.datetime(2030, 1, 1),), pk=(10**6,))
    try:
        ahead = BoundedSource(source, end)
        plain = BoundedSource(source, end, read_ahead=False)

        assert isinstance(ahead, ReadAheadSource)
        assert isinstance(ahead, ChangeSource)
        assert not isinstance(plain, ReadAheadSource)
        assert isinstance(plain, ChangeSource)
    finally:
        source.close()


@pytest.mark.parametrize("read_ahead", [True, False])
def test_a_chunk_reads_ahead_only_when_told(orders, read_ahead):
    reader_threads: list[bool] = []

    def handler(batch: Batch) -> None:
        reader_threads.append(any(t.name.startswith("afdb-read") for t in threading.enumerate()))

    source = SqlSource(orders.url, table="orders", cursor="updated_at", pk="id")
    definition = PollerDefinition(
        config=PollerConfig(name="orders", batch_size=10),
        schedule="0 0 * * * *",
        source=source,
        handler=handler,
    )
    store = MemoryStateStore()
    source.open({})
    try:
        prepare_run(
            definition,
            store,
            namespace="backfill",
            run_id="r1",
            start=None,
            end=None,
            partitions=1,
            by="test",
            now=dt.datetime.now(dt.UTC),
        )
        done = run_chunk(
            definition, store, {}, namespace="backfill", run_id="r1", index=0, read_ahead=read_ahead
        )
    finally:
        source.close()

    assert done.rows == 100
    assert any(reader_threads) is read_ahead
