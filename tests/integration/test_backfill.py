"""Spark backfill (SPEC §7) on ``local[2]``, against SQLite and the real PostgreSQL server.

The app under test is a real ``function_app.py`` whose handler appends one line per delivered
row (``<namespace> <id>``) to a file; executors import it themselves, as on a cluster.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from azure_functions_db.cli import EXIT_OK, EXIT_USAGE, main
from azure_functions_db.core.checkpoint import PollerKey
from azure_functions_db.core.engine import Engine
from azure_functions_db.errors import CheckpointConflictError, ConfigurationError, LeaseLostError
from azure_functions_db.runtime.loader import load_pollers
from azure_functions_db.spark import backfill
from azure_functions_db.spark.chunk import BoundedSource, run_chunk
from azure_functions_db.spark.plan import prepare_run
from azure_functions_db.spark.records import chunk_key, chunk_range
from azure_functions_db.state.local import LocalStateStore
from tests.support.sqlite_orders import T0, Orders

pytestmark = [
    pytest.mark.spark,
    # PySpark 3.5 leaves the socket it reads collect() results from to the garbage collector.
    pytest.mark.filterwarnings("ignore:unclosed <socket.socket:ResourceWarning"),
]

APP = textwrap.dedent(
    """
    import os
    import time
    from pathlib import Path
    import azure_functions_db as afdb

    db = afdb.PollerBlueprint()
    OUT = Path(os.environ["BF_OUT"])
    SHARDS = int(os.environ.get("BF_SHARDS") or 1)

    @db.poller(
        name="orders",
        schedule="0 0 * * * *",
        source=afdb.SqlSource(
            url="%BF_DB%", table="orders", cursor="updated_at", pk="id",
            schema=os.environ.get("BF_SCHEMA") or None,
        ),
        batch_size=int(os.environ.get("BF_BATCH", "10")),
        lease_duration=float(os.environ.get("BF_LEASE", "15")),
        state=(  # the poller's state in Blob Storage when a container is named (Azurite tests)
            afdb.BlobStateStore(container=os.environ["BF_CONTAINER"])
            if os.environ.get("BF_CONTAINER")
            else None
        ),
        **({"shards": SHARDS} if SHARDS > 1 else {}),
    )
    def on_orders(batch: afdb.Batch) -> None:
        with OUT.open("a") as f:
            f.write("".join(f"{batch.namespace} {c.data['id']}\\n" for c in batch))
        if os.environ.get("BF_EVENTS"):  # what a deduplicating handler would key on
            with open(os.environ["BF_EVENTS"], "a") as f:
                f.write("".join(
                    f"{c.data['id']} {c.event_id} {c.poller} {batch.poller} {batch.chunk}\\n"
                    for c in batch
                ))
        time.sleep(float(os.environ.get("BF_SLOW", "0")))
    """
)


@pytest.fixture
def app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "function_app.py"
    path.write_text(APP)
    monkeypatch.setenv("BF_OUT", str(tmp_path / "delivered.txt"))
    monkeypatch.setenv("AFDB_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("BF_LEASE", "15")
    for name in ("BF_SCHEMA", "BF_SLOW", "BF_BATCH", "BF_CONTAINER", "BF_EVENTS", "BF_SHARDS"):
        monkeypatch.delenv(name, raising=False)
    return path


@pytest.fixture
def orders(app: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Orders]:
    table = Orders(app.parent / "orders.db")
    monkeypatch.setenv("BF_DB", table.url)
    yield table
    table.close()


def delivered(path: Path, namespace: str) -> list[int]:
    if not path.exists():
        return []
    return [
        int(i)
        for ns, i in (line.split() for line in path.read_text().splitlines())
        if ns == namespace
    ]


def run_live(app: Path) -> None:
    """One run of the live poller (``afdb run --once``), its connections closed after."""
    definition = load_pollers(str(app))["orders"]
    try:
        definition.run_once()
    finally:
        definition.source.close()


def store_of(app: Path) -> LocalStateStore:
    return LocalStateStore(app.parent / "state")


def test_sqlite_backfill_seeds_the_live_poller_and_hands_off(app, orders, spark, capsys):
    orders.insert(range(1, 61))
    snapshots: list[object] = []
    report = backfill(
        app,
        "orders",
        partitions=4,
        spark=spark,
        run_id="r1",
        progress=snapshots.append,
        progress_interval=0.05,
    )
    out = app.parent / "delivered.txt"
    # Every row up to H0 delivered at least once, by the poller's own handler, in 4 chunks.
    assert set(delivered(out, "backfill")) == set(range(1, 61))
    assert (report.chunks, report.chunks_run, report.chunks_skipped) == (4, 4, 0)
    assert report.rows == report.rows_total == report.rows_estimated == 60
    assert report.h0 is not None
    assert report.h0.pk == (60,)
    assert snapshots[-1].final
    assert snapshots[-1].rows_done == 60
    # The live poller had no checkpoint: it was seeded with H0 (create-only, audited).
    live = store_of(app).read(PollerKey("live", "orders"))
    assert live is not None
    assert live.checkpoint.position == report.h0
    assert live.checkpoint.seek is not None
    assert "backfill run `r1`" in live.checkpoint.seek.reason
    # Rows written after the backfill are the live poller's, and it redelivers no history.
    orders.insert(range(61, 71), base=T0 + dt.timedelta(hours=1))
    assert main(["run", str(app), "--once"]) == EXIT_OK
    assert sorted(delivered(out, "live")) == list(range(61, 71))
    # `afdb status` shows the finished run; rerunning the same run id redoes nothing.
    capsys.readouterr()
    assert main(["status", str(app), "--json"]) == EXIT_OK
    docs = json.loads(capsys.readouterr().out)
    (run,) = [d for d in docs if d["namespace"] == "backfill"]
    assert run["poller"] == "orders~r1"
    assert "finished" in run["detail"]
    assert run["stats"]["rows"] == 60
    again = backfill(app, "orders", spark=spark, run_id="r1")
    assert (again.chunks_run, again.chunks_skipped, again.rows) == (0, 4, 0)
    assert len(delivered(out, "backfill")) == report.rows


def test_a_shard_backfills_its_own_rows_and_the_cli_backfills_every_shard(
    app, orders, spark, *, monkeypatch, capsys, caplog
):
    """A sharded poller's shard backfills the rows of its shard up to its own H0 (seeding its
    own live checkpoint), with the event ids its live poller gives them; the API refuses the
    sharded poller's own name, naming the shards. `afdb backfill` given that name plans every
    shard's run (seeding each H0) before it runs any, all under one run id: the shards'
    unfinished run, resumed, or a new one; refused up front when `--from` would be ignored."""
    monkeypatch.setenv("BF_SHARDS", "3")
    events = app.parent / "events.txt"
    monkeypatch.setenv("BF_EVENTS", str(events))
    orders.insert(range(1, 31))
    out = app.parent / "delivered.txt"
    report = backfill(app, "orders.shard-1-of-3", partitions=2, spark=spark, run_id="s1")
    assert sorted(delivered(out, "backfill")) == list(range(1, 31, 3))  # SQLite: id % 3
    assert report.h0 is not None
    assert report.h0.pk == (28,)
    store = store_of(app)
    seeded = store.read(PollerKey("live", "orders.shard-1-of-3"))
    assert seeded is not None
    assert seeded.checkpoint.position == report.h0
    assert store.read(PollerKey("live", "orders.shard-0-of-3")) is None
    lines = [line.split() for line in events.read_text().splitlines()]
    assert {poller for _, _, poller, _, _ in lines} == {"orders"}  # the event ids' poller
    with pytest.raises(ConfigurationError, match=r"orders\.shard-0-of-3.*orders\.shard-2-of-3"):
        backfill(app, "orders", spark=spark)
    # A run planned, not run: shard 0's run p1 is unfinished, its H0 seeded.
    planned = backfill(app, "orders.shard-0-of-3", spark=spark, run_id="p1", plan_only=True)
    assert (planned.to_json()["status"], planned.rows) == ("planned", 0)
    assert planned.h0 is not None
    assert planned.h0.pk == (30,)  # shard 0's own newest row
    assert store.read(PollerKey("live", "orders.shard-0-of-3")) is not None
    out.unlink()
    command = ["backfill", str(app), "--poller", "orders", "--partitions", "2"]
    assert main([*command, "--from", "2026-01-01 12:00:00"]) == EXIT_USAGE  # p1 would ignore it
    assert not out.exists()
    # Without a run id: p1 resumed for every shard, each planned before any shard runs.
    capsys.readouterr()
    caplog.set_level(logging.INFO, logger="azure_functions_db.spark.job")
    caplog.clear()
    assert main([*command, "--json"]) == EXIT_OK
    docs = json.loads(capsys.readouterr().out)  # one report per shard
    assert [(d["poller"], d["run_id"]) for d in docs] == [
        (f"orders.shard-{i}-of-3", "p1") for i in range(3)
    ]
    assert sorted(delivered(out, "backfill")) == list(range(1, 31))  # each shard up to its H0
    steps = {"action=backfill_ready", "action=backfill_start"}
    actions = [r.getMessage().split()[0] for r in caplog.records]
    actions = [a for a in actions if a in steps]
    assert actions[:3] == ["action=backfill_ready"] * 3
    assert actions[3:] == ["action=backfill_start"] * 3
    for shard in range(3):
        assert store.read(PollerKey("live", f"orders.shard-{shard}-of-3")) is not None
    # Again with its id: every shard's run p1 is finished, nothing is redone.
    capsys.readouterr()
    assert main([*command, "--run-id", "p1"]) == EXIT_OK
    text = capsys.readouterr().out
    for shard in range(3):
        assert f"orders.shard-{shard}-of-3: backfill run p1 finished: 0 row(s)" in text
    assert len(delivered(out, "backfill")) == 30


def test_one_event_id_per_row_version_through_live_backfills_and_replay(
    app, orders, spark, monkeypatch
):
    """`event_id` depends on the poller's name and the row version only: live polling, two
    backfill runs (every chunk) and a seek-back replay hand each row the same id."""
    events = app.parent / "events.txt"
    monkeypatch.setenv("BF_EVENTS", str(events))
    orders.insert(range(1, 41))
    run_live(app)
    for run_id in ("r1", "r2"):
        report = backfill(app, "orders", partitions=3, spark=spark, run_id=run_id)
        assert report.rows >= 40
    assert main(["seek", str(app), "--poller", "orders", "--beginning"]) == EXIT_OK
    run_live(app)
    ids: dict[int, set[str]] = {}
    chunks: dict[int, set[str]] = {}
    for line in events.read_text().splitlines():
        row, event, change_poller, batch_poller, chunk = line.split()
        assert (change_poller, batch_poller) == ("orders", "orders")
        ids.setdefault(int(row), set()).add(event)
        chunks.setdefault(int(row), set()).add(chunk)
    assert sorted(ids) == list(range(1, 41))
    assert all(len(found) == 1 for found in ids.values()), ids
    # Each row came from live (twice: first run and replay) and from a chunk of r1 and of r2.
    for row, seen in chunks.items():
        assert "None" in seen, row
        assert {c.split("/")[0] for c in seen - {"None"}} == {"r1", "r2"}, row


@pytest.mark.mysql
def test_mariadb_default_collation_ties_across_chunk_edges_are_all_delivered(
    app, maria, spark, monkeypatch
):
    """MariaDB orders `a, B, c, D`, Python `B, D, a, c`: the planner's walk and every chunk's
    end are the database's, so no row of a tie group split over chunks is left out."""
    keys = [f"{letter}{n}" for n in range(4) for letter in ("a", "B", "c", "D", "e", "F")]
    with maria.engine.begin() as conn:
        conn.exec_driver_sql(
            "CREATE TABLE orders (id VARCHAR(10) PRIMARY KEY, note VARCHAR(10), "
            "updated_at DATETIME(6) NOT NULL, KEY ix_orders (updated_at, id))"
        )
        conn.execute(
            sa.text("INSERT INTO orders VALUES (:id, 'x', :at)"),
            [{"id": k, "at": T0 + dt.timedelta(seconds=i // 9)} for i, k in enumerate(keys)],
        )
    events = app.parent / "events.txt"
    monkeypatch.setenv("BF_DB", maria.url)
    monkeypatch.setenv("BF_EVENTS", str(events))
    monkeypatch.setenv("BF_BATCH", "2")
    report = backfill(app, "orders", partitions=4, spark=spark, run_id="ci")
    assert report.chunks > 1
    delivered_keys = [line.split()[0] for line in events.read_text().splitlines()]
    assert sorted(set(delivered_keys)) == sorted(keys)
    assert len(delivered_keys) == len(keys)  # each once: no chunk overlaps another


@pytest.mark.postgres
def test_postgres_backfill_up_to_live_position_and_rows_written_during_it(
    app, pg, spark, monkeypatch
):
    table = pg.table(
        "orders",
        [
            sa.Column("id", sa.Integer, primary_key=True),
            sa.Column("note", sa.String(20)),
            sa.Column("updated_at", sa.DateTime, nullable=False),
        ],
        index=["updated_at", "id"],
    )

    def insert(ids: range, hours: int) -> None:
        base = T0 + dt.timedelta(hours=hours)
        rows = [
            {"id": i, "note": "x", "updated_at": base + dt.timedelta(seconds=i // 4)} for i in ids
        ]
        with pg.engine.begin() as conn:
            conn.execute(table.insert(), rows)

    monkeypatch.setenv("BF_DB", pg.url)
    monkeypatch.setenv("BF_SCHEMA", pg.schema)
    monkeypatch.setenv("BF_BATCH", "25")
    monkeypatch.setenv("BF_SLOW", "0.02")
    insert(range(1, 301), 0)
    out = app.parent / "delivered.txt"
    # The live poller is at row 300 when the backfill starts: H0 = its position.
    run_live(app)
    assert sorted(delivered(out, "live")) == list(range(1, 301))
    out.unlink()
    insert(range(301, 351), 1)  # newer than H0 before the backfill starts
    during = threading.Event()

    def progress(_: object) -> None:
        if not during.is_set():
            during.set()
            insert(range(351, 361), 2)  # written while the Spark job runs

    report = backfill(
        app, "orders", partitions=3, spark=spark, progress=progress, progress_interval=0.05
    )
    assert during.is_set()
    assert report.h0 is not None
    assert report.h0.pk == (300,)
    assert report.chunks == 3
    assert set(delivered(out, "backfill")) == set(range(1, 301))  # at least once, nothing > H0
    run_live(app)
    # Live delivers everything after H0 (before and during the backfill), no history again.
    assert sorted(delivered(out, "live")) == list(range(301, 361))


def test_stale_attempt_cannot_commit_after_a_newer_attempt_fenced_the_chunk(app, orders):
    orders.insert(range(1, 31))
    definition = load_pollers(str(app))["orders"]
    settings = dict(os.environ)
    store = definition.store(settings)
    definition.source.open(settings)
    _, (chunk,) = prepare_run(
        definition,
        store,
        namespace="backfill",
        run_id="s1",
        start=None,
        end=None,
        partitions=1,
        by="test",
        now=definition.clock.now(),
    )
    key = chunk_key("backfill", "orders", "s1", 0)
    inside, release = threading.Event(), threading.Event()

    def stuck(batch: object) -> None:  # an attempt whose executor stalls in the handler
        inside.set()
        release.wait(30)

    import dataclasses

    config = dataclasses.replace(
        definition.config, record=key.poller, namespace="backfill", lease_duration=1.0
    )
    old = Engine(
        config,
        BoundedSource(definition.source, chunk.end),
        store,
        stuck,
        definition.clock,
        owner="attempt-0",
        heartbeat_interval=3600,  # its heartbeat is lost too: the lease expires under it
    )
    errors: list[BaseException] = []

    def run_old() -> None:
        try:
            old.run(settings)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run_old)
    thread.start()
    assert inside.wait(10)
    time.sleep(1.2)  # attempt 0's lease expired; Spark starts attempt 1
    newer = run_chunk(definition, store, settings, namespace="backfill", run_id="s1", index=0)
    assert newer.status == "done"
    assert newer.rows == 30
    after_newer = store.read(key)
    assert after_newer is not None
    assert chunk.finished(after_newer.checkpoint)
    release.set()
    thread.join(10)
    (error,) = errors
    assert isinstance(error, CheckpointConflictError | LeaseLostError)
    final = store.read(key)
    assert final is not None
    assert final.checkpoint == after_newer.checkpoint
    assert sorted(delivered(app.parent / "delivered.txt", "backfill")) == list(range(1, 31))


def _descendants(root: int) -> set[int]:
    """Every live process below ``root``, read from ``/proc``."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found: set[int] = set()
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def kill_tree(driver: subprocess.Popen[bytes]) -> None:
    """SIGKILL ``driver`` and every process below it, and wait until all are gone.

    Killing the process group is not enough: PySpark's worker daemon puts itself and its
    workers in a group of their own, and a worker would finish its chunk after the kill.
    """
    doomed = _descendants(driver.pid)
    os.killpg(driver.pid, signal.SIGKILL)
    for pid in doomed:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    driver.wait(30)
    deadline = time.monotonic() + 30
    while any(_running(pid) for pid in doomed) and time.monotonic() < deadline:
        time.sleep(0.05)


def _running(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_killed_driver_resumes_without_redoing_finished_chunks(app, orders, spark, monkeypatch):
    orders.insert(range(1, 81))
    monkeypatch.setenv("BF_BATCH", "5")
    monkeypatch.setenv("BF_LEASE", "3")
    first_out = app.parent / "delivered.txt"
    env = {**os.environ, "BF_SLOW": "0.4", "PYSPARK_PYTHON": sys.executable}
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    command = [sys.executable, "-m", "azure_functions_db", "backfill", str(app), "--poller"]
    command += ["orders", "--run-id", "k1", "--partitions", "4", "--master", "local[2]"]
    driver = subprocess.Popen(
        command,
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    store = store_of(app)

    def finished_chunks() -> set[int]:
        found = set()
        for index in range(4):
            stored = store.read(chunk_key("backfill", "orders", "k1", index))
            chunk = chunk_range(stored.checkpoint) if stored else None
            if stored and chunk and chunk.finished(stored.checkpoint):
                found.add(index)
        return found

    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not finished_chunks():
            time.sleep(0.1)
    finally:
        kill_tree(driver)  # the driver, its JVM and the Python workers
    finished = finished_chunks()
    assert finished, "no chunk finished before the deadline"
    assert len(finished) < 4, "the backfill finished before it could be killed"
    done_rows: set[int] = set()
    for index in finished:
        stored = store.read(chunk_key("backfill", "orders", "k1", index))
        assert stored is not None
        chunk = chunk_range(stored.checkpoint)
        assert chunk is not None
        low = chunk.start.pk[0] if chunk.start else 0
        done_rows |= set(range(low + 1, chunk.end.pk[0] + 1))
    first = Counter(delivered(first_out, "backfill"))
    assert done_rows <= set(first)
    # Rerun without the run id, as a user would after a crash (the CLI, in this process, on the
    # session's Spark): the unfinished run is resumed, not a new one started.
    second_out = app.parent / "delivered-2.txt"
    monkeypatch.setenv("BF_OUT", str(second_out))
    report_out = app.parent / "report.json"
    with report_out.open("w") as sink, pytest.MonkeyPatch.context() as mp:
        mp.setattr(sys, "stdout", sink)
        code = main(["backfill", str(app), "--poller", "orders", "--json"])
    assert code == EXIT_OK
    report = json.loads(report_out.read_text())
    assert (report["run_id"], report["resumed"]) == ("k1", True)
    assert report["chunks"] == 4
    assert report["chunks_skipped"] == len(finished)
    second = set(delivered(second_out, "backfill"))
    assert not second & done_rows  # finished chunks were not redone
    assert set(first) | second == set(range(1, 81))  # and nothing is missing
