"""SqlSinks in several processes creating the position table at once all go on.

On PostgreSQL the loser's ``CREATE TABLE`` fails (a duplicate in ``pg_type``) and aborts its
transaction; looking for the table on that connection then failed too, and the sink refused to
open with a ``SinkError`` that is not transient. Each round starts four processes on a barrier
against a fresh table name, on the real PostgreSQL and MariaDB.
"""

from __future__ import annotations

import multiprocessing
import uuid
from typing import Any

import pytest
import sqlalchemy as sa

from devkit import dbservers

PROCESSES = 4
ROUNDS = 5


def _open(url: str, schema: str | None, table: str, barrier: Any, results: Any) -> None:
    from azure_functions_db.sinks.sql import SqlSink

    sink = SqlSink(url, schema=schema, position_table=table)
    barrier.wait(30)
    try:
        sink.open({})
        results.put("ok")
    except Exception as exc:
        results.put(f"{type(exc).__name__}: {exc}")
    finally:
        sink.close()


def _race(url: str, schema: str | None) -> list[str]:
    ctx = multiprocessing.get_context("spawn")
    outcomes: list[str] = []
    for _ in range(ROUNDS):
        table = f"pos_{uuid.uuid4().hex[:8]}"
        barrier, results = ctx.Barrier(PROCESSES), ctx.Queue()
        procs = [
            ctx.Process(target=_open, args=(url, schema, table, barrier, results))
            for _ in range(PROCESSES)
        ]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join(60)
            assert proc.exitcode == 0
        outcomes.extend(results.get(timeout=5) for _ in procs)
    return outcomes


@pytest.mark.slow
@pytest.mark.postgres
def test_postgres_racing_creators_all_open(pg_schema: str) -> None:
    outcomes = _race(dbservers.pg_url(), pg_schema)
    assert outcomes == ["ok"] * (PROCESSES * ROUNDS), [o for o in outcomes if o != "ok"][:3]


@pytest.mark.slow
@pytest.mark.mysql
def test_mariadb_racing_creators_all_open(mysql_db: str) -> None:
    url = dbservers.mysql_url(mysql_db)
    outcomes = _race(url, None)
    assert outcomes == ["ok"] * (PROCESSES * ROUNDS), [o for o in outcomes if o != "ok"][:3]
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    tables = [t for t in sa.inspect(engine).get_table_names() if t.startswith("pos_")]
    engine.dispose()
    assert len(tables) == ROUNDS
