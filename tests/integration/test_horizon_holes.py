"""Writers the commit-safe horizons used not to see, each reproduced on the real server.

- MariaDB: a statement that read ``NOW(6)`` and is delayed before it touches InnoDB (a slow
  subquery, a metadata-lock wait) is not in ``innodb_trx`` yet; the process list has it.
- PostgreSQL: a session with ``track_activities = off`` shows no ``xact_start``.

Each scenario commits the late row after the poller has moved past its stamp: with the fix it
is delivered, with the horizon off (the control) it is lost.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable

import pytest
import sqlalchemy as sa

from azure_functions_db.sources import AutoHorizon, NoHorizon
from azure_functions_db.sources.sqlalchemy import SqlSource
from devkit import dbservers

SETTLE = dt.timedelta(milliseconds=300)


def drain(source: SqlSource, state: dict[str, object]) -> None:
    """Read everything below the horizon, as the engine does, from ``state['after']``."""
    delivered: list[int] = state.setdefault("delivered", [])  # type: ignore[assignment]
    while True:
        rows = source.fetch(state.get("after"), 50, source.horizon())  # type: ignore[arg-type]
        delivered.extend(int(r.data["id"]) for r in rows)
        if rows:
            state["after"] = rows[-1].position
        if len(rows) < 50:
            return


def late_row_scenario(
    url: str,
    table: str,
    horizon: object,
    slow_writer: Callable[[sa.Engine], None],
    *,
    schema: str | None = None,
) -> list[int]:
    """Rows 1, 2 fast; the slow writer stamps row 100 and commits ~2 s later, while rows 3-6
    are written and polled; then a final poll. Returns the ids delivered."""
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    source = SqlSource(url, table, "updated_at", "id", schema=schema, horizon=horizon)  # type: ignore[arg-type]
    state: dict[str, object] = {}
    qualified = f'"{schema}".{table}' if schema else table

    stamp = "now()" if engine.dialect.name == "postgresql" else "NOW(6)"

    def fast(row_id: int) -> None:
        with engine.begin() as conn:
            conn.exec_driver_sql(f"INSERT INTO {qualified} VALUES ({row_id}, {stamp})")

    try:
        source.open({})
        fast(1)
        fast(2)
        worker = threading.Thread(target=slow_writer, args=(engine,), daemon=True)
        worker.start()
        time.sleep(0.3)  # the slow writer has read its clock
        for row_id in (3, 4, 5, 6):
            fast(row_id)
            time.sleep(0.4)
            drain(source, state)
        worker.join(30)
        assert not worker.is_alive()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            drain(source, state)
            if 100 in state["delivered"] and 6 in state["delivered"]:  # type: ignore[operator]
                break
            time.sleep(0.2)
        return list(state["delivered"])  # type: ignore[call-overload]
    finally:
        source.close()
        engine.dispose()


@pytest.fixture
def maria_table(mysql_db: str) -> tuple[str, str]:
    url = dbservers.mysql_url(mysql_db)
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "CREATE TABLE t (id int PRIMARY KEY, updated_at datetime(6) NOT NULL) ENGINE=InnoDB"
        )
        conn.exec_driver_sql("CREATE TABLE side (x int) ENGINE=InnoDB")
        conn.exec_driver_sql("INSERT INTO side VALUES (1)")
    engine.dispose()
    return url, "t"


def _sleepy_insert(engine: sa.Engine) -> None:
    # NOW(6) is fixed when the statement starts; InnoDB hears of it only after the sleep.
    with engine.begin() as conn:
        conn.exec_driver_sql("INSERT INTO t SELECT 100, NOW(6) FROM (SELECT SLEEP(2)) AS s")


def _mdl_waiting_insert(engine: sa.Engine) -> None:
    blocker = engine.connect()
    blocker.exec_driver_sql("LOCK TABLES side WRITE")  # the insert below waits for this

    def unlock() -> None:
        blocker.exec_driver_sql("UNLOCK TABLES")
        blocker.close()

    release = threading.Timer(2.0, unlock)
    release.start()
    with engine.begin() as conn:
        conn.exec_driver_sql("INSERT INTO t SELECT 100, NOW(6) FROM side LIMIT 1")
    release.join()


@pytest.mark.mysql
@pytest.mark.parametrize("writer", [_sleepy_insert, _mdl_waiting_insert], ids=["sleep", "mdl"])
def test_mariadb_statement_delayed_before_innodb_is_not_passed(maria_table, writer):
    url, table = maria_table
    delivered = late_row_scenario(url, table, AutoHorizon(settle=SETTLE), writer)
    assert sorted(delivered) == [1, 2, 3, 4, 5, 6, 100]


@pytest.mark.mysql
def test_mariadb_control_without_a_horizon_loses_the_delayed_row(maria_table):
    url, table = maria_table
    delivered = late_row_scenario(url, table, NoHorizon(), _sleepy_insert)
    assert 100 not in delivered, "the scenario must be able to lose the row"


@pytest.fixture
def pg_table(pg_schema: str) -> tuple[str, str, str]:
    url = dbservers.pg_url()
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            f'CREATE TABLE "{pg_schema}".t (id int PRIMARY KEY, updated_at timestamptz NOT NULL)'
        )
    engine.dispose()
    return url, "t", pg_schema


def _untracked_writer(schema: str) -> Callable[[sa.Engine], None]:
    def write(engine: sa.Engine) -> None:
        with engine.connect() as conn:
            conn.exec_driver_sql("SET track_activities = off")  # a per-role/database setting
            conn.commit()
            conn.exec_driver_sql(f'INSERT INTO "{schema}".t VALUES (100, now())')
            time.sleep(2)
            conn.commit()

    return write


@pytest.mark.postgres
def test_pg_session_with_track_activities_off_holds_the_bound(pg_table):
    url, table, schema = pg_table
    delivered = late_row_scenario(
        url, table, AutoHorizon(settle=SETTLE), _untracked_writer(schema), schema=schema
    )
    assert sorted(delivered) == [1, 2, 3, 4, 5, 6, 100]


@pytest.mark.postgres
def test_pg_control_without_a_horizon_loses_the_untracked_row(pg_table):
    url, table, schema = pg_table
    delivered = late_row_scenario(url, table, NoHorizon(), _untracked_writer(schema), schema=schema)
    assert 100 not in delivered, "the scenario must be able to lose the row"
