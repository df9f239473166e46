"""Azurite: what an idle minute of the low-latency mode costs in storage requests, against one
idle timer run, with the default lease and time budget.

Per store (Blob, Table), on a drained SQLite ``orders`` table, with ``PollerConfig`` defaults
(``lease_duration=30``, ``time_budget=240``) but for ``poll_interval=0.2``:

- an idle timer run (the same poller without ``poll_interval``), its HTTP requests counted as
  in :mod:`benchmarks.azurite_requests`;
- one low-latency run of :data:`WINDOW` seconds (``time_budget=WINDOW``) on the idle table:
  its requests, split into lease renewals and the rest (the run's own acquire, checkpoint,
  health record and release).

An idle low-latency minute at the default four-minute budget = the renewals of a minute (one
every ``lease_duration / 2.5``, checked against the count) + the rest / 4 (a run's fixed part,
paid once per 240 s). The ratio is the timer run's requests over that: at least 1 means an idle
minute of the low-latency mode costs no more than one timer run (issue 32).
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from collections import Counter

from azure_functions_db.core.clock import SystemClock
from azure_functions_db.core.config import PollerConfig
from azure_functions_db.core.engine import Engine
from azure_functions_db.core.lease import HEARTBEATS_PER_LEASE
from benchmarks import engine_runs as runs
from benchmarks import sqlite_fixture as fx
from benchmarks.azurite_requests import RequestCounter, azurite, make_store
from benchmarks.harness import Benchmark, BenchmarkResult, Context

WINDOW = 62.0  # seconds of one low-latency run (a minute and the run's set-up)
QUICK_WINDOW = 26.0
POLL = 0.2
DEFAULTS = PollerConfig(name="defaults")
BUDGET = DEFAULTS.time_budget  # the default four minutes
HEARTBEAT = DEFAULTS.lease_duration / HEARTBEATS_PER_LEASE  # seconds between renewals


def _renewals(counts: Counter[str]) -> int:
    return sum(n for label, n in counts.items() if "renew" in label)


def run(ctx: Context) -> BenchmarkResult:
    result = BenchmarkResult(name=BENCHMARK.name, title=BENCHMARK.title, tier=BENCHMARK.tier)
    window = QUICK_WINDOW if ctx.quick else WINDOW
    with azurite(ctx) as connection_string:
        base = fx.orders(ctx, min(ctx.rows, 2_000))
        for kind in ("blob", "table"):
            copy = ctx.workdir / f"poll_idle_{kind}.db"
            shutil.copyfile(base.path, copy)
            table = dataclasses.replace(base, path=copy)
            counter = RequestCounter()
            store = make_store(kind, connection_string, counter)
            source = table.source(None)
            try:
                timer = Engine(
                    PollerConfig(name=runs.POLLER, batch_size=ctx.batch_size),
                    source,
                    store,
                    runs.noop_handler,
                    SystemClock(),
                    owner=runs.OWNER,
                )
                timer.run({})  # first run: creates the container and drains the table
                timer.run({})  # a second one, so the idle run counted is a steady one
                counter.take()
                timer.run({})
                idle_run = sum(counter.take().values())
                ctx.progress(f"{kind}: a low-latency run idle for {window:g} s")
                low = Engine(
                    PollerConfig(
                        name=runs.POLLER,
                        batch_size=ctx.batch_size,
                        poll_interval=POLL,
                        time_budget=window,
                    ),
                    source,
                    store,
                    runs.noop_handler,
                    SystemClock(),
                    owner=runs.OWNER,
                )
                started = time.monotonic()
                report = low.run({})
                lasted = time.monotonic() - started
                counts = counter.take()
            finally:
                source.close()
            if report.rows:
                raise RuntimeError(f"{kind}: the idle low-latency run delivered {report.rows} rows")
            renewals = _renewals(counts)
            if renewals != int(lasted // HEARTBEAT):
                raise RuntimeError(
                    f"{kind}: {renewals} renewals in {lasted:.1f} s, not one every {HEARTBEAT:g} s"
                )
            rest = sum(counts.values()) - renewals
            per_minute = 60 / HEARTBEAT + rest * 60 / BUDGET
            label = kind.capitalize()
            result.metric(f"{kind}.timer_run", f"{label}: idle timer run", idle_run, "requests")
            result.metric(
                f"{kind}.renewals",
                f"{label}: low-latency run, renewals",
                renewals,
                "requests",
                f"in {lasted:.1f} s (lease_duration 30: one every {HEARTBEAT:g} s)",
            )
            result.metric(
                f"{kind}.rest",
                f"{label}: low-latency run, the rest",
                rest,
                "requests",
                "acquire, checkpoint, health record, release: once per run",
            )
            result.metric(
                f"{kind}.idle_minute",
                f"{label}: idle low-latency minute",
                round(per_minute, 2),
                "requests",
                f"{60 / HEARTBEAT:g} renewals + the rest / {BUDGET / 60:g} (runs of {BUDGET:g} s)",
            )
            result.metric(
                f"{kind}.ratio",
                f"{label}: timer run / idle low-latency minute",
                round(idle_run / per_minute, 3),
                "ratio",
                "goal >= 1 (issue 32: an idle minute within one timer run)",
            )
    result.note(
        "Requests counted by the same azure-core policy as azurite_requests (after the SDK's "
        "retries). The low-latency run is one run of the window, not the default 240 s: its "
        "renewal count is checked against the heartbeat's period, its fixed part is spread "
        "over 240 s."
    )
    return result


BENCHMARK = Benchmark(
    name="poll_idle",
    title="Azurite: an idle minute of the low-latency mode against one idle timer run (requests)",
    tier="azurite",
    run=run,
)
