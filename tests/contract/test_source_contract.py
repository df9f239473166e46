"""The source contract (:class:`azure_functions_db.testing.SourceContract`) over every tier:
the in-memory fake, SQLite, PostgreSQL, MariaDB, and SqlSource through pyodbc on both servers.

Each tier declares the key types it accepts, stored the way users store them (SQL literals;
SQLite text in each date-time format people write) and including the collations and types that
order unlike Python: SQLite NOCASE, MariaDB's default collation and UUID type, PostgreSQL ICU.
Every one is drained as a cursor and as a primary key through positions that went through a
checkpoint, and must give every row once, in the database's own order.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Mapping, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from azure_functions_db.core.ports import Source
from azure_functions_db.testing import (
    Literal,
    MemorySource,
    Scratch,
    SourceContract,
    SqlSourceContract,
    TypeCase,
)
from devkit import dbservers
from devkit import odbc_dialects as odbc


def L(*values: str) -> tuple[Literal, ...]:
    return tuple(Literal(v) for v in values)


TIMES = L("'2026-01-01 12:00:00'", "'2026-01-01 12:00:00.5'", "'2026-01-01 12:00:01.123456'")
TEXT_KEYS = L("'a'", "'B'", "'c'", "'D'", "'e'", "'F'")
# Ascending in the first segment, descending in the last: MariaDB's UUID type compares the last
# segment first, so it orders these the other way round from Python.
UUIDS = tuple(Literal(f"'0000000{i}-0000-1000-8000-00000000000{9 - i}'") for i in range(1, 7))


# -- in memory ------------------------------------------------------------------------------


class TestMemorySource(SourceContract):
    type_cases = (
        TypeCase("int", "int", (3, 1, 2**53 + 1)),
        TypeCase("float", "float", (0.1, 0.2, 1e300)),
        TypeCase("text", "text", ("a", "B", "é")),
        TypeCase("decimal", "decimal", (Decimal("0.1"), Decimal("0.125"), Decimal("12.5"))),
        TypeCase("date", "date", (dt.date(2026, 1, 2), dt.date(2026, 1, 1), dt.date(2026, 2, 1))),
        TypeCase(
            "datetime-utc",
            "datetime",
            tuple(dt.datetime(2026, 1, 1, 12, 0, s, 5, tzinfo=dt.UTC) for s in (1, 0, 2)),
        ),
        TypeCase("uuid", "uuid", tuple(uuid.UUID(int=i << 64) for i in (3, 1, 2))),
        TypeCase("bytes", "bytes", (b"\x00", b"\x00\x01", b"\xff")),
    )

    @pytest.fixture(autouse=True)
    def _tables(self) -> None:
        self.tables: dict[str, tuple[list[str], list[dict[str, Any]]]] = {}
        self.sources: dict[str, list[MemorySource]] = {}

    def create(
        self,
        table: str,
        columns: Mapping[str, str],
        key: Sequence[str],
        rows: Sequence[Mapping[str, Any]],
    ) -> None:
        self.tables[table] = (list(columns), [])
        self.insert(table, rows)

    def insert(self, table: str, rows: Sequence[Mapping[str, Any]]) -> None:
        self.tables[table][1].extend(dict(r) for r in rows)
        for source in self.sources.get(table, []):
            source.insert(rows)

    def source(
        self, table: str, cursor: Sequence[str], pk: Sequence[str], **options: Any
    ) -> Source:
        missing = [c for c in (*cursor, *pk) if c not in self.tables[table][0]]
        if missing:
            from azure_functions_db.errors import SourceDefinitionError

            raise SourceDefinitionError(f"Table `{table}` has no column `{missing[0]}`")
        made = MemorySource(table, cursor, pk, self.tables[table][1], **options)
        self.sources.setdefault(table, []).append(made)
        return made

    def ordered(
        self, table: str, order_by: Sequence[str], key: Sequence[str]
    ) -> list[tuple[Any, ...]]:
        rows = sorted(self.tables[table][1], key=lambda r: tuple(r[c] for c in order_by))
        return [tuple(r[k] for k in key) for r in rows]


# -- SQLite ---------------------------------------------------------------------------------

SQLITE_TEXT_TIMES = {
    # what `DEFAULT CURRENT_TIMESTAMP` writes
    "current_timestamp": L(
        "'2026-01-01 12:00:00'", "'2026-01-01 12:00:01'", "'2026-01-02 00:00:00'"
    ),
    # Python's isoformat(): a `T`, and no fraction when the microseconds are 0
    "isoformat": L(
        "'2026-01-01T12:00:00'", "'2026-01-01T12:00:00.500000'", "'2026-01-01T12:00:01'"
    ),
    # isoformat(timespec="microseconds")
    "isoformat_us": L(
        "'2026-01-01T12:00:00.000000'",
        "'2026-01-01T12:00:00.500000'",
        "'2026-01-01T12:00:01.000000'",
    ),
    # strftime('%Y-%m-%d %H:%M:%f'): milliseconds
    "strftime_ms": L(
        "'2026-01-01 12:00:00.000'", "'2026-01-01 12:00:00.500'", "'2026-01-01 12:00:01.000'"
    ),
    # SQLAlchemy's own format
    "sqlalchemy": L(
        "'2026-01-01 12:00:00.000000'",
        "'2026-01-01 12:00:00.500000'",
        "'2026-01-01 12:00:01.000000'",
    ),
}


class TestSqliteSource(SqlSourceContract):
    int_type, text_type = "INTEGER", "TEXT"
    type_cases = (
        TypeCase("INTEGER", "INTEGER", L("1", "2", "9007199254740993")),
        TypeCase("REAL", "REAL", L("0.1", "0.2", "1e300")),
        TypeCase("TEXT", "TEXT", L("'a'", "'b'", "'é'")),
        TypeCase("TEXT-NOCASE", "TEXT COLLATE NOCASE", TEXT_KEYS),
        TypeCase("BLOB", "BLOB", L("x'00'", "x'0001'", "x'ff'")),
        TypeCase("DATE", "DATE", L("'2026-01-01'", "'2026-01-02'", "'2026-02-01'")),
        *(TypeCase(f"DATETIME-{n}", "DATETIME", v) for n, v in SQLITE_TEXT_TIMES.items()),
    )

    @pytest.fixture
    def scratch(self, tmp_path: Path) -> Scratch:
        return Scratch(f"sqlite:///{tmp_path / 'contract.db'}")


# -- PostgreSQL and MariaDB, natively and through pyodbc -------------------------------------

POSTGRES = (
    TypeCase("integer", "integer", L("1", "2", "3")),
    TypeCase("bigint", "bigint", L("1", "9007199254740993", "9007199254740994")),
    TypeCase("numeric", "numeric(12,3)", L("0.1", "0.125", "12.5")),
    TypeCase("real", "real", L("0.1", "0.2", "3.3")),
    TypeCase("double", "double precision", L("0.1", "0.2", "3.3")),
    TypeCase("date", "date", L("'2026-01-01'", "'2026-01-02'", "'2026-02-01'")),
    TypeCase("timestamp", "timestamp", TIMES),
    TypeCase("timestamptz", "timestamptz", tuple(Literal(f"{t[:-1]}+00'") for t in TIMES)),
    TypeCase("uuid", "uuid", UUIDS),
    TypeCase("varchar", "varchar(20)", L("'a'", "'B'", "'c'")),
    TypeCase("text-icu", 'text COLLATE "en-x-icu"', TEXT_KEYS),
    TypeCase("bytea", "bytea", L("'\\x00'", "'\\x0001'", "'\\xff'")),
)
MARIADB = (
    TypeCase("int", "int", L("1", "2", "3")),
    TypeCase("bigint", "bigint", L("1", "9007199254740993", "9007199254740994")),
    TypeCase("decimal", "decimal(12,3)", L("0.1", "0.125", "12.5")),
    TypeCase("float", "float", L("0.1", "0.2", "3.3")),
    TypeCase("double", "double", L("0.1", "0.2", "3.3")),
    TypeCase("date", "date", L("'2026-01-01'", "'2026-01-02'", "'2026-02-01'")),
    TypeCase(
        "datetime",
        "datetime",
        L("'2026-01-01 12:00:00'", "'2026-01-01 12:00:01'", "'2026-01-02 00:00:00'"),
    ),
    TypeCase("datetime6", "datetime(6)", TIMES),
    TypeCase("timestamp6", "timestamp(6)", TIMES),
    # the database's default collation (case-insensitive), as users get it
    TypeCase("varchar-default-collation", "varchar(20)", TEXT_KEYS),
    TypeCase("varbinary", "varbinary(8)", L("x'00'", "x'0001'", "x'ff'")),
    TypeCase("uuid", "uuid", UUIDS),
)


@pytest.mark.postgres
class TestPostgresSource(SqlSourceContract):
    int_type, text_type = "integer", "text"
    type_cases = POSTGRES

    @pytest.fixture
    def scratch(self, pg_schema: str) -> Scratch:
        return Scratch(dbservers.pg_url(), pg_schema)


@pytest.mark.mysql
class TestMariaDbSource(SqlSourceContract):
    int_type, text_type = "int", "varchar(40)"
    type_cases = MARIADB

    @pytest.fixture
    def scratch(self, mysql_db: str) -> Scratch:
        return Scratch(dbservers.mysql_url(mysql_db))


REFUSED_THROUGH_MARIADB_ODBC = ("datetime6", "timestamp6", "uuid")


@pytest.mark.mysql
@pytest.mark.odbc
@pytest.mark.parametrize(
    "case", [c for c in MARIADB if c.id in REFUSED_THROUGH_MARIADB_ODBC], ids=str
)
def test_refused_through_mariadb_odbc(case: TypeCase, mysql_db: str, odbc_drivers: None) -> None:
    """A key MariaDB Connector/ODBC cannot bind back exactly is refused when the source opens,
    naming the native driver, never polled (it would re-read a row for ever, or skip rows)."""
    from azure_functions_db.errors import SourceDefinitionError
    from azure_functions_db.sources.sqlalchemy import SqlSource

    engine = sa.create_engine(dbservers.mysql_url(mysql_db), poolclass=sa.NullPool)
    with engine.begin() as conn:
        conn.exec_driver_sql(f"CREATE TABLE t (id int PRIMARY KEY, c {case.type} NOT NULL)")
    engine.dispose()
    for cursor, pk in (("c", "id"), ("id", "c")):
        source = SqlSource(odbc.mysql_odbc_url(mysql_db), "t", cursor, pk, horizon="none")
        with pytest.raises(SourceDefinitionError, match=r"mysql\+pymysql"):
            source.open({})
        source.close()


@pytest.mark.postgres
@pytest.mark.odbc
class TestPostgresOdbcSource(SqlSourceContract):
    int_type, text_type = "integer", "text"
    type_cases = POSTGRES

    @pytest.fixture
    def scratch(self, pg_schema: str, odbc_drivers: None) -> Scratch:
        return Scratch(odbc.pg_odbc_url(), pg_schema, setup_url=dbservers.pg_url())


@pytest.mark.mysql
@pytest.mark.odbc
class TestMariaDbOdbcSource(SqlSourceContract):
    """MariaDB Connector/ODBC binds date-times without their fraction and UUIDs as binary GUIDs,
    so the source refuses those keys through it (``test_refused_through_mariadb_odbc``)."""

    int_type, text_type = "int", "varchar(40)"
    type_cases = tuple(c for c in MARIADB if c.id not in REFUSED_THROUGH_MARIADB_ODBC)

    @pytest.fixture
    def scratch(self, mysql_db: str, odbc_drivers: None) -> Scratch:
        return Scratch(odbc.mysql_odbc_url(mysql_db), setup_url=dbservers.mysql_url(mysql_db))


def test_the_fake_is_a_source() -> None:
    assert isinstance(MemorySource("t", "c", "id"), Source)
