"""Commit-safe horizons that ask the database which transactions are still open (SPEC §5.3).

Each strategy returns an exclusive bound on the leading cursor column such that every row whose
cursor is below it has either committed or rolled back: no transaction that could still commit
such a row is open. All of them are taken before the batch is read and cost one short query.

========================  ==============================  ====================================
strategy                  cursor                          needs
========================  ==============================  ====================================
``PgSnapshotHorizon``     PostgreSQL ``xid8``             nothing
``PgXactStartHorizon``    PostgreSQL date-time            ``pg_read_all_stats`` (or superuser)
``MysqlTrxHorizon``       MySQL/MariaDB date-time         ``PROCESS`` (``_mysql_horizon``)
``MssqlRowversionHorizon`` SQL Server ``rowversion``       nothing
========================  ==============================  ====================================

Date-time cursors are safe when the database stamps them: PostgreSQL ``now()`` is the start of
the transaction, so the oldest ``xact_start`` of every open transaction bounds every value still
to commit; MySQL ``NOW()`` is the start of the statement, and InnoDB lists a transaction in
``innodb_trx`` from its first InnoDB statement. Values computed by the application, or (MySQL)
read with ``SELECT NOW()`` before the transaction touched an InnoDB table, are not covered: use
``lag`` as an extra margin for those. A source's ``lag`` always applies on top of the safe bound.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy.dialects import mssql

from azure_functions_db.core.ports import HorizonHold
from azure_functions_db.core.position import KeyValue
from azure_functions_db.errors import ConfigurationError, HorizonUnavailable
from azure_functions_db.sources._target import HorizonTarget
from azure_functions_db.sources.values import column_kind, time_bound

__all__ = [
    "PG_SETTLE",
    "TIME_KINDS",
    "HorizonUnavailable",
    "MssqlRowversionHorizon",
    "PgSnapshotHorizon",
    "PgXactStartHorizon",
    "apply_lag",
    "pg_cursor_type",
]

logger = logging.getLogger(__name__)

TIME_KINDS = ("datetime", "datetime_tz", "date")

# How far below the server's clock a bound stays, where the database cannot show every writer
# that has read its clock (SQLite's coarse ticks; MySQL, whose process list has whole seconds; a
# MariaDB server with triggers or stored functions). Rows newer than this wait for the next batch.
DEFAULT_SETTLE = dt.timedelta(seconds=1)
#: PostgreSQL needs none: a backend that has read its clock and not yet published its transaction
#: is seen as idle and not reading from its client (see ``PG_CLIENT_READ_SQL``).
PG_SETTLE = dt.timedelta(0)

PG_SNAPSHOT_SQL = sa.text("SELECT pg_snapshot_xmin(pg_current_snapshot())")

# A transaction's now() is read from the clock when its first statement arrives, a moment before
# its backend publishes anything in pg_stat_activity (PostgreSQL: SetCurrentStatementStartTimestamp,
# then pgstat_report_activity(running) with query_start, then xact_start). A backend stalled in
# between (descheduled, stopped) shows its previous state while its rows carry the older stamp.
# That moment is closed exactly, not by a margin, in two readings:
#
# 1. The server's clock T (this statement's start), and the backends then blocked reading from
#    their client (`ClientRead`): each reads its next statement's clock after T.
# 2. In a new transaction (pg_stat_activity is a snapshot per transaction), every other backend
#    of this database: an open transaction counts from its xact_start; a client backend running
#    a statement from its query_start (published before its xact_start); an idle client backend
#    that was not blocked reading at 1 from the moment it went idle (state_change: its next
#    statement's clock is read after it published that). An idle client backend that was
#    blocked reading at 1 stamps nothing below T.
#
# Sessions are client backends and walsenders (a `replication=database` connection runs SQL
# too; one streaming changes, `START_REPLICATION`, stamps nothing). Autovacuum never writes
# user rows and sessions of other databases cannot write this table. Some writers are not
# listed with a start: a session with `track_activities = off` (state `disabled`), or one still
# starting up (state NULL, before its first idle report: PostgreSQL 17 runs login event triggers
# then), is held at its backend_start; a prepared (two-phase) transaction has left
# pg_stat_activity and its start is unknown, so the bound is held entirely while one of this
# database is open (`prepared` names the oldest, for the log). Background workers of this
# database (extensions) publish no idle state: one with no open transaction holds the bound
# BACKGROUND_MARGIN below T. (A logical replication subscriber's apply worker writes the
# publisher's stamps, older by the replication lag: poll the publisher.) All instants come back
# as naive UTC wall-clock times: every driver returns those alike (psqlODBC returns timestamptz
# naive, in the session's zone).
PG_CLIENT_READ_SQL = sa.text(
    "SELECT statement_timestamp() AT TIME ZONE 'UTC' AS server_now, "
    "(SELECT string_agg(a.pid::text, ',') FROM pg_stat_activity AS a "
    "WHERE a.wait_event_type = 'Client' AND a.wait_event = 'ClientRead') AS reading"
)
_PG_OTHERS = (
    "FROM pg_stat_activity AS a WHERE a.pid <> pg_backend_pid() "
    "AND a.datname = current_database() "
    "AND a.backend_type NOT IN ('autovacuum worker', 'autovacuum launcher')"
)
_PG_SESSION = "a.backend_type IN ('client backend', 'walsender')"
_PG_SINCE = (
    "LEAST(a.xact_start, "
    f"CASE WHEN {_PG_SESSION} AND a.state IN ('active', 'fastpath function call') "
    "AND a.query NOT ILIKE 'START_REPLICATION%' THEN a.query_start END, "
    f"CASE WHEN {_PG_SESSION} AND a.state = 'idle' "
    "AND NOT a.pid = ANY(string_to_array(:reading, ',')::int[]) THEN a.state_change END, "
    f"CASE WHEN {_PG_SESSION} AND (a.state = 'disabled' OR a.state IS NULL) "
    "THEN a.backend_start END)"
)
_PG_WHAT = (
    "CASE WHEN a.xact_start IS NOT NULL THEN coalesce(a.state, 'open transaction') "
    "WHEN a.state = 'idle' THEN 'idle, between statements' "
    "WHEN a.state = 'disabled' THEN 'track_activities off' "
    "WHEN a.state IS NULL THEN 'starting' ELSE a.state END"
)
PG_XACT_START_SQL = sa.text(
    "SELECT h.since AS oldest, h.holder, "
    "(SELECT a.backend_type || ' pid ' || a.pid " + _PG_OTHERS + " "
    "AND a.backend_type NOT IN ('client backend', 'walsender', 'parallel worker') "
    "AND a.xact_start IS NULL ORDER BY a.pid LIMIT 1) AS worker, "
    "(SELECT p.gid || ' prepared at ' || p.prepared FROM pg_prepared_xacts AS p "
    "WHERE p.database = current_database() ORDER BY p.prepared LIMIT 1) AS prepared, "
    "pg_has_role('pg_read_all_stats', 'USAGE') AS sees_all, "
    "pg_is_in_recovery() AS standby "
    "FROM (SELECT 1) AS one LEFT JOIN ("
    "SELECT " + _PG_SINCE + " AT TIME ZONE 'UTC' AS since, "
    "'pid ' || a.pid || ', app `' || coalesce(nullif(a.application_name, ''), '-') "
    "|| '`, ' || " + _PG_WHAT + " AS holder " + _PG_OTHERS + " "
    "AND " + _PG_SINCE + " IS NOT NULL ORDER BY 1 LIMIT 1) AS h ON true"
)

#: How far below the server's clock a background worker of the source's database holds the bound
#: while it has no open transaction: it publishes no idle state, so the moment between its clock
#: read and its xact_start is covered by this margin, as it was for every backend before.
BACKGROUND_MARGIN = dt.timedelta(seconds=1)

#: The bound while a prepared transaction is open: nothing new is read until it is resolved.
HELD_ENTIRELY = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)

PG_COLUMN_TYPE_SQL = sa.text(
    "SELECT format_type(a.atttypid, a.atttypmod) FROM pg_attribute AS a "
    "WHERE a.attrelid = CAST(:relation AS regclass) AND a.attname = :column "
    "AND NOT a.attisdropped"
)

SQLITE_NOW_SQL = sa.text("SELECT strftime('%Y-%m-%d %H:%M:%f', 'now')")

MSSQL_ROWVERSION_SQL = sa.text("SELECT MIN_ACTIVE_ROWVERSION()")


def apply_lag(bound: KeyValue | None, target: HorizonTarget, now: dt.datetime) -> KeyValue | None:
    """``min(bound, now - lag)`` for a time cursor with a lag; ``bound`` otherwise."""
    if target.lag <= dt.timedelta(0):
        return bound
    lagged = time_bound(now - target.lag, target.cursor, target.zone)
    if lagged is None or bound is None:
        return bound if lagged is None else lagged
    return min(bound, lagged)  # same column, same Python type


def pg_cursor_type(target: HorizonTarget) -> str:
    """The PostgreSQL type of the leading cursor column as ``format_type`` spells it."""
    column = target.cursor
    engine = target.engine
    relation = engine.dialect.identifier_preparer.format_table(column.table)
    with engine.connect() as conn:
        found = conn.execute(PG_COLUMN_TYPE_SQL, {"relation": relation, "column": column.name})
        return str(found.scalar_one())


class _SafeBound(Protocol):
    name: str

    def safe_bound(self, target: HorizonTarget) -> KeyValue | None: ...


def usable(strategy: _SafeBound, target: HorizonTarget) -> None:
    """Raise ``ConfigurationError`` when ``strategy`` cannot compute its bound for ``target``."""
    try:
        strategy.safe_bound(target)
    except HorizonUnavailable as exc:
        raise ConfigurationError(
            f"Horizon `{strategy.name}` cannot work for `{target.table}`: "
            f'{exc.reason}. Or use `horizon="auto"`, which falls back to `lag`.'
        ) from exc


def _dialect(target: HorizonTarget) -> str:
    return target.engine.dialect.name


def require(target: HorizonTarget, dialects: tuple[str, ...], method: str) -> None:
    if _dialect(target) not in dialects:
        raise ConfigurationError(
            f"Horizon `{method}` works on {' or '.join(dialects)} only, but `"
            f'{target.table}` is on {_dialect(target)}. Use `horizon="auto"` or '
            "`LagHorizon()`."
        )


def time_cursor(target: HorizonTarget, method: str) -> None:
    column = target.cursor
    if column_kind(column) not in TIME_KINDS:
        raise ConfigurationError(
            f"Horizon `{method}` needs a date or date-time cursor, but cursor `{column.name}` of "
            f'`{target.table}` has type `{column.type}`. Use `horizon="auto"`.'
        )


def _no_lag(target: HorizonTarget, method: str) -> None:
    if target.lag > dt.timedelta(0):
        column = target.cursor
        raise ConfigurationError(
            f"`lag={target.lag.total_seconds():g}` needs a date-time cursor, but horizon "
            f"`{method}` orders cursor `{column.name}` of `{target.table}` by "
            "transaction, not time. Remove `lag=`: this horizon is exact."
        )


class PgSnapshotHorizon:
    """PostgreSQL ``xid8`` cursor: bound = ``pg_snapshot_xmin(pg_current_snapshot())``.

    Every transaction id below the snapshot's ``xmin`` has finished, so a cursor stamped with
    ``pg_current_xact_id()`` below it can no longer appear. No privilege needed.
    """

    name = "pg_snapshot_xmin"
    #: What the database role needs for this method, as ``GRANT`` names it.
    privileges: tuple[str, ...] = ()

    def prepare(self, target: HorizonTarget) -> None:
        """Require PostgreSQL, an ``xid8`` leading cursor and no ``lag``."""
        require(target, ("postgresql",), self.name)
        found = pg_cursor_type(target)
        if found != "xid8":
            column = target.cursor
            raise ConfigurationError(
                f"Horizon `{self.name}` needs an `xid8` cursor (stamped with "
                f"`pg_current_xact_id()`), but cursor `{column.name}` of "
                f'`{target.table}` has type `{found}`. Use `horizon="auto"`.'
            )
        _no_lag(target, self.name)

    def bound(self, target: HorizonTarget, now: dt.datetime) -> KeyValue | None:
        """The snapshot ``xmin``, as the driver returns ``xid8`` values (psycopg: text)."""
        with target.engine.connect() as conn:
            value: Any = conn.execute(PG_SNAPSHOT_SQL).scalar_one()
        return value  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        return "PgSnapshotHorizon()"


class PgXactStartHorizon:
    """PostgreSQL date-time cursor: bound = oldest ``xact_start`` of every open transaction.

    ``now()`` in PostgreSQL is the start of the transaction, and a transaction that has not
    written yet (idle in transaction included) may still stamp it, so every open transaction
    counts, not only those holding an xid. A client backend that is running a statement counts
    from its ``query_start`` (published before its ``xact_start``), and an idle one that was not
    blocked reading from its client from when it went idle (it may have read its clock for a new
    transaction and not yet published it). With none of these the bound is the server's clock
    less ``settle`` (default 0). The role must see every session's ``xact_start``: superuser or
    a member of ``pg_read_all_stats`` (otherwise other roles' sessions show NULL and would be
    missed). Not usable on a standby, which does not list the primary's transactions.
    """

    name = "pg_xact_start"
    #: What the database role needs for this method, as ``GRANT`` names it.
    privileges: tuple[str, ...] = ("pg_read_all_stats",)

    def __init__(self, settle: dt.timedelta = PG_SETTLE) -> None:
        self.settle = settle
        self._warned_prepared: str | None = None
        #: The transaction the last bound waited for, if any (see ``Horizon.hold``).
        self.hold: HorizonHold | None = None

    def prepare(self, target: HorizonTarget) -> None:
        """Require PostgreSQL, a time cursor, and that the role sees every transaction."""
        require(target, ("postgresql",), self.name)
        time_cursor(target, self.name)
        usable(self, target)

    def bound(self, target: HorizonTarget, now: dt.datetime) -> KeyValue | None:
        """``min(oldest xact_start, server clock - settle, now - lag)`` in the column's form."""
        return apply_lag(self.safe_bound(target), target, now)

    def safe_bound(self, target: HorizonTarget) -> KeyValue | None:
        """The bound without ``lag``; raises :class:`HorizonUnavailable`."""
        with target.engine.connect() as conn:
            first = conn.execute(PG_CLIENT_READ_SQL).one()
            conn.commit()  # pg_stat_activity is read afresh in the next transaction
            row = conn.execute(PG_XACT_START_SQL, {"reading": first.reading or ""}).one()
        if not row.sees_all:
            user = target.engine.url.username or "the role"
            grant = f"GRANT pg_read_all_stats TO {user}"
            raise HorizonUnavailable(
                f"role `{user}` cannot see other sessions' transactions in pg_stat_activity; "
                f"fix: `{grant}`",
                fix=grant,
            )
        if row.standby:
            raise HorizonUnavailable(
                "the server is a standby, which does not list the primary's open transactions; "
                "fix: point the source at the primary"
            )
        self.hold = None
        if row.prepared is not None:
            self.hold = HorizonHold(
                since=HELD_ENTIRELY, holder=f"prepared transaction {row.prepared}"
            )
            if row.prepared != self._warned_prepared:
                self._warned_prepared = row.prepared
                logger.warning(
                    "action=horizon_held table=%s reason=prepared_transaction transaction=%s "
                    "note=its_start_is_unknown_no_new_rows_until_COMMIT_or_ROLLBACK_PREPARED",
                    target.table,
                    str(row.prepared).replace(" ", "_"),
                )
            return time_bound(HELD_ENTIRELY, target.cursor, target.zone)
        server_now: dt.datetime = first.server_now
        oldest = server_now - self.settle
        held = [(row.oldest, row.holder)]
        if row.worker is not None:
            held.append((server_now - BACKGROUND_MARGIN, f"{row.worker} (background worker)"))
        for since, holder in held:
            if since is not None and since < oldest:
                oldest = since
                self.hold = HorizonHold(since=since.replace(tzinfo=dt.UTC), holder=str(holder))
        return time_bound(oldest.replace(tzinfo=dt.UTC), target.cursor, target.zone)

    def __repr__(self) -> str:
        return f"PgXactStartHorizon(settle={self.settle!r})"


class SqliteClockHorizon:
    """SQLite date-time cursor: bound = SQLite's own clock (UTC) less ``settle``.

    SQLite serializes writers, but that does not make cursor values arrive in key order: with a
    coarse cursor, a row of a lower pk stamped in the same tick as the checkpoint commits after
    it and would be passed over. Reading only below ``now - settle`` lets every tick finish
    before it is read. The clock is SQLite's ``'now'`` (what ``CURRENT_TIMESTAMP`` stamps), read
    as wall-clock time in ``cursor_timezone`` for a naive column.
    """

    name = "sqlite_clock"
    #: What the database role needs for this method, as ``GRANT`` names it.
    privileges: tuple[str, ...] = ()

    def __init__(self, settle: dt.timedelta = DEFAULT_SETTLE) -> None:
        self.settle = settle

    def prepare(self, target: HorizonTarget) -> None:
        """Require SQLite and a date or date-time cursor."""
        require(target, ("sqlite",), self.name)
        time_cursor(target, self.name)

    def bound(self, target: HorizonTarget, now: dt.datetime) -> KeyValue | None:
        """``min(SQLite's clock - settle, now - lag)``."""
        with target.engine.connect() as conn:
            text = conn.execute(SQLITE_NOW_SQL).scalar_one()
        clock = dt.datetime.fromisoformat(str(text)).replace(tzinfo=dt.UTC)
        bound = time_bound(clock - self.settle, target.cursor, target.zone)
        return apply_lag(bound, target, now)

    def __repr__(self) -> str:
        return f"SqliteClockHorizon(settle={self.settle!r})"


class MssqlRowversionHorizon:
    """SQL Server ``rowversion`` cursor: bound = ``MIN_ACTIVE_ROWVERSION()``.

    The lowest rowversion of any open transaction (or the next one to be issued): every row
    below it is committed. No privilege needed.
    """

    name = "mssql_min_active_rowversion"
    #: What the database role needs for this method, as ``GRANT`` names it.
    privileges: tuple[str, ...] = ()

    def prepare(self, target: HorizonTarget) -> None:
        """Require SQL Server, a ``rowversion`` leading cursor and no ``lag``."""
        require(target, ("mssql",), self.name)
        column = target.cursor
        if not isinstance(column.type, mssql.TIMESTAMP):
            raise ConfigurationError(
                f"Horizon `{self.name}` needs a `rowversion` cursor, but cursor `{column.name}` "
                f"of `{target.table}` has type `{column.type}`. Use "
                '`horizon="auto"`.'
            )
        _no_lag(target, self.name)

    def bound(self, target: HorizonTarget, now: dt.datetime) -> KeyValue | None:
        """``MIN_ACTIVE_ROWVERSION()`` as 8 bytes."""
        with target.engine.connect() as conn:
            value = conn.execute(MSSQL_ROWVERSION_SQL).scalar_one()
        return bytes(value)

    def __repr__(self) -> str:
        return "MssqlRowversionHorizon()"
