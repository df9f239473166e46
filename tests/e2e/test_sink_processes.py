"""SqlSink on PostgreSQL with real processes: effectively-once through kill -9 and SIGSTOP.

The poller runs in child processes through the real CLI (``python -m azure_functions_db run APP
--once``): source and sink in one PostgreSQL schema, checkpoints in the local file store. The
handler appends one row per source row version to ``applied``, a table with no unique key, so a
batch written twice would show as two rows and a lost one as none.

- kill -9 between the sink's commit and the checkpoint's, 20 times in a row (the store's
  checkpoint write kills its own process with SIGKILL right after the sink committed), with new
  row versions written between the kills: ``applied`` holds each version exactly once.
- A stale owner: SIGSTOP while its handler has written its batch (uncommitted); its lease
  expires; a new owner delivers everything; the old one is resumed (SIGCONT) and commits
  nothing.
"""

from __future__ import annotations

import signal
import subprocess
import textwrap
import time
from collections import Counter
from pathlib import Path

import pytest
import sqlalchemy as sa

from azure_functions_db.core.checkpoint import PollerKey
from azure_functions_db.state.local import LocalStateStore
from devkit import dbservers
from tests.support.once import finish, frozen_past_its_lease, start_once

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

KEY = PollerKey("live", "orders")
ROWS, BATCH = 60, 3

APP = textwrap.dedent(
    """
    import os, time
    from pathlib import Path
    import azure_functions_db as afdb
    from tests.support.dying_store import DiesAfterTheSinkCommit, handled

    db = afdb.PollerBlueprint()

    @db.poller(
        name="orders",
        schedule="0 0 * * * *",
        source=afdb.SqlSource(
            url="%SINK_DB%", table="orders", schema=os.environ["SINK_SCHEMA"],
            cursor="updated_at", pk="id",
        ),
        sink=afdb.SqlSink(url="%SINK_DB%", schema=os.environ["SINK_SCHEMA"]),
        state=DiesAfterTheSinkCommit(os.environ["SINK_STATE"]),
        batch_size=int(os.environ.get("SINK_BATCH", "3")),
        lease_duration=2,
    )
    def copy_orders(batch, sink):
        sink.insert("applied", [
            {"order_id": c.pk, "version": c.data["version"], "pid": os.getpid()} for c in batch
        ])
        handled(len(batch))
        if os.environ.get("SINK_STALL") == "1":
            Path(os.environ["SINK_READY"]).write_text("written, not committed")
            while not Path(os.environ["SINK_GO"]).exists():
                time.sleep(0.02)
    """
)


@pytest.fixture
def db(pg_schema: str) -> sa.Engine:
    engine = sa.create_engine(dbservers.pg_url(), poolclass=sa.NullPool)
    with engine.begin() as conn:
        conn.exec_driver_sql(f'SET search_path TO "{pg_schema}"')
        conn.exec_driver_sql(
            "CREATE TABLE orders (id int PRIMARY KEY, version int NOT NULL, "
            "updated_at timestamptz NOT NULL)"
        )
        conn.exec_driver_sql(
            "CREATE TABLE applied (n bigserial PRIMARY KEY, order_id int NOT NULL, "
            "version int NOT NULL, pid int NOT NULL)"
        )
        conn.exec_driver_sql(
            "INSERT INTO orders SELECT i, 1, now() - interval '1 hour' + i * interval '1 second' "
            f"FROM generate_series(1, {ROWS}) AS i"
        )
    yield engine
    engine.dispose()


def run(
    tmp_path: Path, schema: str, log: Path | None = None, **env: str
) -> subprocess.Popen[bytes]:
    """Start one ``afdb run --once`` of the test app."""
    (tmp_path / "function_app.py").write_text(APP)
    settings = {
        "SINK_DB": dbservers.pg_url(),
        "SINK_SCHEMA": schema,
        "SINK_STATE": str(tmp_path / "state"),
        "SINK_READY": str(tmp_path / "ready"),
        "SINK_GO": str(tmp_path / "go"),
        **env,
    }
    return start_once(tmp_path / "function_app.py", settings, log)


def applied(db: sa.Engine, schema: str) -> list[tuple[int, int, int]]:
    with db.connect() as conn:
        conn.exec_driver_sql(f'SET search_path TO "{schema}"')
        return [
            tuple(r)
            for r in conn.exec_driver_sql("SELECT order_id, version, pid FROM applied ORDER BY n")
        ]


def versions(db: sa.Engine, schema: str) -> set[tuple[int, int]]:
    with db.connect() as conn:
        conn.exec_driver_sql(f'SET search_path TO "{schema}"')
        return {tuple(r) for r in conn.exec_driver_sql("SELECT id, version FROM orders")}


def drain(tmp_path: Path, schema: str) -> set[int]:
    """The final drain: run until a run has read everything (`caught_up`). An owner killed last
    may still hold the lease for its 2 s term (a run then does nothing: `lease_held`), and an
    open transaction of another client of the database holds the horizon for a while
    (`held_by_horizon`): run again, up to 30 s. The pids of the drain's runs."""
    deadline = time.monotonic() + 30
    pids: set[int] = set()
    while True:
        last = run(tmp_path, schema)
        pids.add(last.pid)
        code, out = finish(last)
        assert code == 0, out
        # The run's status line, not the log's `checkpoint_caught_up_with_sink`: a run that
        # caught the checkpoint up with the sink and was then held by the horizon says both.
        if "orders: caught_up" in out or time.monotonic() > deadline:
            assert "orders: caught_up" in out, out
            return pids
        assert "lease_held" in out or "held_by_horizon" in out, out
        time.sleep(1)


def test_kill_9_between_the_sink_commit_and_the_checkpoint_commit_20_times(
    tmp_path: Path, db: sa.Engine, pg_schema: str
) -> None:
    store = LocalStateStore(tmp_path / "state")
    for kill in range(20):
        proc = run(tmp_path, pg_schema, SINK_KILL="1")
        code, out = finish(proc)
        assert code == -signal.SIGKILL, f"run {kill} was not killed ({code}):\n{out}"
        if kill:
            assert "action=checkpoint_caught_up_with_sink" in out, out
        # The sink holds one batch more than the checkpoint: the killed commit's.
        record = store.read(KEY)
        assert record is not None
        assert record.checkpoint.stats.batches == kill
        assert len(applied(db, pg_schema)) == BATCH * (kill + 1)
        # A new version of a delivered row, between the kills: it must arrive once too.
        with db.begin() as conn:
            conn.exec_driver_sql(f'SET search_path TO "{pg_schema}"')
            conn.exec_driver_sql(
                "UPDATE orders SET version = version + 1, updated_at = clock_timestamp() "
                "WHERE id = :id".replace(":id", str(kill + 1))
            )
    time.sleep(1.5)  # the last version is newer than the horizon's settle margin (1 s)
    drain(tmp_path, pg_schema)
    rows = applied(db, pg_schema)
    counts = Counter((order_id, version) for order_id, version, _ in rows)
    final = versions(db, pg_schema)
    duplicated = {k: n for k, n in counts.items() if n > 1}
    assert duplicated == {}
    # Every final version arrived, and every earlier version of a row that changed.
    expected = final | {(i, v) for i, top in final for v in range(1, top)}
    assert set(counts) == expected
    assert len(rows) == ROWS + 20


def test_a_stale_owner_resumed_after_its_lease_was_taken_writes_nothing(
    tmp_path: Path, db: sa.Engine, pg_schema: str
) -> None:
    stale = run(tmp_path, pg_schema, SINK_STALL="1", SINK_BATCH="10")
    (code, out), (stale_code, stale_out) = frozen_past_its_lease(
        stale, tmp_path, lambda: run(tmp_path, pg_schema, SINK_BATCH="10")
    )
    assert code == 0, out
    assert "caught_up, 6 batch(es), 60 row(s)" in out, out
    assert stale_code != 0, stale_out
    assert "the sink's position record holds fence 2" in stale_out, stale_out
    rows = applied(db, pg_schema)
    assert [pid for *_, pid in rows if pid == stale.pid] == []
    counts = Counter((order_id, version) for order_id, version, _ in rows)
    assert counts == Counter({(i, 1): 1 for i in range(1, ROWS + 1)})


def test_owners_racing_and_killed_at_random_still_write_each_version_once(
    tmp_path: Path, db: sa.Engine, pg_schema: str
) -> None:
    """Three processes run the poller over and over at once while new versions are written;
    the test SIGKILLs one at a random moment every few tenths of a second. The lease keeps
    them apart, the fences refuse the stale ones, and the sink holds each version once."""
    import random

    rng = random.Random(20261125)
    deadline = time.monotonic() + 12
    procs: list[subprocess.Popen[bytes]] = []
    kills = written = 0
    while time.monotonic() < deadline:
        procs = [p for p in procs if p.poll() is None]
        while len(procs) < 3:
            procs.append(run(tmp_path, pg_schema, tmp_path / "owners.log", SINK_BATCH="4"))
        with db.begin() as conn:
            conn.exec_driver_sql(f'SET search_path TO "{pg_schema}"')
            conn.exec_driver_sql(
                "UPDATE orders SET version = version + 1, updated_at = clock_timestamp() "
                f"WHERE id = {rng.randint(1, ROWS)}"
            )
            written += 1
        time.sleep(rng.uniform(0.05, 0.3))
        if rng.random() < 0.3:
            rng.choice(procs).kill()
            kills += 1
    for proc in procs:
        proc.wait(120)
    time.sleep(1.5)  # the last versions pass the horizon's settle margin
    drained_by = drain(tmp_path, pg_schema)
    rows = applied(db, pg_schema)
    assert len({pid for *_, pid in rows if pid not in drained_by}) >= 2, "the owners never raced"
    counts = Counter((order_id, version) for order_id, version, _ in rows)
    assert {k: n for k, n in counts.items() if n > 1} == {}
    final = versions(db, pg_schema)
    assert final <= set(counts), "a final version never reached the sink"
    # Versions overwritten before any poll are legitimately collapsed (SPEC §3.3), never more.
    assert len(rows) <= ROWS + written
    assert kills > 0
