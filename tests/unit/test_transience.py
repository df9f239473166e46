"""Which driver errors are transient, by error code per dialect (the real errors are raised by
the real servers in tests/integration/test_sink_row_errors.py)."""

from __future__ import annotations

import sqlite3
from typing import Any

import psycopg
import pymysql
import pytest
from sqlalchemy import exc as sa_exc

from azure_functions_db.sources.transience import is_transient


def wrapped(orig: BaseException, kind: type[sa_exc.DBAPIError] = sa_exc.OperationalError) -> Any:
    return kind("SELECT 1", {}, orig)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("orig", "transient"),
    [
        # PyMySQL: (code, message)
        (pymysql.err.OperationalError(2003, "Can't connect to MySQL server"), True),
        (pymysql.err.OperationalError(2013, "Lost connection to MySQL server"), True),
        (pymysql.err.OperationalError(1040, "Too many connections"), True),
        (pymysql.err.OperationalError(1205, "Lock wait timeout exceeded"), True),
        (pymysql.err.OperationalError(1213, "Deadlock found"), True),
        (pymysql.err.OperationalError(4025, "CONSTRAINT `c` failed"), False),
        (pymysql.err.OperationalError(1045, "Access denied for user 'u'"), False),
        (pymysql.err.OperationalError(1142, "INSERT command denied"), False),
        (pymysql.err.OperationalError(1366, "Incorrect integer value"), False),
        (pymysql.err.InterfaceError(0, ""), True),
        # psycopg: SQLSTATE
        (psycopg.errors.lookup("54000")("index row size exceeds maximum"), False),
        (psycopg.errors.lookup("28P01")("password authentication failed"), False),
        (psycopg.errors.lookup("23505")("duplicate key"), False),
        (psycopg.errors.lookup("40P01")("deadlock detected"), True),
        (psycopg.errors.lookup("40001")("could not serialize access"), True),
        (psycopg.errors.lookup("57P01")("terminating connection due to administrator"), True),
        (psycopg.errors.lookup("53300")("too many connections"), True),
        (psycopg.errors.lookup("57014")("canceling statement due to statement timeout"), True),
        (psycopg.errors.lookup("40002")("deferred constraint at commit"), False),
        # psycopg: a failed connection attempt carries no SQLSTATE, only libpq's message
        (psycopg.OperationalError("connection failed: Connection refused"), True),
        (psycopg.OperationalError("FATAL:  sorry, too many clients already"), True),
        (
            psycopg.OperationalError('FATAL:  password authentication failed for user "u"'),
            False,
        ),
        (psycopg.OperationalError('FATAL:  database "nope" does not exist'), False),
        # sqlite3
        (sqlite3.OperationalError("database is locked"), True),
        (sqlite3.OperationalError("no such table: t"), False),
    ],
    ids=lambda v: v if isinstance(v, bool) else f"{type(v).__name__}:{str(v)[:30]}",
)
def test_the_error_code_decides(orig: BaseException, transient: bool) -> None:
    assert is_transient(wrapped(orig)) is transient


def test_odbc_states() -> None:
    class Error(Exception):
        pass

    Error.__module__ = "pyodbc"
    assert is_transient(wrapped(Error("08S01", "[ODBC] Communication link failure")))
    assert is_transient(wrapped(Error("HYT00", "[ODBC] Timeout expired")))
    assert is_transient(wrapped(Error("40001", "[SQL Server] deadlock victim")))
    assert not is_transient(wrapped(Error("23000", "[SQL Server] CHECK constraint")))
    assert not is_transient(wrapped(Error("28000", "[SQL Server] Login failed")))


def test_a_lost_connection_and_the_pool_timeout_are_transient() -> None:
    lost = wrapped(pymysql.err.OperationalError(4025, "x"))
    lost.connection_invalidated = True
    assert is_transient(lost)
    assert is_transient(sa_exc.TimeoutError("QueuePool limit reached"))
    assert not is_transient(sa_exc.ArgumentError("bad"))
    integrity = wrapped(pymysql.err.IntegrityError(1062, "Duplicate"), sa_exc.IntegrityError)
    assert not is_transient(integrity)
