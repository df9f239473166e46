"""Checking and resolving the options of :class:`~azure_functions_db.sources.SqlSource`.

Everything that can be checked without a database is checked at construction, with messages that
name the offending value in backticks and say how to fix it; the rest (settings, the URL, names
against the reflected table) is resolved in ``open()``.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import math
import zoneinfo
from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import mssql, mysql
from sqlalchemy.sql import visitors
from sqlalchemy.sql.elements import ColumnClause, ColumnElement, TextClause

from azure_functions_db.core.position import Position
from azure_functions_db.errors import (
    ConfigurationError,
    SourceDefinitionError,
)
from azure_functions_db.sources.keyset import RESERVED_PREFIX, KeysetQuery, text_filter
from azure_functions_db.sources.shards import Shard, shard_term
from azure_functions_db.sources.values import column_kind, python_kind

_LISTED_TABLES = 10


def check_name(value: object, option: str) -> str:
    """``value`` if it is a usable table, schema or column name."""
    if not isinstance(value, str) or not value.strip() or value != value.strip():
        raise ConfigurationError(
            f"`{option}={value!r}` is not a valid name: pass the exact {option} name as a "
            "non-empty string without surrounding spaces."
        )
    return value


def check_names(value: object, option: str) -> tuple[str, ...]:
    """One name or a non-empty list of distinct names, as a tuple."""
    if isinstance(value, str):
        if option == "columns":
            raise ConfigurationError(
                f'`columns={value!r}` must be a list of column names, e.g. `columns=["{value}"]`.'
            )
        return (check_name(value, option),)
    if not isinstance(value, Sequence) or not value:
        raise ConfigurationError(
            f"`{option}={value!r}` must be a column name or a non-empty list of column names."
        )
    names = tuple(check_name(item, option) for item in value)
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ConfigurationError(
            f"`{option}={list(names)!r}` names `{duplicates[0]}` twice: list each column once."
        )
    return names


def check_lag(value: object) -> dt.timedelta:
    """Seconds or a timedelta, zero or more, as a timedelta."""
    if isinstance(value, dt.timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise ConfigurationError(
            f"`lag={value!r}` must be a number of seconds or a `datetime.timedelta`."
        )
    if not math.isfinite(seconds) or seconds < 0:
        raise ConfigurationError(
            f"`lag={value!r}` must be zero or a positive, finite number of seconds, e.g. "
            "`lag=5` to read rows once they are 5 seconds old."
        )
    return value if isinstance(value, dt.timedelta) else dt.timedelta(seconds=seconds)


def check_zone(name: str | None) -> dt.tzinfo:
    """The IANA zone ``name``; UTC when ``None``."""
    if name is None:
        return dt.UTC
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, TypeError) as exc:
        raise ConfigurationError(
            f"`cursor_timezone={name!r}` is not a known time zone: use an IANA name such as "
            '`"UTC"` or `"Europe/Paris"`.'
        ) from exc


def where_filter(
    where: object, params: Mapping[str, Any] | None
) -> tuple[ColumnElement[bool] | TextClause | None, dict[str, Any], str | None]:
    """The filter clause, its parameter values, and its fingerprint (SQL text + param names)."""
    if params is not None and not isinstance(params, Mapping):
        raise ConfigurationError(
            f"`params` must be a mapping of names to values, got `{params!r}`."
        )
    values = dict(params or {})
    if where is None:
        if values:
            raise ConfigurationError(
                f"`params={sorted(values)}` given without `where=`: params are the values of the "
                "`:name` parameters of a `where` text."
            )
        return None, values, None
    clause: ColumnElement[bool] | TextClause
    if isinstance(where, str):
        clause = sa.text(where)
    elif isinstance(where, TextClause | ColumnElement):
        clause = where
    else:
        raise ConfigurationError(
            f"`where={where!r}` is not a filter: pass a SQLAlchemy clause such as "
            '`sa.column("status") == "paid"`, or SQL text with `:name` parameters and their '
            "values in `params=`."
        )
    binds = [b for b in visitors.iterate(clause) if isinstance(b, sa.BindParameter)]
    try:
        compiled = clause.compile()
    except sa_exc.SQLAlchemyError as exc:
        raise ConfigurationError(
            f"`where` cannot be rendered as SQL ({exc}): pass a SQLAlchemy clause or SQL text."
        ) from exc
    names = set(compiled.params)
    for name in sorted({*names, *values}):
        if name.startswith(RESERVED_PREFIX):
            raise ConfigurationError(
                f"Parameter `{name}` of `where` uses the reserved prefix `{RESERVED_PREFIX}`: "
                "rename it."
            )
    missing = sorted({str(b.key) for b in binds if b.required} - set(values))
    if missing:
        raise ConfigurationError(
            f"`where` uses the parameter `:{missing[0]}` but `params=` has no value for it: pass "
            f"`params={{{missing[0]!r}: ...}}`. Put values in params, never into the SQL text."
        )
    unknown = sorted(set(values) - names)
    if unknown:
        raise ConfigurationError(
            f"`params` has `{unknown[0]}` but `where` has no parameter `:{unknown[0]}`: fix the "
            "name in the filter or in params."
        )
    canonical = " ".join(compiled.string.split()) + "|" + ",".join(sorted(names))
    fingerprint = "sha256:" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]
    return clause, values, fingerprint


def table_column(table: sa.Table, name: str, option: str) -> sa.Column[Any]:
    """The reflected column ``name``, or an error listing the columns that exist."""
    if name in table.c:
        return table.c[name]
    existing = ", ".join(f"`{c.name}`" for c in table.columns)
    similar = [c.name for c in table.columns if c.name.lower() == name.lower()]
    hint = f" Did you mean `{similar[0]}`?" if similar else ""
    raise SourceDefinitionError(
        f"Column `{name}` (in `{option}=`) does not exist in table `{table.fullname}`.{hint} "
        f"Its columns are: {existing}."
    )


def bind_to(where: ColumnElement[bool], table: sa.Table, qualified: str) -> ColumnElement[bool]:
    """``where`` with bare ``sa.column("x")`` (or ``x`` of a same-named table) bound to ``table``.

    A clause written before the table was reflected cannot hold its columns; binding them here
    keeps the statement on one FROM (no accidental cross join) and checks every name.
    """

    def replace(element: visitors.ExternallyTraversible, **kw: Any) -> ColumnElement[Any] | None:
        if not isinstance(element, ColumnClause) or element.is_literal:
            return None
        owner = element.table
        if owner is table:
            return None
        if owner is not None and getattr(owner, "name", None) != table.name:
            return None
        if element.name not in table.c:
            existing = ", ".join(f"`{c.name}`" for c in table.columns)
            raise SourceDefinitionError(
                f"`where` of `{qualified}` uses column `{element.name}`, which the table does "
                f"not have. Its columns are: {existing}."
            )
        return table.c[element.name]

    return visitors.replacement_traverse(where, {}, replace)


def reflect_table(
    conn: sa.Connection, name: str, schema: str | None, *, primary_key: bool
) -> sa.Table:
    """The table's columns (name, type with its collation, nullability) and, when
    ``primary_key``, its primary key in the key's own order: what a source reads. One or two
    reflection queries instead of a full ``autoload`` (indexes, foreign keys, unique and check
    constraints, comments, options: eight), which cost a new worker's first run about 60 ms
    more on PostgreSQL (the primary key's query alone about 20 ms). Raises
    ``NoSuchTableError``."""
    inspector = sa.inspect(conn)
    columns = []
    for reflected in inspector.get_columns(name, schema=schema):
        column: dict[str, Any] = dict(reflected)
        options = {k: column[k] for k in ("nullable", "quote", "key") if k in column}
        computed = column.get("computed")  # a generated column (a shard's, see shards.py)
        extra = [sa.Computed(computed["sqltext"], computed.get("persisted"))] if computed else []
        columns.append(sa.Column(column["name"], column["type"], *extra, **options))
    constraints = []
    if primary_key:
        found = inspector.get_pk_constraint(name, schema=schema).get("constrained_columns")
        key = [column for column in found or () if column]
        constraints = [sa.PrimaryKeyConstraint(*key)] if key else []
    return sa.Table(name, sa.MetaData(), *columns, *constraints, schema=schema)


def missing_table(
    table: str, schema: str | None, existing: Sequence[str], url: str
) -> SourceDefinitionError:
    """The error for a table reflection did not find, listing up to ten tables that exist."""
    qualified = f"{schema}.{table}" if schema else table
    shown = ", ".join(f"`{name}`" for name in sorted(existing)[:_LISTED_TABLES])
    more = len(existing) - _LISTED_TABLES
    listing = (
        f"Tables there: {shown}{f' (and {more} more)' if more > 0 else ''}."
        if existing
        else "That database has no tables: is the URL right?"
    )
    hint = " To name a schema, pass `schema=` separately." if "." in table and not schema else ""
    return SourceDefinitionError(
        f"Table `{qualified}` does not exist in `{url}`. {listing} Fix `table=` (or `schema=`) "
        f"or the database URL.{hint}"
    )


def resolve_where(
    where: ColumnElement[bool] | TextClause | None,
    table: sa.Table,
    selected: Sequence[sa.Column[Any]],
    qualified: str,
) -> ColumnElement[bool] | None:
    """The filter bound to the reflected ``table``; a text filter in parentheses.

    Refuses a clause that reads other tables: the source reads one table, and an accidental
    cross join would multiply rows.
    """
    if where is None:
        return None
    if isinstance(where, TextClause):
        return text_filter(where)
    resolved = bind_to(where, table, qualified)
    froms = sa.select(*selected).where(resolved).get_final_froms()
    others = [str(f) for f in froms if f is not table]
    if others:
        raise SourceDefinitionError(
            f"`where` of `{qualified}` refers to other tables ({', '.join(others)}); the source "
            "reads one table. Use a correlated `sa.exists()` subquery instead."
        )
    return resolved


def check_round_trip(
    columns: Sequence[sa.Column[Any]], qualified: str, *, dialect: str = "", driver: str = ""
) -> None:
    """Refuse a cursor or key column whose values cannot be bound back exactly.

    SQL Server's ``DATETIME2(7)``, ``DATETIMEOFFSET(7)`` and ``TIME(7)`` keep 100 ns; Python's
    datetime keeps 1 us, so the position of a row at ``.1234567`` would bind back as
    ``.123456``, select no row with ``=`` and never exclude its own row with ``>``. MariaDB
    Connector/ODBC (``mysql+pyodbc``) binds every date-time without its fraction, so a
    ``DATETIME(n)``/``TIMESTAMP(n)``/``TIME(n)`` position would re-read its own row for ever; and
    it binds a Python UUID as a binary GUID that MariaDB's ``UUID`` never equals (rows skipped).
    """
    if dialect == "mysql" and driver == "pyodbc":
        for column in columns:
            fsp = getattr(column.type, "fsp", None)
            if isinstance(column.type, mysql.DATETIME | mysql.TIMESTAMP | mysql.TIME) and fsp:
                raise SourceDefinitionError(
                    f"Column `{column.name}` of `{qualified}` is `{column.type}`, and MariaDB "
                    "Connector/ODBC (`mysql+pyodbc`) binds date-times without their fractional "
                    "seconds: a position could not select its own row. Use the native driver "
                    "(`mysql+pymysql://`), or a whole-second or integer cursor."
                )
            if isinstance(column.type, sa.Uuid):
                raise SourceDefinitionError(
                    f"Column `{column.name}` of `{qualified}` is `UUID`, and through MariaDB "
                    "Connector/ODBC (`mysql+pyodbc`) a Python UUID is bound as a binary GUID that "
                    "never equals the column's own values: a position could not select its own "
                    "row. Use the native driver (`mysql+pymysql://`)."
                )
    for column in columns:
        precision = getattr(column.type, "precision", None)
        if isinstance(column.type, mssql.DATETIME2 | mssql.DATETIMEOFFSET | mssql.TIME) and (
            precision is None or precision > 6
        ):
            raise SourceDefinitionError(
                f"Column `{column.name}` of `{qualified}` is `{column.type}` with 100 ns "
                "precision, which Python's datetime cannot hold (1 us): a position could not "
                "select its own row. Use a `rowversion` cursor, or a `datetime2(6)` column "
                f"(`ALTER TABLE {qualified} ALTER COLUMN {column.name} datetime2(6)`)."
            )


def check_position(
    after: Position | None, query: KeysetQuery, qualified: str, pk: Sequence[str]
) -> None:
    """Refuse a position that does not fit the source's key (a changed ``cursor=``/``pk=``)."""
    if after is None:
        return
    if len(after.cursor) != len(query.cursor) or len(after.pk) not in (0, len(query.pk)):
        raise SourceDefinitionError(
            f"Position {after} does not fit the source of `{qualified}` (cursor "
            f"{[c.name for c in query.cursor]}, pk {list(pk)}): was `cursor=` or "
            "`pk=` changed? Move the poller with `afdb seek` to continue."
        )
    check_position_types(after, (*query.cursor, *query.pk), qualified)


def keyset_query(
    table: sa.Table,
    dialect: str,
    *,
    cursor: tuple[str, ...],
    pk: tuple[str, ...] | None,
    columns: tuple[str, ...] | None,
    soft_delete: str | None,
    where: ColumnElement[bool] | TextClause | None,
    qualified: str,
    driver: str = "",
    shard: tuple[Shard, sa.Dialect] | None = None,
) -> KeysetQuery:
    """The statements of a source over the reflected ``table``; errors name what is missing.
    A ``shard`` (with the dialect that renders its term) adds its predicate to the filter."""
    cursor_columns = [table_column(table, name, "cursor") for name in cursor]
    if pk is not None:
        pk_columns = [table_column(table, name, "pk") for name in pk]
    else:
        pk_columns = list(table.primary_key.columns)
        if not pk_columns:
            raise SourceDefinitionError(
                f"Table `{qualified}` has no primary key, so rows with the same cursor "
                "cannot be ordered. Pass `pk=` naming a unique, stable column (or columns), "
                'e.g. `pk="id"`.'
            )
    if columns is None:
        selected = list(table.columns)
    else:
        selected = [table_column(table, name, "columns") for name in columns]
        selected += [c for c in (*cursor_columns, *pk_columns) if c not in selected]
    if soft_delete is not None:
        flag = table_column(table, soft_delete, "soft_delete")
        selected += [flag] if flag not in selected else []
    resolved = resolve_where(where, table, selected, qualified)
    check_round_trip((*cursor_columns, *pk_columns), qualified, dialect=dialect, driver=driver)
    term = None if shard is None else shard_term(table, shard[1], pk_columns, shard[0])
    if term is not None:
        resolved = term.predicate() if resolved is None else sa.and_(resolved, term.predicate())
    return KeysetQuery(
        table,
        selected=selected,
        cursor=cursor_columns,
        pk=pk_columns,
        where=resolved,
        # Row values are an index condition on the whole key on PostgreSQL only (see
        # _keyset): MariaDB scans the index with them and SQL Server has none.
        row_values=dialect == "postgresql",
        shard=term,
    )


# Kinds of value that bind against each other's columns; across families a stored position no
# longer means the same thing for the column (a naive time against a `timestamptz`).
_FAMILIES = {
    "int": "number",
    "decimal": "number",
    "float": "number",
    "bool": "number",
    # Naive and zoned date-times bind against each other's columns: the database converts
    # them (some drivers return a zoned column naive), so a timestamp -> timestamptz change
    # continues; only a change of family (text, number) is refused.
    "datetime": "date-time",
    "datetime_tz": "date-time",
    "date": "date",
    "time": "time",
    "str": "text",
    "uuid": "uuid",
    "bytes": "bytes",
}


def check_position_types(
    position: Position, columns: Sequence[sa.Column[Any]], qualified: str
) -> None:
    """Refuse a stored position whose values no longer fit their columns' types.

    A cursor column changed from ``timestamp`` to ``timestamptz`` (or text to a number) would
    make the stored position bind as something else, or fail only after the handler ran.
    Checked before every read, so the handler never runs on such a position.
    """
    for value, column in zip(position.key, columns, strict=False):
        kind = column_kind(column)
        expected = None if kind is None else _FAMILIES[kind]
        value_kind = python_kind(type(value))
        found = None if value_kind is None else _FAMILIES[value_kind]
        if expected is None or found is None or expected == found:
            continue
        if {expected, found} <= {"text", "uuid"}:
            continue  # a UUID column read as text, or text holding UUIDs
        raise SourceDefinitionError(
            f"The checkpoint holds `{column.name}` of `{qualified}` as a {found} "
            f"(`{value!r}`), but the column is now `{column.type}` ({expected}): its type "
            "changed, so the stored position no longer means the same row. Nothing was read. "
            "Move the poller to the right place with `afdb seek --cursor ...` (or `--now`)."
        )
