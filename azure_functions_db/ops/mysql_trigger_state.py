"""What Azure's MySQL trigger keeps in the user's server, read the way the trigger reads it.

The state (extension commit a28494bf, ``MySqlTriggerListener.cs``, ``MySqlTableChangeMonitor.cs``)
lives in the database ``az_func_mysql``: ``GlobalState`` holds one row per function and table,
``(UserFunctionID, UserTableID)``, whose ``LastPolledTime`` is a ``DATETIME`` in the server's
default zone (the trigger's sessions never set one); ``Leases_<UserFunctionID>_<UserTableID>``
(or the name the binding gave) holds the rows it leased, keyed by the table's primary key, with
``_az_func_AttemptCount`` (0 once delivered, 5: given up for good),
``_az_func_LeaseExpirationTime`` and ``_az_func_SyncCompletedTime``. The ids are the first 16
bytes of a SHA-256 as .NET prints a ``Guid`` (its first three groups byte-reversed): of
``WEBSITE_SITE_NAME`` followed by the function's name (16 hex digits), and of
`` `database`.`table` `` (32).

Every wall time of the trigger is read in a session in the server's default zone
(:func:`server_zone`) and turned into seconds since the epoch by the server; a wall time the
clocks went through twice (the hour they go back) is taken at its earlier instant
(:func:`earliest_epoch`), so a takeover never starts later than the trigger stopped.
"""

from __future__ import annotations

import contextlib
import hashlib
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from azure_functions_db.errors import ConfigurationError, SourceError

STATE_DATABASE = "az_func_mysql"
UPDATED_AT = "az_func_updated_at"
#: The trigger gives a row up after this many failed attempts.
GIVEN_UP = 5
EXAMPLES = 20
WALL = "%Y-%m-%d %H:%i:%s"
#: MySQL/MariaDB error codes: a missing grant; a database or table that does not exist.
DENIED = (1044, 1142, 1143)
MISSING = (1049, 1146)
#: The shifts by which zones move their clocks back (an hour; Lord Howe Island half an hour).
CLOCK_SHIFTS = (3600, 1800)


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


def quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def user_table_id(database: str, table: str) -> str:
    """The trigger's ``UserTableID`` of ``table`` (as the binding names it) in ``database``."""
    return _dotnet_guid_hex(f"{quoted(database)}.{quoted(table)}")


@dataclass(frozen=True)
class Row:
    """A row of the user's table the trigger's leases table holds, not delivered since its
    last change: its key, attempts, stamp (as the server's zone shows it) and whether its lease
    is still live (the trigger may still be working on it)."""

    pk: tuple[Any, ...]
    attempts: int
    stamped: str
    live: bool = False


@contextlib.contextmanager
def server_zone(conn: sa.Connection) -> Iterator[str]:
    """The connection in the server's default zone (the trigger's sessions never set one, so
    its ``DATETIME`` values and comparisons are in that zone), back in UTC afterwards; yields
    the zone's name."""
    conn.execute(sa.text("SET time_zone = @@global.time_zone"))
    try:
        zone, system = conn.execute(sa.text("SELECT @@time_zone, @@system_time_zone")).one()
        if str(zone).upper() == "SYSTEM":
            yield f"SYSTEM, the server's own zone ({system} when it started)"
        else:
            yield str(zone)
    finally:
        conn.execute(sa.text("SET time_zone = '+00:00'"))


def code(exc: sa.exc.SQLAlchemyError) -> int | None:
    """The server's error code of ``exc``, if it has one."""
    args = getattr(getattr(exc, "orig", None), "args", ())
    return args[0] if args and isinstance(args[0], int) else None


def unreadable(exc: sa.exc.SQLAlchemyError, poller: str) -> SourceError:
    """The error of a failed read of the trigger's state: a missing grant names the grant."""
    cause = getattr(exc, "orig", None) or exc
    first = (str(cause).strip().splitlines() or [""])[0]
    fix = (
        f" The poller's database user needs `GRANT SELECT ON {STATE_DATABASE}.* TO <user>` for "
        "the takeover (only for it)."
        if code(exc) in DENIED
        else ""
    )
    return SourceError(
        f"Poller `{poller}`: the MySQL trigger's state in `{STATE_DATABASE}` cannot be read "
        f"({type(cause).__name__}: {first}).{fix}",
        poller=poller,
    )


def function_ids(conn: sa.Connection, table_id: str, poller: str) -> list[str]:
    """The functions whose ``GlobalState`` row names the table."""
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
        raise unreadable(exc, poller) from exc


def last_polled(conn: sa.Connection, fid: str, table_id: str, poller: str) -> str:
    """``LastPolledTime`` of the function and table, as the server's zone shows it."""
    try:
        row = conn.execute(
            sa.text(
                f"SELECT DATE_FORMAT(LastPolledTime, '{WALL}') FROM {STATE_DATABASE}.GlobalState "
                "WHERE UserFunctionID = :f AND UserTableID = :t"
            ),
            {"f": fid, "t": table_id},
        ).first()
    except sa.exc.SQLAlchemyError as exc:
        raise unreadable(exc, poller) from exc
    if row is None:
        raise ConfigurationError(
            f"The MySQL trigger's state has no row for function `{fid}` and table `{table_id}` "
            f"in {STATE_DATABASE}.GlobalState: check the function's name and the app's "
            "WEBSITE_SITE_NAME (`--function`, `--site`), or pass `--function-id` (the "
            "UserFunctionID column)."
        )
    return str(row[0])


def earliest_epoch(conn: sa.Connection, wall: str) -> int:
    """Seconds since the epoch of the wall time ``wall`` in the session's zone; of a time the
    clocks went through twice, the earlier instant (the server converts both ways)."""
    epoch = int(conn.execute(sa.text("SELECT UNIX_TIMESTAMP(:w)"), {"w": wall}).scalar_one())
    for shift in CLOCK_SHIFTS:
        again = conn.execute(
            sa.text(f"SELECT DATE_FORMAT(FROM_UNIXTIME(:e), '{WALL}')"), {"e": epoch - shift}
        ).scalar_one()
        if again == wall:
            return epoch - shift
    return epoch


def primary_key(conn: sa.Connection, database: str, table: str) -> list[str]:
    """The table's primary key columns, which the trigger's leases table copies (the poller's
    ``pk`` may be another unique key)."""
    found = sa.inspect(conn).get_pk_constraint(table, schema=database)
    columns = [str(c) for c in found.get("constrained_columns") or ()]
    if not columns:
        raise ConfigurationError(
            f"`{database}`.`{table}` has no primary key: Azure's MySQL trigger cannot have run "
            "on it (it requires one)."
        )
    return columns


def unfinished(
    conn: sa.Connection,
    leases: str,
    table: sa.Table,
    database: str,
    poller: str,
) -> list[Row]:
    """The rows the trigger leased and did not deliver since their last change, in the
    table's order (the session is in the server's zone). A leases table that is missing is an
    error: the trigger creates it with its ``GlobalState`` row, so the binding named its own."""
    pk = primary_key(conn, database, table.name)
    on = " AND ".join(f"u.{quoted(c)} = l.{quoted(c)}" for c in pk)
    keys = ", ".join(f"l.{quoted(c)}" for c in pk)
    statement = sa.text(
        f"SELECT {keys}, l._az_func_AttemptCount, DATE_FORMAT(u.{UPDATED_AT}, '{WALL}'), "
        "l._az_func_LeaseExpirationTime > CURRENT_TIMESTAMP "
        f"FROM {STATE_DATABASE}.{quoted(leases)} AS l "
        f"JOIN {quoted(database)}.{quoted(table.name)} AS u ON {on} "
        "WHERE l._az_func_AttemptCount > 0 AND (l._az_func_SyncCompletedTime IS NULL "
        f"OR l._az_func_SyncCompletedTime < u.{UPDATED_AT}) "
        f"ORDER BY u.{UPDATED_AT}, {keys}"
    )
    try:
        rows = conn.execute(statement).all()
    except sa.exc.SQLAlchemyError as exc:
        if code(exc) in MISSING:
            raise ConfigurationError(
                f"The MySQL trigger's leases table `{STATE_DATABASE}.{leases}` does not exist; "
                "the trigger creates it with its GlobalState row, so its binding named another "
                "(`leases_table_name`): pass that name with `--leases-table NAME`."
            ) from exc
        raise unreadable(exc, poller) from exc
    n = len(pk)
    return [
        Row(pk=tuple(r[:n]), attempts=int(r[n]), stamped=str(r[n + 1]), live=bool(r[n + 2]))
        for r in rows
    ]


def delivered_after(
    conn: sa.Connection,
    leases: str,
    where_: tuple[str, sa.Table],
    after: int,
    keys: Sequence[sa.Column[Any]],
) -> tuple[int, list[tuple[Any, ...]]]:
    """Rows stamped after the epoch second ``after`` that the trigger delivered since their
    last change (its released leases): its ``LastPolledTime`` stays behind a row it gave up on
    while it goes on delivering the rows after it. ``where_``: the table's database and table.
    The session is in the server's zone."""
    database, table = where_
    pk = primary_key(conn, database, table.name)
    on = " AND ".join(f"u.{quoted(c)} = l.{quoted(c)}" for c in pk)
    shown = ", ".join(f"u.{quoted(c.name)}" for c in keys)
    where = (
        f"FROM {STATE_DATABASE}.{quoted(leases)} AS l "
        f"JOIN {quoted(database)}.{quoted(table.name)} AS u ON {on} "
        "WHERE l._az_func_AttemptCount = 0 "
        f"AND l._az_func_SyncCompletedTime >= u.{UPDATED_AT} "
        f"AND UNIX_TIMESTAMP(u.{UPDATED_AT}) > :after"
    )
    count = conn.execute(sa.text(f"SELECT COUNT(*) {where}"), {"after": after}).scalar_one()
    examples = conn.execute(
        sa.text(f"SELECT {shown} {where} ORDER BY u.{UPDATED_AT}, {shown} LIMIT {EXAMPLES}"),
        {"after": after},
    ).all()
    return int(count), [tuple(r) for r in examples]
