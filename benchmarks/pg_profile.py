"""``python -m benchmarks.pg_profile``: where an engine drain of a PostgreSQL table spends time.

Builds the PostgreSQL tier's ``orders`` table (``benchmarks/pg_fixture.py``) in a scratch schema,
then, after one warm-up drain:

1. **Stages, without a profiler.** One drain with a ``perf_counter`` around each step of the
   engine's loop (the source's ``horizon``; the read, and within it the conversion of driver
   rows into ``Change`` objects; ``Batch`` building; the handler; the checkpoint commit) and
   the query (on the read-ahead thread while the run goes on), wrapped on the instances, and
   ``gc.callbacks`` timing every garbage collection. The wrappers cost about a microsecond
   per call, i.e. per batch, not per row.
2. **cProfile** of one drain: the top functions by own time. cProfile slows Python code far more
   than C code (the driver, the database), so read it for what is called, not for shares.
3. **The cyclic garbage collector**, timed: drains as they run by default and after
   ``gc.collect(); gc.freeze()`` (which a Functions app can do itself once at start-up),
   interleaved, best of ``--repeats``.

Every drain is a new ``SqlSource`` and ``Engine`` with a fresh ``LocalStateStore``, the no-op
handler and batch ``--batch-size``, as in ``python -m benchmarks --only pg_drain``.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks import engine_runs as runs
from benchmarks import pg_fixture as pg
from benchmarks.harness import BenchmarkSkipped, Timing, best_of, timed

#: Steps of the loop timed by :func:`staged_drain`: (label, owner, method name); the owner is
#: the "source", the "engine" or its "reader". ``read`` includes ``changes_of``; ``select`` runs
#: on the read-ahead thread for every batch after a full one, overlapping the run's own work.
STEPS: tuple[tuple[str, str, str], ...] = (
    ("source open (engine, reflection, horizon checks)", "source", "open"),
    ("health check", "source", "check"),
    ("horizon (SqlSource.horizon)", "source", "horizon"),
    ("read (BatchReader.read: waits for the read ahead)", "reader", "read"),
    ("  rows -> Change (SqlSource.changes_of)", "source", "changes_of"),
    ("Batch building (Engine._batch)", "engine", "_batch"),
    ("handler call (Engine._call_handler)", "engine", "_call_handler"),
    ("commit hand-off (Engine._delivered; waits for the one before)", "engine", "_delivered"),
    ("query (SqlSource.select; on the read-ahead thread)", "source", "select"),
)
#: Steps inside another one or off the run's thread: not added up as the run's own time.
NOT_ADDED = frozenset({"changes_of", "select"})


class GcTimer:
    """Counts and times the cyclic garbage collector's passes, by generation."""

    def __init__(self) -> None:
        self.count: Counter[int] = Counter()
        self.seconds: Counter[int] = Counter()
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            generation = int(info["generation"])
            self.count[generation] += 1
            self.seconds[generation] += time.perf_counter() - self._started

    @contextmanager
    def watching(self) -> Iterator[GcTimer]:
        gc.callbacks.append(self)
        try:
            yield self
        finally:
            gc.callbacks.remove(self)


def _wrap(target: object, name: str, totals: Counter[str]) -> None:
    """Replace ``target.name`` (a bound method) by one that adds its wall time to ``totals``."""
    method = getattr(target, name, None)
    if method is None:  # renamed since this script was written: that stage shows as 0
        return

    def timed_method(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            totals[name] += time.perf_counter() - started

    setattr(target, name, timed_method)


def staged_drain(
    db: pg.OrdersTable, state: Path, batch_size: int, horizon: pg.Horizon
) -> tuple[float, Counter[str], GcTimer]:
    """One drain with every step of :data:`STEPS` timed; (total seconds, per step, gc)."""
    engine, source = runs.make_engine(
        db, runs.fresh_local_store(state), batch_size, horizon=horizon
    )
    totals: Counter[str] = Counter()
    owners = {"source": source, "engine": engine, "reader": engine._reader}
    for _, owner, name in STEPS:
        _wrap(owners[owner], name, totals)
    collector = GcTimer()
    try:
        with collector.watching():
            started = time.perf_counter()
            runs.drained(engine.run({}), db)
            seconds = time.perf_counter() - started
    finally:
        source.close()
    return seconds, totals, collector


def print_stages(seconds: float, totals: Counter[str], collector: GcTimer, rows: int) -> None:
    def line(label: str, spent: float) -> None:
        print(
            f"  {label:<52} {spent * 1000:9.1f} ms {spent / rows * 1e6:7.2f} µs/row "
            f"{100 * spent / seconds:5.1f} %"
        )

    print(f"Stages of one drain, no profiler ({rows:,} rows, {rows / seconds:,.0f} rows/s):")
    line("whole run (Engine.run)", seconds)
    for label, _, name in STEPS:
        if name == "select":
            accounted = sum(totals[name] for _, _, name in STEPS if name not in NOT_ADDED)
            line("the rest (lease, fence, loop, release)", seconds - accounted)
        line(label, totals[name])
    gc_total = sum(collector.seconds.values())
    passes = ", ".join(
        f"gen{g}: {collector.count[g]} in {collector.seconds[g] * 1000:.0f} ms"
        for g in sorted(collector.count)
    )
    line("garbage collection, inside the stages above", gc_total)
    print(f"    ({passes})")


def profiled_drain(db: pg.OrdersTable, state: Path, batch_size: int, horizon: pg.Horizon) -> Any:
    profiler = cProfile.Profile()
    store = runs.fresh_local_store(state)
    profiler.enable()
    runs.engine_drain(db, store, batch_size, horizon=horizon)
    profiler.disable()
    return pstats.Stats(profiler)


def gc_cost(
    db: pg.OrdersTable, root: Path, batch_size: int, horizon: pg.Horizon, repeats: int
) -> tuple[Timing, Timing]:
    """Best-of-``repeats`` drains as they are, and with everything alive frozen beforehand."""
    plain: list[tuple[int, float]] = []
    frozen: list[tuple[int, float]] = []
    drain: Callable[[], int] = runs.local_drain(db, root / "gc", batch_size, horizon=horizon)
    for i in range(repeats):
        print(f"… gc cost: drains {i + 1}/{repeats}", file=sys.stderr)
        plain.append(timed(drain))
        gc.collect()
        gc.freeze()
        try:
            frozen.append(timed(drain))
        finally:
            gc.unfreeze()
    return best_of(plain), best_of(frozen)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.pg_profile")
    parser.add_argument("--rows", type=int, default=200_000, help="table size")
    parser.add_argument("--batch-size", type=int, default=1000, help="rows per batch")
    parser.add_argument("--horizon", choices=("auto", "none"), default="auto")
    parser.add_argument("--top", type=int, default=25, help="functions to list")
    parser.add_argument(
        "--repeats", type=int, default=3, help="drains per variant for the gc timing (0: skip)"
    )
    args = parser.parse_args(argv)
    horizon: pg.Horizon = args.horizon
    try:
        with pg.scratch_schema() as server, tempfile.TemporaryDirectory() as workdir:
            root = Path(workdir)
            print(f"… building {args.rows:,} rows", file=sys.stderr)
            db = pg.build_orders(server, args.rows)
            pg.raw_scan(db, args.batch_size)
            raw = best_of([timed(lambda: pg.raw_scan(db, args.batch_size)) for _ in range(3)])
            runs.engine_drain(
                db, runs.fresh_local_store(root / "warmup"), args.batch_size, horizon=horizon
            )
            staged = staged_drain(db, root / "staged", args.batch_size, horizon)
            stats = profiled_drain(db, root / "profiled", args.batch_size, horizon)
            gc_timings = (
                gc_cost(db, root, args.batch_size, horizon, args.repeats)
                if args.repeats > 0
                else None
            )
    except BenchmarkSkipped as exc:
        print(f"skipped: {exc}", file=sys.stderr)
        return 2
    print(
        f'Engine drain of {args.rows:,} rows, batch {args.batch_size}, horizon="{horizon}"; raw '
        f"psycopg scan of the same table: {raw.rows_per_second:,.0f} rows/s "
        f"({1e6 / raw.rows_per_second:.2f} µs/row, best of 3)\n"
    )
    print_stages(*staged, args.rows)
    print()
    print("cProfile of one drain, top functions by own time:")
    stats.sort_stats("tottime").print_stats(args.top)
    if gc_timings is not None:
        plain, frozen = gc_timings
        print(f"The garbage collector (best of {plain.repeats}, no profiler):")
        print(f"  drain as it runs              {plain.rows_per_second:10,.0f} rows/s")
        print(f"  after gc.collect(); freeze()  {frozen.rows_per_second:10,.0f} rows/s")
        saved = (plain.seconds - frozen.seconds) / plain.rows * 1e6
        print(f"  difference, per row           {saved:10.2f} µs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
