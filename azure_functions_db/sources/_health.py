"""Findings of ``SqlSource.check()`` beyond NULL cursors: a missing keyset index, and SQLite
date-times stored in a text format that does not compare like the bound positions.

``keyset_index`` returns the index finding as data (``afdb validate`` reports it so).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from azure_functions_db.sources._keyset import KeysetQuery
from azure_functions_db.sources._values import column_kind

# SQLAlchemy stores SQLite DATETIME values as `YYYY-MM-DD HH:MM:SS.ffffff`, 26 characters.
_SQLITE_DATETIME_LENGTH = 26


@dataclass(frozen=True)
class KeysetIndex:
    """Whether an index (or the primary key) of ``table`` starts with (cursor..., pk...).

    ``table`` is the name as configured (schema-qualified if a schema was given), ``name`` the
    bare table name; ``index`` names the first such index (``PRIMARY KEY`` for the primary key),
    ``None`` if there is none.
    """

    table: str
    name: str
    columns: tuple[str, ...]
    index: str | None

    @property
    def ok(self) -> bool:
        """A supporting index exists."""
        return self.index is not None

    @property
    def statement(self) -> str:
        """A ``CREATE INDEX`` statement that would support the keyset query."""
        listed = ", ".join(self.columns)
        return f"CREATE INDEX ix_{self.name}_keyset ON {self.table} ({listed})"

    @property
    def warning(self) -> str | None:
        """The warning ``SqlSource.check()`` reports when no index supports the query."""
        if self.ok:
            return None
        return (
            f"No index of `{self.table}` starts with ({', '.join(self.columns)}): every batch may "
            f"scan the table. Create one, e.g. `{self.statement}`."
        )


def keyset_index(
    conn: sa.Connection,
    table: sa.Table,
    *,
    cursor: Sequence[sa.Column[Any]],
    pk: Sequence[sa.Column[Any]],
    qualified: str,
    schema: str | None,
) -> KeysetIndex:
    """Look for an index (or the primary key) of ``table`` starting with (cursor..., pk...)."""
    inspector = sa.inspect(conn)
    candidates: list[tuple[str, list[str | None]]] = [
        (str(index["name"]), list(index["column_names"]))
        for index in inspector.get_indexes(table.name, schema=schema)
    ]
    primary = inspector.get_pk_constraint(table.name, schema=schema)
    candidates.append(("PRIMARY KEY", list(primary.get("constrained_columns") or [])))
    wanted = tuple(dict.fromkeys(c.name for c in (*cursor, *pk)))
    prefix: list[str | None] = list(wanted)
    found = next((name for name, columns in candidates if columns[: len(wanted)] == prefix), None)
    return KeysetIndex(table=qualified, name=table.name, columns=wanted, index=found)


def index_warning(
    conn: sa.Connection, query: KeysetQuery, qualified: str, schema: str | None
) -> str | None:
    """A warning unless an index (or the primary key) starts with (cursor..., pk...)."""
    found = keyset_index(
        conn, query.table, cursor=query.cursor, pk=query.pk, qualified=qualified, schema=schema
    )
    return found.warning


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
