"""``python -m benchmarks.profile_engine``: where an engine drain of the SQLite table spends time.

Runs one ``Engine.run`` draining the benchmark's ``orders`` table under ``cProfile`` and prints
the share of the run spent in each stage, then the top functions by own time. cProfile slows
Python code down a lot more than C code, so read the shares, not the absolute times.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from benchmarks import sqlite_fixture as fx

#: Stages of a run: (label, file path suffix, function name), measured as cumulative time.
STAGES: tuple[tuple[str, str, str], ...] = (
    ("whole run (Engine.run)", "core/engine.py", "run"),
    ("SqlSource.open (engine, reflection)", "sources/sqlalchemy.py", "open"),
    ("health check (SqlSource.check)", "sources/sqlalchemy.py", "check"),
    ("SqlSource.fetch", "sources/sqlalchemy.py", "fetch"),
    ("  of which SQLAlchemy execute + .all()", "sqlalchemy/engine/result.py", "all"),
    ("  of which SourceRow/Position building", "sources/sqlalchemy.py", "_to_rows"),
    ("Batch building (Engine._batch)", "core/engine.py", "_batch"),
    ("  of which event_id (sha256 of JSON)", "core/batch.py", "event_id"),
    ("checkpoint commit (Engine._commit)", "core/engine.py", "_commit"),
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
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="afdb-profile-") as workdir:
        root = Path(workdir)
        db = fx.build_orders(root / "orders.db", args.rows)
        fx.engine_drain(db, root / "warmup", args.batch_size)  # import and page-cache warm-up
        profiler = cProfile.Profile()
        profiler.enable()
        fx.engine_drain(db, root / "state", args.batch_size)
        profiler.disable()
    stats = pstats.Stats(profiler)
    stages = stage_times(stats)
    whole = stages[0][1] or 1.0
    print(f"Engine drain of {args.rows:,} rows, batch {args.batch_size}, under cProfile")
    for label, seconds in stages:
        print(f"  {label:<42} {seconds:8.3f} s  {100 * seconds / whole:5.1f} %")
    print()
    stats.sort_stats("tottime").print_stats(args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
