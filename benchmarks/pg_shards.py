"""PostgreSQL: how throughput grows with shards when the handler, not the database, sets the
pace (issue 35).

The handler costs 50 ms of I/O per batch (a sleep standing for an HTTP call or a slow sink) and
writes the batch through ``SqlSink`` (effectively-once). For 1, 2, 4 and 8 shards (``--quick``:
1, 2 and 4), a fresh ``orders`` table in a scratch schema is polled by as many ``afdb run``
processes, one shard each, in the low-latency mode (``poll_interval=0.1``); once they all run,
``ROWS`` rows are inserted in one transaction while a writer thread keeps updating rows, and the
figure is the rows applied per second from that insert until a version of every row is applied
(then the writer stops and the run waits until every final version is applied). Each run is
checked: every final version applied, none applied twice, a row's versions in order and all
from the row's own shard.

The ratio is N shards' rate over one poller's, in the same harness run. On a machine with few
cores the processes share them: the ratio shows how far the handler's waiting overlaps, not the
scaling of a cloud deployment, where each shard runs on an instance of its own.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from benchmarks import pg_fixture as pg
from benchmarks.harness import Benchmark, BenchmarkResult, Context
from devkit.processes import stop as stop_processes

COUNTS, QUICK_COUNTS = (1, 2, 4, 8), (1, 2, 4)
ROWS, QUICK_ROWS = 12_000, 4_000
BATCH = 100
HANDLER_SECONDS = 0.05
TIMEOUT = 300.0

APP = textwrap.dedent(
    """
    import os, time
    import azure_functions_db as afdb

    count = int(os.environ["BENCH_SHARDS"])
    db = afdb.PollerBlueprint()

    @db.poller(
        name="orders",
        schedule="*/30 * * * * *",
        source=afdb.SqlSource(
            url="%BENCH_DB%", table="orders", schema=os.environ["BENCH_SCHEMA"],
            cursor="updated_at", pk="id",
        ),
        sink=afdb.SqlSink(url="%BENCH_DB%", schema=os.environ["BENCH_SCHEMA"]),
        state=afdb.LocalStateStore(os.environ["BENCH_STATE"]),
        batch_size=int(os.environ["BENCH_BATCH"]),
        poll_interval=0.1,
        time_budget=25,
        run_on_startup=True,
        **({"shards": count} if count > 1 else {}),
    )
    def apply(batch, sink):
        time.sleep(float(os.environ["BENCH_HANDLER_SECONDS"]))  # the handler's I/O
        sink.insert("applied", [
            {"order_id": c.pk, "version": c.data["version"], "shard": batch.poller}
            for c in batch
        ])
    """
)


def _sql(server: pg.Server, statement: str) -> list[tuple[Any, ...]]:
    with server.connect() as conn:
        conn.execute(f'SET search_path TO "{server.schema}"')
        cursor = conn.execute(statement)
        return [tuple(row) for row in cursor.fetchall()] if cursor.description else []


def _prepare(server: pg.Server, count: int) -> None:
    for statement in (
        "DROP TABLE IF EXISTS orders, applied, afdb_positions",
        "CREATE TABLE orders (id bigint PRIMARY KEY, version int NOT NULL, "
        "updated_at timestamptz NOT NULL DEFAULT clock_timestamp())",
        "CREATE TABLE applied (n bigserial PRIMARY KEY, order_id bigint NOT NULL, "
        "version int NOT NULL, shard text NOT NULL)",
        "CREATE INDEX ix_orders_keyset ON orders (updated_at, id)",
    ):
        _sql(server, statement)
    if count > 1:
        expression = f"mod(coalesce(hashtext(CAST(id AS text))::bigint, 0) + 2147483648, {count})"
        _sql(server, f"CREATE INDEX ix_orders_shard ON orders (({expression}), updated_at, id)")


def _update(server: pg.Server, rows: int, stop: threading.Event) -> None:
    """Keep updating random rows (a new version each) until ``stop``."""
    rng = random.Random(35)
    with server.connect() as conn:
        conn.execute(f'SET search_path TO "{server.schema}"')
        while not stop.is_set():
            ids = ",".join(str(rng.randrange(1, rows + 1)) for _ in range(5))
            conn.execute(
                "UPDATE orders SET version = version + 1, updated_at = clock_timestamp() "
                f"WHERE id IN ({ids})"
            )
            time.sleep(0.02)


def _check(server: pg.Server, count: int) -> None:
    twice = _sql(server, "SELECT order_id, version FROM applied GROUP BY 1, 2 HAVING count(*) > 1")
    if twice:
        raise AssertionError(f"{count} shard(s): {len(twice)} version(s) applied twice")
    applied = _sql(server, "SELECT order_id, version, shard FROM applied ORDER BY n")
    by_row: dict[int, list[tuple[int, str]]] = defaultdict(list)
    for order_id, version, shard in applied:
        by_row[order_id].append((version, shard))
    for order_id, seen in by_row.items():
        versions = [v for v, _ in seen]
        if versions != sorted(versions) or len({s for _, s in seen}) != 1:
            raise AssertionError(f"{count} shard(s): row {order_id} applied as {seen}")


def _reached(server: pg.Server) -> int:
    """Rows of which some version is applied."""
    (row,) = _sql(server, "SELECT count(DISTINCT order_id) FROM applied")
    return int(row[0])


def _missing(server: pg.Server) -> int:
    (row,) = _sql(
        server,
        "SELECT count(*) FROM orders o WHERE NOT EXISTS (SELECT 1 FROM applied a "
        "WHERE a.order_id = o.id AND a.version = o.version)",
    )
    return int(row[0])


def _wait_running(state: Path, names: list[str]) -> None:
    """Until every process ran once (``run_on_startup``: its checkpoint exists), so the figure
    leaves out the processes' start."""
    from azure_functions_db.core.checkpoint import PollerKey
    from azure_functions_db.state.local import LocalStateStore

    store, deadline = LocalStateStore(state), time.monotonic() + 120
    while any(store.read(PollerKey("live", name)) is None for name in names):
        if time.monotonic() > deadline:
            raise AssertionError(f"the pollers {names} did not start within 120 s")
        time.sleep(0.2)
    time.sleep(1.0)  # and their first run (over an empty table) has ended


def _measure(ctx: Context, server: pg.Server, count: int, rows: int) -> float:
    """Rows applied per second by ``count`` shards in as many processes."""
    _prepare(server, count)
    folder = ctx.workdir / f"shards{count}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "function_app.py").write_text(APP)
    env = {
        **os.environ,
        "BENCH_DB": server.url,
        "BENCH_SCHEMA": server.schema,
        "BENCH_STATE": str(folder / "state"),
        "BENCH_SHARDS": str(count),
        "BENCH_BATCH": str(BATCH),
        "BENCH_HANDLER_SECONDS": str(HANDLER_SECONDS),
    }
    names = ["orders"] if count == 1 else [f"orders.shard-{i}-of-{count}" for i in range(count)]
    procs = []
    with (folder / "runs.log").open("ab") as log:
        for name in names:
            command = [
                sys.executable,
                "-m",
                "azure_functions_db",
                "run",
                str(folder),
                "--poller",
                name,
            ]
            procs.append(subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT))
    stop = threading.Event()
    try:
        _wait_running(folder / "state", names)
        started = time.perf_counter()
        _sql(
            server,
            f"INSERT INTO orders (id, version) SELECT g, 1 FROM generate_series(1, {rows}) AS g",
        )
        writer = threading.Thread(target=_update, args=(server, rows, stop))
        writer.start()
        while _reached(server) < rows:  # every row, in some version (the writer goes on)
            if time.perf_counter() - started > TIMEOUT:
                raise AssertionError(f"{count} shard(s): not drained within {TIMEOUT:.0f} s")
            time.sleep(0.05)
        seconds = time.perf_counter() - started
        stop.set()
        writer.join()
        while _missing(server) > 0 and time.perf_counter() - started < TIMEOUT:
            time.sleep(0.1)  # the writer's last versions, for the check below
    finally:
        stop.set()
        stop_processes(procs)
    if _missing(server):
        raise AssertionError(f"{count} shard(s): final versions never applied")
    _check(server, count)
    ctx.progress(f"{count} shard(s): {rows} rows in {seconds:.2f} s")
    return rows / seconds


def run(ctx: Context) -> BenchmarkResult:
    result = BenchmarkResult(name=BENCHMARK.name, title=BENCHMARK.title, tier=BENCHMARK.tier)
    counts, rows = (QUICK_COUNTS, QUICK_ROWS) if ctx.quick else (COUNTS, ROWS)
    with pg.scratch_schema() as server:
        for count in counts:
            rate = _measure(ctx, server, count, rows)
            result.metric(
                f"shards{count}.rate",
                f"{count} shard(s) in {count} process(es): rows applied a second",
                round(rate, 1),
                "rows/s",
                f"{rows} rows, batches of {BATCH}, {HANDLER_SECONDS * 1000:g} ms per batch",
            )
    for count in counts[1:]:
        result.ratio(
            f"shards{count}_vs_1",
            f"{count} shards / one poller",
            f"shards{count}.rate",
            "shards1.rate",
            f">= {count * 0.6:g} (issue 35: about linear)",
        )
    result.note(
        f"A handler sleeping {HANDLER_SECONDS * 1000:g} ms per batch of {BATCH} writes through "
        "SqlSink; a writer updates rows throughout; each run is checked (every final version "
        f"applied once, in order, by the row's shard). {os.cpu_count()} CPU(s): the processes "
        "share them."
    )
    return result


BENCHMARK = Benchmark(
    name="pg_shards",
    title="PostgreSQL, a 50 ms handler: rows a second with 1, 2, 4, 8 shards in as many processes",
    tier="postgres",
    run=run,
)
