"""Findings of ``SqlSource.check()``: NULL cursors, a missing keyset index (with a shard's
term in front for a sharded source), rows no shard reads.

``keyset_index`` returns the index finding as data (``afdb validate`` reports it so).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

from azure_functions_db.errors import NullCursorError, SourceDefinitionError
from azure_functions_db.sources import shards
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
    create: tuple[str, ...] = ()  # the statements that make one, when not a plain index

    @property
    def ok(self) -> bool:
        """A supporting index exists."""
        return self.index is not None

    @property
    def statement(self) -> str:
        """A ``CREATE INDEX`` statement (or for a shard, the statements) that would support the
        keyset query."""
        if self.create:
            return "; ".join(self.create)
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
    shard: shards.ShardTerm | None = None,
) -> KeysetIndex:
    """Look for an index (or the primary key) of ``table`` starting with (cursor..., pk...),
    behind a shard's column or expression (``None`` in an index's columns) for a shard."""
    inspector = sa.inspect(conn)
    with warnings.catch_warnings():  # SQLite's expression indexes: read below instead
        warnings.simplefilter("ignore", sa_exc.SAWarning)
        reflected = inspector.get_indexes(table.name, schema=schema)
    candidates = [(str(index["name"]), list(index["column_names"])) for index in reflected]
    if conn.dialect.name == "sqlite":  # SQLAlchemy does not reflect expression indexes there
        candidates += _sqlite_expression_indexes(conn, table.name)
    primary = inspector.get_pk_constraint(table.name, schema=schema)
    candidates.append(("PRIMARY KEY", list(primary.get("constrained_columns") or [])))
    wanted = tuple(dict.fromkeys(c.name for c in (*cursor, *pk)))
    prefix: list[str | None] = list(wanted)
    create: tuple[str, ...] = ()
    if shard is not None:
        prefix = [shard.column, *wanted]
        wanted = (shard.column or shard.text, *wanted)
        if shard.column is None:
            create = tuple(
                shards.ddl(
                    conn.dialect,
                    table=qualified,
                    bare=table.name,
                    cursor=[c.name for c in cursor],
                    pk=pk,
                    count=shard.shard.count,
                )
            )
        else:  # the generated column exists: only its index is missing
            listed = ", ".join(c for c in wanted if c)
            create = (f"CREATE INDEX ix_{table.name}_{shard.column} ON {qualified} ({listed})",)
    found = next((name for name, columns in candidates if columns[: len(prefix)] == prefix), None)
    return KeysetIndex(table=qualified, name=table.name, columns=wanted, index=found, create=create)


def _sqlite_expression_indexes(
    conn: sa.Connection, table: str
) -> list[tuple[str, list[str | None]]]:
    found: list[tuple[str, list[str | None]]] = []
    for index in conn.exec_driver_sql(f"PRAGMA index_list({_quoted(table)})").mappings():
        info = conn.exec_driver_sql(f"PRAGMA index_xinfo({_quoted(str(index['name']))})")
        columns = [row["name"] for row in info.mappings() if row["key"]]
        if None in columns:
            found.append((str(index["name"]), columns))
    return found


def _quoted(name: str) -> str:
    return "'" + name.replace("'", "''") + "'"


def findings(
    conn: sa.Connection,
    query: KeysetQuery,
    params: Mapping[str, Any],
    *,
    qualified: str,
    schema: str | None,
    raise_on_null: bool,
    logger: logging.Logger,
) -> tuple[int, list[str]]:
    """NULL-cursor rows (raising ``NullCursorError`` if so configured), then every warning:
    the NULL cursors, a missing index, rows of no shard. Each is logged."""
    counts = conn.execute(query.null_counts(), dict(params)).one()
    warnings: list[str] = []
    null_rows = int(counts[0])
    if null_rows:
        nulls = ", ".join(
            f"`{column.name}`"
            for column, count in zip(query.cursor, counts[1:], strict=True)
            if count
        )
        if raise_on_null:
            raise NullCursorError(qualified, nulls.replace("`", ""), null_rows)
        logger.warning(
            "action=null_cursor table=%s columns=%s rows=%s", qualified, nulls, null_rows
        )
        warnings.append(
            f"{null_rows} row(s) of `{qualified}` have a NULL cursor ({nulls}) and are "
            "never delivered: give them a cursor value, or exclude them with `where=`."
        )
    index = keyset_index(
        conn,
        query.table,
        cursor=query.cursor,
        pk=query.pk,
        qualified=qualified,
        schema=schema,
        shard=query.shard,
    )
    term = query.shard
    if term is not None and (
        differ := shards.column_mismatches(conn, query.table, term, query.cursor, query.pk)
    ):
        raise SourceDefinitionError(
            f"The generated column `{term.column}` of `{qualified}` puts {differ} of the newest "
            f"{shards.SAMPLE} rows in another shard than the shard expression does: a shard "
            "reading it would skip rows and repeat others. Recreate it as `... AS ("
            f"{shards.expression_text(conn.dialect, query.pk, term.shard.count)})`, or drop it "
            "to shard on that expression itself."
        )
    found = [index.warning]
    if query.shard is not None and (strays := shards.strays(conn, query.table, query.shard)):
        found.append(
            f"{strays} row(s) of `{qualified}` hold no shard's value in `{query.shard.column}` "
            f"(NULL or outside 0 to {query.shard.shard.count - 1}) and no shard reads them: fix "
            "the generated column's expression (see docs/scale.md)."
        )
    for warning in filter(None, found):
        logger.warning("action=source_check table=%s warning=%s", qualified, warning)
        warnings.append(warning)
    return null_rows, warnings
