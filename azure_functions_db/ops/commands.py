"""The ``afdb`` commands and their options: the argument parser the CLI (``cli.py``) runs.

Kept apart from the CLI's rendering so that ``afdb --help`` and the command reference
(``docs/configuration.md``, checked by ``tests/unit/test_cli_reference_doc.py``) have one
source. It parses; it reads nothing and prints nothing itself.
"""

from __future__ import annotations

import argparse
import importlib.metadata
from collections.abc import Callable


def _version() -> str:
    try:
        return importlib.metadata.version("afdb")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree, not installed
        return "(not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="afdb",
        description="azure-functions-db: a polling database trigger for Azure Functions "
        "(not a native trigger; at-least-once delivery, idempotent handlers).",
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "-v", "--verbose", action="count", default=0, help="more log output (-vv: debug)"
    )
    common.add_argument(
        "--settings",
        metavar="FILE",
        help="app settings (default: "
        "local.settings.json next to the app); environment variables win",
    )
    common.add_argument(
        "--state",
        choices=("local", "azure"),
        help="the state store of "
        "pollers without state=: local files or Blob Storage (sets AFDB_STATE)",
    )
    # Before the command too (`afdb -v run ...`); a separate dest, since the subcommand's
    # default would overwrite a shared one.
    parser.add_argument(
        "-v", "--verbose", dest="verbose_top", action="count", default=0, help=argparse.SUPPRESS
    )
    parser.add_argument("--version", action="version", version=f"afdb {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, help_text: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help_text, parents=[common])

    demo = add("demo", "run a sample poller on a local SQLite table")
    demo.add_argument("--dir", default=".afdb/demo", help="where the demo keeps its files")

    run = add("run", "run an app's pollers locally, without a Functions host")
    run.add_argument("app", help="function_app.py, its folder, or module[:attr]")
    run.add_argument("--once", action="store_true", help="one run of each poller, then exit")
    run.add_argument("--poller", action="append", help="only this poller (repeatable)")
    run.add_argument(
        "--json", action="store_true", help="one JSON object per run (JSON Lines) for scripts"
    )

    status = add("status", "show each poller's checkpoint and lease")
    status.add_argument("app")
    status.add_argument("--poller", action="append", help="only this poller (repeatable)")
    status.add_argument("--json", action="store_true", help="stable JSON output for scripts")

    seek = add("seek", "move a poller's checkpoint (under its lease, audited)")
    seek.add_argument("app")
    seek.add_argument("--poller", required=True)
    where = seek.add_mutually_exclusive_group(required=True)
    where.add_argument("--beginning", action="store_true", help="replay everything")
    where.add_argument("--now", action="store_true", help="skip to the latest row")
    where.add_argument(
        "--cursor", help="restart at the first row with cursor >= this value (ISO time, number)"
    )
    seek.add_argument("--reason", default="", help="recorded in the audit")
    seek.add_argument("--dry-run", action="store_true", help="show the move, write nothing")
    seek.add_argument("--json", action="store_true")

    _add_reshard(add)

    validate = add(
        "validate",
        "check each poller's source, index, horizon, NULL cursors and checkpoint (read-only)",
    )
    validate.add_argument("app")
    validate.add_argument("--poller", action="append", help="only this poller (repeatable)")
    validate.add_argument("--json", action="store_true", help="stable JSON output for scripts")

    _add_quarantine(add, common)

    _add_migrate(add, common)

    backfill = add("backfill", "replay a poller's history on Spark, then hand off to live polling")
    backfill.add_argument("app")
    backfill.add_argument("--poller", required=True)
    backfill.add_argument("--from", dest="start", help="only rows with cursor >= this value")
    backfill.add_argument("--to", dest="end", help="only rows with cursor < this value")
    backfill.add_argument("--partitions", type=int, help="most chunks (Spark tasks) to plan")
    backfill.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    backfill.add_argument("--namespace", default="backfill", help="checkpoint namespace")
    backfill.add_argument(
        "--run-id",
        help="names the run; rerun with the same id to resume (default: the poller's "
        "unfinished run, resumed, else a new one)",
    )
    backfill.add_argument(
        "--new-run", action="store_true", help="start a new run even if one is unfinished"
    )
    backfill.add_argument("--json", action="store_true", help="one JSON report for scripts")
    return parser


def _add_quarantine(
    add: Callable[[str, str], argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    quarantine = add("quarantine", "list, show, replay or drop a poller's quarantined batches")
    actions = quarantine.add_subparsers(dest="action", required=True, metavar="ACTION")
    for name, text in (
        ("list", "the poller's quarantined batches, oldest first"),
        ("show", "one record: its error, history and rows"),
        ("replay", "deliver a quarantined batch to the handler again (under the lease)"),
        ("drop", "give up on a quarantined batch (the record and its history stay)"),
    ):
        action = actions.add_parser(name, help=text, parents=[common])
        action.add_argument("app")
        action.add_argument("--poller", required=True)
        if name == "list":
            action.add_argument("--all", action="store_true", help="replayed and dropped too")
        else:
            action.add_argument("record", help="the record id (`afdb quarantine list`)")
        if name in ("replay", "drop"):
            action.add_argument("--reason", default="", help="recorded in the record's history")
        if name == "replay":
            action.add_argument("--again", action="store_true", help="replay a replayed record")
            action.add_argument("--lossy-ok", action="store_true", help="values kept as text too")
        action.add_argument("--json", action="store_true", help="stable JSON output for scripts")


def _add_reshard(add: Callable[[str, str], argparse.ArgumentParser]) -> None:
    reshard = add(
        "reshard",
        "move a poller to its new shard count (shards=, resharded_from=): no gap, no repeat",
    )
    reshard.add_argument("app")
    reshard.add_argument("--poller", required=True, help="the decorator's name=, not a shard")
    reshard.add_argument(
        "--wait", type=float, default=60.0, help="seconds to wait for a held lease (default 60)"
    )
    reshard.add_argument("--dry-run", action="store_true", help="show the plan, write nothing")
    reshard.add_argument("--json", action="store_true")


def _add_migrate(
    add: Callable[[str, str], argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    migrate = add("migrate", "take over from another trigger where it stopped")
    sources = migrate.add_subparsers(dest="action", required=True, metavar="FROM")
    mysql = sources.add_parser(
        "mysql-trigger",
        help="from Azure's MySQL trigger: create the poller's checkpoint where its function "
        "stopped (docs/migrate-from-mysql-trigger.md)",
        parents=[common],
    )
    mysql.add_argument("app")
    mysql.add_argument("--poller", required=True)
    mysql.add_argument("--function", help="the trigger's function name (with --site)")
    mysql.add_argument(
        "--site", help="the WEBSITE_SITE_NAME of the app that ran the trigger (default: setting)"
    )
    mysql.add_argument(
        "--function-id",
        "--global-state-row",
        dest="function_id",
        help="the trigger's UserFunctionID in az_func_mysql.GlobalState (instead of --function)",
    )
    mysql.add_argument("--leases-table", help="the leases table the binding named, if it did")
    mysql.add_argument(
        "--overlap",
        type=float,
        default=60.0,
        help="seconds before the trigger's LastPolledTime whose rows come again (default 60)",
    )
    mysql.add_argument(
        "--wait",
        type=float,
        default=60.0,
        help="seconds to wait for transactions already open to end (default 60)",
    )
    mysql.add_argument(
        "--dry-run",
        action="store_true",
        help="show the position and what comes again, write nothing",
    )
    mysql.add_argument("--json", action="store_true", help="stable JSON output for scripts")
