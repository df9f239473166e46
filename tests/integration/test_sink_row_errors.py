"""A sink error the rows cause is a failed attempt, never a transient error retried for ever.

Drivers raise ``OperationalError`` for errors a retry cannot fix: PyMySQL for a CHECK
constraint (MariaDB 4025), psycopg for SQLSTATE class 54 (an index row too large). Taken for
transient, such a batch failed on every run with ``attempts=0``: neither ``halt``'s poison
alert nor ``poison="quarantine"`` ever engaged, and nothing behind it was delivered. Against
the real servers: ``halt`` raises the poison alert after ``max_attempts`` runs, and
``quarantine`` parks the one bad row and delivers every other.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from azure_functions_db.core.batch import Batch
from azure_functions_db.core.engine import Engine, PollerConfig
from azure_functions_db.errors import HandlerError, PoisonBatchError, TransientSinkError
from azure_functions_db.sinks.sql import SqlSink
from azure_functions_db.sinks.writes import SqlWriter
from azure_functions_db.sources.sqlalchemy import SqlSource
from azure_functions_db.state.memory import MemoryStateStore
from azure_functions_db.testing.clock import FakeClock
from devkit import dbservers
from tests.support.sqlite_orders import Orders

BAD = 5  # the row the target refuses


@dataclass
class Target:
    """A table the rows are copied into, and the value of the bad row that it refuses."""

    url: str
    table: str
    bad_note: str
    engine: sa.Engine

    def ids(self) -> list[int]:
        with self.engine.connect() as conn:
            return [r[0] for r in conn.exec_driver_sql(f"SELECT id FROM {self.table} ORDER BY id")]


@pytest.fixture
def maria_check(mysql_db: str) -> Iterator[Target]:
    url = dbservers.mysql_url(mysql_db)
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "CREATE TABLE copy (id int PRIMARY KEY, note varchar(50) NOT NULL, "
            "CONSTRAINT note_ok CHECK (note <> 'refused')) ENGINE=InnoDB"
        )
    yield Target(url, "copy", "refused", engine)
    engine.dispose()


@pytest.fixture
def pg_index_row(pg_schema: str) -> Iterator[Target]:
    url = dbservers.pg_url()
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    table = f'"{pg_schema}".copy'
    with engine.begin() as conn:
        conn.exec_driver_sql(f"CREATE TABLE {table} (id int PRIMARY KEY, note text NOT NULL)")
        conn.exec_driver_sql(f"CREATE INDEX ON {table} (note)")
    # Random hex does not compress: past the btree's limit of about 2700 bytes an entry.
    yield Target(url, table, secrets.token_hex(4000), engine)
    engine.dispose()


def copier(target: Target) -> Callable[[Batch, SqlWriter], None]:
    def copy(batch: Batch, sink: SqlWriter) -> None:
        table = target.table.split(".")[-1].strip('"')
        sink.insert(
            table,
            [
                {"id": c.pk, "note": target.bad_note if c.pk == BAD else c.data["note"]}
                for c in batch
            ],
        )

    return copy


def poller(
    target: Target, orders: Orders, store: MemoryStateStore, **config: Any
) -> tuple[Engine, SqlSink, SqlSource]:
    schema = target.table.split(".")[0].strip('"') if "." in target.table else None
    sink = SqlSink(target.url, schema=schema)
    source = SqlSource(orders.url, "orders", "updated_at", "id", horizon="none")
    engine = Engine(
        PollerConfig(name=f"copy_{uuid.uuid4().hex[:6]}", batch_size=4, **config),
        source,
        store,
        copier(target),
        FakeClock(),
        owner="t",
        sink=sink,
    )
    return engine, sink, source


TARGETS = [
    pytest.param("maria_check", marks=pytest.mark.mysql, id="mariadb-check-4025"),
    pytest.param("pg_index_row", marks=pytest.mark.postgres, id="pg-index-row-54000"),
]


@pytest.mark.parametrize("target_name", TARGETS)
def test_halt_raises_the_poison_alert_after_max_attempts(
    request: pytest.FixtureRequest, target_name: str, tmp_path: Path
) -> None:
    target: Target = request.getfixturevalue(target_name)
    orders = Orders(tmp_path / "orders.db")
    orders.insert(range(1, 9))
    store = MemoryStateStore()
    engine, sink, source = poller(target, orders, store, max_attempts=3)
    try:
        for attempt in (1, 2):
            with pytest.raises(HandlerError) as failed:
                engine.run({})
            assert not isinstance(failed.value, PoisonBatchError)
            assert not isinstance(failed.value.__cause__, TransientSinkError)
            stored = store.read(engine.config.key)
            assert stored is not None
            assert stored.checkpoint.attempts == attempt
        with pytest.raises(PoisonBatchError):
            engine.run({})
        assert target.ids() == [1, 2, 3, 4]  # the batch before the bad one, nothing after it
    finally:
        sink.close()
        source.close()
        orders.close()


@pytest.mark.parametrize("target_name", TARGETS)
def test_quarantine_parks_the_bad_row_and_delivers_every_other(
    request: pytest.FixtureRequest, target_name: str, tmp_path: Path
) -> None:
    target: Target = request.getfixturevalue(target_name)
    orders = Orders(tmp_path / "orders.db")
    orders.insert(range(1, 13))
    store = MemoryStateStore()
    engine, sink, source = poller(target, orders, store, max_attempts=2, poison="quarantine")
    try:
        with pytest.raises(HandlerError):
            engine.run({})
        report = engine.run({})
        assert report.quarantined == 1
        assert target.ids() == [i for i in range(1, 13) if i != BAD]
        key = engine.config.key
        (record_id,) = store.list_quarantined(key)
        stored = store.read_quarantined(key, record_id)
        assert stored is not None
        assert [c.pk for c in stored.record.changes] == [BAD]
        assert "TransientSinkError" not in stored.record.error
    finally:
        sink.close()
        source.close()
        orders.close()
