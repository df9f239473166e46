"""The bounded backlog count behind the ``afdb.lag.rows_behind`` metric.

How many rows a poller still has to read is the count of the rows its next batches would
return: the batch query itself, with the key columns only, capped, and counted::

    SELECT count(*) FROM (
        SELECT cursor..., pk... FROM t WHERE <after> [AND lead < :horizon] [AND <where>]
        ORDER BY cursor..., pk... LIMIT :cap)

It uses the same keyset predicate as a batch, so the same ``(cursor, pk)`` index answers it and
the scan stops after ``cap`` index entries however large the table: a cost bounded like one
batch's, paid at most once per run (never in the batch loop). ``cap`` rows means "at least".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa

from azure_functions_db.core.ports import Horizon
from azure_functions_db.core.position import Position
from azure_functions_db.sources.keyset import KeysetQuery


def backlog_statement(
    query: KeysetQuery, after: Position | None, bounded: bool, cap: int, *, until: bool = False
) -> sa.Select[int]:
    """``SELECT count(*)`` over the next ``cap`` keys after ``after`` (below the horizon)."""
    keys = query.batch(query.start_of(after), bounded, cap, until=until).with_only_columns(
        *query.cursor, *query.pk, maintain_column_froms=True
    )
    return sa.select(sa.func.count()).select_from(keys.subquery("afdb_backlog"))


def rows_after(
    conn: sa.Connection,
    query: KeysetQuery,
    after: Position | None,
    horizon: Horizon,
    *,
    params: Mapping[str, Any],
    cap: int,
) -> int:
    """Rows strictly after ``after`` and below ``horizon``'s bound, counting at most ``cap``."""
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
        raise ValueError(f"`cap={cap!r}` must be a positive number of rows")
    statement = backlog_statement(
        query, after, horizon.bound is not None, cap, until=horizon.until is not None
    )
    parameters = query.parameters(after, horizon.bound, params, horizon.until)
    count: int = conn.execute(statement, parameters).scalar_one()
    return count
