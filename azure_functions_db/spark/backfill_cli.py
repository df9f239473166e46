"""``afdb backfill``: a live progress line on stderr, then the final report (or ``--json``)."""

from __future__ import annotations

import argparse
import json
import sys

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

from azure_functions_db.spark._apps import backfill_names
from azure_functions_db.spark.job import BackfillProgress, BackfillReport, backfill


def _eta(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


def run_backfill_command(args: argparse.Namespace, console: Console, stderr: Console) -> int:
    """Run the backfill the arguments describe (a sharded poller's name: each shard's in turn,
    one run each, ``--json`` then printing a list of reports); 0 when it finished."""
    names = backfill_names(args.app, args.poller)
    reports = [_run_one(args, name, console, stderr) for name in names]
    if args.json:
        docs = [r.to_json() for r in reports]
        sys.stdout.write(json.dumps(docs[0] if len(docs) == 1 else docs, indent=2) + "\n")
    return 0


def _run_one(
    args: argparse.Namespace, poller: str | None, console: Console, stderr: Console
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
        report = backfill(
            args.app,
            poller,
            start=args.start,
            end=args.end,
            partitions=args.partitions,
            master=args.master,
            namespace=args.namespace,
            run_id=args.run_id,
            new_run=args.new_run,
            progress=show,
            settings=args.app_settings,  # read by cli.main before the app was imported
        )
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
