"""``python -m benchmarks.profile_engine``: where an engine drain of the SQLite table spends time.

Runs one ``Engine.run`` draining the benchmark's ``orders`` table under ``cProfile`` and prints
the share of the run spent in each stage, then the top functions by own time. cProfile slows
Python code down a lot more than C code, so read the shares, not the absolute times.

The profiled run uses the benchmarks' no-op handler, which never reads ``Change.event_id``: the id
is computed lazily, on first access, so that run computes none. What a handler that reads every
id pays is measured afterwards without the profiler: drains with the no-op handler and with one
that touches ``change.event_id`` on every row, interleaved, best of ``--repeats``; the difference
is reported per row.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from benchmarks import engine_runs as runs
from benchmarks import sqlite_fixture as fx
from benchmarks.harness import Timing, best_of, timed

#: Stages of a run: (label, file path suffix, function name), measured as cumulative time.
STAGES: tuple[tuple[str, str, str], ...] = (
    ("whole run (Engine.run)", "core/engine.py", "run"),
    ("SqlSource.open (engine, reflection)", "sources/sqlalchemy.py", "open"),
    ("health check (SqlSource.check)", "sources/sqlalchemy.py", "check"),
    ("SqlSource.fetch_changes", "sources/sqlalchemy.py", "fetch_changes"),
    ("  of which the query (SqlSource._select)", "sources/sqlalchemy.py", "_select"),
    ("  of which Change/Position building", "sources/_rows.py", "changes"),
    ("    of which Position.__post_init__", "core/position.py", "__post_init__"),
    ("Batch building (Engine._batch, a Change/row)", "core/engine.py", "_batch"),
    ("event_id (lazy; the no-op handler reads none)", "core/batch.py", "event_id"),
    (
        "commit hand-off (Engine._delivered; the write is on its thread)",
        "core/engine.py",
        "_delivered",
    ),
    ("handler call (Engine._call_handler)", "core/engine.py", "_call_handler"),
)


def stage_times(stats: pstats.Stats) -> list[tuple[str, float]]:
    """Cumulative seconds of each stage in :data:`STAGES` (0 if it never ran)."""
    table = stats.stats  # type: ignore[attr-defined]  # pstats keeps its table untyped
    found: list[tuple[str, float]] = []
    for label, suffix, name in STAGES:
        seconds = sum(
            cumulative
            for (filename, _, function), (_, _, _, cumulative, _) in table.items()
            if function == name and filename.endswith(suffix)
        )
        found.append((label, seconds))
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile_engine")
    parser.add_argument("--rows", type=int, default=200_000, help="table size")
    parser.add_argument("--batch-size", type=int, default=1000, help="rows per batch")
    parser.add_argument("--top", type=int, default=20, help="functions to list")
    parser.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="drains per handler when timing event_id without the profiler (0: skip)",
    )
    args = parser.parse_args(argv)
    event_ids: tuple[Timing, Timing] | None = None
    with tempfile.TemporaryDirectory(prefix="afdb-profile-") as workdir:
        root = Path(workdir)
        db = fx.build_orders(root / "orders.db", args.rows)
        warm_up = runs.fresh_local_store(root / "warmup")
        runs.engine_drain(db, warm_up, args.batch_size)  # import and page-cache warm-up
        profiler = cProfile.Profile()
        profiler.enable()
        runs.engine_drain(db, runs.fresh_local_store(root / "state"), args.batch_size)
        profiler.disable()
        if args.repeats > 0:
            event_ids = event_id_cost(db, root, args.batch_size, args.repeats)
    stats = pstats.Stats(profiler)
    stages = stage_times(stats)
    whole = stages[0][1] or 1.0
    print(f"Engine drain of {args.rows:,} rows, batch {args.batch_size}, under cProfile")
    for label, seconds in stages:
        print(f"  {label:<46} {seconds:8.3f} s  {100 * seconds / whole:5.1f} %")
    print()
    stats.sort_stats("tottime").print_stats(args.top)
    if event_ids is not None:
        print_event_id_cost(*event_ids)
    return 0


def event_id_cost(
    db: fx.OrdersTable, root: Path, batch_size: int, repeats: int
) -> tuple[Timing, Timing]:
    """Best-of-``repeats`` drains (no profiler) with the no-op and the event-id-reading handler."""
    plain: list[tuple[int, float]] = []
    reading: list[tuple[int, float]] = []
    for i in range(repeats):
        print(f"… event_id cost: drains {i + 1}/{repeats}", file=sys.stderr)
        plain.append(timed(runs.local_drain(db, root / "plain", batch_size)))
        reading.append(timed(runs.local_drain(db, root / "ids", batch_size, runs.event_id_handler)))
    return best_of(plain), best_of(reading)


def print_event_id_cost(plain: Timing, reading: Timing) -> None:
    extra = (reading.seconds - plain.seconds) / plain.rows * 1e6
    print(f"Cost of Change.event_id, without the profiler (best of {plain.repeats}):")
    print(f"  no-op handler (reads no event_id)        {plain.rows_per_second:10,.0f} rows/s")
    print(f"  handler reading every change.event_id    {reading.rows_per_second:10,.0f} rows/s")
    print(f"  event_id, per row of a handler using it  {extra:10.2f} µs")


if __name__ == "__main__":
    sys.exit(main())
