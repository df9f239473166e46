"""``afdb reshard`` 2 -> 3 shards on PostgreSQL in real processes, killed with SIGKILL after
every step in turn, with writers running throughout.

The old app (2 shards) runs in two processes; the new app (3 shards, ``resharded_from=2``) is
started in two more while the old one still runs, as a deployment overlaps. Then ``afdb
reshard`` runs with a state store that kills it right after its k-th state-changing call
(a lease taken, a checkpoint created or written), for k = 1, 2, ... each attempt resuming what
the one before left, until one completes. A SqlSink applies each version it is given.

What must hold: every row's final version is applied; no version is applied twice (not by an
old shard and a new one, nor by a drain and a crashed drain); a row's versions are applied in
order, each by the shard of that row (old or new); the old pollers refused once retired and the
new ones until positioned, both saying so.
"""

from __future__ import annotations

import os
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
from tests.e2e.test_shard_processes import applied_in_time, query, write

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

ROWS = 60

APP = textwrap.dedent(
    """
    import os
    import azure_functions_db as afdb
    from tests.support.killing_store import KillsAtCall

    count, before = int(os.environ["SHARDS"]), os.environ.get("RESHARDED_FROM")
    db = afdb.PollerBlueprint()

    @db.poller(
        name="orders",
        schedule="* * * * * *",
        source=afdb.SqlSource(
            url="%SHARD_DB%", table="orders", schema=os.environ["SHARD_SCHEMA"],
            cursor="updated_at", pk="id",
        ),
        sink=afdb.SqlSink(url="%SHARD_DB%", schema=os.environ["SHARD_SCHEMA"]),
        state=KillsAtCall(os.environ["SHARD_STATE"]),
        batch_size=7,
        lease_duration=2,
        time_budget=5,
        **({"shards": count} if count > 1 else {}),
        **({"resharded_from": int(before)} if before else {}),
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
    yield engine
    engine.dispose()


def environment(tmp_path: Path, schema: str, count: int, before: int | None) -> dict[str, str]:
    (tmp_path / "function_app.py").write_text(APP)
    env = {
        **os.environ,
        "SHARD_DB": dbservers.pg_url(),
        "SHARD_SCHEMA": schema,
        "SHARD_STATE": str(tmp_path / "state"),
        "SHARDS": str(count),
        "PYTHONPATH": os.pathsep.join([str(Path.cwd()), os.environ.get("PYTHONPATH", "")]),
    }
    if before is not None:
        env["RESHARDED_FROM"] = str(before)
    return env


def start(tmp_path: Path, env: dict[str, str], log: str) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "azure_functions_db", "run", str(tmp_path / "function_app.py")]
    with (tmp_path / log).open("ab") as output:
        return subprocess.Popen(command, env=env, stdout=output, stderr=subprocess.STDOUT)


def test_reshard_killed_after_every_step_loses_and_repeats_nothing(db, pg_schema, tmp_path):
    old_env = environment(tmp_path, pg_schema, 2, None)
    new_env = environment(tmp_path, pg_schema, 3, 2)
    stop_writing = threading.Event()
    writers = [
        threading.Thread(target=write, args=(db, pg_schema, stop_writing, s)) for s in (1, 2)
    ]
    old = [start(tmp_path, old_env, "old.log") for _ in range(2)]
    new: list[subprocess.Popen[bytes]] = []
    kills, attempts = 0, []
    try:
        for writer in writers:
            writer.start()
        time.sleep(4)
        new = [start(tmp_path, new_env, "new.log") for _ in range(2)]
        time.sleep(2)
        command = [
            sys.executable,
            "-m",
            "azure_functions_db",
            "reshard",
            str(tmp_path / "function_app.py"),
            "--poller",
            "orders",
            "--wait",
            "30",
        ]
        for k in range(1, 200):
            done = subprocess.run(
                command,
                env={**new_env, "KILL_AT": str(k)},
                capture_output=True,
                timeout=120,
                check=False,
            )
            attempts.append(
                (k, done.returncode, done.stdout.decode()[-500:], done.stderr.decode()[-800:])
            )
            if done.returncode == -signal.SIGKILL:
                kills += 1
                continue
            assert done.returncode == 0, attempts[-1]
            break
        time.sleep(3)  # the new shards deliver with writers still running
    finally:
        stop_writing.set()
        for writer in writers:
            writer.join()
        stop(old)
    try:
        final, got = applied_in_time(db, pg_schema)
    finally:
        stop(new)
    old_log = (tmp_path / "old.log").read_text(errors="replace")
    new_log = (tmp_path / "new.log").read_text(errors="replace")
    assert kills >= 10, attempts  # a crash after each of many steps, each resumed
    assert final <= got, (
        f"final versions never applied: {sorted(final - got)[:20]}\n{new_log[-2000:]}"
    )
    applied = query(db, pg_schema, "SELECT order_id, version, shard FROM applied ORDER BY n")
    versions = [(order_id, version) for order_id, version, _ in applied]
    twice = query(
        db,
        pg_schema,
        "SELECT order_id, version, array_agg(shard ORDER BY n), array_agg(n ORDER BY n) "
        "FROM applied GROUP BY order_id, version HAVING count(*) > 1",
    )
    assert twice == [], f"versions applied twice: {twice}"
    assert len(versions) == len(set(versions))
    hashed = {
        count: dict(
            query(
                db,
                pg_schema,
                "SELECT id, mod(coalesce(hashtext(CAST(id AS text))::bigint, 0) + 2147483648, "
                f"{count}) FROM orders",
            )
        )
        for count in (2, 3)
    }
    by_row: dict[int, list[tuple[int, str]]] = defaultdict(list)
    for order_id, version, shard in applied:
        by_row[order_id].append((version, shard))
    for order_id, seen in by_row.items():
        assert [v for v, _ in seen] == sorted(v for v, _ in seen), (order_id, seen)
        for _, shard in seen:
            count = int(shard.rsplit("-", 1)[1])
            assert shard == shards.Shard(hashed[count][order_id], count).poller_name("orders")
    assert {int(s.rsplit("-", 1)[1]) for _, _, s in applied} == {2, 3}  # old, then new
    assert "was retired by a reshard" in old_log
    assert "waits to be positioned" in new_log
