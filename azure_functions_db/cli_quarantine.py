"""``afdb quarantine list|show|replay|drop``: the command line of
:mod:`azure_functions_db.ops.quarantine` (parsing and printing only)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.table import Table

from azure_functions_db.core.quarantine import QuarantineRecord, full_json, summary_json
from azure_functions_db.ops import quarantine as ops

EXIT_OK, EXIT_FAILED = 0, 1


def add_parser(add: Callable[[str, str], argparse.ArgumentParser]) -> None:
    """Add ``quarantine`` and its four actions (``add(name, help)`` makes a subcommand)."""
    quarantine = add("quarantine", "list, show, replay or drop a poller's quarantined batches")
    actions = quarantine.add_subparsers(dest="action", required=True, metavar="ACTION")

    def action(name: str, help_text: str, *, record: bool = True) -> argparse.ArgumentParser:
        parser = actions.add_parser(name, help=help_text)
        parser.add_argument("app", help="function_app.py, its folder, or module[:attr]")
        parser.add_argument("--poller", required=True)
        if record:
            parser.add_argument("record", help="the record id (`afdb quarantine list`)")
        parser.add_argument("--json", action="store_true", help="stable JSON output for scripts")
        return parser

    listing = action("list", "the poller's quarantined batches, oldest first", record=False)
    listing.add_argument("--all", action="store_true", help="replayed and dropped ones too")
    action("show", "one record: its error, history and rows")
    replay = action("replay", "deliver a quarantined batch to the handler again (under the lease)")
    replay.add_argument("--reason", default="", help="recorded in the record's history")
    replay.add_argument("--again", action="store_true", help="replay a replayed record again")
    replay.add_argument(
        "--lossy-ok", action="store_true", help="replay values the record kept only as text"
    )
    drop = action("drop", "give up on a quarantined batch (the record and its history stay)")
    drop.add_argument("--reason", default="", help="recorded in the record's history")


def run(args: argparse.Namespace, console: Console, select: Callable[..., list[Any]]) -> int:
    """Run ``afdb quarantine <action>``; ``select(app, [poller])`` loads the poller."""
    (definition,) = select(args.app, [args.poller])
    action = {"list": _list, "show": _show, "replay": _replay, "drop": _drop}[args.action]
    return action(definition, dict(os.environ), args, console)


def _list(definition: Any, settings: dict[str, str], args: Any, console: Console) -> int:
    listed = ops.list_records(definition, settings, every=args.all)
    if args.json:
        docs = [
            summary_json(e.record) if e.record else {"id": e.record_id, "error": e.error}
            for e in listed
        ]
        _json(docs)
    else:
        _print_list(console, args.poller, listed)
    return EXIT_FAILED if any(e.error for e in listed) else EXIT_OK


def _show(definition: Any, settings: dict[str, str], args: Any, console: Console) -> int:
    record = ops.show_record(definition, settings, args.record)
    if args.json:
        return _json(full_json(record))
    _print_record(console, record)
    return EXIT_OK


def _replay(definition: Any, settings: dict[str, str], args: Any, console: Console) -> int:
    record, error = ops.replay_record(
        definition,
        settings,
        args.record,
        reason=args.reason,
        again=args.again,
        lossy_ok=args.lossy_ok,
    )
    if args.json:
        doc = summary_json(record)
        doc["replay_error"] = f"{type(error).__name__}: {error}" if error else None
        _json(doc)
    elif error is None:
        console.print(f"{record.id}: {len(record)} row(s) delivered; the record is replayed")
    else:
        Console(stderr=True, highlight=False, markup=False, soft_wrap=True).print(
            f"failed: {record.id}: the handler raised {type(error).__name__}: {error}; "
            "the record stays quarantined (its history has the attempt)",
            style="red",
        )
    return EXIT_OK if error is None else EXIT_FAILED


def _drop(definition: Any, settings: dict[str, str], args: Any, console: Console) -> int:
    record = ops.drop_record(definition, settings, args.record, reason=args.reason)
    if args.json:
        return _json(summary_json(record))
    console.print(f"{record.id}: dropped ({len(record)} row(s) will not be delivered)")
    return EXIT_OK


def _json(doc: Any) -> int:
    sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    return EXIT_OK


def _print_list(console: Console, poller: str, listed: list[Any]) -> None:
    if not listed:
        console.print(f"{poller}: no quarantined batches")
        return
    table = Table(title=f"{poller}: quarantined batches")
    for column in ("id", "state", "rows", "first .. last", "quarantined at", "error", "replays"):
        table.add_column(column)
    for entry in listed:
        r = entry.record
        if r is None:
            table.add_row(entry.record_id, "UNREADABLE", "-", "-", "-", entry.error or "", "-")
            continue
        table.add_row(
            r.id,
            r.state,
            str(len(r)),
            f"{r.changes[0].position} .. {r.after}",
            r.at.isoformat(timespec="seconds"),
            r.error[:80],
            str(r.replays),
        )
    console.print(table)


def _print_record(console: Console, record: QuarantineRecord) -> None:
    console.print(f"{record.id} ({record.key}): {record.state}, {len(record)} row(s)")
    console.print(f"  error: {record.error}")
    console.print(f"  after {record.before or '(beginning)'} up to {record.after}")
    if record.lossy:
        console.print(f"  kept as text only: {', '.join(record.lossy)}", style="yellow")
    for event in record.history:
        detail = f": {event.detail}" if event.detail else ""
        console.print(
            f"  {event.at.isoformat(timespec='seconds')} {event.action} by {event.by} "
            f"(fence {event.fence}){detail}"
        )
    for doc in full_json(record)["changes"]:
        console.print(f"  {doc['op']} {doc['position']}: {json.dumps(doc['data'], default=str)}")
