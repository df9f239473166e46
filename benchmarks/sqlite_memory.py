"""Memory bound: peak traced memory of an engine run draining N/10 and N rows.

``tracemalloc`` traces Python's allocator: rows, batches, checkpoints, SQLAlchemy objects. It does
not see SQLite's own page cache (C ``malloc``), which SQLite bounds by ``cache_size`` anyway. A
third run drains N/10 rows with batches ten times smaller, to show what the peak scales with.
"""

from __future__ import annotations

import gc
import tracemalloc

from benchmarks import engine_runs as runs
from benchmarks import sqlite_fixture as fx
from benchmarks.harness import Benchmark, BenchmarkResult, Context


def peak_bytes(db: fx.OrdersTable, ctx: Context, batch_size: int, tag: str) -> int:
    """Peak traced bytes above the pre-run level during one draining run."""
    engine, source = runs.make_engine(
        db, runs.fresh_local_store(ctx.workdir / f"state_mem_{tag}"), batch_size
    )
    gc.collect()
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        runs.drained(engine.run({}), db)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        source.close()
    return peak - before


def run(ctx: Context) -> BenchmarkResult:
    result = BenchmarkResult(name=BENCHMARK.name, title=BENCHMARK.title, tier=BENCHMARK.tier)
    small_rows = ctx.rows // 10
    small_db, full_db = fx.orders(ctx, small_rows), fx.orders(ctx, ctx.rows)
    small_batch = max(1, ctx.batch_size // 10)
    ctx.progress(f"traced memory of engine drains ({small_rows:,} and {ctx.rows:,} rows)")
    small = peak_bytes(small_db, ctx, ctx.batch_size, "small")
    full = peak_bytes(full_db, ctx, ctx.batch_size, "full")
    tiny = peak_bytes(small_db, ctx, small_batch, "tiny")
    result.metric(
        "peak_small", f"peak, N/10 = {small_rows:,} rows, batch {ctx.batch_size}", small, "bytes"
    )
    result.metric(
        "peak_full", f"peak, N = {ctx.rows:,} rows, batch {ctx.batch_size}", full, "bytes"
    )
    result.metric("peak_small_batch", f"peak, N/10 rows, batch {small_batch}", tiny, "bytes")
    result.ratio(
        "rows_scaling",
        "peak N / peak N/10 (rows x10)",
        "peak_full",
        "peak_small",
        "~1: bounded by the batch, not the table",
    )
    result.ratio(
        "batch_scaling",
        f"peak batch {ctx.batch_size} / batch {small_batch}",
        "peak_small",
        "peak_small_batch",
        "grows with the batch size",
    )
    return result


BENCHMARK = Benchmark(
    name="sqlite_memory",
    title="SQLite: peak traced memory vs table size",
    tier="sqlite",
    run=run,
)
