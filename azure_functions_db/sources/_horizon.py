"""Horizon strategies: the upper bound of the next batch, fixed before it is read (SPEC §5.3).

A row's cursor is stamped when its transaction starts or writes, but the row becomes visible only
at commit. A batch that reads past a cursor value while a slower transaction holding a lower value
is still open would never see that row. The horizon is an exclusive upper bound on the leading
cursor column below which no row can still appear; rows at or above it wait for a later batch.

This module holds the seam (:class:`HorizonStrategy`), the dialect-neutral strategies and
:class:`AutoHorizon`, which picks the commit-safe per-dialect strategy of
:mod:`~azure_functions_db.sources._dialect_horizons` when the database allows it and otherwise
falls back to ``lag``, saying so once, loudly.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Protocol, runtime_checkable

from sqlalchemy.dialects import mssql

from azure_functions_db.core.ports import HorizonHold
from azure_functions_db.core.position import KeyValue
from azure_functions_db.errors import ConfigurationError, HorizonUnavailable
from azure_functions_db.sources._dialect_horizons import (
    DEFAULT_SETTLE,
    PG_SETTLE,
    TIME_KINDS,
    MssqlRowversionHorizon,
    PgSnapshotHorizon,
    PgXactStartHorizon,
    SqliteClockHorizon,
    pg_cursor_type,
)
from azure_functions_db.sources._mysql_horizon import MysqlTrxHorizon
from azure_functions_db.sources._target import HorizonTarget
from azure_functions_db.sources.values import column_kind, time_bound

__all__ = [
    "AutoHorizon",
    "HorizonStrategy",
    "HorizonTarget",
    "LagHorizon",
    "MssqlRowversionHorizon",
    "MysqlTrxHorizon",
    "NoHorizon",
    "PgSnapshotHorizon",
    "PgXactStartHorizon",
]

logger = logging.getLogger(__name__)


@runtime_checkable
class HorizonStrategy(Protocol):
    """How a source bounds the next batch so that no row below the bound can still appear.

    ``prepare`` runs once in :meth:`SqlSource.open` after reflection and raises
    ``ConfigurationError`` when the strategy cannot work with the table. ``bound`` runs before
    every batch and returns the exclusive upper bound on the leading cursor column, ``None`` for
    no bound. Strategies that ask the database (PostgreSQL snapshot ``xmin`` or oldest
    ``xact_start``, SQL Server ``MIN_ACTIVE_ROWVERSION()``, MySQL ``innodb_trx``) connect through
    ``target.engine``; the lag strategy costs no round trip.
    """

    name: str

    def prepare(self, target: HorizonTarget) -> None:
        """Check once, at open, that this strategy works for ``target``."""
        ...

    def bound(self, target: HorizonTarget, now: dt.datetime) -> KeyValue | None:
        """The exclusive upper bound for the next batch; ``now`` is the clock's aware UTC time."""
        ...


class NoHorizon:
    """No upper bound: every committed row is eligible at once (``lag=0``, the default)."""

    name = "none"

    def prepare(self, target: HorizonTarget) -> None:
        """Nothing to check."""

    def bound(self, target: HorizonTarget, now: dt.datetime) -> KeyValue | None:
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

    def prepare(self, target: HorizonTarget) -> None:
        """Reject a cursor that is not a date or date-time: lag is measured in time."""
        column = target.cursor
        if column_kind(column) not in ("datetime", "datetime_tz", "date"):
            raise ConfigurationError(
                f"`lag={target.lag.total_seconds():g}` needs a date or date-time cursor, but "
                f"cursor `{column.name}` of `{target.table}` has type "
                f"`{column.type}`. Remove `lag=` (or set it to 0), or use a time cursor such as "
                "`updated_at`."
            )

    def bound(self, target: HorizonTarget, now: dt.datetime) -> KeyValue | None:
        """``now - lag`` in the form the leading cursor column compares with."""
        return time_bound(now - target.lag, target.cursor, target.zone)

    def __repr__(self) -> str:
        return "LagHorizon()"


class AutoHorizon:
    """The commit-safe horizon the database offers, else ``lag`` — said once, loudly.

    Per dialect and leading cursor:

    * PostgreSQL ``xid8`` → :class:`PgSnapshotHorizon`; date-time → :class:`PgXactStartHorizon`
      when the role may see every session (``pg_read_all_stats``) and the server is a primary.
    * MySQL/MariaDB date-time → :class:`MysqlTrxHorizon` when the user has ``PROCESS``.
    * SQL Server ``rowversion`` → :class:`MssqlRowversionHorizon`.
    * SQLite date-time → :class:`SqliteClockHorizon` (its own clock less ``settle``: serial
      writers still stamp ties, and a tie with a lower pk may commit after the checkpoint);
      other SQLite cursors → the source's ``lag``, logged once at INFO (a counter a writer
      assigns inside its write transaction commits in order, since SQLite has one writer).
    * anything else → the source's ``lag`` with one WARNING line ``action=horizon_fallback``
      naming the reason and the fix; the reason is kept in :attr:`detail`.

    A privilege lost while running (e.g. ``pg_read_all_stats`` revoked) switches to the fallback
    the same way. After :meth:`prepare`, :attr:`name` is the chosen strategy's name.
    """

    def __init__(self, settle: dt.timedelta | None = None) -> None:
        self.name = "auto"
        self.detail = ""
        self.fix: str | None = None  # after a fallback: the statement that restores the method
        #: The margin below the server's clock; ``None``: the chosen method's own (PostgreSQL 0,
        #: MariaDB 0 or 1 s with triggers or stored functions, MySQL and SQLite 1 s).
        self.settle = settle
        self.chosen: HorizonStrategy | None = None
        self._warned = False

    def prepare(self, target: HorizonTarget) -> None:
        """Choose the strategy for ``target``'s dialect and cursor, checking its privileges."""
        dialect = target.engine.dialect.name
        column = target.cursor
        kind = column_kind(column)
        safe: PgSnapshotHorizon | PgXactStartHorizon | MysqlTrxHorizon | MssqlRowversionHorizon
        if dialect == "sqlite":
            if kind in TIME_KINDS:
                settle = DEFAULT_SETTLE if self.settle is None else self.settle
                self._choose(target, SqliteClockHorizon(settle), "")
                return
            baseline = _baseline(target)
            logger.info(
                "action=horizon_choice table=%s dialect=sqlite cursor=%s method=%s reason=%s",
                target.table,
                column.name,
                baseline.name,
                "not_a_time_cursor_sqlite_writers_are_serial",
            )
            self._choose(target, baseline, "")
            return
        if dialect == "postgresql" and pg_cursor_type(target) == "xid8":
            safe = PgSnapshotHorizon()
        elif dialect == "postgresql" and kind in TIME_KINDS:
            safe = PgXactStartHorizon(PG_SETTLE if self.settle is None else self.settle)
        elif dialect in ("mysql", "mariadb") and kind in TIME_KINDS:
            safe = MysqlTrxHorizon(self.settle)
        elif dialect == "mssql" and isinstance(column.type, mssql.TIMESTAMP):
            safe = MssqlRowversionHorizon()
        else:
            self._fall_back(target, _no_safe_method(target, dialect))
            return
        if isinstance(safe, PgXactStartHorizon | MysqlTrxHorizon):
            try:
                safe.safe_bound(target)
            except HorizonUnavailable as exc:
                self._fall_back(target, exc.reason, exc.fix)
                return
        self._choose(target, safe, "")

    def bound(self, target: HorizonTarget, now: dt.datetime) -> KeyValue | None:
        """The chosen strategy's bound; on a lost privilege, the fallback's (and one warning)."""
        if self.chosen is None:
            self.prepare(target)
        assert self.chosen is not None
        try:
            return self.chosen.bound(target, now)
        except HorizonUnavailable as exc:
            self._fall_back(target, exc.reason, exc.fix)
            return self.chosen.bound(target, now)

    @property
    def privileges(self) -> tuple[str, ...]:
        """What the chosen strategy needs of the database role (``GRANT`` names)."""
        privileges: tuple[str, ...] = getattr(self.chosen, "privileges", ())
        return privileges

    @property
    def hold(self) -> HorizonHold | None:
        """The open transaction the chosen strategy's last bound waited for, if it says."""
        hold: HorizonHold | None = getattr(self.chosen, "hold", None)
        return hold

    def _choose(self, target: HorizonTarget, strategy: HorizonStrategy, detail: str) -> None:
        if detail == "":
            strategy.prepare(target)
        self.chosen, self.name, self.detail, self.fix = strategy, strategy.name, detail, None

    def _fall_back(self, target: HorizonTarget, reason: str, fix: str | None = None) -> None:
        fallback = _baseline(target)
        fallback.prepare(target)
        margin = f"lag={target.lag.total_seconds():g}s" if target.lag else "no horizon (lag=0)"
        detail = f"commit-safe horizon unavailable, using {margin}: {reason}"
        if not self._warned:
            self._warned = True
            logger.warning(
                "action=horizon_fallback table=%s dialect=%s cursor=%s method=%s reason=%s; rows "
                "of transactions that commit late can be missed until this is fixed",
                target.table,
                target.engine.dialect.name,
                target.cursor.name,
                fallback.name,
                detail,
            )
        self.chosen, self.name, self.detail, self.fix = fallback, fallback.name, detail, fix

    def __repr__(self) -> str:
        return f"AutoHorizon(settle={self.settle!r})"


def _baseline(target: HorizonTarget) -> HorizonStrategy:
    if target.lag > dt.timedelta(0):
        return LagHorizon()
    return NoHorizon()


def _no_safe_method(target: HorizonTarget, dialect: str) -> str:
    column = target.cursor
    fixes = {
        "postgresql": "stamp a `timestamptz` cursor with `now()`, or an `xid8` cursor with "
        "`pg_current_xact_id()`",
        "mysql": "use a `DATETIME(6)` cursor stamped with `NOW(6)`",
        "mariadb": "use a `DATETIME(6)` cursor stamped with `NOW(6)`",
        "mssql": "use a `rowversion` cursor",
    }
    fix = fixes.get(dialect, "set `lag=` longer than your longest write transaction")
    return (
        f"no commit-safe horizon for cursor `{column.name}` ({column.type}) on {dialect}; fix: "
        f"{fix}, or set `lag=` longer than your longest write transaction"
    )


def horizon_strategy(horizon: object) -> HorizonStrategy:
    """The strategy ``SqlSource(horizon=...)`` names: ``None``/``"auto"``, ``"lag"``, ``"none"``,
    or a strategy object."""
    if horizon is None or horizon == "auto":
        return AutoHorizon()
    if horizon == "lag":
        return LagHorizon()
    if horizon == "none":
        return NoHorizon()
    if isinstance(horizon, HorizonStrategy):
        return horizon
    raise ConfigurationError(
        f'`horizon={horizon!r}` is not a horizon strategy: pass `"auto"` (the '
        'default), `"lag"`, `"none"`, or an object with `name`, `prepare()` and `bound()`.'
    )
