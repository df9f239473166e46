"""Horizon strategies: the upper bound of the next batch, fixed before it is read (SPEC §5.3).

A row's cursor is stamped when its transaction starts or writes, but the row becomes visible only
at commit. A batch that reads past a cursor value while a slower transaction holding a lower value
is still open would never see that row. The horizon is an exclusive upper bound on the leading
cursor column below which no row can still appear; rows at or above it wait for a later batch.

This module holds the seam (:class:`HorizonStrategy`) and the dialect-neutral strategies; the
per-dialect ones (PostgreSQL ``pg_snapshot_xmin`` / oldest ``xact_start``, SQL Server
``MIN_ACTIVE_ROWVERSION()``, MySQL ``innodb_trx``) plug in beside them.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from azure_functions_db.core.position import KeyValue
from azure_functions_db.errors import ConfigurationError
from azure_functions_db.sources._values import column_kind, time_bound

if TYPE_CHECKING:
    from azure_functions_db.sources.sqlalchemy import SqlSource


@runtime_checkable
class HorizonStrategy(Protocol):
    """How a source bounds the next batch so that no row below the bound can still appear.

    ``prepare`` runs once in :meth:`SqlSource.open` after reflection and raises
    ``ConfigurationError`` when the strategy cannot work with the table. ``bound`` runs before
    every batch and returns the exclusive upper bound on the leading cursor column, ``None`` for
    no bound. Strategies that ask the database (PostgreSQL snapshot ``xmin`` or oldest
    ``xact_start``, SQL Server ``MIN_ACTIVE_ROWVERSION()``, MySQL ``innodb_trx``) connect through
    ``source.engine``; the lag strategy costs no round trip.
    """

    name: str

    def prepare(self, source: SqlSource) -> None:
        """Check once, at open, that this strategy works for ``source``."""
        ...

    def bound(self, source: SqlSource, now: dt.datetime) -> KeyValue | None:
        """The exclusive upper bound for the next batch; ``now`` is the clock's aware UTC time."""
        ...


class NoHorizon:
    """No upper bound: every committed row is eligible at once (``lag=0``, the default)."""

    name = "none"

    def prepare(self, source: SqlSource) -> None:
        """Nothing to check."""

    def bound(self, source: SqlSource, now: dt.datetime) -> KeyValue | None:
        """Always ``None``."""
        return None

    def __repr__(self) -> str:
        return "NoHorizon()"


class LagHorizon:
    """Rows wait until their cursor is ``lag`` older than now: bound = ``now - lag``.

    Needs a date or date-time leading cursor. For a naive column the bound is the wall-clock time
    in the source's ``cursor_timezone`` (UTC by default); for a date column, that zone's date.
    """

    name = "lag"

    def prepare(self, source: SqlSource) -> None:
        """Reject a cursor that is not a date or date-time: lag is measured in time."""
        column = source.cursor_columns[0]
        if column_kind(column) not in ("datetime", "datetime_tz", "date"):
            raise ConfigurationError(
                f"`lag={source.lag.total_seconds():g}` needs a date or date-time cursor, but "
                f"cursor `{column.name}` of `{source.description.table}` has type "
                f"`{column.type}`. Remove `lag=` (or set it to 0), or use a time cursor such as "
                "`updated_at`."
            )

    def bound(self, source: SqlSource, now: dt.datetime) -> KeyValue | None:
        """``now - lag`` in the form the leading cursor column compares with."""
        return time_bound(now - source.lag, source.cursor_columns[0], source.cursor_timezone)

    def __repr__(self) -> str:
        return "LagHorizon()"
