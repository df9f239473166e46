"""A position bound back must find its own row: `=` selects it, `>` excludes it, on every type.

For each dialect and cursor type we accept, values are stored the way users store them (SQL
literals, SQLite text in each date-time format people write), each value twice (a tie on the
cursor), and the table is drained one row per batch through the source, as the engine reads it:
a bound that does not equal its own stored value either re-reads the same row for ever (stuck)
or skips the row tied with it (lost). Every row must come exactly once, in the database's order.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import sqlalchemy as sa

from azure_functions_db.core.ports import Horizon
from azure_functions_db.errors import SourceDefinitionError
from azure_functions_db.sources.sqlalchemy import SqlSource

from . import dbservers

NO_HORIZON = Horizon(bound=None, method="none")


@dataclass(frozen=True)
class TypeCase:
    dialect: str  # sqlite | postgres | mysql
    sql_type: str
    literals: tuple[str, ...]

    @property
    def id(self) -> str:
        return f"{self.dialect}-{self.sql_type}".replace(" ", "_")


def _cases(dialect: str, table: dict[str, tuple[str, ...]]) -> list[TypeCase]:
    return [TypeCase(dialect, sql_type, literals) for sql_type, literals in table.items()]


TIMES = ("'2026-01-01 12:00:00'", "'2026-01-01 12:00:00.5'", "'2026-01-01 12:00:01.123456'")
SQLITE = _cases(
    "sqlite",
    {
        "INTEGER": ("1", "2", "9007199254740993"),
        "REAL": ("0.1", "0.2", "1e300"),
        "TEXT": ("'a'", "'b'", "'é'"),
        "BLOB": ("x'00'", "x'0001'", "x'ff'"),
        "DATE": ("'2026-01-01'", "'2026-01-02'", "'2026-02-01'"),
        # SQLAlchemy's own format
        "DATETIME": (
            "'2026-01-01 12:00:00.000000'",
            "'2026-01-01 12:00:00.500000'",
            "'2026-01-01 12:00:01.000000'",
        ),
    },
)
SQLITE_TEXT_TIMES = {
    # what `DEFAULT CURRENT_TIMESTAMP` writes
    "current_timestamp": (
        "'2026-01-01 12:00:00'",
        "'2026-01-01 12:00:01'",
        "'2026-01-02 00:00:00'",
    ),
    # Python's isoformat(): a `T`, and no fraction when the microseconds are 0
    "isoformat": ("'2026-01-01T12:00:00'", "'2026-01-01T12:00:00.500000'", "'2026-01-01T12:00:01'"),
    # isoformat(timespec="microseconds")
    "isoformat_us": (
        "'2026-01-01T12:00:00.000000'",
        "'2026-01-01T12:00:00.500000'",
        "'2026-01-01T12:00:01.000000'",
    ),
    # strftime('%Y-%m-%d %H:%M:%f'): milliseconds
    "strftime_ms": (
        "'2026-01-01 12:00:00.000'",
        "'2026-01-01 12:00:00.500'",
        "'2026-01-01 12:00:01.000'",
    ),
}
SQLITE += [
    TypeCase("sqlite", f"DATETIME:{name}", values) for name, values in SQLITE_TEXT_TIMES.items()
]
POSTGRES = _cases(
    "postgres",
    {
        "integer": ("1", "2", "3"),
        "bigint": ("1", "9007199254740993", "9007199254740994"),
        "numeric(12,3)": ("0.1", "0.125", "12.5"),
        "real": ("0.1", "0.2", "3.3"),
        "double precision": ("0.1", "0.2", "3.3"),
        "date": ("'2026-01-01'", "'2026-01-02'", "'2026-02-01'"),
        "timestamp": TIMES,
        "timestamptz": tuple(f"{t[:-1]}+00'" for t in TIMES),
        "uuid": (
            "'00000000-0000-0000-0000-000000000001'",
            "'7fffffff-0000-0000-0000-000000000000'",
            "'ffffffff-0000-0000-0000-000000000000'",
        ),
        "varchar(20)": ("'a'", "'B'", "'c'"),
        "bytea": ("'\\x00'", "'\\x0001'", "'\\xff'"),
    },
)
MYSQL = _cases(
    "mysql",
    {
        "int": ("1", "2", "3"),
        "bigint": ("1", "9007199254740993", "9007199254740994"),
        "decimal(12,3)": ("0.1", "0.125", "12.5"),
        "float": ("0.1", "0.2", "3.3"),
        "double": ("0.1", "0.2", "3.3"),
        "date": ("'2026-01-01'", "'2026-01-02'", "'2026-02-01'"),
        "datetime": ("'2026-01-01 12:00:00'", "'2026-01-01 12:00:01'", "'2026-01-02 00:00:00'"),
        "datetime(6)": TIMES,
        "timestamp(6)": TIMES,
        "varchar(20)": ("'a'", "'B'", "'c'"),
        "varbinary(8)": ("x'00'", "x'0001'", "x'ff'"),
        "uuid": (
            "'00000000-0000-1000-8000-000000000003'",
            "'00000001-0000-1000-8000-000000000002'",
            "'00000002-0000-1000-8000-000000000001'",
        ),
    },
)
ALL = SQLITE + POSTGRES + MYSQL
_MARKS = {"sqlite": (), "postgres": (pytest.mark.postgres,), "mysql": (pytest.mark.mysql,)}


@pytest.fixture
def scratch(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str | None]]:
    """(url, schema) of an empty scratch namespace on the case's dialect."""
    case: TypeCase = request.param
    if case.dialect == "sqlite":
        yield f"sqlite:///{tmp_path / 'types.db'}", None
    elif case.dialect == "postgres":
        yield dbservers.pg_url(), request.getfixturevalue("pg_schema")
    else:
        yield dbservers.mysql_url(request.getfixturevalue("mysql_db")), None


def _create(url: str, schema: str | None, case: TypeCase) -> list[int]:
    """The table ``t(id, c)``: each literal twice (ids i and i+10); ids in database order."""
    sql_type = case.sql_type.split(":")[0]
    table = f'"{schema}".t' if schema else "t"
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(f"CREATE TABLE {table} (id INTEGER PRIMARY KEY, c {sql_type})")
            for i, literal in enumerate(case.literals):
                for row_id in (i + 10, i):
                    conn.exec_driver_sql(
                        f"INSERT INTO {table} (id, c) VALUES ({row_id}, {literal})"
                    )
            return list(conn.exec_driver_sql(f"SELECT id FROM {table} ORDER BY c, id").scalars())
    finally:
        engine.dispose()


@pytest.mark.parametrize(
    ("scratch", "case"),
    [pytest.param(case, case, id=case.id, marks=_MARKS[case.dialect]) for case in ALL],
    indirect=["scratch"],
)
@pytest.mark.parametrize("batch", [1, 2])
def test_every_row_once_through_its_own_bound_position(scratch, case, batch):
    url, schema = scratch
    expected = _create(url, schema, case)
    source = SqlSource(url, "t", "c", "id", schema=schema, horizon="none")
    try:
        try:
            source.open({})
        except SourceDefinitionError as exc:  # refused with a clear error: never polled wrong
            pytest.fail(f"{case.id} refused: {exc}")
        seen: list[int] = []
        after = None
        for _ in range(len(expected) + 3):  # a stuck bound re-reads the same rows for ever
            rows = source.fetch(after, batch, NO_HORIZON)
            if not rows:
                break
            seen.extend(row.position.pk[0] for row in rows)
            after = rows[-1].position
    finally:
        source.close()
    assert seen == expected
