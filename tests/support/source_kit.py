"""Helpers shared by the source test modules (SQLite, PostgreSQL/MariaDB, horizons)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from azure_functions_db.core.ports import Horizon, SourceRow
from azure_functions_db.core.position import Position
from azure_functions_db.sources import SqlSource

NO_HORIZON = Horizon(bound=None, method="none")


def drain(
    source: SqlSource, batch: int, horizon: Horizon = NO_HORIZON, after: Position | None = None
) -> list[SourceRow]:
    """Read everything the way the engine does: each batch starts after the last position."""
    out: list[SourceRow] = []
    while True:
        rows = source.fetch(after, batch, horizon)
        assert len(rows) <= batch
        if not rows:
            return out
        out.extend(rows)
        after = rows[-1].position


@dataclass
class Db:
    """One scratch namespace on one server: where tables go and how the source reaches them."""

    dialect: str  # "postgres" or "mysql"
    url: str
    schema: str | None  # PostgreSQL: the scratch schema; MariaDB: None (the URL names the db)
    engine: sa.Engine  # for setting tables up and inspecting plans

    def table(
        self,
        name: str,
        columns: Sequence[sa.Column[Any]],
        rows: Sequence[dict[str, Any]] = (),
        *,
        index: Sequence[str] | None = None,
    ) -> sa.Table:
        metadata = sa.MetaData(schema=self.schema)
        table = sa.Table(name, metadata, *columns)
        if index:
            sa.Index(f"ix_{name}_keyset", *(table.c[c] for c in index))
        metadata.create_all(self.engine)
        if rows:
            with self.engine.begin() as conn:
                conn.execute(table.insert(), list(rows))
        return table

    def qualified(self, name: str) -> str:
        return f'"{self.schema}"."{name}"' if self.schema else f"`{name}`"


def open_source(
    opened: list[SqlSource], db: Db, table: str, *args: Any, **kwargs: Any
) -> SqlSource:
    source = SqlSource(db.url, table, *args, schema=db.schema, **kwargs)
    source.open({})
    opened.append(source)
    return source
