"""Idle run cost: what a run that finds nothing new costs in database round trips and
state-store operations, counted rather than timed.

Scenarios, on a table the engine has drained:

- ``drain``: the draining run itself (for scale: one fetch and one commit per batch);
- ``idle, same process``: the next run of the same engine and source (steady state: the health
  check is throttled by ``health_interval`` and the source is already open);
- ``idle, first run in a process``: a new source and engine, as a freshly started worker builds
  them: the source reflects the table and the first run does the health check;
- ``idle, second run in that process``: steady state again.

Round trips are statements seen by SQLAlchemy's ``before_cursor_execute`` for the table's
database file; store operations are calls through a counting proxy of ``LocalStateStore`` (each
is at least one request on a remote store such as Blob or Table).
"""

from __future__ import annotations

import time

from azure_functions_db.core.engine import Engine
from benchmarks import engine_runs as runs
from benchmarks import sqlite_fixture as fx
from benchmarks.harness import Benchmark, BenchmarkResult, Context, Scalar


def _kind(statement: str) -> str:
    upper = statement.upper()
    if upper.startswith("PRAGMA") or "SQLITE_MASTER" in upper:
        return "schema"
    if "COUNT(" in upper:
        return "health"
    if upper.startswith("SELECT") and "ORDER BY" in upper:
        return "fetch"
    return "other"


def run(ctx: Context) -> BenchmarkResult:
    result = BenchmarkResult(name=BENCHMARK.name, title=BENCHMARK.title, tier=BENCHMARK.tier)
    db = fx.orders(ctx, ctx.rows)
    store = fx.CountingStore(runs.fresh_local_store(ctx.workdir / "state_idle"))
    log = fx.StatementLog(db.path)
    columns = ("db", "schema", "health", "fetch", *fx.STORE_METHODS, "store total", "ms")
    rows: list[tuple[str, tuple[Scalar, ...]]] = []

    def measure(key: str, label: str, short: str, engine: Engine, rows_expected: int) -> None:
        store.reset()
        log.take()
        started = time.perf_counter()
        report = engine.run({})
        elapsed_ms = (time.perf_counter() - started) * 1000
        if report.status != "caught_up" or report.rows != rows_expected:
            raise RuntimeError(f"{label}: unexpected run {report.status}, {report.rows} rows")
        statements = log.take()
        kinds = [_kind(s) for s in statements]
        ops = store.snapshot()
        total_ops = sum(ops.values())
        rows.append(
            (
                short,
                (
                    len(statements),
                    kinds.count("schema"),
                    kinds.count("health"),
                    kinds.count("fetch"),
                    *(ops[m] for m in fx.STORE_METHODS),
                    total_ops,
                    round(elapsed_ms, 1),
                ),
            )
        )
        result.metric(f"{key}.db_round_trips", f"{label}: DB round trips", len(statements), "count")
        result.metric(
            f"{key}.store_ops",
            f"{label}: state-store operations",
            total_ops,
            "count",
            " ".join(f"{m}={n}" for m, n in ops.items() if n),
        )
        if kinds.count("other"):
            result.note(f"{label}: unclassified statements: {statements}")

    ctx.progress(f"idle-run counts on {db.rows:,} rows")
    with log.listening():
        engine, source = runs.make_engine(db, store, ctx.batch_size)
        try:
            measure("drain", "drain (first run)", "drain", engine, db.rows)
            measure("idle_steady", "idle, same process", "idle, warm", engine, 0)
        finally:
            source.close()
        engine, source = runs.make_engine(db, store, ctx.batch_size)
        try:
            measure("idle_first", "idle, first run in a process", "idle, new process", engine, 0)
            measure(
                "idle_second", "idle, second run in that process", "idle, 2nd in new", engine, 0
            )
        finally:
            source.close()
    result.grid("breakdown", "Per run: DB statements by kind, store calls by method", columns, rows)
    result.note(
        "The first run in a process also reflects the table (schema statements, in "
        "SqlSource.open) and runs the health check (NULL-cursor count, index check, SQLite "
        "date-time format count); the health check then waits `health_interval` (300 s)."
    )
    result.note(
        "Every run, idle or not, writes the checkpoint once (`replace` right after `acquire`) to "
        "stamp its fence, so an older owner's late commit fails."
    )
    return result


BENCHMARK = Benchmark(
    name="sqlite_idle",
    title="SQLite: cost of an idle run (counted)",
    tier="sqlite",
    run=run,
)
