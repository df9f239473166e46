"""``python -m benchmarks``: run the registered benchmarks and print their results."""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from benchmarks import pg_fixture, registry, report
from benchmarks.harness import Benchmark, BenchmarkResult, BenchmarkSkipped, Context

FULL_ROWS = 200_000
QUICK_ROWS = 20_000


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Benchmarks of azure-functions-db (measurements, never assertions).",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"small table ({QUICK_ROWS:,} rows instead of {FULL_ROWS:,})",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    parser.add_argument(
        "--only", action="append", metavar="NAME", help="run this benchmark (repeatable)"
    )
    parser.add_argument(
        "--rows",
        type=int,
        help="table size N of every tier (overrides --quick; PostgreSQL: 1,000,000, quick 100,000)",
    )
    parser.add_argument("--repeats", type=int, default=3, help="timed repetitions (best is kept)")
    parser.add_argument("--batch-size", type=int, default=1000, help="rows per batch")
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    return parser


def _run_one(benchmark: Benchmark, ctx: Context) -> tuple[BenchmarkResult, bool]:
    """Run one benchmark; a skip is a result, a crash is a result plus ``False``."""
    started = time.perf_counter()
    load_start = report.load_average()[0]
    ok = True
    try:
        result = benchmark.run(ctx)
    except BenchmarkSkipped as exc:
        result = BenchmarkResult(benchmark.name, benchmark.title, benchmark.tier, "skipped")
        result.note(str(exc))
    except Exception:  # noqa: BLE001 - report the crash, run the other benchmarks
        result = BenchmarkResult(benchmark.name, benchmark.title, benchmark.tier, "skipped")
        result.note("FAILED:\n" + traceback.format_exc())
        ok = False
    result.seconds = time.perf_counter() - started
    result.load = (load_start, report.load_average()[0])
    return result, ok


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.list:
        for benchmark in registry.ALL:
            print(f"{benchmark.name:<20} [{benchmark.tier}] {benchmark.title}")
        return 0
    try:
        chosen = registry.by_name(args.only)
    except KeyError as exc:
        print(exc.args[0], file=sys.stderr)
        return 2
    rows = args.rows or (QUICK_ROWS if args.quick else FULL_ROWS)
    if rows < 10 or args.repeats < 1 or args.batch_size < 1:
        print("--rows must be >= 10, --repeats and --batch-size >= 1", file=sys.stderr)
        return 2
    err = Console(stderr=True)
    started_at = dt.datetime.now(dt.UTC)
    load_start = report.load_average()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="afdb-bench-") as workdir:
        ctx = Context(
            rows=rows,
            repeats=args.repeats,
            batch_size=args.batch_size,
            workdir=Path(workdir),
            progress=lambda text: err.print(f"[dim]… {text}[/dim]", highlight=False),
            quick=args.quick,
        )
        # Tiers whose default N differs (PostgreSQL) follow an explicit --rows only.
        ctx.memo(pg_fixture.ROWS_MEMO, lambda: args.rows)
        outcomes = [_run_one(benchmark, ctx) for benchmark in chosen]
    results = [result for result, _ in outcomes]
    info = report.RunInfo(
        started_at=started_at,
        seconds=time.perf_counter() - started,
        load_start=load_start,
        load_end=report.load_average(),
    )
    if args.json:
        print(report.dumps(report.document(results, ctx, info)))
    else:
        out = Console()
        # Piped output would wrap at 80 columns; these tables need a little more.
        report.render(results, ctx, info, out if out.is_terminal else Console(width=120))
    err.print(f"[dim]done in {info.seconds:.1f} s[/dim]")
    return 0 if all(ok for _, ok in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
