"""What ``afdb validate`` makes of a source's cursor: its horizon and its key columns.

:func:`describe_horizon` gives the horizon method in effect, the privileges it needs, and what a
fallback means for late-committing rows (SPEC §5.3). Pure: it reads only the
:class:`~azure_functions_db.core.ports.Horizon` the source returned and a few facts about the
source.
Only fixes the source accepts are suggested: ``lag=`` never for a cursor the source refuses a lag
on (:func:`lag_refused`: anything but a date or date-time), even where the source's fallback
reason offers it.

:func:`key_problems` says which cursor and key columns a poller cannot keep a position in: types
whose values a checkpoint cannot store, or the database cannot order or find again.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy.dialects import mysql, postgresql

from azure_functions_db.core.ports import Horizon
from azure_functions_db.core.position import KeyValue, decode_value, encode_value
from azure_functions_db.errors import CodecError, ConfigurationError
from azure_functions_db.sources import (
    LagHorizon,
    MssqlRowversionHorizon,
    MysqlTrxHorizon,
    PgSnapshotHorizon,
    PgXactStartHorizon,
    SqlSource,
)
from azure_functions_db.sources.keyset import bound_value, key_param
from azure_functions_db.sources.values import column_kind

__all__ = ["HorizonFinding", "Level", "describe_horizon", "key_problems", "lag_refused"]

Level = Literal["ok", "warning", "error"]

# What each commit-safe method does, and what it needs, in words (the privileges themselves come
# from the strategy, in `Horizon.privileges`).
_SAFE_METHODS: dict[str, tuple[str, str]] = {
    PgSnapshotHorizon.name: (
        "every row below the snapshot xmin (`pg_snapshot_xmin(pg_current_snapshot())`) has "
        "committed",
        "needs no privilege",
    ),
    PgXactStartHorizon.name: (
        "rows wait until every transaction that started before them has ended (oldest "
        "`xact_start` in pg_stat_activity)",
        "needs membership in `pg_read_all_stats` (or superuser), which {user} has",
    ),
    MysqlTrxHorizon.name: (
        "rows wait until every InnoDB transaction that started before them has ended (oldest "
        "`trx_started` in information_schema.innodb_trx)",
        "needs the `PROCESS` privilege, which {user} has",
    ),
    MssqlRowversionHorizon.name: (
        "every row below `MIN_ACTIVE_ROWVERSION()` has committed",
        "needs no privilege",
    ),
}
# The source's "no commit-safe horizon" reason offers `lag=` whatever the cursor; that offer (and
# a "fix:" it leaves empty) is dropped for a cursor the source refuses a lag on.
_LAG_FIX = re.compile(r"(?:,? or )?set `lag=` longer than your longest write transaction")
_EMPTY_FIX = re.compile(r";? fix:\s*$")


@dataclass(frozen=True)
class HorizonFinding:
    """The level and message of the horizon check, the privileges of the method in effect, and
    the ``GRANT`` that restores the commit-safe method after a fallback (if that is the fix)."""

    level: Level
    message: str
    privileges: tuple[str, ...]
    fix: str | None
    detail: str = ""  # ``horizon.detail``, less a ``lag=`` fix the source would refuse


def describe_horizon(
    horizon: Horizon,
    *,
    dialect: str | None,
    lag: dt.timedelta | None,
    user: str | None,
    lag_refused: str | None = None,
) -> HorizonFinding:
    """Describe ``horizon`` (from ``source.horizon()`` after ``open``) for a validation report.

    ``dialect``, ``lag`` and ``user`` (the database user) are ``None`` when the source does not
    say. A non-empty ``horizon.detail`` means ``auto`` fell back from the commit-safe method.
    ``lag_refused`` says why the source refuses ``lag=`` for this cursor (``None``: it takes one,
    or does not say); then ``lag=`` is not suggested, and the message says why.
    """
    if lag_refused:
        detail = _EMPTY_FIX.sub("", _LAG_FIX.sub("", horizon.detail))
        horizon = replace(horizon, detail=detail)
    safe = _SAFE_METHODS.get(horizon.method)
    lag_text = f"lag={lag.total_seconds():g}s" if lag else "lag=0"
    fix = horizon.fix
    if safe is not None:
        what, needs = safe
        privileges = horizon.privileges
        granted = needs.format(user=f"`{user}`" if user else "the connection")
        margin = f"; `{lag_text}` is added as a margin" if lag else ""
        message = f"Horizon `{horizon.method}` (commit-safe): {what}; {granted}{margin}."
        return HorizonFinding("ok", message, privileges, fix, horizon.detail)
    if horizon.detail:
        message = _fallback_message(horizon, lag_refused)
        return HorizonFinding("warning", message, (), fix, horizon.detail)
    if dialect == "sqlite":
        message = (
            f"Horizon `{horizon.method}` ({lag_text}): SQLite runs one writer at a time, so no "
            "row can commit below one already read; needs no privilege."
        )
        return HorizonFinding("ok", message, (), None)
    level, message = _unsafe_finding(horizon.method, lag_text, lag_refused)
    return HorizonFinding(level, message, (), None)


def _fallback_message(horizon: Horizon, lag_refused: str | None) -> str:
    """``auto`` could not use the commit-safe method; ``detail`` says why and how to fix it."""
    if horizon.method == "none" and lag_refused:
        apply = ": apply that fix" if "fix:" in horizon.detail else ""
        return (
            f"Horizon `none`: {horizon.detail}. With no commit-safe method, rows of transactions "
            f"that commit late (after rows with later cursors were read) can be missed{apply}. "
            f"`lag=` is no fix for this cursor: {lag_refused}."
        )
    if horizon.method == "none":
        return (
            f"Horizon `none`: {horizon.detail}. With lag=0 and no commit-safe method, rows of "
            "transactions that commit late (after rows with later cursors were read) can be "
            "missed: apply that fix, or set `lag=` longer than your longest write "
            "transaction."
        )
    return (
        f"Horizon `{horizon.method}`: {horizon.detail}. Rows of a transaction that stays open "
        "longer than the lag can be missed until the commit-safe method works."
    )


def _unsafe_finding(method: str, lag: str, lag_refused: str | None) -> tuple[Level, str]:
    """A method chosen on purpose (``horizon="lag"``, ``"none"``, a custom strategy)."""
    if method == "none" and lag_refused:
        return "warning", (
            "Horizon `none`: the source reads without an upper bound, so rows of transactions "
            "that commit late (after rows with later cursors were read) can be missed. Use "
            '`horizon="auto"` (the default): it uses a commit-safe method where the database '
            f"has one for the cursor. `lag=` is no fix for this cursor: {lag_refused}."
        )
    if method == "none":
        return "warning", (
            "Horizon `none`: the source reads without an upper bound, so rows of transactions "
            "that commit late (after rows with later cursors were read) can be missed. Use "
            '`horizon="auto"` (the default), or set `lag=` longer than your longest write '
            "transaction."
        )
    if method == "lag":
        return "ok", (
            f"Horizon `lag` ({lag}): rows wait that long before they are read; needs no "
            "privilege. Rows of a transaction open longer than the lag can be missed; "
            '`horizon="auto"` uses a commit-safe method where the database has one.'
        )
    return "ok", f"Horizon `{method}` (a custom strategy)."


# -- the cursor and key columns ------------------------------------------------------------------

_ROLE = {"cursor": "Cursor column", "pk": "Key column"}

# A cursor a checkpoint holds, which the database also has a commit-safe horizon for.
_CURSOR_FIX = {
    "postgresql": "a `timestamptz` column stamped with `now()`, or an `xid8` column stamped "
    "with `pg_current_xact_id()`",
    "mysql": "a `DATETIME(6)` column stamped with `NOW(6)`",
    "mariadb": "a `DATETIME(6)` column stamped with `NOW(6)`",
    "mssql": "a `rowversion` column",
}
_STORES = (
    "a checkpoint stores integers, text, numbers, date-times, dates, times without offset, "
    "UUIDs, bytes and booleans"
)
_CHARSET = re.compile(r" (?:CHARACTER SET|COLLATE) .*$")  # MySQL's text types spell them


def lag_refused(source: SqlSource) -> str | None:
    """Why ``source`` refuses ``lag=`` (its lag horizon's own check at open), ``None`` if it
    takes one: the ``lag_refused`` of :func:`describe_horizon`."""
    try:
        LagHorizon().prepare(source.horizon_target())
    except ConfigurationError:
        column = source.cursor_columns[0]
        return (
            "the source refuses it unless the cursor is a date or date-time, and "
            f"`{column.name}` is {_type_name(column, source.engine.dialect)}"
        )
    return None


def key_problems(source: SqlSource) -> list[str]:
    """Why ``source`` (open) cannot keep a position in its cursor and key columns, one message
    per problem naming the column, its type and the fix; empty when it can.

    By type first, so an empty table is judged too: a column whose Python values are not of a
    kind a checkpoint holds (``column_kind``, the map ``seek --cursor`` and the horizons use;
    JSON, arrays, ranges, intervals, times with an offset, MySQL durations). Then by the key of
    the first row in keyset order, which catches what a type does not say (a type SQLAlchemy
    does not recognize, a SQLite ``DECIMAL`` read to 10 places): the database must order the
    key columns, the codec must hold every value, and the values, decoded and bound back as the
    keyset query binds them, must find that row again (or batches after a checkpoint there
    would read rows again, or skip them). Reads one key, writes nothing.
    """
    table, dialect = source.description.table, source.engine.dialect
    key = [("cursor", c) for c in source.cursor_columns]
    key += [("pk", c) for c in source.pk_columns]
    problems = [
        f"{_subject(role, column, table, dialect)} is {why}. {_key_fix(role, dialect.name)}"
        for role, column in key
        if (why := _unstorable_type(column))
    ]
    return problems or _first_key_problems(source, key)


def _first_key_problems(source: SqlSource, key: list[tuple[str, sa.Column[Any]]]) -> list[str]:
    columns = [column for _, column in key]
    table, dialect = source.description.table, source.engine.dialect
    first = (
        sa.select(*columns)
        .where(*(column.is_not(None) for column in columns[: len(source.cursor_columns)]))
        .order_by(*columns)
        .limit(1)
    )
    try:
        with source.engine.connect() as conn:
            row = conn.execute(first).first()
            if row is None:
                return []
            values = _stored(tuple(row))
            lost = _lost(conn, columns, values)
    except _Unstorable as exc:
        role, column = key[exc.index]
        return [
            f"{_subject(role, column, table, dialect)} holds a value a checkpoint cannot store: "
            f"{exc}. The poller fails on such a row. {_key_fix(role, dialect.name)}"
        ]
    except (sa.exc.SQLAlchemyError, ValueError, TypeError) as exc:
        cause = getattr(exc, "orig", None) or exc
        first_line = (str(cause).strip().splitlines() or [""])[0]
        if _lost_connection(exc):
            return [
                f"The cursor and key values of `{table}` cannot be checked "
                f"({type(cause).__name__}): {first_line}"
            ]
        unknown = [f"`{c.name}` is {_type_name(c, dialect)}" for c in columns if not column_kind(c)]
        return [
            f"The first key of `{table}` in keyset order (ORDER BY "
            f"{', '.join(c.name for c in columns)}) cannot be read"
            f"{' (' + ', '.join(unknown) + ')' if unknown else ''}: {type(cause).__name__}: "
            f"{first_line}. Every batch reads in that order, so the cursor and key columns need "
            "types the database can order and compare and a checkpoint can store. "
            f"{_key_fix('cursor', dialect.name)}"
        ]
    return [
        f"{_subject(key[i][0], columns[i], table, dialect)} does not find its row again: the "
        f"first row's value `{row[i]!r}`, bound back into a query as a checkpoint binds it, "
        "matches no row (the database keeps it in another precision or form than it returns), "
        "so batches after such a checkpoint would read rows again or skip them. "
        f"{_key_fix(key[i][0], dialect.name)}"
        for i in lost
    ]


def _unstorable_type(column: sa.Column[Any]) -> str | None:
    """Why no value of ``column`` can be a position, judged by its type; ``None`` if values can
    be (or the type does not say, as for a type SQLAlchemy does not recognize)."""
    type_ = column.type
    try:
        python_type: type = type_.python_type
    except NotImplementedError:
        python_type = object
    read_as = None
    if column_kind(column) is None and python_type is not object:
        read_as = f"Python `{python_type.__name__}`"
    elif isinstance(type_, sa.JSON):
        read_as = "parsed JSON (`dict`, `list`, ...)"
    elif isinstance(type_, sa.types.Indexable | postgresql.ranges.AbstractRange):
        read_as = "structured Python values (containers or ranges)"
    elif isinstance(type_, sa.Time) and type_.timezone:
        read_as = "times with a UTC offset"
    if read_as is not None:
        return (
            f"read as {read_as}, which a checkpoint cannot store ({_STORES}): the poller fails "
            "on its first row"
        )
    if isinstance(type_, mysql.TIME):
        return (
            "a duration (up to 838:59:59, or negative) read as a time of day: a value outside "
            "00:00-24:00 comes back wrapped (30:00 as 06:00), so a checkpoint taken there would "
            "not match its row"
        )
    return None


def _key_fix(role: str, dialect: str) -> str:
    if role == "pk":
        return (
            "Use another key: name a unique, stable column of an integer, text, UUID or "
            "date-time type with `pk=`."
        )
    example = _CURSOR_FIX.get(dialect, "a date-time or integer column")
    return f"Use a different cursor column, e.g. {example}."


def _subject(role: str, column: sa.Column[Any], table: str, dialect: sa.Dialect) -> str:
    return f"{_ROLE[role]} `{column.name}` of `{table}` ({_type_name(column, dialect)})"


def _type_name(column: sa.Column[Any], dialect: sa.Dialect) -> str:
    """``column``'s type as the database spells it, quoted (`` `INTEGER[]` ``)."""
    if isinstance(column.type, sa.types.NullType):
        return "a type SQLAlchemy does not recognize"
    try:
        spelled = column.type.compile(dialect=dialect)
    except sa.exc.SQLAlchemyError:
        spelled = str(column.type)
    return f"`{_CHARSET.sub('', spelled)}`"


class _Unstorable(Exception):
    """A value of the ``index``-th key column that the checkpoint codec refuses."""

    def __init__(self, index: int, cause: CodecError) -> None:
        super().__init__(str(cause))
        self.index = index


def _stored(values: Sequence[Any]) -> list[KeyValue]:
    """``values`` as a checkpoint stores and returns them; ``_Unstorable`` names the first that
    it cannot."""
    stored: list[KeyValue] = []
    for i, value in enumerate(values):
        try:
            stored.append(decode_value(encode_value(value)))
        except CodecError as exc:
            raise _Unstorable(i, exc) from exc
    return stored


def _lost(conn: sa.Connection, columns: list[sa.Column[Any]], values: list[KeyValue]) -> list[int]:
    """Indexes of the columns whose value, bound back, matches no row (one query on the whole
    key, which the keyset index answers; one per column only when that finds nothing)."""
    # Bound as the keyset query binds a position (``bound_value``: in the column's own type).
    names = [key_param(i) for i in range(len(columns))]

    def found(*indexes: int) -> bool:
        matches = (columns[i] == bound_value(names[i], columns[i]) for i in indexes)
        statement = sa.select(columns[indexes[0]]).where(*matches).limit(1)
        return conn.execute(statement, {names[i]: values[i] for i in indexes}).first() is not None

    if found(*range(len(columns))):
        return []
    return [i for i in range(len(columns)) if not found(i)]


def _lost_connection(exc: Exception) -> bool:
    return isinstance(exc, sa.exc.DisconnectionError | sa.exc.TimeoutError) or (
        isinstance(exc, sa.exc.DBAPIError) and exc.connection_invalidated
    )
