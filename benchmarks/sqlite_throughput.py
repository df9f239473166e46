"""Engine vs baselines, same run: drain one SQLite table three ways and compare rows/s.

- Baseline A, ``raw``: ``sqlite3`` keyset batches with the nested predicate
  ``updated_at >= ? AND (updated_at > ? OR id > ?) ORDER BY updated_at, id LIMIT 1000``.
- Baseline B, ``core``: the same statement through SQLAlchemy Core on one connection.
- ``engine``: one ``Engine.run`` with ``SqlSource`` and ``LocalStateStore`` from an empty state
  directory to the end of the table: lease, fence, health check, and a real checkpoint commit
  (fsync'd file replace) per batch. Its handler does nothing and reads no ``Change.event_id``
  (computed lazily, so none is computed).
"""

from __future__ import annotations

from benchmarks import sqlite_fixture as fx
from benchmarks.harness import Benchmark, BenchmarkResult, Context, Timing

SPEC_TARGET = "SPEC §9: >= 0.70 vs raw psycopg on PostgreSQL with Azure state (not this tier)"


def _detail(timing: Timing) -> str:
    runs = ", ".join(f"{s:.3f}" for s in timing.all_seconds)
    return f"best of {timing.repeats}: {timing.seconds:.3f} s (runs {runs})"


def run(ctx: Context) -> BenchmarkResult:
    result = BenchmarkResult(name=BENCHMARK.name, title=BENCHMARK.title, tier=BENCHMARK.tier)
    timings = fx.scans(ctx, ctx.rows)
    db = timings.db
    result.metric("rows", "table rows", db.rows, "rows")
    result.metric(
        "distinct_cursors",
        "distinct updated_at values",
        db.distinct_cursors,
        "count",
        f"largest tie {db.largest_tie:,} rows (> batch {ctx.batch_size})",
    )
    result.metric(
        "raw_rps",
        "A: raw sqlite3 keyset scan",
        timings.raw.rows_per_second,
        "rows/s",
        _detail(timings.raw),
    )
    result.metric(
        "core_rps",
        "B: SQLAlchemy Core keyset scan",
        timings.core.rows_per_second,
        "rows/s",
        _detail(timings.core),
    )
    result.metric(
        "engine_rps",
        "engine: Engine.run, local state",
        timings.engine.rows_per_second,
        "rows/s",
        _detail(timings.engine),
    )
    result.ratio("engine_vs_raw", "engine / raw sqlite3", "engine_rps", "raw_rps", SPEC_TARGET)
    result.ratio("engine_vs_core", "engine / SQLAlchemy Core", "engine_rps", "core_rps")
    result.ratio("core_vs_raw", "SQLAlchemy Core / raw sqlite3", "core_rps", "raw_rps")
    result.note(
        "raw sqlite3 returns updated_at as text; Core and the engine parse it into datetime."
    )
    result.note(
        "The engine time covers a whole run: source open (reflection), lease, fence, the "
        "health check (two counts), every batch (fetch, Batch building, no-op handler, "
        "fsync'd checkpoint commit) and the release. Change.event_id is computed lazily, on "
        "first access: the no-op handler reads none, so no hash is in this time (a handler "
        "that reads every id pays it per row; python -m benchmarks.profile_engine measures it)."
    )
    return result


BENCHMARK = Benchmark(
    name="sqlite_throughput",
    title="SQLite: engine vs raw keyset scan, same run",
    tier="sqlite",
    run=run,
)
