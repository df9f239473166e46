"""The MySQL/MariaDB commit-safe horizon: the oldest transaction in a reading of
``information_schema.innodb_trx`` that proves itself fresh (SPEC §5.3)."""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
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
from azure_functions_db.sources.values import column_kind, time_bound

__all__ = ["MysqlTrxHorizon", "innodb_trx_sql"]

logger = logging.getLogger(__name__)

# How MysqlTrxHorizon reads information_schema.innodb_trx, and why it can trust what it reads.
#
# InnoDB serves innodb_trx from one server-wide cache that it refreshes only when no session read
# it in the last 0.1 s. Several readers (pollers of one server, monitoring) that read it less than
# 0.1 s apart keep it frozen for as long as they go on: a transaction begun since is missing (the
# bound passes its rows: lost) and one ended since is still listed (a hold naming a finished
# session). So a reading is used only when it proves itself fresh. This session starts a read-only
# InnoDB transaction, then in one statement reads the clock (T0: the statement's start) and the
# statements running in the process list (not cached; P: after T0), then reads innodb_trx in a
# statement marked `read` with a nonce. A snapshot that lists this session's transaction running
# the marked statement was taken during it, after P, so it lists every transaction that was
# registered before P and still open; a snapshot without it is older: wait more than 0.1 s and
# read again. Our readers of one server take turns under a named lock, so one that waits for the
# cache to refresh is not kept waiting by the others; the lock only helps, the proof alone is what
# makes a reading count. Read-only transactions (ours, and any other) are left out: they cannot
# write a row.
#
# What a writing transaction may have stamped. NOW() is the start of the statement, but InnoDB
# registers the transaction (and sets trx_started, whole seconds) only at its first row operation,
# after the statement parsed, waited for metadata and table locks (up to lock_wait_timeout) and ran
# its BEFORE triggers. While that statement runs the process list has it, with its start (MariaDB's
# TIME_MS, microseconds; MySQL's TIME, whole seconds, so a second is added); once it has ended and
# its transaction stays open, trx_started can be later than its rows' stamps by the whole wait. So
# each transaction is remembered from the first fresh reading that listed it, with a floor: the
# T0 and the statement starts of the reading before (`floor` below). It was not listed then, so
# every statement of it that stamped a row either started after that reading's T0, or was still
# running (and not yet registered) when that reading read the process list: no row of it is
# older than the floor. A transaction already open at this poller's first reading has no floor:
# the bound holds entirely until it ends (reported). While the bound is held by a transaction
# listed for the first time in this bound's readings whose floor is unknown or doubtful (the
# reading before was more than DOUBTFUL_GAP earlier: the last timer run), the reading is taken
# again (a short transaction has ended meanwhile), for up to `proof_timeout`.
START_READ_ONLY = "/* afdb horizon {nonce} */ START TRANSACTION READ ONLY, WITH CONSISTENT SNAPSHOT"
#: The server-wide named lock our readers of innodb_trx take turns under, and how long one waits.
INNODB_TRX_LOCK = "afdb.innodb_trx"
INNODB_TRX_LOCK_WAIT = 2
TAKE_LOCK = (
    f"/* afdb horizon {{nonce}} */ SELECT GET_LOCK('{INNODB_TRX_LOCK}', {INNODB_TRX_LOCK_WAIT})"
)
RELEASE_LOCK = f"DO RELEASE_LOCK('{INNODB_TRX_LOCK}')"
# A transaction counts once it has modified a row: its row's stamp is its writing statement's
# start, and a statement that has not finished writing is in the process list. One that has
# not written yet (MariaDB lists them all as trx_id 0, MySQL under ids that are reused) stamps
# nothing older than the statements still to come.
_OTHER = (
    "t.trx_mysql_thread_id <> CONNECTION_ID() AND t.trx_is_read_only = 0 "
    "AND t.trx_rows_modified > 0"
)
# Every thread running a command counts (also `Busy`, and one whose INFO is not set yet: the
# start shown is then its previous command's, earlier; and the event scheduler's workers, whose
# command is `Connect` while they run an event's statement), except our horizon readers'
# read-only statements (they would hold the bound for their lock wait).
_CLOCKS = (
    "/* afdb horizon {nonce} */ SELECT UTC_TIMESTAMP(6) AS utc_now, NOW(6) AS session_now, "
    "CONVERT_TZ(UTC_TIMESTAMP(6), '+00:00', 'SYSTEM') AS system_now, "
    "(SELECT MIN(UTC_TIMESTAMP(6) - INTERVAL {elapsed} MICROSECOND) "
    "FROM information_schema.PROCESSLIST AS p WHERE p.ID <> CONNECTION_ID() "
    "AND p.COMMAND NOT IN ('Sleep', 'Daemon', 'Binlog Dump', 'Binlog Dump GTID') "
    "AND (p.COMMAND <> 'Connect' OR p.INFO IS NOT NULL) "
    "AND (p.INFO IS NULL OR p.INFO NOT LIKE '/* afdb horizon %')) AS statement"
)
_TRX = (
    "/* afdb horizon {nonce} read */ SELECT t.trx_id, t.trx_started, "
    "t.trx_mysql_thread_id AS thread, "
    "(t.trx_mysql_thread_id = CONNECTION_ID() "
    "AND LOCATE('afdb horizon {nonce} read', t.trx_query) > 0) AS mine, "
    f"({_OTHER}) AS other, "
    "CONCAT('user `', COALESCE(p.USER, '?'), '@', COALESCE(p.HOST, '?'), '`, ', "
    "COALESCE(p.COMMAND, '?')) AS session "
    "FROM information_schema.INNODB_TRX AS t "
    "LEFT JOIN information_schema.PROCESSLIST AS p ON p.ID = t.trx_mysql_thread_id"
)
_MYSQL_ELAPSED = "(p.TIME + 1) * 1000000"

# The settle margin a MariaDB server needs. A statement shows in the process list (command set)
# before it reads its clock (MariaDB sets the command, then the time), and it shows its start
# until it ends: no margin needed. Except inside a trigger or stored function: there NOW() stays
# the start of the triggering statement while the process list's time restarts at the end of
# each statement inside it, so until the transaction's first row change is in innodb_trx, a
# statement whose trigger or function has run a while looks younger than its rows' stamps. The
# margin covers that while (up to DEFAULT_SETTLE) on a server that has triggers or stored
# functions in any schema this user can see.
_ROUTINES = (
    "SELECT (SELECT CONCAT('trigger `', t.TRIGGER_SCHEMA, '`.`', t.TRIGGER_NAME, '`') "
    "FROM information_schema.TRIGGERS AS t WHERE t.TRIGGER_SCHEMA NOT IN {system} LIMIT 1) "
    "AS trg, (SELECT CONCAT('function `', r.ROUTINE_SCHEMA, '`.`', r.ROUTINE_NAME, '`') "
    "FROM information_schema.ROUTINES AS r WHERE r.ROUTINE_TYPE = 'FUNCTION' "
    "AND r.ROUTINE_SCHEMA NOT IN {system} LIMIT 1) AS fn"
).replace("{system}", "('mysql', 'sys', 'information_schema', 'performance_schema')")
#: The margin on MariaDB without triggers or stored functions.
MARIADB_SETTLE = dt.timedelta(0)
# information_schema lists only the triggers and functions this user may see: every trigger
# with the global TRIGGER privilege, every function with SELECT on mysql.proc. Without both,
# "none" is not proven and the margin stays DEFAULT_SETTLE.
_GLOBAL_TRIGGER = (
    "SELECT COUNT(*) FROM information_schema.USER_PRIVILEGES WHERE PRIVILEGE_TYPE = 'TRIGGER' "
    "AND GRANTEE = CONCAT(CHAR(39), SUBSTRING_INDEX(CURRENT_USER(), '@', 1), CHAR(39), '@', "
    "CHAR(39), SUBSTRING_INDEX(CURRENT_USER(), '@', -1), CHAR(39))"  # (any sql_mode)
)
_READ_PROC = "SELECT 1 FROM mysql.proc LIMIT 0"
ROUTINES_GRANT = "GRANT TRIGGER ON *.* TO {user}; GRANT SELECT ON mysql.proc TO {user}"
_MARIADB_ELAPSED = "CEIL(p.TIME_MS * 1000)"


def innodb_trx_sql(mariadb: bool, nonce: str) -> tuple[sa.TextClause, sa.TextClause]:
    """The two statements of one reading for one transaction's ``nonce``: the clocks with the
    running statements (``statement``), then ``innodb_trx``, a row per transaction."""
    clocks = _CLOCKS.replace("{elapsed}", _MARIADB_ELAPSED if mariadb else _MYSQL_ELAPSED)
    return sa.text(clocks.replace("{nonce}", nonce)), sa.text(_TRX.replace("{nonce}", nonce))


@dataclass(frozen=True)
class _Reading:
    """One reading: the clocks and the oldest running statement (naive UTC), and the open
    transactions of a fresh ``innodb_trx`` snapshot (``None``: none proven fresh)."""

    clocks: Any
    trx: Sequence[Any] | None
    taken: int

    @property
    def started(self) -> dt.datetime:
        """T0: the server's UTC clock when the reading began."""
        return self.clocks.utc_now  # type: ignore[no-any-return]

    @property
    def floor(self) -> dt.datetime:
        """No statement running or begun since can have stamped a row older than this."""
        statement = self.clocks.statement
        return self.started if statement is None else min(self.started, statement)


#: Seconds to wait for the innodb_trx cache to refresh before reading it again (InnoDB refreshes
#: it once nobody read it for 0.1 s), and how long one bound keeps trying before it holds.
INNODB_TRX_CACHE_IDLE = 0.12
INNODB_TRX_PROOF_TIMEOUT = 2.0


#: How many row versions of the table the narrowing of a floor reads at most (see ``_narrowed``).
UNCOMMITTED_SCAN = 1000


#: Seconds between two readings beyond which the later one's new transactions get a doubtful
#: floor (the reading before was long ago, e.g. the last timer run): while one first seen in this
#: bound holds it, the reading is taken again (a short transaction has ended meanwhile).
DOUBTFUL_GAP = 1.0


@dataclass(frozen=True)
class _Seen:
    """An open transaction as first listed: its floor (``None``: unknown), whether that floor
    is doubtful (unknown, or from a reading long before), and the bound call that listed it."""

    floor: dt.datetime | None
    doubtful: bool
    call: int


class MysqlTrxHorizon:
    """MySQL/MariaDB date-time cursor: bound = oldest stamp an open transaction may have written.

    ``NOW()`` is the start of the statement, and InnoDB lists the transaction in ``innodb_trx``
    only from its first row operation (``trx_started``, which can be later than its rows'
    stamps). Each open writing transaction is bounded by its floor instead: the clock and the
    running statements of the reading before the first one that listed it (see the comment
    above). A
    statement still running is bounded by its start in the process list; ``settle`` covers the
    moment between a statement's clock read and its appearance there. Needs the ``PROCESS``
    privilege. With none open the bound is the server's clock less ``settle``.

    ``innodb_trx`` is a server-wide cache that other readers can keep from refreshing, so a
    reading counts only when it proves itself newer than the process list it is read with. While
    no reading can prove that, the bound stays where it last was proven safe and :attr:`hold`
    says why (never a finished transaction). A transaction already open at this horizon's first
    reading has no known floor: the bound holds entirely until it ends.
    """

    name = "mysql_innodb_trx"
    #: What the database role needs for this method, as ``GRANT`` names it.
    privileges: tuple[str, ...] = ("PROCESS",)

    def __init__(
        self, settle: dt.timedelta | None = None, proof_timeout: float = INNODB_TRX_PROOF_TIMEOUT
    ) -> None:
        #: The margin below the server's clock, the running statements and the floors. ``None``
        #: until the first bound: then 0 on MariaDB without triggers or stored functions, else
        #: ``DEFAULT_SETTLE`` (MySQL's process list has whole seconds; see ``_ROUTINES``).
        self.settle = settle
        self.proof_timeout = proof_timeout
        #: The transaction the last bound waited for, if any (see ``Horizon.hold``).
        self.hold: HorizonHold | None = None
        self._proven: KeyValue | None = None  # the last bound a fresh reading gave
        self._stale_since: dt.datetime | None = None
        # The open transactions of the last fresh reading by trx_id, and that reading's own
        # floor and T0 (None before the first reading); the number of the bound call.
        self._seen: dict[Any, _Seen] = {}
        self._floor: dt.datetime | None = None
        self._previous: dt.datetime | None = None
        self._call = 0
        self._routines: bool | None = None  # triggers or stored functions: known at 1st bound
        # One bound at a time: a floor must come from a reading taken before the one that uses
        # it (an instance shared by pollers on several threads).
        self._lock = threading.Lock()

    def prepare(self, target: HorizonTarget) -> None:
        """Require MySQL/MariaDB, a time cursor and the ``PROCESS`` privilege."""
        require(target, ("mysql", "mariadb"), self.name)
        time_cursor(target, self.name)
        usable(self, target)

    def bound(self, target: HorizonTarget, now: dt.datetime) -> KeyValue | None:
        """``min(server clock, statements running, open transactions' floors) - settle``,
        then lag."""
        return apply_lag(self.safe_bound(target), target, now)

    def safe_bound(self, target: HorizonTarget) -> KeyValue | None:
        """The bound without ``lag``; raises :class:`HorizonUnavailable`."""
        with self._lock:
            return self._safe_bound(target)

    def _safe_bound(self, target: HorizonTarget) -> KeyValue | None:
        settle = self._margin(target)
        deadline = time.monotonic() + self.proof_timeout
        self._call += 1
        while True:
            try:
                reading = self._fresh_reading(target, deadline)
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
            if reading.trx is None:
                return self._held_stale(target, reading.started, reading.taken)
            if self._stale_since is not None:
                logger.info(
                    "action=horizon_resumed table=%s reason=innodb_trx_refreshed "
                    "stale_seconds=%.1f",
                    target.table,
                    (reading.started - self._stale_since.replace(tzinfo=None)).total_seconds(),
                )
                self._stale_since = None
            oldest, again = self._account(reading)
            if not again or time.monotonic() + INNODB_TRX_CACHE_IDLE > deadline:
                break
            time.sleep(INNODB_TRX_CACHE_IDLE)
        held = oldest <= HELD_ENTIRELY.replace(tzinfo=None)  # (no settle below 1970)
        if not held and oldest < reading.floor and not self._routines:
            oldest = self._narrowed(target, oldest, reading.floor)
        when = HELD_ENTIRELY if held else (oldest - settle).replace(tzinfo=dt.UTC)
        bound = time_bound(when, target.cursor, target.zone)
        self._proven = bound
        return bound

    def _narrowed(self, target: HorizonTarget, low: dt.datetime, high: dt.datetime) -> dt.datetime:
        """A transaction's floor holds the bound at ``low``, below the clock and the running
        statements (``high``): its rows' stamps lie somewhere between. Read them: the earliest
        stamp in ``[low, high)`` of a row version that is uncommitted (seen at READ UNCOMMITTED,
        then not at READ COMMITTED) is the bound, ``high`` if there is none. A transaction that
        has not written this table stamps its later statements' rows at their start: after
        ``high``. Naive UTC in and out."""
        column = target.cursor
        if column_kind(column) != "datetime":
            return low
        table = column.table
        keys = [column, *(c for c in table.primary_key.columns if c is not column)]
        if len(keys) == 1:
            keys = [column, *(c for c in table.columns if c is not column)]
        query = (
            sa.select(*keys)
            .where(
                column >= time_bound(low.replace(tzinfo=dt.UTC), column, target.zone),
                column < time_bound(high.replace(tzinfo=dt.UTC), column, target.zone),
            )
            .order_by(*keys)
            .limit(UNCOMMITTED_SCAN)
        )
        versions = []
        for level in ("READ UNCOMMITTED", "READ COMMITTED"):  # in this order
            with target.engine.connect() as conn:
                conn.execution_options(isolation_level=level)  # this connection, in place
                versions.append([tuple(row) for row in conn.execute(query)])
                conn.rollback()
        everything, committed = versions[0], set(versions[1])
        first = next((row for row in everything if row not in committed), None)
        if first is None and len(everything) < UNCOMMITTED_SCAN:
            self.hold = None
            return high
        stamp = (first or everything[-1])[0]
        found: dt.datetime = stamp.replace(tzinfo=target.zone).astimezone(dt.UTC)
        if self.hold is not None:
            self.hold = HorizonHold(since=found, holder=self.hold.holder)
        return max(low, min(high, found.replace(tzinfo=None)))

    def _margin(self, target: HorizonTarget) -> dt.timedelta:
        """``settle``, chosen at the first bound when not given (logged once); whether the
        server has triggers or stored functions (then no floor is narrowed: a statement inside
        one ends, and the process list's time restarts, before its caller's rows are written)."""
        if self._routines is not None:
            assert self.settle is not None
            return self.settle
        with target.engine.connect() as conn:
            found = conn.execute(sa.text(_ROUTINES)).one()
            sees_all = bool(conn.execute(sa.text(_GLOBAL_TRIGGER)).scalar())
            try:
                conn.execute(sa.text(_READ_PROC)).all()
            except sa.exc.DBAPIError:
                sees_all = False
        routine = found.trg or found.fn
        self._routines = routine is not None or not sees_all
        if self.settle is None:
            reason = "none_needed" if routine is None else f"{routine}_may_stamp_rows_early"
            if routine is None and not sees_all:
                user = target.engine.url.username or "the_user"
                grant = ROUTINES_GRANT.format(user=user).replace(" ", "_")
                reason = f"cannot_see_every_trigger_and_function;_for_0:_{grant}"
            if not getattr(target.engine.dialect, "is_mariadb", False):
                reason = "mysql_process_list_has_whole_seconds"
            self.settle = MARIADB_SETTLE if reason == "none_needed" else DEFAULT_SETTLE
            logger.info(
                "action=horizon_settle table=%s method=%s settle_seconds=%g reason=%s",
                target.table,
                self.name,
                self.settle.total_seconds(),
                reason.replace(" ", "_"),
            )
        return self.settle

    def _account(self, reading: _Reading) -> tuple[dt.datetime, bool]:
        """Remember the reading's transactions and floors; (the oldest stamp they and the
        running statements may have written, naive UTC, before ``settle``; whether to read
        again: the transaction holding it was first listed in this bound call, with a doubtful
        floor)."""
        assert reading.trx is not None
        clocks, previous = reading.clocks, self._previous
        gap = None if previous is None else (reading.started - previous).total_seconds()
        new = _Seen(self._floor, gap is None or gap > DOUBTFUL_GAP, self._call)
        oldest = reading.floor
        self.hold = None
        again = False
        seen: dict[Any, _Seen] = {}
        for trx in reading.trx:
            if not trx.other:
                continue
            known = seen[trx.trx_id] = self._seen.get(trx.trx_id, new)
            # The floor, not trx_started: that is when InnoDB registered it, which can be later
            # than its rows' stamps (and has whole seconds).
            floor = known.floor
            low = HELD_ENTIRELY.replace(tzinfo=None) if floor is None else floor
            if low >= oldest:
                continue
            oldest = low
            holder = f"thread {trx.thread}"
            if trx.session is not None:
                holder += f", {trx.session}"
            since = floor
            if since is None:
                holder += " (open before this poller's first reading: its rows' stamps unknown)"
                since = self._utc(trx.trx_started, clocks)
            self.hold = HorizonHold(since=since.replace(tzinfo=dt.UTC), holder=holder)
            again = known.doubtful and known.call == self._call
        self._seen, self._floor, self._previous = seen, reading.floor, reading.started
        return oldest, again

    def _utc(self, trx_started: dt.datetime, clocks: Any) -> dt.datetime:
        """``trx_started`` in naive UTC. It is written in the server's system zone on MariaDB,
        in the session zone elsewhere: of the readings not in the future, the earlier one (the
        safe one)."""
        utc_now: dt.datetime = clocks.utc_now
        readings = [
            trx_started - (zone_now - utc_now)
            for zone_now in (clocks.session_now, clocks.system_now)
            if zone_now is not None
        ]
        plausible = [r for r in readings if r <= utc_now + DEFAULT_SETTLE] or readings
        earliest: dt.datetime = min(plausible)
        return earliest

    def _fresh_reading(self, target: HorizonTarget, deadline: float) -> _Reading:
        """A reading whose ``innodb_trx`` snapshot was taken after its process list (``trx``
        ``None`` when none could be proven so by ``deadline``: at least one is tried)."""
        nonce = uuid.uuid4().hex
        mariadb = bool(getattr(target.engine.dialect, "is_mariadb", False))
        clocks_sql, trx_sql = innodb_trx_sql(mariadb, nonce)
        with target.engine.connect() as conn:
            try:
                conn.exec_driver_sql(START_READ_ONLY.replace("{nonce}", nonce))
                locked = conn.exec_driver_sql(TAKE_LOCK.replace("{nonce}", nonce)).scalar()
                try:
                    clocks = conn.execute(clocks_sql).one()
                    taken = 0
                    while True:
                        rows = conn.execute(trx_sql).all()
                        taken += 1
                        if any(row.mine for row in rows):
                            return _Reading(clocks, rows, taken)
                        if time.monotonic() + INNODB_TRX_CACHE_IDLE > deadline:
                            return _Reading(clocks, None, taken)
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
