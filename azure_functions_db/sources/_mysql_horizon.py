"""The MySQL/MariaDB commit-safe horizon: the oldest transaction in a reading of
``information_schema.innodb_trx`` that proves itself fresh (SPEC §5.3)."""

from __future__ import annotations

import datetime as dt
import logging
import time
import uuid
from typing import Any

import sqlalchemy as sa

from azure_functions_db.core.ports import HorizonHold
from azure_functions_db.core.position import KeyValue
from azure_functions_db.errors import HorizonUnavailable
from azure_functions_db.sources._dialect_horizons import (
    DEFAULT_SETTLE,
    HELD_ENTIRELY,
    apply_lag,
    require,
    time_cursor,
    usable,
)
from azure_functions_db.sources._target import HorizonTarget
from azure_functions_db.sources.values import time_bound

__all__ = ["MysqlTrxHorizon", "innodb_trx_sql"]

logger = logging.getLogger(__name__)

# How MysqlTrxHorizon reads information_schema.innodb_trx, and why it can trust what it reads.
#
# InnoDB serves innodb_trx from one server-wide cache that it refreshes only when no session read
# it in the last 0.1 s. Several readers (pollers of one server, monitoring) that read it less than
# 0.1 s apart keep it frozen for as long as they go on: a transaction begun since is missing (the
# bound passes its rows: lost) and one ended since is still listed (a hold naming a finished
# session). So a reading is used only when it proves itself fresh. Before reading, this session
# reads the clock (`UTC_NOW_SQL`, T0) and starts a read-only InnoDB transaction; every statement
# of that transaction carries a nonce in a leading comment. A snapshot that lists this session's
# transaction running a statement with the nonce was taken after T0, so it lists every
# transaction that began before T0 and was still open when it was taken, and the bound is kept
# at or below T0. A snapshot without it is older: wait more than 0.1 s and read again. Our
# readers of one server take turns under a named lock, so one that waits for the cache to refresh
# is not kept waiting by the others; the lock only helps, the proof alone is what makes a reading
# count. Read-only transactions (ours, and any other) are left out of the oldest start: they
# cannot write a row.
#
# trx_started has whole seconds (rounded down, which only makes the bound safer) and is written by
# InnoDB in the server's system zone on MariaDB, in the session zone elsewhere: both readings are
# returned. A statement that read NOW() but has not touched InnoDB yet (waiting for a metadata
# lock, or in a slow subquery before its first row) is not in innodb_trx, but it is in the process
# list (which is not cached), with its running time: `statement` is the oldest such start, in UTC
# (MariaDB's TIME_MS has milliseconds; MySQL's TIME whole seconds, so a second is added).
UTC_NOW_SQL = sa.text("SELECT UTC_TIMESTAMP(6)")
START_READ_ONLY = "/* afdb horizon {nonce} */ START TRANSACTION READ ONLY, WITH CONSISTENT SNAPSHOT"
#: The server-wide named lock our readers of innodb_trx take turns under, and how long one waits.
INNODB_TRX_LOCK = "afdb.innodb_trx"
INNODB_TRX_LOCK_WAIT = 2
TAKE_LOCK = (
    f"/* afdb horizon {{nonce}} */ SELECT GET_LOCK('{INNODB_TRX_LOCK}', {INNODB_TRX_LOCK_WAIT})"
)
RELEASE_LOCK = f"DO RELEASE_LOCK('{INNODB_TRX_LOCK}')"
_OTHER = "t.trx_mysql_thread_id <> CONNECTION_ID() AND t.trx_is_read_only = 0"
_STATEMENTS = (
    "(SELECT MIN(UTC_TIMESTAMP(6) - INTERVAL {elapsed} MICROSECOND) "
    "FROM information_schema.PROCESSLIST AS p WHERE p.ID <> CONNECTION_ID() AND p.INFO IS NOT "
    "NULL AND p.COMMAND NOT IN ('Sleep', 'Daemon', 'Binlog Dump', 'Binlog Dump GTID', "
    "'Connect')) AS statement"
)
_MYSQL_TRX = (
    "/* afdb horizon {nonce} */ SELECT NOW(6) AS session_now, UTC_TIMESTAMP(6) AS utc_now, "
    "CONVERT_TZ(UTC_TIMESTAMP(6), '+00:00', 'SYSTEM') AS system_now, x.fresh, x.oldest, "
    "x.holder_thread, (SELECT CONCAT('user `', COALESCE(p.USER, '?'), '@', COALESCE(p.HOST, '?'), "
    "'`, ', COALESCE(p.COMMAND, '?')) FROM information_schema.PROCESSLIST AS p "
    "WHERE p.ID = x.holder_thread) AS holder_session, {statements} FROM ("
    "SELECT COALESCE(MAX(t.trx_mysql_thread_id = CONNECTION_ID() "
    "AND LOCATE('afdb horizon {nonce}', t.trx_query) > 0), 0) AS fresh, "
    f"MIN(CASE WHEN {_OTHER} THEN t.trx_started END) AS oldest, "
    "CAST(SUBSTRING(MIN(CASE WHEN "
    f"{_OTHER} THEN CONCAT(DATE_FORMAT(t.trx_started, '%Y%m%d%H%i%s'), "
    "LPAD(t.trx_mysql_thread_id, 20, '0')) END), 15) AS UNSIGNED) AS holder_thread "
    "FROM information_schema.INNODB_TRX AS t) AS x"
)
_MYSQL_ELAPSED = "(p.TIME + 1) * 1000000"
_MARIADB_ELAPSED = "CEIL(p.TIME_MS * 1000)"


def innodb_trx_sql(mariadb: bool, nonce: str) -> sa.TextClause:
    """The reading of ``innodb_trx`` (and the process list) for one transaction's ``nonce``."""
    statements = _STATEMENTS.format(elapsed=_MARIADB_ELAPSED if mariadb else _MYSQL_ELAPSED)
    return sa.text(_MYSQL_TRX.replace("{statements}", statements).replace("{nonce}", nonce))


#: Seconds to wait for the innodb_trx cache to refresh before reading it again (InnoDB refreshes
#: it once nobody read it for 0.1 s), and how long one bound keeps trying before it holds.
INNODB_TRX_CACHE_IDLE = 0.12
INNODB_TRX_PROOF_TIMEOUT = 2.0


class MysqlTrxHorizon:
    """MySQL/MariaDB date-time cursor: bound = oldest ``trx_started`` in ``innodb_trx``.

    ``NOW()`` is the start of the statement, and InnoDB lists the transaction from its first
    InnoDB statement, so a value stamped by ``INSERT``/``UPDATE ... NOW(6)`` is at or after the
    ``trx_started`` of its transaction (which has whole seconds, rounded down); ``settle`` covers
    the moment between the statement's clock read and the transaction's start. Needs the
    ``PROCESS`` privilege. With none open the bound is the server's clock less ``settle``.

    ``innodb_trx`` is a server-wide cache that other readers can keep from refreshing, so a
    reading counts only when it proves itself newer than the clock read the bound starts from
    (see the comment on ``innodb_trx_sql``). While no reading can prove that, the bound stays
    where it last was proven safe and :attr:`hold` says why (never a finished transaction).
    """

    name = "mysql_innodb_trx"
    #: What the database role needs for this method, as ``GRANT`` names it.
    privileges: tuple[str, ...] = ("PROCESS",)

    def __init__(
        self, settle: dt.timedelta = DEFAULT_SETTLE, proof_timeout: float = INNODB_TRX_PROOF_TIMEOUT
    ) -> None:
        self.settle = settle
        self.proof_timeout = proof_timeout
        #: The transaction the last bound waited for, if any (see ``Horizon.hold``).
        self.hold: HorizonHold | None = None
        self._proven: KeyValue | None = None  # the last bound a fresh reading gave
        self._stale_since: dt.datetime | None = None

    def prepare(self, target: HorizonTarget) -> None:
        """Require MySQL/MariaDB, a time cursor and the ``PROCESS`` privilege."""
        require(target, ("mysql", "mariadb"), self.name)
        time_cursor(target, self.name)
        usable(self, target)

    def bound(self, target: HorizonTarget, now: dt.datetime) -> KeyValue | None:
        """``min(oldest trx_started, server clock, statements running) - settle``, then lag."""
        return apply_lag(self.safe_bound(target), target, now)

    def safe_bound(self, target: HorizonTarget) -> KeyValue | None:
        """The bound without ``lag``; raises :class:`HorizonUnavailable`."""
        try:
            started, row, taken = self._fresh_reading(target)
        except sa.exc.DBAPIError as exc:
            message = str(exc.orig).lower()
            if "access denied" in message or "process privilege" in message:
                user = target.engine.url.username or "the user"
                grant = f"GRANT PROCESS ON *.* TO {user}"
                raise HorizonUnavailable(
                    f"user `{user}` may not read information_schema.innodb_trx; fix: `{grant}`",
                    fix=grant,
                ) from exc
            raise
        if row is None:
            return self._held_stale(target, started, taken)
        if self._stale_since is not None:
            logger.info(
                "action=horizon_resumed table=%s reason=innodb_trx_refreshed stale_seconds=%.1f",
                target.table,
                (started - self._stale_since.replace(tzinfo=None)).total_seconds(),
            )
            self._stale_since = None
        oldest: dt.datetime = started
        self.hold = None
        if row.oldest is not None:
            # Read trx_started in both zones it may be written in; a reading in the future is
            # the wrong one, and of two plausible readings the earlier is the safe one.
            utc_now: dt.datetime = row.utc_now
            readings = [
                row.oldest - (zone_now - utc_now)
                for zone_now in (row.session_now, row.system_now)
                if zone_now is not None
            ]
            plausible = [r for r in readings if r <= utc_now + self.settle] or readings
            held = min(plausible)
            oldest = min(oldest, held)
            holder = f"thread {row.holder_thread}"
            if row.holder_session is not None:
                holder += f", {row.holder_session}"
            self.hold = HorizonHold(since=held.replace(tzinfo=dt.UTC), holder=holder)
        if row.statement is not None:
            oldest = min(oldest, row.statement)
        bound = time_bound(
            (oldest - self.settle).replace(tzinfo=dt.UTC), target.cursor, target.zone
        )
        self._proven = bound
        return bound

    def _fresh_reading(self, target: HorizonTarget) -> tuple[dt.datetime, Any, int]:
        """(T0, a reading of innodb_trx taken after T0, how many were taken), the reading
        ``None`` when none could be proven fresh within ``proof_timeout``."""
        nonce = uuid.uuid4().hex
        mariadb = bool(getattr(target.engine.dialect, "is_mariadb", False))
        reading = innodb_trx_sql(mariadb, nonce)
        with target.engine.connect() as conn:
            try:
                started: dt.datetime = conn.execute(UTC_NOW_SQL).scalar_one()
                conn.exec_driver_sql(START_READ_ONLY.replace("{nonce}", nonce))
                locked = conn.exec_driver_sql(TAKE_LOCK.replace("{nonce}", nonce)).scalar()
                try:
                    deadline = time.monotonic() + self.proof_timeout
                    taken = 0
                    while True:
                        row = conn.execute(reading).one()
                        taken += 1
                        if row.fresh:
                            return started, row, taken
                        if time.monotonic() + INNODB_TRX_CACHE_IDLE > deadline:
                            return started, None, taken
                        time.sleep(INNODB_TRX_CACHE_IDLE)
                finally:
                    conn.exec_driver_sql("ROLLBACK")  # ends the read-only transaction
                    if locked == 1:
                        conn.exec_driver_sql(RELEASE_LOCK)
                    conn.rollback()
            except BaseException:
                # The named lock and the transaction belong to this session: never hand them
                # back to the pool.
                conn.invalidate()
                raise

    def _held_stale(
        self, target: HorizonTarget, started: dt.datetime, taken: int
    ) -> KeyValue | None:
        """No fresh reading: keep the last proven bound (a bound once safe stays safe) and say
        why, once per episode."""
        if self._stale_since is None:
            self._stale_since = started.replace(tzinfo=dt.UTC)
            logger.warning(
                "action=horizon_held table=%s reason=innodb_trx_not_refreshed readings=%d "
                "note=another_session_reads_information_schema.innodb_trx_less_than_0.1s_apart;"
                "_no_new_rows_until_a_fresh_reading",
                target.table,
                taken,
            )
        self.hold = HorizonHold(
            since=self._stale_since,
            holder=(
                "information_schema.innodb_trx not refreshed (InnoDB refreshes it only after "
                "0.1 s without a reader; something reads it more often)"
            ),
        )
        if self._proven is not None:
            return self._proven
        return time_bound(HELD_ENTIRELY, target.cursor, target.zone)

    def __repr__(self) -> str:
        return f"MysqlTrxHorizon(settle={self.settle!r})"
