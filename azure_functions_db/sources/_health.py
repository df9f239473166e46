"""Findings of ``SqlSource.check()`` beyond NULL cursors: a missing keyset index, and SQLite
date-times stored in a text format that does not compare like the bound positions."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa

from azure_functions_db.sources._keyset import KeysetQuery
from azure_functions_db.sources._values import column_kind

# SQLAlchemy stores SQLite DATETIME values as `YYYY-MM-DD HH:MM:SS.ffffff`, 26 characters.
_SQLITE_DATETIME_LENGTH = 26


def index_warning(
    conn: sa.Connection, query: KeysetQuery, qualified: str, schema: str | None
) -> str | None:
    """A warning unless an index (or the primary key) starts with (cursor..., pk...)."""
    inspector = sa.inspect(conn)
    name = query.table.name
    indexes: list[list[str | None]] = [
        list(index["column_names"]) for index in inspector.get_indexes(name, schema=schema)
    ]
    primary = inspector.get_pk_constraint(name, schema=schema)
    indexes.append(list(primary.get("constrained_columns") or []))
    wanted: list[str | None] = list(dict.fromkeys(c.name for c in (*query.cursor, *query.pk)))
    if any(index[: len(wanted)] == wanted for index in indexes):
        return None
    listed = ", ".join(str(column) for column in wanted)
    return (
        f"No index of `{qualified}` starts with ({listed}): every batch may scan the table. "
        f"Create one, e.g. `CREATE INDEX ix_{name}_keyset ON {qualified} ({listed})`."
    )


def sqlite_datetime_warning(
    conn: sa.Connection, query: KeysetQuery, params: Mapping[str, Any], qualified: str
) -> str | None:
    """A warning when a SQLite date-time cursor holds text SQLAlchemy did not write.

    SQLite keeps date-times as text and compares them as text: a row written as
    ``2026-01-01 12:00:00`` (``CURRENT_TIMESTAMP``) sorts *before* the bound position
    ``2026-01-01 12:00:00.000000`` of that same row, so rows tied with a checkpoint are skipped.
    """
    lead = query.cursor[0]
    if conn.dialect.name != "sqlite" or column_kind(lead) != "datetime":
        return None
    statement = sa.select(sa.func.count()).select_from(query.table)
    statement = statement.where(lead.is_not(None), sa.func.length(lead) != _SQLITE_DATETIME_LENGTH)
    if query.where is not None:
        statement = statement.where(query.where)
    rows = int(conn.execute(statement, dict(params)).scalar_one())
    if not rows:
        return None
    return (
        f"{rows} row(s) of `{qualified}` store `{lead.name}` in a text format other than "
        "`YYYY-MM-DD HH:MM:SS.ffffff`. SQLite compares date-times as text, so such rows can be "
        "skipped when tied with a checkpoint. Rewrite them: "
        f"`UPDATE {qualified} SET {lead.name} = strftime('%Y-%m-%d %H:%M:%f', {lead.name}) "
        "|| '000'`."
    )
