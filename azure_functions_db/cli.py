"""The ``afdb`` command line (also ``python -m azure_functions_db``).

Exit status: 0 success, 1 a run or operation failed, 2 bad usage or configuration, 130
``afdb run --once`` interrupted (Ctrl-C).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import signal
import sys
import threading
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

try:  # the `cli` extra: a Function App does not install it
    from rich.console import Console
    from rich.table import Table
except ImportError:  # pragma: no cover - exercised in a subprocess by the tests
    _CLI_EXTRA = False
else:
    _CLI_EXTRA = True

from azure_functions_db.errors import AfdbError, ConfigurationError, HandlerError
from azure_functions_db.ops.commands import build_parser
from azure_functions_db.runtime.local_settings import export_settings, read_settings

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report a Ctrl-C
INTERRUPTED = "interrupted; batch not acknowledged (it is delivered again on the next run)"


def main(argv: Sequence[str] | None = None) -> int:
    if not _CLI_EXTRA:
        sys.stderr.write(
            "afdb: the command line needs the `cli` extra (rich): pip install 'afdb[cli]'\n"
        )
        return EXIT_USAGE
    args = build_parser().parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose + args.verbose_top, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    if level > logging.DEBUG:
        # -v is for our own lines; the Azure SDK logs every HTTP request at INFO.
        logging.getLogger("azure").setLevel(logging.WARNING)
    for log_handler in logging.getLogger().handlers:
        # The command prints each failed run itself (`<poller>: failed: ...`): the runner's
        # `run_failed` line, meant for a host's log, would say it twice.
        log_handler.addFilter(lambda r: getattr(r, "afdb_action", None) != "run_failed")
    # No markup: error texts and row values may contain `[...]`; colour goes through style=.
    console = Console(highlight=False, soft_wrap=True, markup=False)
    try:
        handler = {
            "demo": _demo,
            "run": _run,
            "status": _status,
            "seek": _seek,
            "validate": _validate,
            "backfill": _backfill,
            "quarantine": _quarantine,
            "migrate": _migrate,
            "reshard": _reshard,
        }[args.command]
        if args.command != "demo":
            args.app_settings = export_settings(
                read_settings(getattr(args, "app", None), args.settings, state=args.state)
            )
        return handler(args, console)
    except ConfigurationError as exc:
        _stderr().print(f"error: {exc}", style="red")
        return EXIT_USAGE
    except AfdbError as exc:
        _stderr().print(f"failed: {exc}", style="red")
        return EXIT_FAILED


def _settings(args: argparse.Namespace) -> dict[str, str]:
    """What ``func start`` would read: local.settings.json (or ``--settings``), then the
    environment, then ``--state``; read once per command by :func:`main`, before the app is
    imported."""
    settings: dict[str, str] = args.app_settings
    return settings


def _quarantine(args: argparse.Namespace, console: Console) -> int:
    from azure_functions_db.core.quarantine import full_json, summary_json
    from azure_functions_db.ops import quarantine as ops

    (definition,) = _select(args, [args.poller], single=True)
    settings = _settings(args)
    store = _store_name(definition.store(settings))
    if not args.json:
        console.print(f"state: {store}")
    if args.action == "list":
        listed = ops.list_records(definition, settings, every=args.all)
        table = Table(*ops.LIST_COLUMNS, title=f"{args.poller}: quarantined batches")
        for entry in listed:
            table.add_row(*ops.list_row(entry))
        docs = [
            {**(summary_json(e.record) if e.record else vars(e)), "store": store} for e in listed
        ]
        _emit(console, args.json, docs, table if listed else f"{args.poller}: nothing quarantined")
        return EXIT_FAILED if any(e.error for e in listed) else EXIT_OK
    if args.action != "replay":
        if args.action == "show":
            record = ops.show_record(definition, settings, args.record)
            text = "\n".join(ops.describe(record))
        else:
            record = ops.drop_record(definition, settings, args.record, reason=args.reason)
            text = f"{record.id}: dropped ({len(record)} row(s) will not be delivered)"
        doc = full_json(record) if args.action == "show" else summary_json(record)
        _emit(console, args.json, {**doc, "store": store}, text)
        return EXIT_OK
    record, error = ops.replay_record(
        definition,
        settings,
        args.record,
        reason=args.reason,
        again=args.again,
        lossy_ok=args.lossy_ok,
    )
    failure = f"{type(error).__name__}: {error}" if error is not None else None
    if failure is None or args.json:
        done = f"{record.id}: {len(record)} row(s) delivered; the record is replayed"
        doc = {**summary_json(record), "replay_error": failure, "store": store}
        _emit(console, args.json, doc, done)
    else:
        _stderr().print(
            f"failed: {record.id}: the handler raised {failure}; the record stays quarantined "
            "(its history has the attempt)",
            style="red",
        )
    return EXIT_OK if error is None else EXIT_FAILED


def _store_name(store: Any) -> str:
    """The store a command uses, as ``describe()`` says; a local folder under the current one
    relative to it (``local:.afdb/state``)."""
    name = str(store.describe())
    if name.startswith("local:"):
        with contextlib.suppress(ValueError):
            return f"local:{Path(name[6:]).relative_to(Path.cwd())}"
    return name


def _emit(console: Console, as_json: bool, doc: Any, text: Any) -> None:
    """``doc`` as JSON on stdout with ``--json``, else ``text`` (a string or a rich table)."""
    if as_json:
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        console.print(text)


def _stderr() -> Console:
    # soft_wrap: long messages stay one line, so they can be grepped and copied.
    return Console(stderr=True, highlight=False, soft_wrap=True, markup=False)


def _select(
    args: argparse.Namespace, names: Sequence[str] | None, *, single: bool = False
) -> list[Any]:
    """The app's pollers ``names`` names (all without), their default state store checked
    (reachable, and not moved away from their checkpoints: :mod:`.ops.store_guard`). A sharded
    poller's name stands for its shards (not for a ``single`` poller), and the pollers a
    pending reshard retires are found by their names too (their quarantine, their status)."""
    from azure_functions_db.ops.reshard import old_definitions
    from azure_functions_db.ops.store_guard import check_default_stores
    from azure_functions_db.runtime.loader import load_pollers
    from azure_functions_db.runtime.poller import with_shards

    app = args.app
    pollers: dict[str, Any] = dict(load_pollers(app))
    retired = {}  # the pollers a pending reshard retires, by name
    for definition in list(pollers.values()):
        group = definition.group
        if group is not None and group.resharded_from is not None and group.name not in retired:
            retired[group.name] = {d.name: d for d in old_definitions(definition, group)}
    olds = {name: d for found in retired.values() for name, d in found.items()}
    wanted = list(names or ()) if single else with_shards(pollers, names or ())
    for name in wanted:
        pollers.setdefault(name, olds.get(name))  # a retired poller, or unknown (None)
    unknown = [n for n in wanted if pollers.get(n) is None]
    if unknown:
        defined = ", ".join(sorted(n for n, d in pollers.items() if d is not None))
        raise ConfigurationError(f"Unknown poller `{unknown[0]}` in `{app}`; defined: {defined}")
    selected = [pollers[n] for n in wanted] if names else list(pollers.values())
    check_default_stores(selected, _settings(args))
    return selected


def _demo(args: argparse.Namespace, console: Console) -> int:
    from azure_functions_db.ops import demo

    def show(event: demo.DemoEvent) -> None:
        if isinstance(event, demo.DemoStarted):
            console.print(f"SQLite table: {event.database}   state: {event.state}")
        elif isinstance(event, demo.DemoStep):
            console.rule(event.title)
        elif isinstance(event, demo.DemoBatch):
            table = Table(title=f"batch (attempt {event.attempt}, fence {event.fence})")
            for column in demo.BATCH_COLUMNS:
                table.add_column(column)
            for row in event.rows:
                table.add_row(*row)
            console.print(table)
        else:
            console.print(
                f"run: {event.status}, {event.batches} batch(es), {event.rows} row(s) delivered"
            )
            if not event.ok:
                console.print(
                    f"expected ids {event.expected}, delivered {event.delivered}", style="red"
                )

    result = demo.run_demo(args.dir, show)
    status = result.status
    if status is not None:
        console.rule("status")
        console.print(
            f"poller {status.poller} ({status.namespace}): position {status.position}, fence "
            f"{status.fence}, {status.batches} batch(es) / {status.rows} row(s) committed, "
            f"lease {status.lease_state}"
        )
    console.print("demo OK" if result.ok else "demo FAILED", style="green" if result.ok else "red")
    return EXIT_OK if result.ok else EXIT_FAILED


def _run(args: argparse.Namespace, console: Console) -> int:
    from azure_functions_db.core.clock import SystemClock
    from azure_functions_db.runtime.runner import RunOutcome, run_one, run_scheduled

    pollers = _select(args, args.poller)
    settings = _settings(args)
    stores = {p.name: _store_name(p.store(settings)) for p in pollers}
    for definition in pollers:
        if not args.json:
            console.print(f"{definition.name}: state {stores[definition.name]}")

    def show(outcome: RunOutcome) -> None:
        if args.json:
            sys.stdout.write(json.dumps(outcome.to_json(stores[outcome.poller])) + "\n")
            sys.stdout.flush()
            return
        if outcome.report is not None:
            r = outcome.report
            if r.status == "lease_held":
                console.print(f"{r.poller}: lease_held by {r.holder}; nothing to do this run")
            elif r.status == "held_by_horizon":
                console.print(
                    f"{r.poller}: held_by_horizon for {r.held_seconds or 0:.0f}s by {r.held_by}: "
                    f"newer rows wait for it; {r.batches} batch(es), {r.rows} row(s), "
                    f"position {r.position or '(beginning)'}",
                    style="yellow",
                )
            else:
                console.print(
                    f"{r.poller}: {r.status}, {r.batches} batch(es), {r.rows} row(s), "
                    f"position {r.position or '(beginning)'}"
                )
            if r.quarantined:
                console.print(
                    f"{r.poller}: {r.quarantined} row(s) quarantined in {len(r.records)} "
                    f"record(s): {', '.join(r.records)}",
                    style="yellow",
                )
        else:
            console.print(f"{outcome.poller}: failed: {outcome.error}", style="red")
            if outcome.error is not None:
                _show_handler_error(outcome.error, verbose=args.verbose + args.verbose_top > 0)

    if args.once:
        failures = 0
        try:
            for definition in pollers:
                outcome = run_one(definition, settings, manual=True)
                show(outcome)
                failures += 0 if outcome.ok else 1
        except KeyboardInterrupt:
            _stderr().print(INTERRUPTED, style="red")
            return EXIT_INTERRUPTED
        return EXIT_FAILED if failures else EXIT_OK
    _check_sources(pollers, settings)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    if not args.json:
        console.print(
            f"Running {len(pollers)} poller(s) on their schedules; Ctrl-C to stop.", style="bold"
        )
    try:
        failures = run_scheduled(pollers, settings, SystemClock(), stop=stop, on_outcome=show)
    except KeyboardInterrupt:
        _stderr().print(INTERRUPTED, style="red")
        return EXIT_OK
    return EXIT_FAILED if failures else EXIT_OK


def _check_sources(pollers: Sequence[Any], settings: dict[str, str]) -> None:
    """Open each poller's source once before the schedule starts, so a missing table or column
    is reported now rather than at that poller's first tick (importing the app checks nothing).
    A poller that fails here stays scheduled, and its runs report the error; the others run."""
    for definition in pollers:
        try:
            definition.source.open(settings)
        except AfdbError as exc:
            _stderr().print(f"{definition.name}: cannot run yet: {exc}", style="red")


def _show_handler_error(error: AfdbError, *, verbose: bool) -> None:
    """What the handler raised, under the run's failure line; its traceback with ``-v``."""
    cause = error.__cause__
    if not isinstance(error, HandlerError) or cause is None:
        return
    err = _stderr()
    err.print(f"  handler raised {type(cause).__name__}: {cause}", style="red")
    if verbose:
        err.print("".join(traceback.format_exception(cause)).rstrip())
    else:
        err.print("  (-v shows the traceback)")


def _status(args: argparse.Namespace, console: Console) -> int:
    from azure_functions_db.ops.status import (
        STATUS_COLUMNS,
        WIDE,
        backfill_statuses,
        group_notes,
        poller_status,
        status_cells,
        status_notes,
    )

    settings = _settings(args)
    statuses, selected = [], _select(args, args.poller)
    for definition in selected:
        statuses.append(poller_status(definition, settings))
        statuses.extend(backfill_statuses(definition, settings))
    if args.json:
        sys.stdout.write(json.dumps([s.to_json() for s in statuses], indent=2) + "\n")
    elif console.is_terminal and console.width >= WIDE:
        table = Table(title="azure-functions-db pollers")
        for column in STATUS_COLUMNS:
            table.add_column(column)
        for s in statuses:
            table.add_row(s.poller, *status_cells(s)[1:])
        console.print(table)
    else:  # narrow or piped: one block per poller, every value whole (wrapped, never cut)
        for s in statuses:
            console.print(f"{s.poller} ({s.namespace})", style="bold")
            for column, value in zip(STATUS_COLUMNS[2:], status_cells(s)[2:], strict=True):
                console.print(f"  {column + ':':<13} {value}")
    if not args.json:
        notes = [note for s in statuses for note in status_notes(s, args.app)]
        for text, style in [*notes, *group_notes(selected, statuses)]:
            console.print(text, style=style)
        if statuses:
            console.print(f"state: {statuses[0].store}")
    stalled = any(s.health is not None and s.health.state == "stalled" for s in statuses)
    return EXIT_FAILED if stalled or any(s.error for s in statuses) else EXIT_OK


def _seek(args: argparse.Namespace, console: Console) -> int:
    from azure_functions_db.ops.seek import SeekTarget, seek

    (definition,) = _select(args, [args.poller], single=True)
    settings = _settings(args)
    cursor = None
    target: SeekTarget = "beginning"
    if args.now:
        target = "now"
    elif args.cursor is not None:
        target = "cursor"
        definition.source.open(settings)
        cursor = definition.source.parse_cursor(args.cursor)
    result = seek(
        definition, settings, target, cursor=cursor, reason=args.reason, dry_run=args.dry_run
    )
    if args.json:
        doc = {
            "poller": result.poller,
            "namespace": result.namespace,
            "from": result.from_position.to_json() if result.from_position else None,
            "to": result.to_position.to_json() if result.to_position else None,
            "fence": result.fence,
            "by": result.by,
            "store": result.store,
            "dry_run": result.dry_run,
        }
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        moved = "would move (dry run, nothing written)" if result.dry_run else "moved"
        console.print(
            f"{result.poller} ({result.namespace}) in {result.store}: {moved} from "
            f"{result.from_position or '(beginning)'} to {result.to_position or '(beginning)'} "
            f"under fence {result.fence}, by {result.by}"
        )
    return EXIT_OK


def _migrate(args: argparse.Namespace, console: Console) -> int:
    from azure_functions_db.ops.migrate_mysql import Request, take_over

    (definition,) = _select(args, [args.poller], single=True)
    request = Request(
        function=args.function,
        site=args.site,
        function_id=args.function_id,
        leases_table=args.leases_table,
        overlap=args.overlap,
        wait=args.wait,
        dry_run=args.dry_run,
    )
    found = take_over(definition, _settings(args), request)
    if args.json:
        sys.stdout.write(json.dumps(found.to_json(), indent=2, default=str) + "\n")
        return EXIT_OK
    for line in found.lines():
        console.print(line)
    return EXIT_OK


def _reshard(args: argparse.Namespace, console: Console) -> int:
    from azure_functions_db.ops.reshard import group_of, reshard
    from azure_functions_db.ops.store_guard import check_default_stores
    from azure_functions_db.runtime.loader import load_pollers

    pollers = group_of(load_pollers(args.app), args.poller)
    check_default_stores(pollers, _settings(args))
    say = None if args.json else console.print
    result = reshard(pollers, _settings(args), wait=args.wait, dry_run=args.dry_run, progress=say)
    if args.json:
        sys.stdout.write(json.dumps(result.to_json(), indent=2) + "\n")
    for line in [] if args.json else result.lines():
        console.print(line)
    return EXIT_OK


_LEVEL_STYLE = {"ok": "green", "warning": "yellow", "error": "red"}


def _validate(args: argparse.Namespace, console: Console) -> int:
    from azure_functions_db.ops.validate import validate_app

    # The report shows every finding; the library's own WARNING lines (NULL cursors, missing
    # index, horizon fallback) would only repeat them on stderr. `-v` shows them too.
    library = logging.getLogger("azure_functions_db")
    previous = library.level
    if args.verbose + args.verbose_top == 0:
        library.setLevel(logging.ERROR)
    try:
        results = validate_app(args.app, _settings(args), args.poller)
    finally:
        library.setLevel(previous)
    if args.json:
        sys.stdout.write(json.dumps([r.to_json() for r in results], indent=2) + "\n")
    else:
        for r in results:
            console.print(
                f"{r.poller} (namespace {r.namespace}, table {r.source.table}): "
                f"{r.errors} error(s), {r.warnings} warning(s)",
                style="bold",
            )
            for finding in r.findings:
                label = finding.level.upper()
                console.print(
                    f"  {label:<8}{finding.check}: {finding.message}",
                    style=_LEVEL_STYLE[finding.level],
                )
                if finding.fix:
                    console.print(f"  {'':<8}fix: {finding.fix}")
            console.print()
        errors = sum(r.errors for r in results)
        warnings = sum(r.warnings for r in results)
        console.print(
            f"{len(results)} poller(s): {errors} error(s), {warnings} warning(s)",
            style="red" if errors else "yellow" if warnings else "green",
        )
    return EXIT_FAILED if any(not r.ok for r in results) else EXIT_OK


def _backfill(args: argparse.Namespace, console: Console) -> int:
    from azure_functions_db.spark.backfill_cli import run_backfill_command

    return run_backfill_command(args, console, _stderr())


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
