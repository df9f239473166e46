"""``afdb migrate mysql-trigger``: a poller takes over from Azure's MySQL trigger where it stopped.

What the trigger keeps, and how it is read, is in :mod:`.mysql_trigger_state`. The poller's
checkpoint is created (never moved: a poller that has one keeps it) at the first row whose
``az_func_updated_at`` is at or after the earliest of:

- ``LastPolledTime`` less an overlap (60 s by default). The rows stamped in the second it last
  polled come again in any case (a whole-second stamp cannot tell which of them it delivered);
  the overlap gets the poller the rows of a transaction that stamped them before the trigger's
  last poll and committed after it, which the trigger passes over, if it was open less long;
- the stamp of every row its leases table shows unfinished or given up.

It is written once the poller's commit-safe horizon is past that start: no transaction still
open may commit a row stamped below it (without a commit-safe horizon, no takeover). Everything
from there on comes to the handler; what comes again is counted and named: the rows from the
start to ``LastPolledTime``, and the rows the trigger delivered after it (its ``LastPolledTime``
stops behind a row it gave up on while it goes on delivering). Nothing in ``az_func_mysql`` is
changed: the statements that drop it are printed.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import mysql

from azure_functions_db.core.logs import log_event
from azure_functions_db.core.position import Position
from azure_functions_db.errors import ConfigurationError, SourceError
from azure_functions_db.ops import mysql_trigger_state as state
from azure_functions_db.ops.mysql_trigger_state import (
    GIVEN_UP,
    STATE_DATABASE,
    UPDATED_AT,
    Row,
    quoted,
    user_function_id,
    user_table_id,
)
from azure_functions_db.ops.seek import move_checkpoint, operator_identity
from azure_functions_db.runtime.poller import PollerDefinition
from azure_functions_db.sources import values
from azure_functions_db.sources.sqlalchemy import SqlSource

logger = logging.getLogger(__name__)

__all__ = ["Request", "Takeover", "take_over", "user_function_id", "user_table_id"]

#: Seconds before the trigger's ``LastPolledTime`` that come again by default (see ``Request``).
OVERLAP = 60.0
#: Seconds the takeover waits at most for older transactions to end, and between readings.
WAIT, HORIZON_POLL = 60.0, 0.5


@dataclass(frozen=True)
class Request:
    """How the trigger's row is found (see :func:`take_over`), how far back to start, and
    whether to write.

    ``overlap``: seconds before ``LastPolledTime`` whose rows come again. The trigger polls rows
    stamped after ``LastPolledTime`` once their transaction has committed: a transaction that
    stamped its rows before the trigger's last poll and committed after it was passed over by
    the trigger, and only an overlap as long as that transaction gets its rows to the poller.
    ``wait``: seconds to wait for transactions already open to end (see
    :func:`_wait_for_horizon`)."""

    function: str | None = None
    site: str | None = None
    function_id: str | None = None
    leases_table: str | None = None
    overlap: float = OVERLAP
    wait: float = WAIT
    dry_run: bool = False
    by: str | None = None

    def __post_init__(self) -> None:
        for name in ("overlap", "wait"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                raise ConfigurationError(
                    f"`--{name} {value}` must be a number of seconds, 0 or more (default "
                    f"{OVERLAP if name == 'overlap' else WAIT:g})."
                )


@dataclass
class Takeover:
    """What ``afdb migrate mysql-trigger`` found and did (or, dry run, would do)."""

    poller: str
    namespace: str
    function_id: str
    table_id: str
    leases_table: str
    zone: str
    last_polled: str  # GlobalState.LastPolledTime as stored (the server's default zone)
    start: Position | None = None
    start_reason: str = ""
    again: int = 0  # rows stamped from the start to LastPolledTime
    again_examples: list[tuple[Any, ...]] = field(default_factory=list)
    after: int = 0  # rows after LastPolledTime the trigger delivered (released leases)
    after_examples: list[tuple[Any, ...]] = field(default_factory=list)
    unfinished: list[Row] = field(default_factory=list)
    given_up: list[Row] = field(default_factory=list)
    existing: Position | None = None
    fence: int | None = None
    store: str = ""
    dry_run: bool = False

    @property
    def written(self) -> bool:
        return self.fence is not None and not self.dry_run

    def drop_statements(self) -> list[str]:
        """What drops the trigger's state of this function and table once the poller has
        taken over (the database too when no other trigger keeps state in it)."""
        return [
            f"DROP TABLE {STATE_DATABASE}.{quoted(self.leases_table)};",
            f"DELETE FROM {STATE_DATABASE}.GlobalState WHERE UserFunctionID = "
            f"'{self.function_id}' AND UserTableID = '{self.table_id}';",
            f"-- when GlobalState is empty: DROP DATABASE {STATE_DATABASE};",
        ]

    def lines(self) -> list[str]:
        """What ``afdb migrate mysql-trigger`` prints."""
        done = (
            "would be created (dry run: nothing written)"
            if self.dry_run
            else f"created under fence {self.fence}"
        )
        cursor = self.start.cursor[0] if self.start else None
        shown = cursor.isoformat(sep=" ") if isinstance(cursor, dt.datetime) else repr(cursor)

        def keys(count: int, examples: list[tuple[Any, ...]]) -> str:
            return f"keys {examples[:5]}{' ...' if count > len(examples[:5]) else ''}"

        lines = [
            f"{self.poller} ({self.namespace}): taking over from the MySQL trigger's function "
            f"`{self.function_id}` on table `{self.table_id}`",
            f"  the trigger's LastPolledTime: {self.last_polled} ({self.zone})",
            f"  checkpoint {done} in {self.store}: every row with {UPDATED_AT} >= {shown} "
            f"(UTC), because of {self.start_reason}",
            f"  delivered again: {self.again + self.after} row(s): {self.again} stamped from "
            "there to the trigger's LastPolledTime (it delivered them, but for the unfinished "
            f"and given-up ones below and late commits it passed over), "
            f"{keys(self.again, self.again_examples)}",
        ]
        if self.after:
            lines.append(
                f"    and {self.after} it delivered after its LastPolledTime, which stays "
                f"behind a row it gave up on, {keys(self.after, self.after_examples)}"
            )
        live = sum(r.live for r in [*self.unfinished, *self.given_up])
        if live:
            lines.append(
                f"  {live} row(s) still under a live lease: is the trigger's function stopped? "
                "While it runs it delivers them again."
            )
        for label, found in (
            ("unfinished in the trigger's leases", self.unfinished),
            ("given up by the trigger after 5 attempts (they come to the handler)", self.given_up),
        ):
            if found:
                listed = ", ".join(f"{r.pk} ({r.attempts} attempts)" for r in found[:10])
                tail = " ..." if len(found) > 10 else ""
                lines.append(f"  {label}: {len(found)}: {listed}{tail}")
        lines.append("  the trigger's state is unchanged; once the poller runs, drop it with:")
        lines.extend(f"    {statement}" for statement in self.drop_statements())
        return lines

    def to_json(self) -> dict[str, Any]:
        def rows(found: Sequence[Row]) -> list[dict[str, Any]]:
            return [
                {"pk": list(r.pk), "attempts": r.attempts, "stamped": r.stamped, "live": r.live}
                for r in found
            ]

        return {
            "poller": self.poller,
            "namespace": self.namespace,
            "function_id": self.function_id,
            "table_id": self.table_id,
            "leases_table": self.leases_table,
            "zone": self.zone,
            "last_polled": self.last_polled,
            "start": self.start.to_json() if self.start else None,
            "start_reason": self.start_reason,
            "delivered_again": self.again + self.after,
            "delivered_again_examples": [list(pk) for pk in self.again_examples],
            "delivered_after_last_polled": self.after,
            "delivered_after_last_polled_examples": [list(pk) for pk in self.after_examples],
            "unfinished": rows(self.unfinished),
            "given_up": rows(self.given_up),
            "existing": self.existing.to_json() if self.existing else None,
            "fence": self.fence,
            "store": self.store,
            "dry_run": self.dry_run,
            "written": self.written,
            "drop_statements": self.drop_statements(),
        }


def take_over(
    definition: PollerDefinition, settings: Mapping[str, str], request: Request
) -> Takeover:
    """Create the poller's checkpoint where the MySQL trigger's function stopped (see the
    module's docstring). The trigger's row is found by ``request.function_id``, or by
    ``request.function`` in the app ``request.site`` (default: the ``WEBSITE_SITE_NAME``
    setting), or as the only row of the poller's table; ``request.leases_table`` names a leases
    table the binding named. Raises ``ConfigurationError`` naming what does not fit and the
    fix."""
    source = definition.source
    cfg = definition.config
    if not isinstance(source, SqlSource):
        raise ConfigurationError(
            f"Poller `{cfg.name}` does not read a SQL table: `afdb migrate mysql-trigger` takes "
            "over a MySQL trigger's table from a poller with `SqlSource(...)` on it."
        )
    source.open(settings)
    try:
        return _take_over(definition, source, settings, request)
    finally:
        source.close()


def _take_over(
    definition: PollerDefinition, source: SqlSource, settings: Mapping[str, str], request: Request
) -> Takeover:
    cfg = definition.config
    engine = source.engine
    if engine.dialect.name not in ("mysql", "mariadb"):
        raise ConfigurationError(
            f"Poller `{cfg.name}` reads {engine.dialect.name}: the MySQL trigger runs on "
            "MySQL (Azure Database for MySQL) only."
        )
    cursor = source.cursor_columns
    if len(cursor) != 1 or cursor[0].name.lower() != UPDATED_AT:
        names = ", ".join(f"`{c.name}`" for c in cursor)
        raise ConfigurationError(
            f"Poller `{cfg.name}` has the cursor ({names}); the MySQL trigger's position is a "
            f'time in `{UPDATED_AT}`: declare `cursor="{UPDATED_AT}"` to take over from it (or '
            "start elsewhere with `afdb seek`)."
        )
    table = cursor[0].table
    if not isinstance(cursor[0].type, mysql.TIMESTAMP):
        raise ConfigurationError(
            f"`{UPDATED_AT}` of `{table.name}` is a {cursor[0].type}, not the `TIMESTAMP` the "
            "MySQL trigger asks for: the takeover reads the trigger's times as instants of a "
            "`TIMESTAMP` column only (start the poller with `afdb seek` instead)."
        )
    with engine.connect() as conn:
        database = table.schema or str(conn.execute(sa.text("SELECT DATABASE()")).scalar_one())
        table_id = user_table_id(database, table.name)
        with state.server_zone(conn) as zone:
            fid = _function_id(conn, cfg.name, table_id, request, settings)
            leases = request.leases_table or f"Leases_{fid}_{table_id}"
            polled = state.last_polled(conn, fid, table_id, cfg.name)
            found = Takeover(cfg.name, cfg.namespace, fid, table_id, leases, zone, polled)
            stuck = state.unfinished(conn, leases, table, database, cfg.name)
            for row in stuck:
                (found.given_up if row.attempts >= GIVEN_UP else found.unfinished).append(row)
            # Seconds since the epoch, from the server: the earliest wins.
            polled_epoch = state.earliest_epoch(conn, polled)
            overlap = f" less the {request.overlap:g} s overlap" if request.overlap else ""
            starts = [
                (polled_epoch - request.overlap, f"the trigger's LastPolledTime{overlap}"),
                *(
                    (
                        state.earliest_epoch(conn, row.stamped),
                        f"a row the trigger did not finish (key {row.pk})",
                    )
                    for row in stuck[:1]  # the first in the table's order
                ),
            ]
            found.after, found.after_examples = state.delivered_after(
                conn, leases, (database, table), polled_epoch, source.pk_columns
            )
        moment, reason = min(starts, key=lambda s: s[0])
        target = source.horizon_target()
        start_value = values.time_bound(
            dt.datetime.fromtimestamp(math.floor(moment), dt.UTC), target.cursor, target.zone
        )
        if start_value is None:  # pragma: no cover - a TIMESTAMP column, checked above
            raise ConfigurationError(f"`{UPDATED_AT}` is not a date-time column")
        _wait_for_horizon(source, start_value, request.wait, cfg.name)
        found.start = Position(cursor=(start_value,), pk=())
        found.start_reason = reason
        found.again, found.again_examples = _again(conn, source, math.floor(moment), polled_epoch)
    store = definition.store(settings)
    found.store = store.describe()
    stored = store.read(cfg.key)
    found.existing = stored.checkpoint.position if stored is not None else None
    if stored is not None and stored.checkpoint.position is not None:
        raise ConfigurationError(
            f"Poller `{cfg.name}` already has a checkpoint ({stored.checkpoint.position}) in "
            f"{found.store}: `afdb migrate mysql-trigger` only creates one. To move it, use "
            f"`afdb seek APP --poller {cfg.name} --cursor ...`."
        )
    if request.dry_run:
        found.dry_run = True
        return found
    who = request.by or operator_identity()
    fence, before, after = move_checkpoint(
        definition,
        store,
        found.start,
        owner=f"afdb-migrate:{who}",
        by=who,
        reason=f"taking over from the MySQL trigger ({reason})",
        unless_positioned=True,
    )
    if before is not None or after != found.start:
        raise ConfigurationError(
            f"Poller `{cfg.name}` got a checkpoint ({before}) while the takeover ran: nothing "
            "was changed. Check `afdb status` before trying again."
        )
    found.fence = fence
    log_event(
        logger,
        logging.WARNING,
        "migrated_from_mysql_trigger",
        poller=cfg.name,
        namespace=cfg.namespace,
        fence=fence,
        by=who,
        to_position=found.start,
        function_id=fid,
        table_id=table_id,
    )
    return found


def _wait_for_horizon(source: SqlSource, start: Any, wait: float, poller: str) -> None:
    """Return once the poller's horizon is at or past ``start``: no transaction still open may
    commit a row stamped below it (which neither the stopped trigger nor the poller would
    deliver). A transaction already open at the first reading holds the horizon whole until
    it ends; raises ``SourceError`` naming the one still holding it after ``wait`` seconds."""
    deadline = time.monotonic() + wait
    while True:
        horizon = source.horizon()
        if horizon.method in ("none", "lag") or horizon.fix:
            why = horizon.detail or f'the source has `horizon="{horizon.method}"`'
            fix = f" Fix: `{horizon.fix}`." if horizon.fix else ' Use `horizon="auto"`.'
            raise SourceError(
                f"Poller `{poller}`: the takeover needs the commit-safe horizon, to prove that "
                f"no transaction still open commits a row below its start; here {why}.{fix}",
                poller=poller,
            )
        # Both are values of the cursor column's own kind (``time_bound``'s): instants.
        if horizon.bound is None or not horizon.bound < start:
            return
        if time.monotonic() >= deadline:
            hold = horizon.hold
            who = f"{hold.holder}, open since {hold.since:%Y-%m-%d %H:%M:%S} UTC" if hold else ""
            raise SourceError(
                f"Poller `{poller}`: a transaction still open may commit rows stamped before "
                f"the takeover's start ({who or horizon.detail or horizon.method}); waited "
                f"{wait:g} s. Let it end (or end it) and run the takeover again, or wait longer "
                "with `--wait SECONDS`.",
                poller=poller,
            )
        time.sleep(HORIZON_POLL)


def _function_id(
    conn: sa.Connection, poller: str, table_id: str, request: Request, settings: Mapping[str, str]
) -> str:
    if request.function_id:
        return request.function_id.lower()
    if function := request.function:
        site = request.site or settings.get("WEBSITE_SITE_NAME")
        if not site:
            raise ConfigurationError(
                f"`--function {function}` needs the app's name as the trigger saw it: pass "
                "`--site NAME` (the WEBSITE_SITE_NAME of the app that ran the trigger)."
            )
        return user_function_id(site, function)
    rows = state.function_ids(conn, table_id, poller)
    if len(rows) == 1:
        return str(rows[0])
    listed = ", ".join(f"`{r}`" for r in rows) or "none"
    raise ConfigurationError(
        f"The trigger's state has {len(rows)} function(s) on this table ({listed}): name the "
        "function with `--function NAME --site APPNAME`, or its id with `--function-id ID`."
    )


def _again(
    conn: sa.Connection, source: SqlSource, start: int, until: int
) -> tuple[int, list[tuple[Any, ...]]]:
    """Rows stamped from the epoch second ``start`` to ``until`` (``LastPolledTime``)."""
    column = source.cursor_columns[0]
    keys = list(source.pk_columns)
    stamp = sa.func.unix_timestamp(column)
    where = sa.and_(stamp >= start, stamp <= until)
    count = conn.execute(sa.select(sa.func.count()).select_from(column.table).where(where))
    examples = conn.execute(
        sa.select(*keys).where(where).order_by(column, *keys).limit(state.EXAMPLES)
    ).all()
    return int(count.scalar_one()), [tuple(r) for r in examples]
