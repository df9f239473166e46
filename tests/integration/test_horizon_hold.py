"""A stall is never silent: rows held back by an open transaction are reported, not caught up.

While a session stays idle in a transaction, the commit-safe horizon holds every newer row back
(correctly). The run says so, ``held_by_horizon``, with the blocking session and the age of the
hold, logs it (a WARNING past ``hold_warning``), records ``afdb.horizon.held``, and
``afdb status`` shows it too.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import textwrap
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from azure_functions_db.cli import EXIT_OK, main
from azure_functions_db.core.clock import SystemClock
from azure_functions_db.core.engine import Engine, PollerConfig
from azure_functions_db.sources import AutoHorizon
from azure_functions_db.sources.sqlalchemy import SqlSource
from azure_functions_db.state.memory import MemoryStateStore
from devkit import dbservers

SETTLE = dt.timedelta(milliseconds=300)


def _scenario(
    url: str, qualified: str, schema: str | None, stamp: str, caplog, *, blocker_writes: bool
) -> None:
    """A transaction left open holds row 2, stamped after it began. On PostgreSQL a session
    idle in a transaction that has only read holds it (``now()`` is its start, whatever it
    writes later); on MariaDB ``NOW()`` is each statement's start, so the transaction holds
    once it has written a row (``blocker_writes``: row 100, rolled back at the end)."""
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    with engine.begin() as conn:
        conn.exec_driver_sql(f"INSERT INTO {qualified} VALUES (1, {stamp})")
    blocker = engine.connect()
    if blocker_writes:
        blocker.exec_driver_sql(f"INSERT INTO {qualified} VALUES (100, {stamp})")
    else:
        blocker.exec_driver_sql(f"SELECT count(*) FROM {qualified}")  # now idle in a transaction
    time.sleep(0.5)
    with engine.begin() as conn:
        conn.exec_driver_sql(f"INSERT INTO {qualified} VALUES (2, {stamp})")
    time.sleep(0.5)
    source = SqlSource(url, "t", "updated_at", "id", schema=schema, horizon=AutoHorizon(SETTLE))
    store = MemoryStateStore()
    seen: list[int] = []
    poller = Engine(
        PollerConfig(name="orders", hold_warning=0.5),
        source,
        store,
        lambda batch: seen.extend(c.pk for c in batch),
        SystemClock(),
        owner="test",
    )
    try:
        with caplog.at_level(logging.INFO, "azure_functions_db"):
            held = poller.run({})
        assert held.status == "held_by_horizon"
        assert held.held_by is not None
        assert held.held_seconds is not None
        assert held.held_seconds >= 0.5
        assert 2 not in seen  # stamped after the blocker began: it waits behind it
        (line,) = [r for r in caplog.records if "action=horizon_held" in r.getMessage()]
        assert line.levelno == logging.WARNING
        blocker.rollback()
        blocker.close()
        time.sleep(0.5)
        done = poller.run({})
        assert done.status == "caught_up"
        assert sorted(set(seen)) == [1, 2]
    finally:
        blocker.close()
        source.close()
        engine.dispose()
    return held.held_by  # type: ignore[return-value]


@pytest.mark.postgres
def test_pg_idle_in_transaction_session_is_reported_not_caught_up(pg_schema, caplog):
    url = dbservers.pg_url()
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            f'CREATE TABLE "{pg_schema}".t (id int PRIMARY KEY, updated_at timestamptz NOT NULL)'
        )
    engine.dispose()
    holder = _scenario(
        url + "?application_name=nightly-report",
        f'"{pg_schema}".t',
        pg_schema,
        "now()",
        caplog,
        blocker_writes=False,
    )
    assert "app `nightly-report`" in holder
    assert "idle in transaction" in holder


@pytest.mark.mysql
def test_mariadb_open_transaction_is_reported_not_caught_up(mysql_db, caplog):
    url = dbservers.mysql_url(mysql_db)
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "CREATE TABLE t (id int PRIMARY KEY, updated_at datetime(6) NOT NULL) ENGINE=InnoDB"
        )
    engine.dispose()
    holder = _scenario(url, "t", None, "NOW(6)", caplog, blocker_writes=True)
    assert holder.startswith("thread ")
    assert "user `root@" in holder


@pytest.mark.postgres
def test_afdb_status_shows_the_hold(pg_schema, tmp_path: Path, monkeypatch, capsys):
    url = dbservers.pg_url()
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            f'CREATE TABLE "{pg_schema}".t (id int PRIMARY KEY, updated_at timestamptz NOT NULL)'
        )
    blocker = engine.connect()
    blocker.exec_driver_sql("SELECT 1")
    time.sleep(1.5)  # older than the default settle margin (1 s): the transaction holds the bound
    with engine.begin() as conn:
        conn.exec_driver_sql(f'INSERT INTO "{pg_schema}".t VALUES (1, now())')
    app = tmp_path / "function_app.py"
    app.write_text(
        textwrap.dedent(
            f"""
            import azure_functions_db as afdb
            db = afdb.PollerBlueprint()

            @db.poller(name="orders", schedule="0 0 * * * *",
                       source=afdb.SqlSource(url={url!r}, table="t", schema={pg_schema!r},
                                             cursor="updated_at", pk="id"))
            def on_orders(batch):
                pass
            """
        )
    )
    monkeypatch.setenv("AFDB_STATE_DIR", str(tmp_path / "state"))
    try:
        assert main(["status", str(app), "--json"]) == EXIT_OK
        (doc,) = json.loads(capsys.readouterr().out)
        assert "idle in transaction" in doc["held"]["by"]
        assert doc["held"]["seconds"] >= 0
        assert main(["status", str(app)]) == EXIT_OK
        assert "rows held back by the horizon" in capsys.readouterr().out
    finally:
        blocker.close()
        engine.dispose()
