"""Commit-to-handler latency under a steady insert load: the per-second timer against the
low-latency mode (``poll_interval``), and what each costs in state-store calls.

A writer thread inserts one row every 50 ms (20 rows/s) into a SQLite table for ``SECONDS``,
stamping ``updated_at`` with the time of its commit; the handler notes when each row arrives.
Latency is arrival minus commit (both on this process's monotonic clock):

- ``timer``: one ``Engine.run`` per second, as a ``*/1`` timer would start them (each run takes
  the lease, fences, drains, writes its health record and releases);
- ``poll``: one ``Engine.run`` with ``poll_interval=0.2`` and a time budget covering the load:
  it keeps the lease and reads again every 0.2 s.

Both use the default ``horizon="auto"``; on SQLite that is the database clock minus a settle
margin of 1 s (serial writers still stamp ties), so no mode can go below about 1 s here. The
idle cost is counted through a counting proxy of ``LocalStateStore``: calls per idle minute in
the low-latency mode (one run a minute: its own calls plus its heartbeat's renewals, one every
``lease_duration / 3``; and runs of the default ``time_budget``, 240 s, with a lease of 30 s
and of 60 s) against the calls of one idle timer run.
"""

from __future__ import annotations

import datetime as dt
import statistics
import threading
import time
from typing import Any

import sqlalchemy as sa

from azure_functions_db.core.batch import Batch
from azure_functions_db.core.clock import SystemClock
from azure_functions_db.core.config import PollerConfig
from azure_functions_db.core.engine import Engine
from azure_functions_db.sources.sqlalchemy import SqlSource
from benchmarks import engine_runs as runs
from benchmarks import sqlite_fixture as fx
from benchmarks.harness import Benchmark, BenchmarkResult, Context

SECONDS = 12.0  # of steady inserts per mode
EVERY = 0.05  # seconds between inserts
POLL = 0.2  # poll_interval of the low-latency mode
IDLE = 20.0  # seconds of the idle measurement of the low-latency mode
IDLE_60 = 45.0  # the same with a lease of 60 s (a budget must outlive one heartbeat, 20 s)
BUDGET = 240.0  # the default time_budget: the run length of the low-latency mode


class _Load:
    """A SQLite table, a writer thread, and the arrival times the handler notes."""

    def __init__(self, ctx: Context, name: str) -> None:
        self.path = ctx.workdir / f"latency_{name}.db"
        self.path.unlink(missing_ok=True)
        self.url = f"sqlite:///{self.path}"
        self.engine = sa.create_engine(self.url)
        with self.engine.begin() as conn:
            conn.exec_driver_sql(
                "CREATE TABLE orders (id INTEGER PRIMARY KEY, updated_at TIMESTAMP NOT NULL)"
            )
            conn.exec_driver_sql("CREATE INDEX ix_orders ON orders (updated_at, id)")
        self.committed: dict[int, float] = {}
        self.arrived: dict[int, float] = {}
        self.stop = threading.Event()

    def source(self) -> SqlSource:
        return SqlSource(self.url, table="orders", cursor="updated_at", pk="id")

    def handler(self, batch: Batch) -> None:
        now = time.monotonic()
        for change in batch:
            self.arrived.setdefault(int(change.pk), now)

    def write(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        row = 0
        while time.monotonic() < deadline and not self.stop.is_set():
            row += 1
            with self.engine.begin() as conn:
                conn.execute(
                    sa.text("INSERT INTO orders VALUES (:id, :at)"),
                    {"id": row, "at": dt.datetime.now(dt.UTC).replace(tzinfo=None)},
                )
            self.committed[row] = time.monotonic()
            time.sleep(EVERY)

    def latencies(self) -> list[float]:
        return sorted(self.arrived[i] - t for i, t in self.committed.items() if i in self.arrived)


def _engine(load: _Load, store: Any, **config: Any) -> Engine:
    config = {"lease_duration": 30, **config}
    cfg = PollerConfig(name=runs.POLLER, batch_size=1000, **config)
    return Engine(cfg, load.source(), store, load.handler, SystemClock(), owner=runs.OWNER)


def _percentile(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def _timer_mode(ctx: Context) -> tuple[list[float], int, int]:
    load = _Load(ctx, "timer")
    store = fx.CountingStore(runs.fresh_local_store(ctx.workdir / "latency_timer_state"))
    engine = _engine(load, store, time_budget=30)
    writer = threading.Thread(target=load.write, args=(SECONDS,))
    writer.start()
    runs_done = 0
    started = time.monotonic()
    while writer.is_alive() or time.monotonic() - started < SECONDS + 3:
        tick = time.monotonic()
        engine.run({})
        runs_done += 1
        time.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))
    writer.join()
    store.reset()
    engine.run({})  # one idle run, counted
    idle_calls = sum(store.snapshot().values())
    missing = len(load.committed) - len(load.arrived)
    if missing:
        raise RuntimeError(f"timer mode: {missing} committed row(s) never arrived")
    return load.latencies(), runs_done, idle_calls


def _poll_mode(ctx: Context) -> tuple[list[float], int]:
    load = _Load(ctx, "poll")
    store = fx.CountingStore(runs.fresh_local_store(ctx.workdir / "latency_poll_state"))
    engine = _engine(load, store, time_budget=SECONDS + 3, poll_interval=POLL)
    writer = threading.Thread(target=load.write, args=(SECONDS,))
    writer.start()
    engine.run({})
    writer.join()
    missing = len(load.committed) - len(load.arrived)
    if missing:  # rows committed in the last instant wait for the next run, as with a timer
        engine.run({})
    if len(load.committed) != len(load.arrived):
        raise RuntimeError("poll mode: committed rows never arrived")
    return load.latencies(), len(load.committed)


def _poll_idle(ctx: Context, lease: float, idle: float = IDLE) -> tuple[int, float]:
    """State-store calls of one low-latency run that finds nothing for ``idle`` seconds, and
    its heartbeat's renewals per minute (from the times of the acquire and the renewals)."""
    load = _Load(ctx, f"idle_{lease:g}")
    store = fx.CountingStore(runs.fresh_local_store(ctx.workdir / f"latency_idle_{lease:g}"))
    engine = _engine(load, store, time_budget=idle, poll_interval=POLL, lease_duration=lease)
    engine.run({})  # creates the checkpoint and the health record: not idle yet
    store.reset()
    engine.run({})
    beats = store.times["acquire"][:1] + store.times.get("renew", [])
    if len(beats) < 2:
        raise RuntimeError(f"no heartbeat renewal in {idle:g} s with a lease of {lease:g} s")
    return sum(store.snapshot().values()), 60 * (len(beats) - 1) / (beats[-1] - beats[0])


def run(ctx: Context) -> BenchmarkResult:
    result = BenchmarkResult(name=BENCHMARK.name, title=BENCHMARK.title, tier=BENCHMARK.tier)
    ctx.progress(f"timer mode: a run per second, {SECONDS:g} s of inserts at {1 / EVERY:g} rows/s")
    timer, timer_runs, timer_idle = _timer_mode(ctx)
    ctx.progress(f"low-latency mode: poll_interval={POLL:g} s, the same load")
    poll, rows = _poll_mode(ctx)
    ctx.progress(f"low-latency mode idle for {IDLE:g} s (lease 30 s), {IDLE_60:g} s (lease 60 s)")
    idle_calls, beats = _poll_idle(ctx, 30)
    _, beats_60 = _poll_idle(ctx, 60, IDLE_60)
    for key, label, values in (
        ("timer", "timer, one run per second", timer),
        (
            "poll",
            f"low-latency mode, poll_interval={POLL:g} s",
            poll,
        ),
    ):
        result.metric(
            f"{key}_p50",
            f"{label}: commit to handler, p50",
            round(_percentile(values, 0.5), 3),
            "s",
            f"{len(values)} rows",
        )
        result.metric(
            f"{key}_p99",
            f"{label}: commit to handler, p99",
            round(_percentile(values, 0.99), 3),
            "s",
            f"max {max(values):.3f} s, mean {statistics.fmean(values):.3f} s",
        )
    result.metric("rows", "rows inserted per mode", rows, "rows", f"one every {EVERY:g} s")
    result.metric("timer_runs", "timer mode: runs", timer_runs, "count")
    result.metric(
        "timer_idle_calls",
        "timer mode: state-store calls of one idle run",
        timer_idle,
        "count",
        "acquire, fence, health record, release",
    )
    renewals = beats
    result.metric(
        "poll_idle_renewals_per_minute",
        "low-latency mode: heartbeat renewals per idle minute",
        round(renewals, 1),
        "count",
        f"one run idle for {IDLE:g} s ({idle_calls} calls, one run's own {timer_idle}): the "
        "renewals' spacing",
    )
    result.metric(
        "poll_idle_minute_calls",
        "low-latency mode: state-store calls of an idle minute (one run a minute)",
        round(timer_idle + renewals, 1),
        "count",
        "one run's own calls plus a minute of renewals; the timer mode makes 60 runs a minute",
    )
    # A run of the default time budget spreads its own calls over its four minutes.
    for lease, per_minute, idle in ((30, beats, IDLE), (60, beats_60, IDLE_60)):
        key = f"poll_idle_minute_calls_long_{lease}"
        result.metric(
            key,
            f"low-latency mode: state-store calls of an idle minute, {BUDGET:g} s runs, "
            f"lease_duration={lease}",
            round(timer_idle * 60 / BUDGET + per_minute, 1),
            "count",
            f"{per_minute:.1f} renewals a minute (measured over {idle:g} s) and a quarter of "
            "one run's own calls",
        )
        result.ratio(
            f"idle_minute_vs_timer_run_{lease}",
            f"idle minute ({BUDGET:g} s runs, lease {lease} s) / one timer run",
            key,
            "timer_idle_calls",
            "issue 15: <= 1",
        )
    result.ratio(
        "latency_gain",
        "p50 latency, timer / low-latency mode",
        "timer_p50",
        "poll_p50",
        "the low-latency mode delivers in about poll_interval + the horizon margin",
    )
    result.note(
        "SQLite's horizon holds rows back by a settle margin of 1 s (writers stamp ties), so "
        "neither mode goes below about 1 s here; on PostgreSQL the horizon waits only for "
        "transactions still open."
    )
    return result


BENCHMARK = Benchmark(
    name="sqlite_latency",
    title="SQLite: commit-to-handler latency, timer vs low-latency mode (poll_interval)",
    tier="sqlite",
    run=run,
)
