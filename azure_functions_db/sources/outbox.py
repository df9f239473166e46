"""``OutboxSource``: an append-only outbox table, optionally emptied as its rows are delivered.

The transactional outbox pattern: the application inserts one row per event into an outbox table
in the same transaction as its business change, and never updates it. The poller reads the outbox
in keyset order like any table. With ``delete_delivered=True`` it deletes the rows of each batch
after the batch's checkpoint commit, so the table holds only what is still to come.

Only the delivered rows are deleted, by primary key, never a range below the checkpoint: a row
of a transaction that committed late (below the checkpoint, see the horizon rules) stays in the
table, and the source reports it loudly (``action=outbox_rows_left``) instead of deleting it
unseen.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.sql.elements import ColumnElement

from azure_functions_db.core.ports import SourceRow
from azure_functions_db.core.position import KeyValue, Position
from azure_functions_db.errors import ConfigurationError
from azure_functions_db.sources import engines
from azure_functions_db.sources.keyset import KeysetQuery, after_predicate
from azure_functions_db.sources.sqlalchemy import SqlSource

__all__ = ["OutboxSource"]

logger = logging.getLogger(__name__)

# Keys per DELETE statement: well below SQL Server's 2,100 parameters per statement.
_DELETE_CHUNK = 500


class OutboxSource(SqlSource):
    """Rows of an append-only outbox table in ``ORDER BY cursor, pk`` batches.

    Args:
        url: SQLAlchemy URL (``%NAME%`` placeholders allowed), as for :class:`SqlSource`.
        table: The outbox table.
        cursor: The column(s) that order the outbox; default ``"id"``. On PostgreSQL prefer an
            ``xid8`` column filled with ``pg_current_xact_id()``: a sequence number is taken
            before its transaction commits, so a plain ``id`` cursor has no commit-safe horizon.
        pk: Unique key column(s); ``None`` uses the table's primary key.
        delete_delivered: Delete each batch's rows, by primary key, after its checkpoint
            commit. Needs ``DELETE`` on the table. A failed delete is logged
            (``action=acknowledge_failed``) and the rows stay; they are never redelivered.
        **options: Every other :class:`SqlSource` option (``where=``, ``columns=``,
            ``horizon=``, ``lag=``, ``soft_delete=``, ...).
    """

    def __init__(
        self,
        url: str,
        table: str,
        cursor: str | Sequence[str] = "id",
        pk: str | Sequence[str] | None = None,
        *,
        delete_delivered: bool = False,
        **options: Any,
    ) -> None:
        if not isinstance(delete_delivered, bool):
            raise ConfigurationError(
                f"`delete_delivered={delete_delivered!r}` must be `True` (delete delivered "
                "outbox rows after each commit) or `False` (keep them)."
            )
        super().__init__(url, table, cursor, pk, **options)
        self.delete_delivered = delete_delivered

    def acknowledge(self, rows: Sequence[SourceRow], position: Position) -> None:
        """Delete ``rows`` (by primary key) if ``delete_delivered``; report rows left below.

        Runs in one transaction: the deletes, then a count of the rows still at or below
        ``position``. Such rows were never delivered (a transaction that committed below the
        checkpoint, or a delete that failed earlier) and are logged at WARNING with the fix.
        """
        if not self.delete_delivered or not rows:
            return
        query = self._require_open()
        keys = [row.position.pk for row in rows]
        deleted = 0
        with self._db_errors("outbox delete"), engines.transaction(self.engine) as conn:
            for start in range(0, len(keys), _DELETE_CHUNK):
                chunk = keys[start : start + _DELETE_CHUNK]
                result = conn.execute(sa.delete(query.table).where(_key_in(query, chunk, conn)))
                deleted += max(result.rowcount, 0)
            left = int(
                conn.execute(_at_or_before(query, position), dict(self._params)).scalar_one()
            )
        logger.debug("action=outbox_deleted table=%s rows=%d", self.description.table, deleted)
        if left:
            logger.warning(
                "action=outbox_rows_left table=%s rows=%d position=%s; these rows are at or "
                "below the checkpoint and were never delivered (a transaction that committed "
                "late, or a failed delete). Deliver them with `afdb seek APP --poller NAME "
                "--cursor <value before them>` (handlers must be idempotent), and use a "
                "commit-safe cursor (see docs/sources.md, outbox)",
                self.description.table,
                left,
                position,
            )

    def __repr__(self) -> str:
        return super().__repr__().replace("SqlSource(", "OutboxSource(", 1)[:-1] + (
            f", delete_delivered={self.delete_delivered!r})"
        )


def _bound(value: KeyValue, column: sa.Column[Any]) -> ColumnElement[Any]:
    return sa.bindparam(None, value, type_=column.type)


def _key_in(
    query: KeysetQuery, keys: Sequence[tuple[KeyValue, ...]], conn: sa.Connection
) -> ColumnElement[bool]:
    """``pk IN (keys)``: a plain ``IN`` for one column, row values or ORs for several."""
    if len(query.pk) == 1:
        (column,) = query.pk
        return column.in_([key[0] for key in keys])
    if conn.dialect.name != "mssql":  # SQL Server has no row values
        return sa.tuple_(*query.pk).in_(keys)
    return sa.or_(
        *(sa.and_(*(c == _bound(v, c) for c, v in zip(query.pk, key, strict=True))) for key in keys)
    )


def _at_or_before(query: KeysetQuery, position: Position) -> sa.Select[Any]:
    """Count of the rows whose key is at or before ``position`` (NULL cursors excluded)."""
    key = (*query.cursor, *query.pk)
    values = [_bound(v, c) for v, c in zip(position.key, key, strict=True)]
    statement = sa.select(sa.func.count()).select_from(query.table)
    statement = statement.where(sa.not_(after_predicate(key, values)))
    statement = statement.where(*(column.is_not(None) for column in query.cursor))
    if query.where is not None:
        statement = statement.where(query.where)
    return statement
