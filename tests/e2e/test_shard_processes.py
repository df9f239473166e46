"""Sharded pollers in real processes on PostgreSQL: three shards, each in its own ``afdb run``
process, plus one process running every shard (so each shard's lease has two owners), a
SqlSink, writers with late commits, and one shard's process killed with SIGKILL and restarted.

What must hold: every row's final version reaches ``applied``; no version is applied twice (the
SqlSink is effectively-once per shard); the versions of a row are applied in order, all by the
one shard the database's hash puts the row in.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest
import sqlalchemy as sa

from azure_functions_db.sources import shards
from devkit import dbservers
from devkit.processes import stop

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

SHARDS, ROWS, WRITE_SECONDS = 3, 60, 10.0

APP = textwrap.dedent(
    """
    import os
    import azure_functions_db as afdb

    db = afdb.PollerBlueprint()

    @db.poller(
        name="orders",
        schedule="* * * * * *",
        source=afdb.SqlSource(
            url="%SHARD_DB%", table="orders", schema=os.environ["SHARD_SCHEMA"],
            cursor="updated_at", pk="id",
        ),
        sink=afdb.SqlSink(url="%SHARD_DB%", schema=os.environ["SHARD_SCHEMA"]),
        state=afdb.LocalStateStore(os.environ["SHARD_STATE"]),
        batch_size=5,
        lease_duration=3,
        shards=3,
    )
    def copy_orders(batch, sink):
        sink.insert("applied", [
            {"order_id": c.pk, "version": c.data["version"], "shard": batch.poller}
            for c in batch
        ])
    """
)


@pytest.fixture
def db(pg_schema: str):
    engine = sa.create_engine(dbservers.pg_url(), poolclass=sa.NullPool)
    with engine.begin() as conn:
        conn.exec_driver_sql(f'SET search_path TO "{pg_schema}"')
        conn.exec_driver_sql(
            "CREATE TABLE orders (id int PRIMARY KEY, version int NOT NULL, "
            "updated_at timestamptz NOT NULL DEFAULT clock_timestamp())"
        )
        conn.exec_driver_sql(
            "CREATE TABLE applied (n bigserial PRIMARY KEY, order_id int NOT NULL, "
            "version int NOT NULL, shard text NOT NULL)"
        )
        conn.exec_driver_sql(
            f"INSERT INTO orders (id, version) SELECT i, 1 FROM generate_series(1, {ROWS}) AS i"
        )
        table = sa.Table("orders", sa.MetaData(), autoload_with=conn)
        (index,) = shards.ddl(
            conn.dialect,
            table="orders",
            bare="orders",
            cursor=["updated_at"],
            pk=[table.c.id],
            count=SHARDS,
        )
        conn.exec_driver_sql(index.replace(" CONCURRENTLY", ""))
    yield engine
    engine.dispose()


def start(tmp_path: Path, schema: str, *pollers: str) -> subprocess.Popen[bytes]:
    app = tmp_path / "function_app.py"
    app.write_text(APP)
    env = {
        **os.environ,
        "SHARD_DB": dbservers.pg_url(),
        "SHARD_SCHEMA": schema,
        "SHARD_STATE": str(tmp_path / "state"),
    }
    chosen = [arg for poller in pollers for arg in ("--poller", poller)]
    command = [sys.executable, "-m", "azure_functions_db", "run", str(app), *chosen]
    with (tmp_path / "runs.log").open("ab") as log:
        return subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)


def write(db: sa.Engine, schema: str, stop: threading.Event, seed: int) -> None:
    """Update and insert rows until ``stop``; some transactions stay open a while (late
    commits: their rows' cursor is stamped when the transaction starts)."""
    rng = random.Random(seed)
    next_id = ROWS + 1 + seed * 100_000
    while not stop.is_set():
        with db.begin() as conn:
            conn.exec_driver_sql(f'SET search_path TO "{schema}"')
            conn.exec_driver_sql("SELECT 1")
            stamp = "now()" if rng.random() < 0.3 else "clock_timestamp()"
            # In key order: two writers lock their rows in one order, so they never deadlock.
            for pk in sorted(rng.sample(range(1, ROWS + 1), 3)):
                conn.exec_driver_sql(
                    f"UPDATE orders SET version = version + 1, updated_at = {stamp} WHERE id = {pk}"
                )
            if rng.random() < 0.3:
                conn.exec_driver_sql(f"INSERT INTO orders (id, version) VALUES ({next_id}, 1)")
                next_id += 1
            if stamp == "now()":
                time.sleep(rng.uniform(0.2, 1.2))  # committed late, below rows already read
        time.sleep(0.01)


def applied_in_time(db: sa.Engine, schema: str) -> tuple[set[tuple], set[tuple]]:
    """The table's final versions, and the versions applied once they all are (or 90 s on)."""
    final = set(query(db, schema, "SELECT id, version FROM orders"))
    deadline = time.monotonic() + 90
    while True:
        got = set(query(db, schema, "SELECT order_id, version FROM applied"))
        if final <= got or time.monotonic() > deadline:
            return final, got
        time.sleep(0.5)


def query(db: sa.Engine, schema: str, sql: str) -> list[tuple]:
    with db.connect() as conn:
        conn.exec_driver_sql(f'SET search_path TO "{schema}"')
        return [tuple(row) for row in conn.exec_driver_sql(sql)]


def test_three_shards_in_four_processes_deliver_every_version_once_in_order(
    db, pg_schema, tmp_path
):
    names = [shards.Shard(i, SHARDS).poller_name("orders") for i in range(SHARDS)]
    procs = [start(tmp_path, pg_schema, name) for name in names]
    procs.append(start(tmp_path, pg_schema))  # every shard: a second owner for each lease
    stop_writing = threading.Event()
    writers = [
        threading.Thread(target=write, args=(db, pg_schema, stop_writing, s)) for s in (1, 2)
    ]
    try:
        for writer in writers:
            writer.start()
        time.sleep(WRITE_SECONDS / 2)
        procs[1].send_signal(signal.SIGKILL)  # shard 1's own process, mid-run
        procs[1].wait()
        time.sleep(1)
        procs[1] = start(tmp_path, pg_schema, names[1])
        time.sleep(WRITE_SECONDS / 2)
    finally:
        stop_writing.set()
        for writer in writers:
            writer.join()
    try:
        final, got = applied_in_time(db, pg_schema)
    finally:
        stop(procs)
    log = (tmp_path / "runs.log").read_text(errors="replace")
    assert final <= got, f"final versions never applied: {sorted(final - got)[:20]}\n{log[-3000:]}"
    applied = query(db, pg_schema, "SELECT order_id, version, shard FROM applied ORDER BY n")
    versions = [(order_id, version) for order_id, version, _ in applied]
    assert len(versions) == len(set(versions)), "a version applied twice"
    by_row: dict[int, list[tuple[int, str]]] = defaultdict(list)
    for order_id, version, shard in applied:
        by_row[order_id].append((version, shard))
    expected = dict(
        query(
            db,
            pg_schema,
            "SELECT id, mod(coalesce(hashtext(CAST(id AS text))::bigint, 0) + 2147483648, "
            f"{SHARDS}) FROM orders",
        )
    )
    for order_id, seen in by_row.items():
        assert [v for v, _ in seen] == sorted(v for v, _ in seen), (order_id, seen)
        assert {s for _, s in seen} == {names[expected[order_id]]}, (order_id, seen)
    assert {s for _, _, s in applied} == set(names)  # every shard took part
