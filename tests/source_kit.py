"""Helpers shared by the source test modules (SQLite, PostgreSQL/MariaDB, horizons)."""

from __future__ import annotations

from azure_functions_db.core.position import Position
from azure_functions_db.ports import Horizon, SourceRow
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
