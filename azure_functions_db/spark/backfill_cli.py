"""``afdb backfill``: a live progress line on stderr, then the final report (or ``--json``)."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    ProgressColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Column

from azure_functions_db.errors import ConfigurationError
from azure_functions_db.spark._apps import backfill_names, driver_definition
from azure_functions_db.spark._session import session_for
from azure_functions_db.spark.job import BackfillProgress, BackfillReport, backfill
from azure_functions_db.spark.records import unfinished_runs


def _eta(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


def run_backfill_command(args: argparse.Namespace, console: Console, stderr: Console) -> int:
    """Run the backfill the arguments describe; 0 when it finished. A sharded poller's name
    backfills each shard: every shard's run planned first (so each shard's H0 is its live
    position now, seeded at once into a shard with no checkpoint), under one run id, then run
    in turn; ``--json`` prints a list of reports (those finished, when one fails)."""
    names = backfill_names(args.app, args.poller)
    if len(names) == 1:
        report = _run_one(args, names[0], console, stderr)
        if args.json:
            sys.stdout.write(json.dumps(report.to_json(), indent=2) + "\n")
        return 0
    shards = [name for name in names if name is not None]
    args.run_id = _shared_run_id(args, shards)
    session, owned = session_for(None, args.master)  # one Spark session for every shard
    reports: list[BackfillReport] = []
    try:
        for name in shards:
            backfill(args.app, name, **_options(args), plan_only=True, spark=session)
        for name in shards:
            reports.append(_run_one(args, name, console, stderr, session))
    finally:
        if args.json:  # what finished, also when a shard failed (its error follows)
            sys.stdout.write(json.dumps([r.to_json() for r in reports], indent=2) + "\n")
        if owned:
            session.stop()
    return 0


def _shared_run_id(args: argparse.Namespace, shards: list[str]) -> str:
    """The run id every shard's backfill uses: ``--run-id``; else, unless ``--new-run``, the
    one unfinished run of the shards (resumed: a shard whose run finished is skipped); else a
    new one named by the UTC time. Refuses, before any shard runs, when shards have different
    unfinished runs, or one with ``--from``/``--to`` given (resuming would ignore them)."""
    if args.run_id is not None:
        return str(args.run_id)
    if not args.new_run:
        env = dict(os.environ if args.app_settings is None else args.app_settings)
        unfinished: dict[str, list[str]] = {}
        for name in shards:
            _, definition = driver_definition(args.app, name, env)
            for record in unfinished_runs(definition.store(env), args.namespace, name):
                unfinished.setdefault(record.run_id, []).append(name)
        found = ", ".join(f"`{r}` ({', '.join(n)})" for r, n in sorted(unfinished.items()))
        if len(unfinished) > 1 or (unfinished and (args.start, args.end) != (None, None)):
            raise ConfigurationError(
                f"Shards of `{shards[0].rpartition('.shard-')[0]}` have unfinished backfill "
                f"runs: {found}. Resume one "
                "with `--run-id ID` (its own range), or start another with `--new-run`."
            )
        if unfinished:
            (run_id,) = unfinished
            return run_id
    return dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")


def _options(args: argparse.Namespace) -> dict[str, Any]:
    """The command's options, as ``backfill()`` takes them."""
    return {
        "start": args.start,
        "end": args.end,
        "partitions": args.partitions,
        "master": args.master,
        "namespace": args.namespace,
        "run_id": args.run_id,
        "new_run": args.new_run,
        "settings": args.app_settings,  # read by cli.main before the app was imported
    }


def _run_one(
    args: argparse.Namespace,
    poller: str | None,
    console: Console,
    stderr: Console,
    spark: Any = None,
) -> BackfillReport:
    """One poller's backfill, with its progress display; its report printed unless ``--json``."""
    # Below 120 columns: one line of text that wraps, no bar; the numbers are never cut.
    if stderr.width >= 120:
        columns: tuple[ProgressColumn, ...] = (
            TextColumn("backfill {task.fields[run]}"),
            BarColumn(),
            TextColumn("{task.completed:,.0f}/{task.total:,.0f} rows"),
            TextColumn("{task.fields[chunks]} chunks"),
            TextColumn("{task.fields[rate]:,.0f} rows/s"),
            TextColumn("ETA {task.fields[eta]}"),
            TimeElapsedColumn(),
        )
    else:
        columns = (
            TextColumn(
                "backfill {task.fields[run]}: {task.completed:,.0f}/{task.total:,.0f} rows, "
                "{task.fields[chunks]} chunks, {task.fields[rate]:,.0f} rows/s, "
                "ETA {task.fields[eta]}",
                table_column=Column(overflow="fold"),
            ),
        )
    bar = Progress(*columns, console=stderr, disable=args.json or not stderr.is_terminal)
    task: list[TaskID] = []

    def show(p: BackfillProgress) -> None:
        chunks, eta = f"{p.chunks_done}/{p.chunks_total}", _eta(p.eta)
        if not task:
            task.append(
                bar.add_task(
                    "backfill",
                    total=p.rows_estimated,
                    run=p.run_id,
                    chunks=chunks,
                    rate=p.rate,
                    eta=eta,
                )
            )
        bar.update(
            task[0],
            completed=p.rows_done,
            total=p.rows_estimated,
            run=p.run_id,
            chunks=chunks,
            rate=p.rate,
            eta=eta,
        )
        if not args.json and not stderr.is_terminal and not p.final:
            # No live display (a log file, CI): one plain line per update instead.
            stderr.print(
                f"backfill {p.run_id}: {p.rows_done}/{p.rows_estimated} rows, chunks "
                f"{p.chunks_done}/{p.chunks_total}, {p.rate:,.0f} rows/s, ETA {_eta(p.eta)}"
            )

    with bar:
        report = backfill(args.app, poller, **_options(args), spark=spark, progress=show)
    if args.json:
        return report
    console.print(
        f"{report.poller}: backfill run {report.run_id} finished: {report.rows} row(s) in "
        f"{report.chunks_run} chunk(s) ({report.chunks_skipped} already finished), "
        f"{report.retries} retried task attempt(s), {report.seconds:.1f} s "
        f"({report.rate:,.0f} rows/s)",
        style="green",
    )
    console.print(
        f"  handoff H0 {report.h0 or '(empty table)'}: the backfill covered rows up to it, the "
        f"live poller delivers the rows after it"
    )
    console.print(
        f"  total over the run: {report.rows_total} row(s), {report.batches} batch(es); "
        f"state {report.store} (namespace {report.namespace})"
    )
    return report
