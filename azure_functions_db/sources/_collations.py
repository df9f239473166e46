"""How the database compares a source's text keys and naive times: for ``afdb validate``.

The poller follows the database's order and equality in every query, so nothing here changes
behaviour; it tells the operator which rules apply (a case-insensitive collation treats `a` and
`A` as one key; a naive cursor holds wall-clock time of the database's default zone).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import sqlalchemy as sa

from azure_functions_db.sources import _zones as zones

_MYSQL = sa.text(
    "SELECT COLLATION_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = "
    "COALESCE(:schema, DATABASE()) AND TABLE_NAME = :table AND COLUMN_NAME = :column"
)
_PG = sa.text(
    "SELECT CASE WHEN c.collname = 'default' OR c.collname IS NULL THEN "
    "(SELECT datcollate FROM pg_database WHERE datname = current_database()) || ' (the "
    "database default)' ELSE c.collname || ' (' || c.collprovider::text || ')' END "
    "FROM pg_attribute AS a LEFT JOIN pg_collation AS c ON c.oid = a.attcollation "
    "WHERE a.attrelid = CAST(:relation AS regclass) AND a.attname = :column"
)


def collation(conn: sa.Connection, column: sa.Column[Any], schema: str | None) -> str | None:
    """The collation ``column`` compares with, as the database names it; ``None`` if not text."""
    if not isinstance(column.type, sa.String):
        return None
    dialect = conn.dialect.name
    table = column.table.name
    if dialect in ("mysql", "mariadb"):
        found = conn.execute(_MYSQL, {"schema": schema, "table": table, "column": column.name})
        return str(found.scalar() or "?")
    if dialect == "postgresql":
        relation = f'"{schema}"."{table}"' if schema else f'"{table}"'
        found = conn.execute(_PG, {"relation": relation, "column": column.name})
        return str(found.scalar() or "?")
    declared = getattr(column.type, "collation", None)
    return str(declared) if declared else "BINARY" if dialect == "sqlite" else None


def describe(
    conn: sa.Connection,
    columns: list[sa.Column[Any]],
    schema: str | None,
    zone: dt.tzinfo,
) -> list[str]:
    """One line per text key column (its collation) and per naive time cursor (the zones)."""
    lines: list[str] = []
    for column in columns:
        name = collation(conn, column, schema)
        if name is not None:
            lines.append(
                f"`{column.name}` ({column.type}) compares with collation `{name}`; batches, "
                "ties and backfill chunk ends follow it."
            )
    lead = columns[0]
    if zones.holds_writer_wall_clock(lead):
        found = zones.default_zone(conn)
        if found is not None:
            lines.append(
                f"`{lead.name}` holds wall-clock time without a zone: the database's default "
                f"zone is `{found[0]}`, `cursor_timezone` is `{zone}`."
            )
    return lines
