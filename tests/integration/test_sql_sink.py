"""SqlSink beyond its contract: a poller writing through it on SQLite and MariaDB, engines that
ignore transactions refused, SQL Server statements, options and secrets in errors."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.dialects import mssql
from sqlalchemy.schema import CreateTable

from azure_functions_db.core.batch import Batch
from azure_functions_db.core.engine import Engine, PollerConfig
from azure_functions_db.errors import ConfigurationError, PoisonBatchError, SinkError
from azure_functions_db.sinks.sql import SqlSink, _position_table
from azure_functions_db.sinks.writes import SqlWriter, upsert_statement
from azure_functions_db.sources.sqlalchemy import SqlSource
from azure_functions_db.state.memory import MemoryStateStore
from azure_functions_db.testing.clock import FakeClock
from devkit import dbservers
from tests.support.sqlite_orders import T0, Orders

COPY = "CREATE TABLE orders_copy (id integer PRIMARY KEY, note varchar(50) NOT NULL)"


def copy_orders(batch: Batch, sink: SqlWriter) -> None:
    sink.upsert("orders_copy", [{"id": c.pk, "note": c.data["note"]} for c in batch])


def drain_into(sink: SqlSink, source: SqlSource, store: MemoryStateStore) -> Engine:
    config = PollerConfig(name="orders", batch_size=4)
    engine = Engine(config, source, store, copy_orders, FakeClock(), owner="t", sink=sink)
    engine.run({})
    return engine


def test_a_poller_copies_sqlite_rows_into_sqlite_once(tmp_path: Path) -> None:
    orders = Orders(tmp_path / "orders.db")
    orders.insert(range(1, 11))
    target = sa.create_engine(f"sqlite:///{tmp_path / 'target.db'}")
    with target.begin() as conn:
        conn.exec_driver_sql(COPY)
    sink = SqlSink(f"sqlite:///{tmp_path / 'target.db'}")
    source = SqlSource(orders.url, "orders", "updated_at", "id", horizon="none")
    store = MemoryStateStore(FakeClock())
    try:
        drain_into(sink, source, store)
        orders.touch([3], T0 + dt.timedelta(hours=1))  # a new version of row 3
        drain_into(sink, source, store)
        with target.connect() as conn:
            rows = conn.exec_driver_sql("SELECT id, note FROM orders_copy ORDER BY id").all()
        assert [r.id for r in rows] == list(range(1, 11))
        mark = sink.mark(PollerConfig(name="orders").key)
        stored = store.read(PollerConfig(name="orders").key)
        assert mark is not None
        assert stored is not None
        assert (mark.sequence, mark.after) == (
            stored.checkpoint.stats.batches,
            stored.checkpoint.position,
        )
    finally:
        sink.close()
        source.close()
        orders.close()
        target.dispose()


@pytest.fixture
def maria(mysql_db: str) -> Iterator[sa.Engine]:
    engine = sa.create_engine(dbservers.mysql_url(mysql_db), poolclass=sa.NullPool)
    yield engine
    engine.dispose()


@pytest.mark.mysql
def test_a_myisam_target_table_is_refused_before_anything_is_written(
    maria: sa.Engine, mysql_db: str
) -> None:
    with maria.begin() as conn:
        conn.exec_driver_sql(COPY + " ENGINE=MyISAM")
        conn.exec_driver_sql(
            "CREATE TABLE source_rows (id int PRIMARY KEY, note varchar(50), "
            "updated_at datetime(6) NOT NULL)"
        )
        conn.exec_driver_sql("INSERT INTO source_rows VALUES (1, 'a', '2026-01-01 00:00:00')")
    sink = SqlSink(dbservers.mysql_url(mysql_db))
    source = SqlSource(
        dbservers.mysql_url(mysql_db), "source_rows", "updated_at", "id", horizon="none"
    )
    config = PollerConfig(name="orders", batch_size=4, max_attempts=1)
    engine = Engine(
        config,
        source,
        MemoryStateStore(FakeClock()),
        copy_orders,
        FakeClock(),
        owner="t",
        sink=sink,
    )
    try:
        with pytest.raises(PoisonBatchError) as caught:
            engine.run({})
        text = str(caught.value.__cause__)
        assert "MyISAM storage engine, which ignores transactions" in text
        assert "ALTER TABLE orders_copy ENGINE=InnoDB" in text
        with maria.connect() as conn:
            assert conn.exec_driver_sql("SELECT count(*) FROM orders_copy").scalar() == 0
    finally:
        sink.close()
        source.close()


@pytest.mark.mysql
def test_a_myisam_position_table_is_refused_when_the_sink_opens(
    maria: sa.Engine, mysql_db: str
) -> None:
    with maria.begin() as conn:
        conn.exec_driver_sql(
            "CREATE TABLE afdb_positions (namespace varchar(63), poller varchar(120), "
            "PRIMARY KEY (namespace, poller)) ENGINE=MyISAM"
        )
    sink = SqlSink(dbservers.mysql_url(mysql_db))
    with pytest.raises(ConfigurationError, match="afdb_positions` uses the MyISAM"):
        sink.open({})
    sink.close()


def test_sql_server_upsert_is_one_merge_with_holdlock() -> None:
    table = sa.Table(
        "orders copy",
        sa.MetaData(),
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("select", sa.String(20)),
        schema="dbo",
    )
    statement, bind = upsert_statement(mssql.dialect(), table, ["id", "select"], ["id"])
    sql = str(statement.compile(dialect=mssql.dialect()))
    assert sql.startswith("MERGE INTO dbo.[orders copy] WITH (HOLDLOCK) AS t USING (SELECT ")
    assert "ON t.id = s.id WHEN MATCHED THEN UPDATE SET t.[select] = s.[select]" in sql
    assert "WHEN NOT MATCHED THEN INSERT (id, [select]) VALUES (s.id, s.[select]);" in sql
    assert bind({"id": 1, "select": "x"}) == {"p0": 1, "p1": "x"}
    keys_only, _ = upsert_statement(mssql.dialect(), table, ["id"], ["id"])
    assert "WHEN MATCHED" not in str(keys_only.compile(dialect=mssql.dialect()))


def test_the_position_table_compiles_for_sql_server() -> None:
    ddl = str(
        CreateTable(_position_table("afdb_positions", "ops")).compile(dialect=mssql.dialect())
    )
    assert "CREATE TABLE ops.afdb_positions" in ddl
    assert "PRIMARY KEY (namespace, poller)" in ddl


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"url": ""}, "`url=''` is not a database URL"),
        ({"url": 5}, "`url=5` is not a database URL"),
        ({}, '`connection="ORDERS_DB"`'),
        ({"url": "sqlite://", "position_table": "my positions"}, "`position_table='my positions'`"),
        ({"url": "sqlite://", "schema": "a;b"}, "`schema='a;b'` is not a plain SQL name"),
        ({"url": "sqlite://", "engine_options": 3}, "`engine_options=3` must be a mapping"),
        ({"url": "sqlite://", "connect_timeout": 0}, "`connect_timeout=0` must be a number"),
    ],
)
def test_bad_options_name_the_value_and_the_fix(options: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        SqlSink(**options)  # type: ignore[arg-type]
    assert message in str(caught.value)
    assert "validation error" not in str(caught.value)


def test_construction_does_no_io_and_errors_never_show_the_password() -> None:
    sink = SqlSink("postgresql+psycopg://app:s3cr3t-pw@127.0.0.1:1/nowhere", connect_timeout=1)
    assert "s3cr3t-pw" not in repr(sink)
    with pytest.raises(SinkError) as caught:
        sink.open({})
    assert "s3cr3t-pw" not in str(caught.value)
    assert "***" in str(caught.value)


def test_the_url_comes_from_a_setting_when_the_sink_opens(tmp_path: Path) -> None:
    sink = SqlSink("%TARGET_DB%")
    sink.open({"TARGET_DB": f"sqlite:///{tmp_path / 't.db'}"})
    try:
        assert (tmp_path / "t.db").exists()
        assert "afdb_positions" in sink.describe()
    finally:
        sink.close()


def test_the_commit_is_a_compare_and_set_even_without_a_locking_read(tmp_path: Path) -> None:
    """SQL Server's dialect renders no FOR UPDATE, and a batch reads no record at all when the
    sink remembers it: the mark's write must itself refuse a newer fence. Here the newer fence
    lands in the batch's own transaction, after the handler's writes, before the mark."""
    from azure_functions_db.core.checkpoint import PollerKey
    from azure_functions_db.errors import SinkFencedError
    from azure_functions_db.testing.sink_contract import contract_batch

    url = f"sqlite:///{tmp_path / 't.db'}"
    sink = SqlSink(url)
    sink.open({})
    key = PollerKey("live", "orders")
    sink.claim(key, 1)
    batch = contract_batch(1, [1])

    def stale_batch() -> None:
        with sink.transaction(key, batch, 1) as writer:
            assert writer is not None
            writer.execute("UPDATE afdb_positions SET fence = 2")

    with pytest.raises(SinkFencedError):
        stale_batch()
    mark = sink.mark(key)
    assert mark is not None
    assert (mark.fence, mark.sequence) == (1, 0)  # rolled back: neither the fence nor the batch
    sink.close()


def test_sql_server_reads_the_record_with_an_update_lock() -> None:
    from azure_functions_db.sinks.sql import locked_read

    table = _position_table("afdb_positions", None)
    sql = str(locked_read(table, mssql.dialect()).compile(dialect=mssql.dialect()))
    assert "WITH (UPDLOCK, ROWLOCK)" in sql


STATUS_APP = """
import os
import azure_functions_db as afdb
from azure_functions_db.state.local import LocalStateStore

class LosesCommits(LocalStateStore):
    # With LOSE_COMMIT=1, a checkpoint commit after a batch fails: the sink holds one batch more.
    def replace(self, new, etag):
        if os.environ.get("LOSE_COMMIT") == "1" and new.stats.batches:
            raise afdb.TransientStoreError("lost")
        return super().replace(new, etag)

db = afdb.PollerBlueprint()

@db.poller(
    name="orders", schedule="0 0 * * * *", batch_size=4,
    source=afdb.SqlSource(url="%SRC%", table="orders", cursor="updated_at", pk="id",
                          horizon="none"),
    sink=afdb.SqlSink(url="%DST%"),
    state=LosesCommits(os.environ["STATE"]),
)
def copy(batch, sink):
    sink.upsert("orders_copy", [{"id": c.pk, "note": c.data["note"]} for c in batch])
"""


def test_status_shows_what_the_sink_holds_and_a_batch_ahead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from azure_functions_db.cli import main

    orders = Orders(tmp_path / "orders.db")
    orders.insert(range(1, 7))
    orders.close()
    target = sa.create_engine(f"sqlite:///{tmp_path / 'dst.db'}")
    with target.begin() as conn:
        conn.exec_driver_sql(COPY)
    target.dispose()
    (tmp_path / "function_app.py").write_text(STATUS_APP)
    monkeypatch.setenv("SRC", orders.url)
    monkeypatch.setenv("DST", f"sqlite:///{tmp_path / 'dst.db'}")
    monkeypatch.setenv("STATE", str(tmp_path / "state"))
    app = str(tmp_path / "function_app.py")
    monkeypatch.setenv("LOSE_COMMIT", "1")
    assert main(["run", app, "--once"]) != 0  # batch 1 in the sink, its checkpoint commit lost
    monkeypatch.delenv("LOSE_COMMIT")
    capsys.readouterr()
    assert main(["status", app]) == 0
    out = capsys.readouterr().out
    assert "batch 1 ending at" in out
    assert "one batch ahead of the checkpoint" in out
    assert main(["run", app, "--once"]) == 0  # catches up, then delivers the rest
    capsys.readouterr()
    assert main(["status", app, "--json"]) == 0
    (doc,) = json.loads(capsys.readouterr().out)
    assert doc["sink"]["sequence"] == doc["stats"]["batches"] == 2
    assert doc["sink"]["position"] == doc["position"]


def test_validate_opens_the_sink_and_names_what_is_wrong(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from azure_functions_db.cli import main

    orders = Orders(tmp_path / "orders.db")
    orders.close()
    (tmp_path / "function_app.py").write_text(STATUS_APP)
    monkeypatch.setenv("SRC", orders.url)
    monkeypatch.setenv("STATE", str(tmp_path / "state"))
    app = str(tmp_path / "function_app.py")
    monkeypatch.delenv("DST", raising=False)
    assert main(["validate", app, "--json"]) != 0
    findings = json.loads(capsys.readouterr().out)[0]["findings"]
    assert any(f["check"] == "settings" and "`DST`" in f["message"] for f in findings)
    monkeypatch.setenv("DST", f"sqlite:///{tmp_path / 'dst.db'}")
    assert main(["validate", app, "--json"]) == 0
    findings = json.loads(capsys.readouterr().out)[0]["findings"]
    assert any(f["check"] == "sink" and f["level"] == "ok" for f in findings)
