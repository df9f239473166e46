"""PostgreSQL: the engine draining a 1M-row table against a raw psycopg keyset scan, same run.

On two tables built in a scratch schema, N rows (1,000,000; 100,000 with ``--quick``) and N/10:

- ``raw``, the baseline of SPEC §9: psycopg keyset batches with the nested predicate
  ``updated_at >= %s AND (updated_at > %s OR id > %s) ORDER BY updated_at, id LIMIT 1000``, all
  columns, ``fetchall()``; on N also the row-value form ``(updated_at, id) > (%s, %s)``;
- ``core``: the nested statement through SQLAlchemy Core on one connection;
- ``engine``: one ``Engine.run`` with ``SqlSource`` and a ``LocalStateStore`` from an empty state
  directory to the end of the table, no-op handler, ``horizon="none"`` and the default
  ``horizon="auto"`` (on a ``timestamptz`` cursor: one ``pg_stat_activity`` query per batch);
- on N, if Azurite can be started: the same drain with ``BlobStateStore`` and the default horizon,
  the configuration of the SPEC §9 target (lease and Azurite checkpoint per batch);
- on N, the same Blob drain with Azure-like latency (``blob_latency``): Azurite behind
  ``devkit/latency_proxy.py`` (in a child process), a loopback TCP proxy delaying every chunk by
  :data:`AZURE_LIKE_DELAY` (10 ms) each way. Azurite on loopback answers a conditional PUT in a
  few ms, Azure Storage from a Function in 10-30 ms: this row is the honest one for the target.

Repetitions are interleaved (N/10: raw, Core, engine...; N: raw, ...; then again) and the best of
``--repeats`` is kept. The horizon query is also timed alone (an open source, 200 calls).
"""

from __future__ import annotations

import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from azure_functions_db.core.engine import Handler
from azure_functions_db.core.ports import StateStore
from benchmarks import engine_runs as runs
from benchmarks import pg_fixture as pg
from benchmarks.harness import (
    Benchmark,
    BenchmarkResult,
    BenchmarkSkipped,
    Context,
    Timing,
    best_of,
    timed,
)

SPEC_TARGET = "SPEC §9: >= 0.70 with Azure state; local state should do better"
LOCAL_TARGET = "issue 15: local state >= 0.80"
AZURITE_TARGET = "SPEC §9: >= 0.70 (Azurite, not Azure)"
AZURE_TARGET = "issue 15: Blob + 10 ms + a handler reading a column >= 0.70"
DEFAULT_AZURE_TARGET = "issue 31: Blob + 10 ms, no knob set >= 0.70"
COLUMN_TARGET = "issue 31: >= 0.85"
#: One-way delay of the ``blob_latency`` drain's proxy, seconds (a round trip costs twice this).
AZURE_LIKE_DELAY = 0.010
HORIZON_CALLS = 200


def _detail(timing: Timing) -> str:
    runs = ", ".join(f"{s:.3f}" for s in timing.all_seconds)
    return f"best of {timing.repeats}: {timing.seconds:.3f} s (runs {runs})"


@dataclass
class Scans:
    """Best-of-N timings of one table's drains, by name (``raw``, ``core``, ``none``, ...)."""

    db: pg.OrdersTable
    samples: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    cpu: dict[str, list[float]] = field(default_factory=dict)

    def add(self, name: str, drain: Callable[[], int]) -> None:
        """Run ``drain`` once; keep its wall time and this process's CPU time."""
        started = time.process_time()
        self.samples.setdefault(name, []).append(timed(drain))
        self.cpu.setdefault(name, []).append(time.process_time() - started)

    def best(self, name: str) -> Timing:
        return best_of(self.samples[name])

    def cpu_us_per_row(self, name: str) -> float:
        """The least client CPU time of the repetitions, per row, in microseconds."""
        return min(self.cpu[name]) / self.db.rows * 1e6

    def __contains__(self, name: str) -> bool:
        return name in self.samples


def measure(ctx: Context, work: list[tuple[Scans, dict[str, Callable[[], int]]]]) -> None:
    """Run every drain of every table ``ctx.repeats`` times, interleaved across tables too.

    One repetition drains N/10 then N with each method, so drift of a shared machine, and the
    slow growth of a long process's live objects (which the cyclic garbage collector walks),
    hit both sizes and every method alike.
    """
    for i in range(ctx.repeats):
        for scans, drains in work:
            ctx.progress(
                f"{', '.join(drains)} drains of {scans.db.rows:,} rows ({i + 1}/{ctx.repeats})"
            )
            for name, drain in drains.items():
                scans.add(name, drain)


def horizon_ms(db: pg.OrdersTable, horizon: pg.Horizon) -> tuple[float, str]:
    """Median wall time of ``SqlSource.horizon()`` on an open source, and the method used."""
    source = db.source(horizon)
    source.open({})
    try:
        method = source.horizon().method
        times = []
        for _ in range(HORIZON_CALLS):
            started = time.perf_counter()
            source.horizon()
            times.append(time.perf_counter() - started)
        return statistics.median(times) * 1000, method
    finally:
        source.close()


@dataclass
class BlobStores:
    """``make()`` of fresh ``BlobStateStore``s by drain name (``blob`` straight to Azurite,
    ``blob_latency`` through the proxy), all counting their HTTP requests in ``counter``."""

    makers: dict[str, Callable[[], StateStore]]
    counter: Any = None  # azurite_requests.RequestCounter (the SDKs are imported late)
    requests: dict[str, int] = field(default_factory=dict)  # per drain name, last repetition

    def counted(self, name: str, drain: Callable[[], int]) -> Callable[[], int]:
        """``drain``, recording the storage requests it sent under ``name``."""

        def run() -> int:
            self.counter.take()
            rows = drain()
            self.requests[name] = sum(self.counter.take().values())
            return rows

        return run


@contextmanager
def blob_stores(ctx: Context, result: BenchmarkResult) -> Iterator[BlobStores]:
    """Blob state stores on a private Azurite: straight, and through a :data:`AZURE_LIKE_DELAY`
    proxy; none, and a note, without Azurite."""
    from benchmarks import azurite_requests

    stack = ExitStack()
    try:
        connection_string = stack.enter_context(azurite_requests.azurite(ctx))
    except BenchmarkSkipped as exc:
        result.note(f"The BlobStateStore drains on Azurite were not measured: {exc}")
        yield BlobStores({})
        return
    with stack:
        from azure_functions_db.state.blob import BlobStateStore
        from devkit.latency_proxy import proxied_connection_string

        counter = azurite_requests.RequestCounter()
        proxied = stack.enter_context(
            proxied_connection_string(connection_string, AZURE_LIKE_DELAY, in_process=False)
        )

        def maker(connection: str) -> Callable[[], StateStore]:
            settings = {"AzureWebJobsStorage": connection}

            def make() -> StateStore:
                container = f"pgbench-{uuid.uuid4().hex[:10]}"
                return BlobStateStore(
                    settings=settings,
                    container=container,
                    client_options=counter.client_options("blob"),
                )

            return make

        yield BlobStores(
            {"blob": maker(connection_string), "blob_latency": maker(proxied)}, counter
        )


#: Rows per checkpoint write of the coalesced drain (``checkpoint_every``).
COALESCE_ROWS = 10_000


def blob_drain(
    db: pg.OrdersTable,
    make: Callable[[], StateStore],
    batch: int,
    handler: Handler = runs.noop_handler,
    *,
    pipeline: bool = True,
    checkpoint_every: int | None = None,
) -> int:
    """One engine drain of ``db`` with a fresh Blob state store (a new container) from ``make``
    (``pipeline=False``: every commit waited for before the next batch, the old order)."""
    return runs.engine_drain(
        db,
        make(),
        batch,
        handler,
        horizon="auto",
        pipeline=pipeline,
        checkpoint_every=checkpoint_every,
    )


def full_work(
    db: pg.OrdersTable, state: Path, batch: int, blobs: BlobStores
) -> dict[str, Callable[[], int]]:
    """The drains of the N table beyond :func:`plain`'s, by name (``_col``: the handler reads
    one column of every row; ``_serial``: ``pipeline=False``; ``_coalesced``: one commit per
    :data:`COALESCE_ROWS` rows)."""
    column = runs.column_handler
    work: dict[str, Callable[[], int]] = {
        "raw_row": lambda: pg.raw_scan(db, batch, "row"),
        "raw_col": lambda: pg.raw_scan(db, batch, column=True),
        "auto_col": runs.local_drain(db, state, batch, column, "auto"),
        "auto_serial": runs.local_drain(db, state, batch, horizon="auto", pipeline=False),
    }
    variants: dict[str, dict[str, Any]] = {
        "": {},
        "_col": {"handler": column},
        "_serial": {"pipeline": False},
        "_coalesced": {"checkpoint_every": COALESCE_ROWS},
        "_coalesced_col": {"handler": column, "checkpoint_every": COALESCE_ROWS},
    }
    for store, make in blobs.makers.items():
        for suffix, options in variants.items():
            if store == "blob" and suffix not in ("", "_col"):
                continue
            drain = partial(blob_drain, db, make, batch, **options)
            work[f"{store}{suffix}"] = blobs.counted(f"{store}{suffix}", drain)
    return work


def run(ctx: Context) -> BenchmarkResult:  # noqa: PLR0915 - one linear report
    result = BenchmarkResult(name=BENCHMARK.name, title=BENCHMARK.title, tier=BENCHMARK.tier)
    rows = pg.table_rows(ctx)
    small_rows = max(rows // 10, 10)
    batch = ctx.batch_size
    with pg.scratch_schema() as server:
        ctx.progress(f"building PostgreSQL table orders_{small_rows} ({small_rows:,} rows)")
        small_db = pg.build_orders(server, small_rows)
        ctx.progress(f"building PostgreSQL table orders_{rows} ({rows:,} rows)")
        db = pg.build_orders(server, rows)
        for table in (small_db, db):  # warm the caches and the code paths once, untimed
            pg.raw_scan(table, batch)

        def plain(table: pg.OrdersTable, tag: str) -> dict[str, Callable[[], int]]:
            state = ctx.workdir / f"pg_state_{tag}"
            return {
                "raw": lambda: pg.raw_scan(table, batch),
                "core": lambda: pg.core_scan(table, batch),
                "none": runs.local_drain(table, state, batch, horizon="none"),
                "auto": runs.local_drain(table, state, batch, horizon="auto"),
            }

        small, full = Scans(db=small_db), Scans(db=db)
        with blob_stores(ctx, result) as blobs:
            work = {**plain(db, "full"), **full_work(db, ctx.workdir / "pg_state_x", batch, blobs)}
            measure(ctx, [(small, plain(small_db, "small")), (full, work)])
        ctx.progress("timing the horizon query")
        auto_ms, method = horizon_ms(db, "auto")
        none_ms, _ = horizon_ms(db, "none")

    batches = -(-rows // batch)
    result.metric("rows", "table rows (N)", rows, "rows", f"N/10 = {small_rows:,}")
    result.metric(
        "distinct_cursors",
        "distinct updated_at values",
        db.distinct_cursors,
        "count",
        f"largest tie {db.largest_tie:,} rows (> batch {batch})",
    )
    result.metric(
        "table_bytes", "table + indexes on disk", db.total_bytes, "bytes", "pg_total_relation_size"
    )
    delay_ms = AZURE_LIKE_DELAY * 1000
    latency = f"Blob on Azurite + {delay_ms:g} ms each way"
    col = ", handler reads one column"
    coalesced = f"checkpoint_every={COALESCE_ROWS:,}"
    # name: (label, short label for the CPU and request lines, ratio target or None)
    drains: dict[str, tuple[str, str, str | None]] = {
        "raw": ("A: raw psycopg keyset scan (nested predicate)", "A: raw psycopg (nested)", None),
        "raw_row": ("A': raw psycopg keyset scan (row-value predicate)", "A': row value", None),
        "raw_col": ("A'': raw psycopg keyset scan reading one column", "A'': one column", None),
        "core": ("B: SQLAlchemy Core keyset scan", "B: SQLAlchemy Core", None),
        "none": ('engine, local state, horizon="none"', 'engine, local, "none"', SPEC_TARGET),
        "auto": ('engine, local state, horizon="auto"', 'engine, local, "auto"', SPEC_TARGET),
        "auto_col": (f'engine, local state, "auto"{col}', f"engine, local{col}", LOCAL_TARGET),
        "auto_serial": (
            'engine, local state, "auto", pipeline=False',
            "engine, local, pipeline=False",
            "each commit waited for",
        ),
        "blob": ('engine, Blob on Azurite, "auto"', "engine, Blob on Azurite", AZURITE_TARGET),
        "blob_col": (f"engine, Blob on Azurite{col}", f"engine, Blob{col}", AZURITE_TARGET),
        "blob_latency": (
            f'engine, {latency}, "auto", no knob set (group commit)',
            f"engine, {latency}",
            DEFAULT_AZURE_TARGET,
        ),
        "blob_latency_col": (f"engine, {latency}{col}", f"engine, {latency}{col}", AZURE_TARGET),
        "blob_latency_serial": (
            f"engine, {latency}, pipeline=False (each commit before the next batch)",
            f"engine, {latency}, pipeline=False",
            "the commit waited for before each next batch",
        ),
        "blob_latency_coalesced": (
            f"engine, {latency}, {coalesced}",
            f"engine, {latency}, {coalesced}",
            AZURE_TARGET,
        ),
        "blob_latency_coalesced_col": (
            f"engine, {latency}, {coalesced}{col}",
            f"engine, {latency}, {coalesced}{col}",
            AZURE_TARGET,
        ),
    }
    for name, (label, short, target) in drains.items():
        if name not in full:
            continue
        timing = full.best(name)
        result.metric(f"{name}_rps", label, timing.rows_per_second, "rows/s", _detail(timing))
        result.metric(
            f"{name}_cpu",
            f"client CPU time, {short}",
            full.cpu_us_per_row(name),
            "µs/row",
            f"least of {ctx.repeats}; client process only",
        )
        if name in blobs.requests:
            result.metric(
                f"{name}_requests",
                f"storage requests per 1M rows, {short}",
                blobs.requests[name] / rows * 1e6,
                "requests",
                f"{blobs.requests[name]:,} for {rows:,} rows, counted by an azure-core policy",
            )
        if target is not None:
            ratio = "engine_vs_raw" if name == "none" else f"{name}_vs_raw"
            result.ratio(ratio, f"{label} / raw psycopg", f"{name}_rps", "raw_rps", target)
    if "blob_latency_serial" in full:
        result.ratio(
            "pipeline_gain",
            "engine Blob + latency, pipelined / not pipelined",
            "blob_latency_rps",
            "blob_latency_serial_rps",
            "what taking the commit off the critical path buys",
        )
    result.ratio(
        "local_pipeline_gain",
        "engine local, pipelined / not pipelined",
        "auto_rps",
        "auto_serial_rps",
        "the fsync'd commit off the critical path",
    )
    result.ratio(
        "auto_col_vs_raw_col",
        "engine, local, handler reads one column / raw psycopg reading the same column",
        "auto_col_rps",
        "raw_col_rps",
        COLUMN_TARGET,
    )
    result.ratio(
        "auto_vs_raw_row",
        "engine (auto) / raw psycopg, row value",
        "auto_rps",
        "raw_row_rps",
        "the engine's own predicate on PostgreSQL",
    )
    result.ratio("engine_vs_core", "engine (none) / SQLAlchemy Core", "none_rps", "core_rps")
    result.ratio("core_vs_raw", "SQLAlchemy Core / raw psycopg", "core_rps", "raw_rps")
    result.ratio("row_vs_nested", "raw row-value / raw nested", "raw_row_rps", "raw_rps")

    # The horizon: timed alone, and as the difference of the two drains.
    result.metric(
        "horizon_auto_ms",
        f'SqlSource.horizon(), "auto" (method {method})',
        auto_ms,
        "ms",
        f"median of {HORIZON_CALLS} calls on an open source",
    )
    result.metric(
        "horizon_none_ms",
        'SqlSource.horizon(), "none"',
        none_ms,
        "ms",
        f"median of {HORIZON_CALLS} calls",
    )
    auto_extra = (full.best("auto").seconds - full.best("none").seconds) / batches * 1000
    result.metric(
        "auto_extra_ms_per_batch",
        'drain "auto" - drain "none", per batch',
        auto_extra,
        "ms",
        f"{batches} batches",
    )
    if "blob" in full and "blob_latency" in full:
        extra = full.best("blob_latency").seconds - full.best("blob").seconds
        result.metric(
            "blob_latency_extra_ms_per_batch",
            f"drain Blob + {delay_ms:g} ms each way - drain Blob, per batch",
            extra / batches * 1000,
            "ms",
            f"{batches} batches; each storage round trip costs {2 * delay_ms:g} ms more",
        )

    # Flatness.
    short = {"raw": "raw psycopg", "none": 'engine "none"', "auto": 'engine "auto"'}
    for size, scans in (("small", small), ("full", full)):
        which = "N/10" if size == "small" else "N"
        for name in ("raw", "none", "auto"):
            timing = scans.best(name)
            result.metric(
                f"{name}_rps_{size}",
                f"{short[name]}, {which} = {scans.db.rows:,} rows",
                timing.rows_per_second,
                "rows/s",
                f"best of {timing.repeats}",
            )
        result.metric(
            f"none_cpu_{size}",
            f'client CPU time, engine "none", {which}',
            scans.cpu_us_per_row("none"),
            "µs/row",
            f"least of {ctx.repeats}",
        )
        result.metric(
            f"engine_overhead_{size}",
            f"engine (none) cost above raw, {which}",
            1e6 / scans.best("none").rows_per_second - 1e6 / scans.best("raw").rows_per_second,
            "µs/row",
            "1/engine - 1/raw",
        )
    result.ratio(
        "engine_flatness",
        "engine (none) N / N/10",
        "none_rps_full",
        "none_rps_small",
        "~1 (SPEC §9: flat as the table grows)",
    )
    result.ratio("auto_flatness", "engine (auto) N / N/10", "auto_rps_full", "auto_rps_small", "~1")
    result.ratio(
        "raw_flatness",
        "raw N / raw N/10",
        "raw_rps_full",
        "raw_rps_small",
        "reference: the database alone",
    )
    result.ratio(
        "cpu_flatness",
        "engine (none) client CPU per row, N / N/10",
        "none_cpu_full",
        "none_cpu_small",
        "~1: the engine's own per-row work does not grow",
    )
    result.ratio(
        "overhead_flatness",
        "engine cost above raw, N / N/10",
        "engine_overhead_full",
        "engine_overhead_small",
        "~1: the engine's own per-row work does not grow",
    )
    result.note(
        "Raw psycopg runs on one autocommit connection; psycopg prepares the repeated statement "
        "after five executions, for the raw scan, Core and the engine alike."
    )
    result.note(
        "Client CPU time is time.process_time() of this process around each drain (the server's "
        "work is not in it); on a shared machine it moves less than wall time when other work "
        "competes for the CPUs."
    )
    result.note(
        "The engine time covers a whole run: source open (reflection; the auto horizon's "
        "checks), lease, fence, the health check, every batch (horizon, fetch, Batch building, "
        "no-op handler, checkpoint commit: an fsync'd file replace, or one conditional PUT on "
        "Azurite) and the release."
    )
    if "blob_latency" in full:
        result.note(
            "Blob + latency: the same Azurite behind devkit/latency_proxy.py (in a child process, "
            "so this process's interpreter lock does not add to the delay), a loopback TCP "
            f"proxy that delays every chunk by {delay_ms:g} ms each way, so a "
            f"storage round trip costs {2 * delay_ms:g} ms more (Azure Storage answers a "
            "Function in 10-30 ms, Azurite on loopback in a few). Connection set-up and TLS are "
            "not delayed (the SDK keeps its connections alive); the extra time per batch over "
            "the plain Blob drain, divided by the round trip, is the storage requests per batch."
        )
    return result


BENCHMARK = Benchmark(
    name="pg_drain",
    title="PostgreSQL: engine vs raw psycopg keyset scan, 1M rows, same run",
    tier="postgres",
    run=run,
)
