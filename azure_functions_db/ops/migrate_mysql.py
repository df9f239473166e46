"""``afdb migrate mysql-trigger``: a poller takes over from Azure's MySQL trigger where it stopped.

Azure's MySQL trigger keeps its state in the user's server, in the database ``az_func_mysql``
(extension commit a28494bf, ``MySqlTriggerListener.cs`` / ``MySqlTableChangeMonitor.cs``):

- ``GlobalState``: one row per function and table, ``(UserFunctionID, UserTableID)``, whose
  ``LastPolledTime`` (a ``DATETIME`` in the server's default zone) is the highest
  ``az_func_updated_at`` of a batch it finished, moved only when nothing below it is unfinished;
  it delivers rows stamped after it;
- ``Leases_<UserFunctionID>_<UserTableID>``: the rows it leased, with ``_az_func_AttemptCount``
  (0 once delivered, 5: given up for good) and ``_az_func_SyncCompletedTime``.

The ids are the first 16 bytes of a SHA-256 as .NET prints a ``Guid`` (its first three groups
byte-reversed): of ``WEBSITE_SITE_NAME`` followed by the function's name (16 hex digits), and of
`` `database`.`table` `` (32).

The poller's checkpoint is created (never moved: a poller that has one keeps it) at the first
row whose ``az_func_updated_at`` is at or after the earliest of: ``LastPolledTime`` less an
overlap (60 s by default; the rows stamped in the second it last polled come again in any case,
as a whole-second stamp cannot tell which of them it delivered; the overlap gets the poller the
rows of transactions that stamped them before the trigger's last poll and committed after it,
which the trigger passes over), and the stamp of every row its leases table shows unfinished or
given up. It is written once the poller's horizon is past that start: no transaction still
open may commit a row stamped below it. Everything from there on comes to the handler; what
comes again is counted and named. Nothing in ``az_func_mysql`` is changed: the statements that
drop it are printed.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import logging
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from azure_functions_db.core.logs import log_event
from azure_functions_db.core.position import Position
from azure_functions_db.errors import ConfigurationError, SourceError
from azure_functions_db.ops.seek import move_checkpoint, operator_identity
from azure_functions_db.runtime.poller import PollerDefinition
from azure_functions_db.sources import values
from azure_functions_db.sources.sqlalchemy import SqlSource

logger = logging.getLogger(__name__)

STATE_DATABASE = "az_func_mysql"
UPDATED_AT = "az_func_updated_at"
#: The trigger gives a row up after this many failed attempts.
GIVEN_UP = 5
EXAMPLES = 20
#: Seconds before the trigger's ``LastPolledTime`` that come again by default (see ``Request``).
OVERLAP = 60.0
#: Seconds the takeover waits at most for older transactions to end, and between readings.
WAIT, HORIZON_POLL = 60.0, 0.5


def _dotnet_guid_hex(text: str) -> str:
    """The first 16 bytes of SHA-256(UTF-8 ``text``) as .NET's ``Guid.ToString("N")``."""
    return uuid.UUID(bytes_le=hashlib.sha256(text.encode()).digest()[:16]).hex


def user_function_id(site: str, function: str) -> str:
    """The trigger's ``UserFunctionID`` of ``function`` in the app ``site``
    (``WEBSITE_SITE_NAME``, which the extension refuses to start without)."""
    if not site:
        raise ConfigurationError(
            "The MySQL trigger's function id needs the app's WEBSITE_SITE_NAME (the extension "
            "refuses to start without it): pass the app's name."
        )
    return _dotnet_guid_hex(site + function)[:16]


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def user_table_id(database: str, table: str) -> str:
    """The trigger's ``UserTableID`` of ``table`` (as the binding names it) in ``database``."""
    return _dotnet_guid_hex(f"{_quoted(database)}.{_quoted(table)}")


@dataclass(frozen=True)
class Row:
    """A row of the user's table the trigger's leases table holds."""

    pk: tuple[Any, ...]
    attempts: int
    stamped: str  # az_func_updated_at, as the server's default zone shows it


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
    again: int = 0  # rows stamped from the start to LastPolledTime: the trigger delivered them
    again_examples: list[tuple[Any, ...]] = field(default_factory=list)
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
            f"DROP TABLE {STATE_DATABASE}.{_quoted(self.leases_table)};",
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
        more = " ..." if self.again > len(self.again_examples[:5]) else ""
        lines = [
            f"{self.poller} ({self.namespace}): taking over from the MySQL trigger's function "
            f"`{self.function_id}` on table `{self.table_id}`",
            f"  the trigger's LastPolledTime: {self.last_polled} ({self.zone})",
            f"  checkpoint {done} in {self.store}: every row with {UPDATED_AT} >= {shown} "
            f"(UTC), because of {self.start_reason}",
            f"  delivered again: {self.again} row(s) stamped up to the trigger's LastPolledTime "
            f"(it delivered or leased them), keys {self.again_examples[:5]}{more}",
        ]
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
            return [{"pk": list(r.pk), "attempts": r.attempts, "stamped": r.stamped} for r in found]

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
            "delivered_again": self.again,
            "delivered_again_examples": [list(pk) for pk in self.again_examples],
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
    with engine.connect() as conn:
        database = table.schema or str(conn.execute(sa.text("SELECT DATABASE()")).scalar_one())
        table_id = user_table_id(database, table.name)
        with _server_zone(conn) as zone:
            fid = _function_id(conn, cfg.name, table_id, request, settings)
            leases = request.leases_table or f"Leases_{fid}_{table_id}"
            last_polled, polled_epoch = _state_row(conn, fid, table_id, cfg.name)
            found = Takeover(
                cfg.name, cfg.namespace, fid, table_id, leases, zone, last_polled=last_polled
            )
            first = _read_leases(conn, found, source, database, table.name)
            # Seconds since the epoch, from the server: the earliest wins.
            overlap = f" less the {request.overlap:g} s overlap" if request.overlap else ""
            starts = [
                (
                    float(polled_epoch) - request.overlap,
                    f"the trigger's LastPolledTime {last_polled} ({zone}){overlap}",
                )
            ]
            if first is not None:
                epoch = _epoch(conn, first.stamped)
                starts.append((float(epoch), f"a row the trigger did not finish (key {first.pk})"))
        moment, reason = min(starts, key=lambda s: s[0])
        target = source.horizon_target()
        start_value = values.time_bound(
            dt.datetime.fromtimestamp(float(moment), dt.UTC), target.cursor, target.zone
        )
        if start_value is None:
            raise ConfigurationError(
                f"`{UPDATED_AT}` of `{table.name}` is not a date-time column: it is not the "
                "MySQL trigger's column."
            )
        _wait_for_horizon(source, start_value, request.wait, cfg.name)
        found.start = Position(cursor=(start_value,), pk=())
        found.start_reason = reason
        again = _again(conn, source, start_value, last_polled)
        found.again = int(again[0])
        found.again_examples = again[1]
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


@contextlib.contextmanager
def _server_zone(conn: sa.Connection) -> Iterator[str]:
    """The connection in the server's default zone (the trigger's sessions never set one, so
    its ``DATETIME`` values and comparisons are in that zone), back in UTC afterwards; yields
    the zone's name."""
    conn.execute(sa.text("SET time_zone = @@global.time_zone"))
    try:
        zone, system = conn.execute(sa.text("SELECT @@time_zone, @@system_time_zone")).one()
        yield f"SYSTEM ({system})" if str(zone).upper() == "SYSTEM" else str(zone)
    finally:
        conn.execute(sa.text("SET time_zone = '+00:00'"))


def _wait_for_horizon(source: SqlSource, start: Any, wait: float, poller: str) -> None:
    """Return once the poller's horizon is at or past ``start``: no transaction still open may
    commit a row stamped below it (which neither the stopped trigger nor the poller would
    deliver). A transaction already open at the first reading holds the horizon whole until
    it ends; raises ``SourceError`` naming the one still holding it after ``wait`` seconds."""
    deadline = time.monotonic() + wait
    while True:
        horizon = source.horizon()
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
    rows = _state_rows(conn, table_id, poller)
    if len(rows) == 1:
        return str(rows[0])
    listed = ", ".join(f"`{r}`" for r in rows) or "none"
    raise ConfigurationError(
        f"The trigger's state has {len(rows)} function(s) on this table ({listed}): name the "
        "function with `--function NAME --site APPNAME`, or its id with `--function-id ID`."
    )


def _state_rows(conn: sa.Connection, table_id: str, poller: str) -> list[str]:
    try:
        found = conn.execute(
            sa.text(
                f"SELECT UserFunctionID FROM {STATE_DATABASE}.GlobalState "
                "WHERE UserTableID = :t ORDER BY UserFunctionID"
            ),
            {"t": table_id},
        )
        return [str(r[0]) for r in found]
    except sa.exc.SQLAlchemyError as exc:
        raise _unreadable(exc, poller) from exc


def _state_row(conn: sa.Connection, fid: str, table_id: str, poller: str) -> tuple[str, Any]:
    """``LastPolledTime`` as stored (text) and as seconds since the epoch."""
    try:
        row = conn.execute(
            sa.text(
                "SELECT DATE_FORMAT(LastPolledTime, '%Y-%m-%d %H:%i:%s'), "
                f"UNIX_TIMESTAMP(LastPolledTime) FROM {STATE_DATABASE}.GlobalState "
                "WHERE UserFunctionID = :f AND UserTableID = :t"
            ),
            {"f": fid, "t": table_id},
        ).first()
    except sa.exc.SQLAlchemyError as exc:
        raise _unreadable(exc, poller) from exc
    if row is None:
        raise ConfigurationError(
            f"The MySQL trigger's state has no row for function `{fid}` and table `{table_id}` "
            f"in {STATE_DATABASE}.GlobalState: check the function's name and the app's "
            "WEBSITE_SITE_NAME (`--function`, `--site`), or pass `--function-id` (the "
            "UserFunctionID column)."
        )
    return str(row[0]), row[1]


def _unreadable(exc: sa.exc.SQLAlchemyError, poller: str) -> SourceError:
    cause = getattr(exc, "orig", None) or exc
    first = (str(cause).strip().splitlines() or [""])[0]
    return SourceError(
        f"Poller `{poller}`: the MySQL trigger's state in `{STATE_DATABASE}` cannot be read "
        f"({type(cause).__name__}: {first}). The poller's database user needs `GRANT SELECT "
        f"ON {STATE_DATABASE}.* TO <user>` for the takeover (only for it).",
        poller=poller,
    )


def _read_leases(
    conn: sa.Connection, found: Takeover, source: SqlSource, database: str, table: str
) -> Row | None:
    """The rows the trigger leased and did not finish: attempted and not delivered since their
    last change, split into unfinished ones and those given up (5 attempts); the earliest in
    the table's order, or ``None``."""
    pk = [c.name for c in source.pk_columns]
    on = " AND ".join(f"u.{_quoted(c)} = l.{_quoted(c)}" for c in pk)
    keys = ", ".join(f"l.{_quoted(c)}" for c in pk)
    statement = sa.text(
        f"SELECT {keys}, l._az_func_AttemptCount, "
        f"DATE_FORMAT(u.{UPDATED_AT}, '%Y-%m-%d %H:%i:%s') "
        f"FROM {STATE_DATABASE}.{_quoted(found.leases_table)} AS l "
        f"JOIN {_quoted(database)}.{_quoted(table)} AS u ON {on} "
        "WHERE l._az_func_AttemptCount > 0 AND (l._az_func_SyncCompletedTime IS NULL "
        f"OR l._az_func_SyncCompletedTime < u.{UPDATED_AT}) "
        f"ORDER BY u.{UPDATED_AT}, {keys}"
    )
    try:
        rows = conn.execute(statement).all()
    except sa.exc.SQLAlchemyError as exc:
        if "doesn't exist" in str(getattr(exc, "orig", exc)):
            return None  # no leases table yet: the trigger never leased a row
        raise _unreadable(exc, found.poller) from exc
    entries = [
        Row(pk=tuple(row[: len(pk)]), attempts=int(row[len(pk)]), stamped=str(row[-1]))
        for row in rows
    ]
    for entry in entries:
        (found.given_up if entry.attempts >= GIVEN_UP else found.unfinished).append(entry)
    return entries[0] if entries else None


def _epoch(conn: sa.Connection, stamped: str) -> Any:
    """A time the server's default zone shows, as seconds since the epoch (the server says)."""
    return conn.execute(sa.text("SELECT UNIX_TIMESTAMP(:s)"), {"s": stamped}).scalar_one()


def _again(
    conn: sa.Connection, source: SqlSource, start: Any, last_polled: str
) -> tuple[int, list[tuple[Any, ...]]]:
    """Rows from ``start`` to the trigger's ``LastPolledTime``: it delivered them (or holds
    them unfinished), and they come again."""
    table = source.cursor_columns[0].table
    column = source.cursor_columns[0]
    pk = list(source.pk_columns)
    with _server_zone(conn):
        until = conn.execute(sa.text("SELECT UNIX_TIMESTAMP(:s)"), {"s": last_polled}).scalar()
    where = sa.and_(column >= start, column <= sa.func.from_unixtime(until))
    count = conn.execute(sa.select(sa.func.count()).select_from(table).where(where)).scalar_one()
    examples = conn.execute(sa.select(*pk).where(where).order_by(column, *pk).limit(EXAMPLES)).all()
    return int(count), [tuple(r) for r in examples]
