"""DeltaSink with real processes: exactly-once into a Delta table through kill -9 and SIGSTOP.

The poller runs in child processes through the real CLI (``python -m azure_functions_db run APP
--once``) on a SQLite table, with checkpoints in the local file store, appending one row per
source row version to a Delta table (``deltalake``, local file system). The table is
append-only, so a batch written twice would show as two rows and a lost one as none.
"""

from __future__ import annotations

import datetime as dt
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
from tests.support.once import finish, frozen_past_its_lease, start_once
from tests.support.sqlite_orders import T0, Orders

pytestmark = pytest.mark.slow

KEY = PollerKey("live", "orders")
ROWS, BATCH = 60, 3
SECOND = dt.timedelta(seconds=1)

APP = textwrap.dedent(
    """
    import os, time
    from pathlib import Path
    import pyarrow as pa
    import azure_functions_db as afdb
    from azure_functions_db.sinks.delta import DeltaSink
    from tests.support.dying_store import DiesAfterTheSinkCommit, handled

    SCHEMA = pa.schema([("order_id", pa.int64()), ("version", pa.int64()), ("pid", pa.int64())])
    db = afdb.PollerBlueprint()

    @db.poller(
        name="orders",
        schedule="0 0 * * * *",
        source=afdb.SqlSource(url="%SINK_DB%", table="orders", cursor="updated_at", pk="id"),
        sink=DeltaSink("%SINK_LAKE%", schema=SCHEMA),
        state=DiesAfterTheSinkCommit(os.environ["SINK_STATE"]),
        batch_size=int(os.environ.get("SINK_BATCH", "3")),
        lease_duration=2,
    )
    def copy_orders(batch, sink):
        sink.insert([
            {"order_id": c.pk, "version": int(c.data["note"]), "pid": os.getpid()} for c in batch
        ])
        handled(len(batch))
        if os.environ.get("SINK_STALL") == "1":
            Path(os.environ["SINK_READY"]).write_text("staged, not committed")
            while not Path(os.environ["SINK_GO"]).exists():
                time.sleep(0.02)
    """
)


@pytest.fixture
def orders(tmp_path: Path) -> Orders:
    table = Orders(tmp_path / "orders.db")
    with table.engine.begin() as conn:
        conn.execute(
            table.table.insert(),
            [
                {"id": i, "note": "1", "updated_at": T0.replace(second=0) + (i * SECOND)}
                for i in range(1, ROWS + 1)
            ],
        )
    yield table
    table.close()


def run(
    tmp_path: Path, orders: Orders, log: Path | None = None, **env: str
) -> subprocess.Popen[bytes]:
    """Start one ``afdb run --once`` of the test app."""
    (tmp_path / "function_app.py").write_text(APP)
    settings = {
        "SINK_DB": orders.url,
        "SINK_LAKE": str(tmp_path / "lake" / "applied"),
        "SINK_STATE": str(tmp_path / "state"),
        "SINK_READY": str(tmp_path / "ready"),
        "SINK_GO": str(tmp_path / "go"),
        **env,
    }
    return start_once(tmp_path / "function_app.py", settings, log)


def applied(tmp_path: Path) -> list[tuple[int, int, int]]:
    from deltalake import DeltaTable

    table = DeltaTable(str(tmp_path / "lake" / "applied"))
    return [(r["order_id"], r["version"], r["pid"]) for r in table.to_pyarrow_table().to_pylist()]


def test_kill_9_between_the_delta_commit_and_the_checkpoint_commit_20_times(
    tmp_path: Path, orders: Orders
) -> None:
    store = LocalStateStore(tmp_path / "state")
    for kill in range(20):
        code, out = finish(run(tmp_path, orders, SINK_KILL="1"))
        assert code == -signal.SIGKILL, f"run {kill} was not killed ({code}):\n{out}"
        if kill:
            assert "action=checkpoint_caught_up_with_sink" in out, out
        record = store.read(KEY)
        assert record is not None
        assert record.checkpoint.stats.batches == kill
        assert len(applied(tmp_path)) == BATCH * (kill + 1)
        # A new version of a delivered row, between the kills: it must arrive once too.
        with orders.engine.begin() as conn:
            conn.execute(
                orders.table.update()
                .where(orders.table.c.id == kill + 1)
                .values(note="2", updated_at=T0 + 3600 * SECOND + kill * SECOND)
            )
    code, out = finish(run(tmp_path, orders))
    assert code == 0, out
    counts = Counter((order_id, version) for order_id, version, _ in applied(tmp_path))
    expected = {(i, 1) for i in range(1, ROWS + 1)} | {(i, 2) for i in range(1, 21)}
    assert {k: n for k, n in counts.items() if n > 1} == {}
    assert set(counts) == expected


def test_a_stale_owner_resumed_after_its_lease_was_taken_commits_nothing_to_delta(
    tmp_path: Path, orders: Orders
) -> None:
    stale = run(tmp_path, orders, SINK_STALL="1", SINK_BATCH="10")
    (code, out), (stale_code, stale_out) = frozen_past_its_lease(
        stale, tmp_path, lambda: run(tmp_path, orders, SINK_BATCH="10")
    )
    assert code == 0, out
    assert "caught_up, 6 batch(es), 60 row(s)" in out, out
    assert stale_code != 0, stale_out
    assert "holds fence 2" in stale_out, stale_out
    rows = applied(tmp_path)
    assert [pid for *_, pid in rows if pid == stale.pid] == []
    counts = Counter((order_id, version) for order_id, version, _ in rows)
    assert counts == Counter({(i, 1): 1 for i in range(1, ROWS + 1)})


def test_owners_racing_and_killed_at_random_still_write_each_version_once_to_delta(
    tmp_path: Path, orders: Orders
) -> None:
    """Three processes run the poller over and over at once while new versions are written;
    the test SIGKILLs one at a random moment. The Delta table holds each version once."""
    import random

    rng = random.Random(20261125)
    deadline = time.monotonic() + 12
    procs: list[subprocess.Popen[bytes]] = []
    kills = 0
    stamp = T0 + 3600 * SECOND
    while time.monotonic() < deadline:
        procs = [p for p in procs if p.poll() is None]
        while len(procs) < 3:
            procs.append(run(tmp_path, orders, tmp_path / "owners.log", SINK_BATCH="4"))
        stamp += SECOND
        with orders.engine.begin() as conn:
            conn.execute(
                orders.table.update()
                .where(orders.table.c.id == rng.randint(1, ROWS))
                .values(note=sa.cast(orders.table.c.note, sa.Integer) + 1, updated_at=stamp)
            )
        time.sleep(rng.uniform(0.05, 0.3))
        if rng.random() < 0.3:
            rng.choice(procs).kill()
            kills += 1
    for proc in procs:
        proc.wait(120)
    last = run(tmp_path, orders)
    code, out = finish(last)
    assert code == 0, out
    rows = applied(tmp_path)
    assert len({pid for *_, pid in rows if pid != last.pid}) >= 2, "the owners never raced"
    counts = Counter((order_id, version) for order_id, version, _ in rows)
    assert {k: n for k, n in counts.items() if n > 1} == {}
    with orders.engine.connect() as conn:
        final = {(r.id, int(r.note)) for r in conn.execute(sa.select(orders.table))}
    assert final <= set(counts), "a final version never reached the table"
    assert kills > 0
