"""Findings of ``SqlSource.check()`` beyond NULL cursors: a missing keyset index, and SQLite
date-times stored in a text format that does not compare like the bound positions.

``keyset_index`` returns the index finding as data (``afdb validate`` reports it so).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from azure_functions_db.sources.keyset import KeysetQuery

# SQLAlchemy stores SQLite DATETIME values as `YYYY-MM-DD HH:MM:SS.ffffff`, 26 characters.


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
