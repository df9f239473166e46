"""``afdb validate``: check each poller of an app without running it.

For every poller: the schedule, the knobs and the ``%SETTING%`` references resolve; the source
opens (table and columns exist); a checkpoint can hold the cursor and key values, and they find
their row again; an index supports the keyset query; which horizon method ``auto`` chose and the
privileges it needs; how many rows have a NULL cursor; a table Azure's MySQL trigger watched
(:mod:`.validate_mysql_trigger`); and the checkpoint in the poller's state store, compared with
the current source definition by the rules the engine applies (:mod:`..core.source_change`).
Read-only: it opens the source (and closes it again), reads the key of the first row, reads the
checkpoint, and never takes the lease or writes anything. The result is data
(:class:`PollerValidation`); the CLI only renders it. Levels: ``ok``, ``warning`` (the poller
runs, but see the message) and ``error`` (it cannot run, or would run wrongly, until fixed).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import sqlalchemy as sa

from azure_functions_db.core.checkpoint import Checkpoint, SourceDescription
from azure_functions_db.core.ports import Source
from azure_functions_db.core.position import Position
from azure_functions_db.core.settings import setting_name
from azure_functions_db.core.source_change import (
    COLUMNS_CHANGED_NOTE,
    FILTER_CHANGED_NOTE,
    source_change,
)
from azure_functions_db.errors import (
    AfdbError,
    CheckpointCorruptError,
    ConfigurationError,
    NullCursorError,
    SettingNotFoundError,
    SourceDefinitionError,
)
from azure_functions_db.ops.validate_horizon import (
    Level,
    describe_horizon,
    key_problems,
    lag_refused,
)
from azure_functions_db.ops.validate_mysql_trigger import mysql_trigger_findings
from azure_functions_db.runtime.knobs import resolve_knobs
from azure_functions_db.runtime.poller import PollerDefinition, resolve_schedule
from azure_functions_db.sources import SqlSource
from azure_functions_db.sources.health import KeysetIndex, keyset_index

__all__ = [
    "CheckpointInfo",
    "Finding",
    "HorizonInfo",
    "Level",
    "PollerValidation",
    "validate_app",
    "validate_poller",
]


@dataclass(frozen=True)
class Finding:
    """One result of one check.

    Attributes:
        check: ``schedule``, ``settings``, ``source``, ``key_types`` (a cursor or key column
            whose values a checkpoint cannot hold or the database cannot order or find again;
            reported only when there is a problem), ``index``, ``horizon``, ``null_cursor``,
            ``source_check`` (other findings of the source's own check), ``mysql_trigger``,
            ``sink``, ``state``, ``checkpoint`` or ``source_change``.
        level: ``ok``, ``warning`` or ``error``.
        message: What was found, naming the value and the fix.
        fix: A statement or command that fixes it, when there is one.
    """

    check: str
    level: Level
    message: str
    fix: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"check": self.check, "level": self.level, "message": self.message, "fix": self.fix}


@dataclass(frozen=True)
class HorizonInfo:
    """The horizon method in effect after the source opened (``auto`` resolved to a method).
    ``detail`` says why the commit-safe method is not used (empty when nothing fell back),
    without a ``lag=`` fix the source would refuse; ``privileges``: what the method needs."""

    method: str
    detail: str
    privileges: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"method": self.method, "detail": self.detail, "privileges": list(self.privileges)}


@dataclass(frozen=True)
class CheckpointInfo:
    """The poller's checkpoint as stored: ``absent``, ``present``, ``unreadable`` (corrupt), or
    ``unknown`` (the state store could not be read)."""

    state: Literal["absent", "present", "unreadable", "unknown"]
    position: Position | None = None
    fence: int | None = None
    source: SourceDescription | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "position": self.position.to_json() if self.position else None,
            "position_text": str(self.position) if self.position else None,
            "fence": self.fence,
            "source": self.source.to_json() if self.source else None,
        }


@dataclass(frozen=True)
class PollerValidation:
    """Everything ``afdb validate`` found for one poller."""

    poller: str
    namespace: str
    source: SourceDescription
    store: str | None
    findings: tuple[Finding, ...]
    horizon: HorizonInfo | None = None
    index_ok: bool | None = None
    null_cursor_rows: int | None = None
    checkpoint: CheckpointInfo = field(default_factory=lambda: CheckpointInfo("unknown"))

    @property
    def errors(self) -> int:
        return sum(1 for f in self.findings if f.level == "error")

    @property
    def warnings(self) -> int:
        return sum(1 for f in self.findings if f.level == "warning")

    @property
    def ok(self) -> bool:
        """No errors (warnings allowed)."""
        return self.errors == 0

    def to_json(self) -> dict[str, Any]:
        """A stable, JSON-ready form for scripts (keys never renamed, only added)."""
        return {
            "poller": self.poller,
            "namespace": self.namespace,
            "ok": self.ok,
            "errors": self.errors,
            "warnings": self.warnings,
            "source": self.source.to_json(),
            "store": self.store,
            "horizon": self.horizon.to_json() if self.horizon else None,
            "index_ok": self.index_ok,
            "null_cursor_rows": self.null_cursor_rows,
            "checkpoint": self.checkpoint.to_json(),
            "findings": [f.to_json() for f in self.findings],
        }


def validate_app(
    app: str,
    settings: Mapping[str, str] | None = None,
    pollers: Sequence[str] | None = None,
) -> list[PollerValidation]:
    """Validate the pollers of ``app`` (a path or ``module[:attr]``, as ``afdb run`` takes it).

    The app is loaded without the decorators' source checks, so a missing table is reported per
    poller instead of stopping the import. ``settings`` default to the environment; ``pollers``
    selects by name (a sharded poller's: its shards). Raises ``ConfigurationError`` when the app
    cannot be loaded or a name is not one of its pollers."""
    from azure_functions_db.runtime.loader import load_pollers
    from azure_functions_db.runtime.poller import with_shards

    env = dict(os.environ) if settings is None else settings  # keeps CommandSettings.sources
    found = load_pollers(app)
    names = with_shards(found, pollers or found)
    unknown = [name for name in names if name not in found]
    if unknown:
        raise ConfigurationError(
            f"Unknown poller `{unknown[0]}` in `{app}`; defined: {', '.join(sorted(found))}"
        )
    return [validate_poller(found[name], env, app=app) for name in names]


def validate_poller(
    definition: PollerDefinition, settings: Mapping[str, str], *, app: str = "APP"
) -> PollerValidation:
    """Check one poller; never raises for what it checks (problems become findings).

    ``app`` is how the poller's app is named in suggested commands (``afdb seek APP ...``).
    The source is opened and closed again; do not validate a poller that is running in this
    process.
    """
    check = _Validation(definition, settings, app)
    check.schedule()
    check.knobs()
    if check.open_source():
        try:
            check.key_types()
            check.key_order()
            check.index()
            check.horizon()
            check.source_health()
            for found in mysql_trigger_findings(definition.source, app, definition.name):
                check.add("mysql_trigger", *found)
        finally:
            definition.source.close()
    check.sink()
    check.checkpoint()
    return check.result()


class _Validation:
    """The checks of one poller, in order, collecting findings."""

    def __init__(self, definition: PollerDefinition, settings: Mapping[str, str], app: str):
        self.definition = definition
        self.settings = settings
        self.app = app
        self.findings: list[Finding] = []
        self.description: SourceDescription | None = None  # after a successful open
        self.horizon_info: HorizonInfo | None = None
        self.index_found: KeysetIndex | None = None
        self.null_rows: int | None = None
        self.store: str | None = None
        self.stored = CheckpointInfo("unknown")

    def add(self, check: str, level: Level, message: str, fix: str | None = None) -> None:
        self.findings.append(Finding(check, level, message, fix))

    @property
    def source(self) -> Source:
        return self.definition.source

    @property
    def name(self) -> str:
        return self.definition.name

    # -- configuration and source -----------------------------------------------------------

    def schedule(self) -> None:
        schedule = self.definition.schedule
        if setting_name(schedule) is None:
            return  # a literal schedule was checked when the decorator ran
        try:
            resolved = resolve_schedule(schedule, self.settings, self.name)
        except SettingNotFoundError as exc:
            self.add("settings", "error", str(exc))
        except ConfigurationError as exc:
            self.add("schedule", "error", str(exc))
        else:
            self.add("schedule", "ok", f"Schedule `{schedule}` is `{resolved}`.")

    def knobs(self) -> None:
        """The knobs read from app settings (``batch_size="%NAME%"``): set, and valid."""
        if named := self.definition.knobs:
            try:
                values = resolve_knobs(named, self.settings, self.name)
            except ConfigurationError as exc:
                missing = isinstance(exc, SettingNotFoundError)
                self.add("settings" if missing else "knobs", "error", str(exc))
                return
            shown = ", ".join(f"`{knob}` = {values[knob]:g} (`{named[knob]}`)" for knob in named)
            self.add("knobs", "ok", f"Knobs from app settings: {shown}.")

    def open_source(self) -> bool:
        try:
            self.source.open(self.settings)
        except SettingNotFoundError as exc:
            self.add("settings", "error", str(exc))
            return False
        except SourceDefinitionError as exc:
            self.add("source", "error", str(exc))
            return False
        except AfdbError as exc:
            self.add("source", "error", f"The source cannot be opened: {exc}")
            return False
        desc = self.description = self.source.description
        self.add(
            "source",
            "ok",
            f"Table `{desc.table}` exists with cursor ({', '.join(desc.cursor)}) and key "
            f"({', '.join(desc.pk)}).",
        )
        return True

    def sink(self) -> None:
        """A transactional sink opens: its settings resolve, the target is reachable, the
        position table exists or is created (as the first run would), its engine is
        transactional."""
        sink = self.definition.sink
        if sink is None:
            return
        try:
            sink.open(self.settings)
        except SettingNotFoundError as exc:
            self.add("settings", "error", str(exc))
        except AfdbError as exc:
            self.add("sink", "error", f"The sink cannot be opened: {exc}")
        else:
            self.add("sink", "ok", f"{sink.describe()} is ready.")

    def key_types(self) -> None:
        if isinstance(self.source, SqlSource):
            for problem in key_problems(self.source):
                self.add("key_types", "error", problem)

    def key_order(self) -> None:
        if not isinstance(self.source, SqlSource):
            return
        try:
            lines = self.source.describe_order()
        except AfdbError as exc:
            self.add("key_order", "warning", f"The key's collation cannot be read: {exc}")
            return
        for line in lines:
            self.add("key_order", "ok", line)

    def index(self) -> None:
        source = self.source
        if not isinstance(source, SqlSource):
            return
        cursor, pk = source.cursor_columns, source.pk_columns
        table = cursor[0].table
        try:
            with source.engine.connect() as conn:
                found = keyset_index(
                    conn,
                    table,
                    cursor=cursor,
                    pk=pk,
                    qualified=source.description.table,
                    schema=table.schema,
                    shard=source.shard_term,
                )
        except sa.exc.SQLAlchemyError as exc:
            cause = getattr(exc, "orig", None) or exc
            first = (str(cause).strip().splitlines() or [""])[0]
            self.add(
                "index",
                "error",
                f"The indexes of `{source.description.table}` cannot be read "
                f"({type(cause).__name__}): {first}",
            )
            return
        self.index_found = found
        if found.ok:
            self.add(
                "index",
                "ok",
                f"Index `{found.index}` starts with ({', '.join(found.columns)}): the keyset "
                "query can read each batch as an index range.",
            )
        else:
            self.add("index", "warning", found.warning or "", fix=found.statement)

    def horizon(self) -> None:
        try:
            horizon = self.source.horizon()
        except AfdbError as exc:
            self.add("horizon", "error", f"The horizon cannot be computed: {exc}")
            return
        source = self.source
        sql = source if isinstance(source, SqlSource) else None
        found = describe_horizon(
            horizon,
            dialect=sql.engine.dialect.name if sql else None,
            lag=sql.horizon_target().lag if sql else None,
            user=sql.engine.url.username if sql else None,
            lag_refused=lag_refused(sql) if sql else None,
        )
        self.horizon_info = HorizonInfo(horizon.method, found.detail, found.privileges)
        self.add("horizon", found.level, found.message, found.fix)

    def source_health(self) -> None:
        try:
            health = self.source.check()
        except NullCursorError as exc:
            self.null_rows = exc.count
            self.add("null_cursor", "error", str(exc))
            return
        except AfdbError as exc:
            self.add("source_check", "error", f"The source check failed: {exc}")
            return
        warnings = list(health.warnings)
        rows = self.null_rows = health.null_cursor_rows
        if rows:
            # SqlSource.check() reports NULL cursors first, naming the columns and the fix.
            message = (
                warnings.pop(0)
                if warnings and "NULL cursor" in warnings[0]
                else (f"{rows} row(s) have a NULL cursor and are never delivered.")
            )
            self.add("null_cursor", "warning", message)
        elif rows == 0:
            self.add("null_cursor", "ok", "No row has a NULL cursor.")
        already = self.index_found.warning if self.index_found else None
        for warning in warnings:
            if warning != already:
                self.add("source_check", "warning", warning)

    # -- state -------------------------------------------------------------------------------

    def checkpoint(self) -> None:
        cfg = self.definition.config
        try:
            store = self.definition.store(self.settings)
            self.store = store.describe()
            stored = store.read(cfg.key)
        except CheckpointCorruptError as exc:
            self.stored = CheckpointInfo("unreadable")
            self.add("checkpoint", "error", str(exc))
            return
        except AfdbError as exc:
            where = f"`{self.store}`" if self.store else "of this poller"
            self.add("state", "error", f"The state store {where} cannot be read: {exc}")
            return
        if stored is None:
            self.stored = CheckpointInfo("absent")
            start = (
                "records the newest row as the checkpoint and delivers only rows after it "
                '(`start="now"`)'
                if cfg.start == "now"
                else "starts from the beginning and delivers every row already in the table "
                '(`start="beginning"`; `start="now"` skips them)'
            )
            self.add(
                "checkpoint",
                "ok",
                f"No checkpoint yet in `{self.store}`: the first run {start}. Or choose the start "
                f"with `afdb seek {self.app} --poller {cfg.name} --now` or `--cursor`.",
            )
            return
        cp = stored.checkpoint
        self.stored = CheckpointInfo("present", cp.position, cp.fence, cp.source)
        unchecked = "" if self.description else " The source definition was not compared with it."
        self.add(
            "checkpoint",
            "ok",
            f"Checkpoint in `{self.store}` at position {cp.position or '(beginning)'}, fence "
            f"{cp.fence}.{unchecked}",
        )
        if self.description is not None:
            self._compare(cp)

    def _compare(self, cp: Checkpoint) -> None:
        assert self.description is not None
        change = source_change(cp.source, self.description)
        if change is None:
            return
        cfg = self.definition.config
        if change.key_changed:
            self.add(
                "source_change",
                "error",
                change.key_changed_message(cfg.name, cfg.namespace, self.app),
                fix=f"afdb seek {self.app} --poller {cfg.name} --beginning",
            )
            return
        if change.where_changed:
            self.add(
                "source_change",
                "warning",
                f"The `where` filter changed since the checkpoint was written (stored "
                f"`{change.old.where}`, now `{change.new.where}`). The next run logs "
                f"action=source_filter_changed and goes on, {FILTER_CHANGED_NOTE}. To get "
                f"them, `afdb seek {self.app} --poller {cfg.name} --cursor ...` back to before "
                "they changed.",
            )
        if change.columns_changed:
            added = ", ".join(change.columns_added) or "-"
            removed = ", ".join(change.columns_removed) or "-"
            self.add(
                "source_change",
                "warning",
                f"The columns read changed since the checkpoint was written (added: {added}; "
                f"removed: {removed}). The next run logs action=source_columns_changed and goes "
                f"on, {COLUMNS_CHANGED_NOTE}.",
            )

    def result(self) -> PollerValidation:
        cfg = self.definition.config
        return PollerValidation(
            poller=cfg.name,
            namespace=cfg.namespace,
            source=self.description or self.source.description,
            store=self.store,
            findings=tuple(self.findings),
            horizon=self.horizon_info,
            index_ok=self.index_found.ok if self.index_found else None,
            null_cursor_rows=self.null_rows,
            checkpoint=self.stored,
        )
