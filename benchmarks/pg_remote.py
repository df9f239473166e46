"""PostgreSQL across a network: what reading the next batch ahead buys when each query waits.

An Azure Function reaches its database over the network (1-2 ms a round trip in one region,
more across regions); a benchmark on loopback hides that wait. Here the tier's ``orders`` table
(``benchmarks/pg_fixture.py``, N rows: 300,000, 100,000 with ``--quick``, or ``--rows``) is read
through ``devkit/latency_proxy.py`` (in a child process), a loopback TCP proxy delaying every
chunk by :data:`DB_DELAY` each way, by:

- ``raw``: the psycopg keyset scan of ``pg_drain`` (baseline A), through the proxy;
- ``engine``: one ``Engine.run`` with local state, the default configuration (commits in flight,
  the next batch read ahead while the handler takes this one);
- ``engine_no_read_ahead``: the same with a source that declines reading ahead (commits still
  in flight): every query waits on the run's thread, as before read-ahead;
- ``engine_serial``: ``pipeline=False`` (neither);
- ``raw_loopback``: the raw scan without the proxy, for scale.

Each with the no-op handler; repetitions interleaved, best of ``--repeats``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import sqlalchemy as sa

from azure_functions_db.sources.sqlalchemy import SqlSource
from benchmarks import engine_runs as runs
from benchmarks import pg_fixture as pg
from benchmarks.harness import Benchmark, BenchmarkResult, Context, Timing, best_of, timed

#: One-way delay of the proxy in front of PostgreSQL, seconds (a round trip costs twice this).
DB_DELAY = 0.001
#: N when neither ``--rows`` nor ``--quick`` says otherwise.
ROWS = 300_000
TARGET = "issue 15: the framework must not be the bottleneck"


class _NoReadAhead(SqlSource):
    """``SqlSource`` declining to be read on another thread: every read on the run's thread."""

    @property
    def reads_from_any_thread(self) -> bool:
        return False


@dataclass(frozen=True)
class _SerialTable:
    """An ``orders`` table whose source is never read ahead."""

    table: pg.OrdersTable

    @property
    def rows(self) -> int:
        return self.table.rows

    @property
    def name(self) -> str:
        return self.table.name

    def source(self, horizon: str | None = None) -> SqlSource:
        return self.table.source(horizon, kind=_NoReadAhead)


def _through(table: pg.OrdersTable, host: str, port: int) -> pg.OrdersTable:
    url = sa.make_url(table.server.url).set(host=host, port=port)
    server = dataclasses.replace(table.server, url=url.render_as_string(hide_password=False))
    return dataclasses.replace(table, server=server)


def run(ctx: Context) -> BenchmarkResult:
    from devkit.latency_proxy import proxy_process

    result = BenchmarkResult(name=BENCHMARK.name, title=BENCHMARK.title, tier=BENCHMARK.tier)
    given = ctx.memoized(pg.ROWS_MEMO)
    rows = given if isinstance(given, int) else pg.QUICK_ROWS if ctx.quick else ROWS
    batch = ctx.batch_size
    with pg.scratch_schema() as server:
        ctx.progress(f"building PostgreSQL table orders_{rows} ({rows:,} rows)")
        db = pg.build_orders(server, rows)
        url = sa.make_url(server.url)
        with proxy_process(url.host or "127.0.0.1", url.port or 5432, DB_DELAY) as port:
            far = _through(db, "127.0.0.1", port)
            state = ctx.workdir / "pg_remote_state"
            drains: dict[str, Callable[[], int]] = {
                "raw_loopback": lambda: pg.raw_scan(db, batch),
                "raw": lambda: pg.raw_scan(far, batch),
                "engine": runs.local_drain(far, state, batch, horizon="auto"),
                "engine_no_read_ahead": runs.local_drain(
                    _SerialTable(far), state, batch, horizon="auto"
                ),
                "engine_serial": runs.local_drain(
                    far, state, batch, horizon="auto", pipeline=False
                ),
            }
            for name, drain in drains.items():  # warm the caches and code paths, untimed
                ctx.progress(f"warming up: {name}")
                drain()
            samples: dict[str, list[tuple[int, float]]] = {name: [] for name in drains}
            for i in range(ctx.repeats):
                ctx.progress(f"drains of {rows:,} rows through the proxy ({i + 1}/{ctx.repeats})")
                for name, drain in drains.items():
                    samples[name].append(timed(drain))
    delay_ms = DB_DELAY * 1000
    result.metric("rows", "table rows (N)", rows, "rows", f"batch {batch}")
    result.metric("delay_ms", "proxy delay, each way", delay_ms, "ms", "a round trip costs 2x")
    labels = {
        "raw_loopback": "raw psycopg keyset scan, loopback (no proxy)",
        "raw": f"raw psycopg keyset scan, +{delay_ms:g} ms each way",
        "engine": "engine, local state, read ahead (default)",
        "engine_no_read_ahead": "engine, local state, no read ahead (commits in flight)",
        "engine_serial": "engine, local state, pipeline=False",
    }
    for name, label in labels.items():
        timing: Timing = best_of(samples[name])
        runs_text = ", ".join(f"{s:.3f}" for s in timing.all_seconds)
        result.metric(
            f"{name}_rps",
            label,
            timing.rows_per_second,
            "rows/s",
            f"best of {timing.repeats}: {timing.seconds:.3f} s (runs {runs_text})",
        )
    for name in ("engine", "engine_no_read_ahead", "engine_serial"):
        result.ratio(
            f"{name}_vs_raw", f"{labels[name]} / raw, same proxy", f"{name}_rps", "raw_rps", TARGET
        )
    result.ratio(
        "read_ahead_gain",
        "read ahead / no read ahead",
        "engine_rps",
        "engine_no_read_ahead_rps",
        "what hiding the query's round trip buys",
    )
    result.note(
        "The proxy (devkit/latency_proxy.py) runs in a child process, so its threads do not "
        "take the benchmark's GIL; on a 2-CPU machine it still competes for the CPUs with the "
        "benchmark and the server."
    )
    return result


BENCHMARK = Benchmark(
    name="pg_remote",
    title="PostgreSQL across a network: the next batch read ahead",
    tier="postgres",
    run=run,
)
