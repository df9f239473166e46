"""Which database errors a retry may fix, decided by the driver's error code, per dialect.

Transient: the connection was lost or refused, the server is shutting down, starting or out of
connections, a timeout, a deadlock or lock wait the server gave up on. Everything else is not:
an error the statement or its rows cause fails the same way on every retry, so it must count as
a failed attempt of the batch (and reach ``max_attempts``, the poison alert or quarantine)
instead of being retried for ever. Drivers do not say this by their exception class: PyMySQL
raises ``OperationalError`` for a CHECK constraint (4025), a wrong password (1045) and every
server error it has no class for; psycopg for SQLSTATE class 54 (an index row too large) and
28P01 (a wrong password). So the code decides, and only an error with no code a driver
documents falls back to its class.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import exc as sa_exc

__all__ = ["is_transient"]

# PostgreSQL SQLSTATEs (Appendix A of its manual): connection exceptions (class 08), the
# server shutting down or not accepting connections yet (57P01-57P03, 57P05), out of
# resources (class 53: connections, memory, disk), a statement or lock timeout (57014, 55P03),
# serialization failures and deadlocks (40001, 40P01) and an unknown commit outcome (40003),
# an I/O error (58030).
PG_TRANSIENT_CLASSES = ("08", "53")
PG_TRANSIENT_STATES = frozenset(
    {"57P01", "57P02", "57P03", "57P05", "57014", "55P03", "40001", "40P01", "40003", "58030"}
)

# What libpq says when a connection attempt can never succeed as configured (psycopg gives
# these no SQLSTATE): a wrong password, an unknown role or database, a pg_hba.conf rule.
PG_CONNECT_PERMANENT_TEXT = (
    "authentication failed",
    "does not exist",
    "no pg_hba.conf entry",
    "permission denied",
    "password authentication",
)

# MySQL/MariaDB error numbers. Client side (2xxx): cannot connect (2001-2005), server gone
# away or connection lost (2006, 2013, 2055), a broken pipe (2011, 2012). Server side: too many
# connections (1040, 1203), shutting down (1053, 1077), network read/write failures and aborted
# connections (1152-1161), lock wait timeout and deadlock (1205, 1213, 1614, 1689), the
# statement or connection killed (1317, 1927), statement timeouts (1969 MariaDB, 3024 MySQL),
# too many concurrent transactions (1637), client interaction timeout (4031, MySQL 8).
# PyMySQL reports a closed connection as (0, '').
MYSQL_TRANSIENT_CODES = frozenset(
    {
        0,
        1040,
        1053,
        1077,
        1152,
        1153,
        1154,
        1155,
        1156,
        1157,
        1158,
        1159,
        1160,
        1161,
        1203,
        1205,
        1213,
        1317,
        1614,
        1637,
        1689,
        1927,
        1969,
        2001,
        2002,
        2003,
        2004,
        2005,
        2006,
        2011,
        2012,
        2013,
        2055,
        3024,
        4031,
    }
)

# ODBC SQLSTATEs: connection exceptions (08xxx), timeouts (HYT00, HYT01), and SQL Server's
# deadlock victim / serialization failure (40001).
ODBC_TRANSIENT_CLASSES = ("08",)
ODBC_TRANSIENT_STATES = frozenset({"HYT00", "HYT01", "40001", "40003"})

# SQLite primary result codes: SQLITE_BUSY and SQLITE_LOCKED (another connection writes).
SQLITE_TRANSIENT_CODES = frozenset({5, 6})
SQLITE_TRANSIENT_TEXT = ("database is locked", "database table is locked", "database is busy")

# Drivers we do not know: their OperationalError, unless it names a mistake of the statement.
_PERMANENT_TEXT = (
    "no such table",
    "no such column",
    "syntax error",
    "unknown column",
    "doesn't exist",
    "access denied",
    "authentication failed",
    "constraint",
)


def is_transient(exc: BaseException) -> bool:
    """Whether retrying the operation that raised ``exc`` (a SQLAlchemy error) may succeed."""
    if isinstance(exc, sa_exc.DisconnectionError | sa_exc.TimeoutError):
        return True  # the pool's own: a connection that could not be had in time
    if not isinstance(exc, sa_exc.DBAPIError):
        return False
    if exc.connection_invalidated:
        return True  # the dialect recognised a lost connection
    orig: BaseException = exc.orig if exc.orig is not None else exc
    by_code = _BY_DRIVER.get(type(orig).__module__.split(".")[0])
    verdict = by_code(orig) if by_code is not None else None
    if verdict is not None:
        return verdict
    if not isinstance(exc, sa_exc.OperationalError | sa_exc.InterfaceError):
        return False
    # No code: a driver we do not know, or no answer from the server (refused, reset).
    message = str(orig).lower()
    return not any(text in message for text in _PERMANENT_TEXT)


def _postgres(orig: BaseException) -> bool | None:
    state = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
    if state is None:
        # psycopg gives a failed connection attempt no SQLSTATE, only libpq's message.
        message = str(orig).lower()
        return not any(text in message for text in PG_CONNECT_PERMANENT_TEXT)
    return str(state).startswith(PG_TRANSIENT_CLASSES) or state in PG_TRANSIENT_STATES


def _mysql(orig: BaseException) -> bool | None:
    errno = getattr(orig, "errno", None)  # mariadb / mysql-connector
    if isinstance(errno, int):
        return errno in MYSQL_TRANSIENT_CODES
    if orig.args and isinstance(orig.args[0], int):
        return orig.args[0] in MYSQL_TRANSIENT_CODES  # PyMySQL / mysqlclient: (code, message)
    return None


def _odbc(orig: BaseException) -> bool | None:
    if not orig.args or not isinstance(orig.args[0], str):
        return None
    state = orig.args[0]
    return state.startswith(ODBC_TRANSIENT_CLASSES) or state in ODBC_TRANSIENT_STATES


def _sqlite(orig: BaseException) -> bool:
    code = getattr(orig, "sqlite_errorcode", None)
    if isinstance(code, int):
        return (code & 0xFF) in SQLITE_TRANSIENT_CODES
    return any(text in str(orig).lower() for text in SQLITE_TRANSIENT_TEXT)


_BY_DRIVER: dict[str, Callable[[BaseException], bool | None]] = {
    "psycopg": _postgres,
    "psycopg2": _postgres,
    "pymysql": _mysql,
    "MySQLdb": _mysql,
    "mariadb": _mysql,
    "mysql": _mysql,
    "pyodbc": _odbc,
    "sqlite3": _sqlite,
}
