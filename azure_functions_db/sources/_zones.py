"""Naive date-time cursors: the zone writers stamp in must be the source's ``cursor_timezone``.

A ``timestamp``/``DATETIME`` column holds wall-clock time without a zone. Writers that stamp it
with ``now()``/``NOW()`` write the wall-clock time of their session's zone, which is the
database's default unless they set another. The poller reads such a column as wall-clock time
in ``cursor_timezone`` (UTC unless configured): its lag and commit-safe horizons are computed in
that zone. If the two disagree, the horizon lies hours away from the rows it must hold back and a
late commit below the checkpoint is lost, so the source refuses to open and says which zone to
set.

The poller's own sessions are pinned to UTC (``engines.utc_sessions``); the default zone is read
as the value a new session starts with (PostgreSQL ``reset_val``, MySQL ``@@global.time_zone``).
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import mysql

from azure_functions_db.errors import SourceDefinitionError

logger = logging.getLogger(__name__)

_PG_DEFAULT = sa.text(
    "SELECT reset_val, EXTRACT(EPOCH FROM (now() AT TIME ZONE reset_val) - "
    "(now() AT TIME ZONE 'UTC'))::int FROM pg_settings WHERE name = 'TimeZone'"
)
_MYSQL_DEFAULT = sa.text(
    "SELECT @@global.time_zone, @@system_time_zone, TIMESTAMPDIFF(SECOND, UTC_TIMESTAMP(), "
    "CONVERT_TZ(UTC_TIMESTAMP(), '+00:00', @@global.time_zone))"
)


def default_zone(conn: sa.Connection) -> tuple[str, int] | None:
    """The database's default zone for new sessions and its UTC offset now, in seconds.

    ``None`` where the dialect has none (SQLite's ``CURRENT_TIMESTAMP`` is UTC) or it is not
    read (SQL Server: the server's own clock zone).
    """
    name = conn.dialect.name
    if name == "postgresql":
        zone, offset = conn.execute(_PG_DEFAULT).one()
        return str(zone), int(offset)
    if name in ("mysql", "mariadb"):
        zone, system, offset = conn.execute(_MYSQL_DEFAULT).one()
        if offset is None:  # a named zone without the server's zone tables: unknown offset
            return None
        shown = f"SYSTEM ({system})" if str(zone).upper() == "SYSTEM" else str(zone)
        return shown, int(offset)
    return None


def holds_writer_wall_clock(column: sa.Column[Any]) -> bool:
    """A date-time without a zone that holds the writers' wall-clock time.

    Not MySQL's ``TIMESTAMP``: it is stored as UTC and read in the poller's UTC session.
    """
    naive = isinstance(column.type, sa.DateTime) and not column.type.timezone
    return naive and not isinstance(column.type, mysql.TIMESTAMP)


def check_writer_zone(
    conn: sa.Connection,
    column: sa.Column[Any],
    zone: dt.tzinfo,
    qualified: str,
    now: dt.datetime,
    *,
    explicit: bool,
) -> None:
    """Refuse a naive date-time ``column`` whose database stamps in another zone than ``zone``.

    With ``cursor_timezone`` left to its default (``explicit=False``), a database whose default
    zone is not UTC is refused. A zone the user named explicitly is their statement of where
    writers stamp (they may set their sessions' zone themselves): a different database default
    is then logged as a warning, not refused.
    """
    if not holds_writer_wall_clock(column):
        return
    found = default_zone(conn)
    if found is None:
        return
    name, offset = found
    expected = now.astimezone(zone).utcoffset() or dt.timedelta()
    if int(expected.total_seconds()) == offset:
        return
    if explicit:
        logger.warning(
            "action=cursor_timezone_differs table=%s cursor=%s cursor_timezone=%s "
            "database_zone=%s note=writers_must_stamp_in_cursor_timezone",
            qualified,
            column.name,
            zone,
            name.replace(" ", "_"),
        )
        return
    hours = offset / 3600
    suggestion = f'"{name}"' if "/" in name else '"<the IANA zone of the writers>"'
    raise SourceDefinitionError(
        f"Cursor column `{column.name}` of `{qualified}` is a date-time without a time zone, "
        f"and the database's default zone is `{name}` (UTC{hours:+g} h now), but "
        f"`cursor_timezone` is `{zone}`. Writers stamping `now()` write `{name}` wall-clock "
        "time, so the horizon would be computed hours away from the rows it must hold back and "
        f"late commits would be lost. Set `cursor_timezone={suggestion}` (the zone writers "
        "stamp in), make the column zone-aware (`timestamptz`), or set the database's default "
        "zone to UTC."
    )
