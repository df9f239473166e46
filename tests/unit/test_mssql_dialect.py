"""SQL Server: every statement ``SqlSource`` sends, as SQLAlchemy's ``mssql+pyodbc`` renders it.

No SQL Server engine can run here (SPEC §10), so these tests stop at the driver: ``SqlSource``
builds its engine from a real ``mssql+pyodbc://`` URL with ``engine_options={"module": ...}``
naming :class:`RecordingPyodbc`, a stand-in for the ``pyodbc`` module that records each
statement and its parameters exactly as pyodbc would receive them (``?`` placeholders, values
after SQLAlchemy's bind processing) and answers from a script. Everything above the DBAPI is the
package's and SQLAlchemy's own code: the URL, the connection string, the dialect (including its
first-connect queries), the keyset statements, the horizon strategies, the result processing,
the checkpoint codec and the error translation.

One thing is given instead of read: the table. Reflection would need answers to SQL Server's
catalog queries, so :class:`GivenTableSource` returns a ``sa.Table`` declared with the types
reflection produces (``rowversion`` reflects as ``mssql.TIMESTAMP``, checked below).

What this cannot show: that SQL Server accepts and plans these statements, and how pyodbc's SQL
Server driver converts values. ``tests/integration/test_pyodbc_path.py`` runs the pyodbc code path
against the PostgreSQL and MariaDB ODBC drivers; docs/databases.md says what is tested how.
"""

from __future__ import annotations

import datetime as dt
import logging
import traceback
import types
import urllib.parse
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.dialects import mssql

from azure_functions_db.core.checkpoint import (
    Checkpoint,
    PollerKey,
    decode_checkpoint,
    encode_checkpoint,
)
from azure_functions_db.core.ports import Horizon
from azure_functions_db.core.position import Position
from azure_functions_db.errors import ConfigurationError, SourceError, TransientSourceError
from azure_functions_db.sources import (
    AutoHorizon,
    LagHorizon,
    MssqlRowversionHorizon,
    NoHorizon,
    SqlSource,
)
from tests.support.source_kit import NO_HORIZON

pyodbc = pytest.importorskip("pyodbc", reason="pyodbc is in the dev extra: pip install -e '.[dev]'")

SQL_SERVER_2022 = "16.0.1000.6"
SQL_SERVER_2008_R2 = "10.50.6000.34"  # no OFFSET/FETCH: the last version before SQL Server 2012
SECRET = "Sw0rd;fish}x"  # a ';' and a '}' so that the ODBC string must brace and escape it
URL = (
    f"mssql+pyodbc://app:{urllib.parse.quote_plus(SECRET)}@sql.example:1433/shop"
    "?driver=ODBC+Driver+18+for+SQL+Server"
)
ODBC_STRING = (
    "DRIVER={ODBC Driver 18 for SQL Server};SERVER=sql.example,1433;DATABASE=shop;UID=app;"
    "PWD={" + SECRET.replace("}", "}}") + "};Encrypt=yes"
)
ODBC_CONNECT_URL = f"mssql+pyodbc:///?odbc_connect={urllib.parse.quote_plus(ODBC_STRING)}"
KEY = PollerKey("live", "orders")
RV = [bytes.fromhex(f"{n:016x}") for n in (0x7D0, 0x7D1, 0x7D1, 0x1_0000_0000_0000)]


# --------------------------------------------------------------------------------------------
# a recording pyodbc and a source over it
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sent:
    """One statement as pyodbc received it; ``sql`` with runs of whitespace made one space."""

    sql: str
    params: tuple[Any, ...]


# What SQLAlchemy's mssql dialect asks when it first connects, and what a SQL Server answers.
_FIRST_CONNECT = (
    ("SERVERPROPERTY('ProductVersion')", "version"),
    ("SELECT schema_name()", "dbo"),
    ("FROM sys.system_views", "dm_exec_sessions"),
    ("transaction_isolation_level", "READ COMMITTED"),
    ("SELECT CAST('test max support' AS NVARCHAR(max))", "test max support"),
    ("fn_listextendedproperty", 1),
)


class RecordingPyodbc:
    """The ``module=`` of the engine: pyodbc's own attributes, with ``connect`` recording.

    ``answer(marker, columns, rows)`` queues the result of the next statement containing
    ``marker``; a statement nobody scripted fails the test. ``catalog`` answers the catalog
    queries (``sys.*``) of SQLAlchemy's index and primary-key reflection.
    """

    def __init__(self, server_version: str = SQL_SERVER_2022) -> None:
        self.server_version = server_version
        self.connection_strings: list[str] = []
        self.sent: list[Sent] = []
        self.connect_error: Exception | None = None
        self.catalog: Catalog | None = None
        self._answers: list[tuple[str, tuple[str, ...], list[tuple[Any, ...]]]] = []
        self.module = types.ModuleType("recording_pyodbc")
        for name in dir(pyodbc):
            if not name.startswith("__"):
                setattr(self.module, name, getattr(pyodbc, name))
        self.module.connect = self._connect  # type: ignore[attr-defined]

    def answer(self, marker: str, columns: Sequence[str], rows: Sequence[tuple[Any, ...]]) -> None:
        self._answers.append((marker, tuple(columns), list(rows)))

    def take(self) -> list[Sent]:
        """The statements the source sent since the last call (first-connect queries left out)."""
        sent, self.sent = self.sent, []
        return [s for s in sent if not any(m in s.sql for m, _ in _FIRST_CONNECT)]

    def _connect(self, connection_string: str, **kwargs: Any) -> _Connection:
        self.connection_strings.append(connection_string)
        if self.connect_error is not None:
            raise self.connect_error
        return _Connection(self)

    def respond(self, sql: str) -> tuple[tuple[str, ...], list[tuple[Any, ...]]] | None:
        for marker, value in _FIRST_CONNECT:
            if marker in sql:
                return ("value",), [(self.server_version if value == "version" else value,)]
        for i, (marker, columns, rows) in enumerate(self._answers):
            if marker in sql:
                del self._answers[i]
                return columns, rows
        if self.catalog is not None and "FROM sys." in sql:
            return self.catalog.respond(" ".join(sql.split()))
        raise AssertionError(f"SQL Server stand-in: no answer scripted for {sql!r}")


@dataclass
class Catalog:
    """One table of a SQL Server catalog, as ``sys.objects``, ``sys.indexes``, ... describe it."""

    table: str
    primary_key: Sequence[str]
    indexes: dict[str, Sequence[str]]
    schema: str = "dbo"

    def respond(self, sql: str) -> tuple[tuple[str, ...], list[tuple[Any, ...]]]:
        labels = tuple(
            item.split(" AS ")[-1].split(".")[-1]
            for item in sql[len("SELECT ") : sql.index(" FROM ")].split(", ")
        )
        source = sql[sql.index(" FROM ") :].split()[1]
        rows: list[dict[str, Any]]
        if source == "sys.objects" and labels == ("name",):
            rows = [{"name": self.table}]
        elif source == "sys.indexes":
            rows = [
                {"index_id": i, "is_unique": False, "name": name, "type": 2}
                for i, name in enumerate(self.indexes, start=2)
            ]
        elif source == "sys.index_columns":
            rows = [
                {"index_id": i, "name": column, "is_included_column": False}
                for i, columns in enumerate(self.indexes.values(), start=2)
                for column in columns
            ]
        elif source == "sys.key_constraints":
            rows = [
                {
                    "owner": self.schema,
                    "constraint_name": f"PK_{self.table}",
                    "column_name": column,
                    "key_ordinal": k,
                    "index_type": 1,
                }
                for k, column in enumerate(self.primary_key, start=1)
            ]
        else:
            raise AssertionError(f"SQL Server stand-in: no catalog answer for {sql!r}")
        return labels, [
            tuple({"table_name": self.table, **row}.get(label) for label in labels) for row in rows
        ]


class _Connection:
    autocommit = False

    def __init__(self, recorder: RecordingPyodbc) -> None:
        self._recorder = recorder

    def cursor(self) -> _Cursor:
        return _Cursor(self._recorder)

    def add_output_converter(self, sql_type: int, function: Any) -> None:
        """pyodbc API; the mssql dialect registers a datetimeoffset converter here."""

    def commit(self) -> None:
        """Nothing to commit."""

    def rollback(self) -> None:
        """Nothing to roll back."""

    def close(self) -> None:
        """Nothing to close."""


class _Cursor:
    def __init__(self, recorder: RecordingPyodbc) -> None:
        self._recorder = recorder
        self.description: list[tuple[Any, ...]] | None = None
        self.rowcount = -1
        self._rows: list[tuple[Any, ...]] = []

    def execute(self, sql: str, params: Sequence[Any] = ()) -> _Cursor:
        self._recorder.sent.append(Sent(" ".join(sql.split()), tuple(params)))
        answer = self._recorder.respond(sql)
        if answer is not None:
            columns, self._rows = answer[0], list(answer[1])
            self.description = [(c, str, None, None, None, None, True) for c in columns]
        return self

    def setinputsizes(self, sizes: Any) -> None:
        """pyodbc API; the types SQLAlchemy declares for the parameters."""

    def fetchone(self) -> tuple[Any, ...] | None:
        return self._rows.pop(0) if self._rows else None

    def fetchmany(self, size: int = 1) -> list[tuple[Any, ...]]:
        rows, self._rows = self._rows[:size], self._rows[size:]
        return rows

    def fetchall(self) -> list[tuple[Any, ...]]:
        rows, self._rows = self._rows, []
        return rows

    def nextset(self) -> bool:
        return False

    def close(self) -> None:
        """Nothing to close."""


class GivenTableSource(SqlSource):
    """``SqlSource`` with ``table`` given instead of reflected; nothing else is changed."""

    def __init__(self, table: sa.Table, recorder: RecordingPyodbc, *args: Any, **kw: Any) -> None:
        url = kw.pop("url", URL)
        options = {"module": recorder.module}
        super().__init__(url, table.name, *args, schema=table.schema, engine_options=options, **kw)
        self.given_table = table

    def _reflect(self, conn: sa.Connection) -> sa.Table:
        return self.given_table


def orders(cursor_type: Any = mssql.ROWVERSION) -> sa.Table:
    """``dbo.orders(id int PRIMARY KEY, rv <cursor_type> NOT NULL, status nvarchar(20))``."""
    return sa.Table(
        "orders",
        sa.MetaData(),
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("rv", cursor_type, nullable=False),
        sa.Column("status", mssql.NVARCHAR(20)),
        schema="dbo",
    )


def composite() -> sa.Table:
    """``dbo.events``: composite cursor ``(shard, rv)``, composite primary key ``(region, num)``."""
    return sa.Table(
        "events",
        sa.MetaData(),
        sa.Column("shard", sa.Integer, nullable=False),
        sa.Column("rv", mssql.ROWVERSION, nullable=False),
        sa.Column("region", mssql.NVARCHAR(10), primary_key=True),
        sa.Column("num", sa.Integer, primary_key=True, autoincrement=False),
        schema="dbo",
    )


@pytest.fixture
def recorder() -> RecordingPyodbc:
    return RecordingPyodbc()


@pytest.fixture
def sources() -> Iterator[list[SqlSource]]:
    made: list[SqlSource] = []
    yield made
    for source in made:
        source.close()


def opened(sources: list[SqlSource], source: SqlSource) -> SqlSource:
    source.open({})
    sources.append(source)
    return source


def only(sent: list[Sent]) -> Sent:
    assert len(sent) == 1, sent
    return sent[0]


# --------------------------------------------------------------------------------------------
# the engine, the dialect and the connection string
# --------------------------------------------------------------------------------------------


def test_the_real_mssql_pyodbc_dialect_connects_with_the_urls_odbc_string(recorder, sources):
    source = opened(sources, GivenTableSource(orders(), recorder, "rv"))
    dialect = source.engine.dialect
    assert (dialect.name, dialect.driver) == ("mssql", "pyodbc")
    assert dialect.server_version_info == (16, 0, 1000, 6)
    assert isinstance(source.cursor_columns[0].type, mssql.TIMESTAMP)
    # PyODBCConnector braces the password (it holds ';' and '}') and doubles its '}'.
    assert recorder.connection_strings == [
        "DRIVER={ODBC Driver 18 for SQL Server};Server=sql.example,1433;Database=shop;UID=app;"
        "PWD={Sw0rd;fish}}x}"
    ]
    assert recorder.take() == []  # opening (with a given table) sends no statement of its own


def test_rowversion_columns_reflect_as_the_type_the_horizon_looks_for():
    # INFORMATION_SCHEMA and sys.types name a rowversion column's type `timestamp`; reflection
    # maps that name to mssql.TIMESTAMP, which AutoHorizon and MssqlRowversionHorizon test for.
    names = sa.create_engine(URL, module=RecordingPyodbc().module).dialect.ischema_names
    assert names["timestamp"] is mssql.TIMESTAMP
    assert issubclass(mssql.ROWVERSION, mssql.TIMESTAMP)


# --------------------------------------------------------------------------------------------
# the batch query
# --------------------------------------------------------------------------------------------

SELECT = "SELECT TOP 100 dbo.orders.id, dbo.orders.rv, dbo.orders.status FROM dbo.orders"
ORDER = "ORDER BY dbo.orders.rv, dbo.orders.id"
HORIZON_RV = bytes.fromhex("0000000000000900")


AFTER_7 = "dbo.orders.rv >= ? AND (dbo.orders.rv > ? OR dbo.orders.id > ?)"


@pytest.mark.parametrize(
    ("after", "bounded", "expected"),
    [
        pytest.param(None, False, ("dbo.orders.rv IS NOT NULL", ()), id="first-batch"),
        pytest.param(None, True, ("dbo.orders.rv < ?", (HORIZON_RV,)), id="first-batch-horizon"),
        pytest.param(
            Position(cursor=(RV[1],), pk=(7,)),
            False,
            (AFTER_7, (RV[1], RV[1], 7)),
            id="after-position",
        ),
        pytest.param(
            Position(cursor=(RV[1],), pk=(7,)),
            True,
            (f"{AFTER_7} AND dbo.orders.rv < ?", (RV[1], RV[1], 7, HORIZON_RV)),
            id="after-position-horizon",
        ),
        pytest.param(
            Position(cursor=(RV[1],), pk=()),
            False,
            ("dbo.orders.rv >= ?", (RV[1],)),
            id="pk-less-position",
        ),
        pytest.param(
            Position(cursor=(RV[1],), pk=()),
            True,
            ("dbo.orders.rv >= ? AND dbo.orders.rv < ?", (RV[1], HORIZON_RV)),
            id="pk-less-position-horizon",
        ),
    ],
)
def test_batch_statement(recorder, sources, after, bounded, expected):
    where, params = expected
    source = opened(sources, GivenTableSource(orders(), recorder, "rv"))
    recorder.answer("SELECT TOP 100", ["id", "rv", "status"], [])
    horizon = Horizon(bound=HORIZON_RV, method="test") if bounded else NO_HORIZON
    assert source.fetch(after, 100, horizon) == []
    sent = only(recorder.take())
    assert sent.sql == f"{SELECT} WHERE {where} {ORDER}"
    # pyodbc receives rowversion values as pyodbc.Binary (bytearray), equal to the bytes.
    assert sent.params == params
    assert [type(p) for p in sent.params] == [
        bytearray if isinstance(p, bytes) else type(p) for p in params
    ]


@pytest.mark.parametrize("version", [SQL_SERVER_2008_R2, SQL_SERVER_2022])
def test_the_limit_is_top_n_on_every_server_version(sources, version):
    # SQLAlchemy writes OFFSET ... FETCH only for an offset (SQL Server 2012 and later), or
    # ROW_NUMBER() before 2012; keyset batches never have one, so every version gets TOP n.
    recorder = RecordingPyodbc(server_version=version)
    source = opened(sources, GivenTableSource(orders(), recorder, "rv"))
    recorder.answer("SELECT TOP 25 ", ["id", "rv", "status"], [])
    source.fetch(Position(cursor=(RV[0],), pk=(1,)), 25, NO_HORIZON)
    sql = only(recorder.take()).sql
    assert sql.startswith("SELECT TOP 25 dbo.orders.id")
    for other in ("OFFSET", "FETCH", "ROW_NUMBER", "LIMIT", "(dbo.orders.rv, dbo.orders.id)"):
        assert other not in sql


def test_composite_cursor_and_pk_nest_without_row_values(recorder, sources):
    source = opened(sources, GivenTableSource(composite(), recorder, ["shard", "rv"]))
    assert source.description.pk == ("region", "num")
    select = (
        "SELECT TOP 10 dbo.events.shard, dbo.events.rv, dbo.events.region, dbo.events.num "
        "FROM dbo.events WHERE "
    )
    order = "ORDER BY dbo.events.shard, dbo.events.rv, dbo.events.region, dbo.events.num"
    columns = ["shard", "rv", "region", "num"]

    recorder.answer("SELECT TOP 10", columns, [])
    source.fetch(Position(cursor=(3, RV[2]), pk=("eu", 40)), 10, NO_HORIZON)
    sent = only(recorder.take())
    assert sent.sql == select + (
        "dbo.events.shard >= ? AND (dbo.events.shard > ? OR dbo.events.rv >= ? AND "
        "(dbo.events.rv > ? OR dbo.events.region >= ? AND (dbo.events.region > ? OR "
        "dbo.events.num > ?))) AND dbo.events.rv IS NOT NULL " + order
    )
    assert sent.params == (3, 3, RV[2], RV[2], "eu", "eu", 40)

    recorder.answer("SELECT TOP 10", columns, [])
    source.fetch(Position(cursor=(3, RV[2]), pk=()), 10, Horizon(bound=5, method="test"))
    sent = only(recorder.take())
    assert sent.sql == select + (
        "dbo.events.shard >= ? AND (dbo.events.shard > ? OR dbo.events.rv >= ?) "
        "AND dbo.events.shard < ? AND dbo.events.rv IS NOT NULL " + order
    )
    assert sent.params == (3, 3, RV[2], 5)

    recorder.answer("SELECT TOP 10", columns, [])
    source.fetch(None, 10, NO_HORIZON)
    sent = only(recorder.take())
    assert sent.sql == select + (
        "dbo.events.shard IS NOT NULL AND dbo.events.rv IS NOT NULL " + order
    )


# --------------------------------------------------------------------------------------------
# latest, the NULL count, the where filter
# --------------------------------------------------------------------------------------------


def test_latest_is_top_1_in_descending_key_order(recorder, sources):
    source = opened(sources, GivenTableSource(orders(), recorder, "rv"))
    base = "SELECT TOP 1 dbo.orders.rv, dbo.orders.id FROM dbo.orders WHERE "
    order = " ORDER BY dbo.orders.rv DESC, dbo.orders.id DESC"

    recorder.answer("SELECT TOP 1", ["rv", "id"], [(RV[3], 12)])
    assert source.latest(NO_HORIZON) == Position(cursor=(RV[3],), pk=(12,))
    assert only(recorder.take()) == Sent(base + "dbo.orders.rv IS NOT NULL" + order, ())

    recorder.answer("SELECT TOP 1", ["rv", "id"], [])
    assert source.latest(Horizon(bound=HORIZON_RV, method="test")) is None
    assert only(recorder.take()) == Sent(base + "dbo.orders.rv < ?" + order, (HORIZON_RV,))


def test_null_count_statement_and_check(recorder, sources, caplog):
    source = opened(sources, GivenTableSource(orders(mssql.DATETIME2(6)), recorder, "rv"))
    recorder.take()
    recorder.answer("count(*)", ["rows", "null_0"], [(3, 3)])
    recorder.catalog = Catalog("orders", primary_key=["id"], indexes={"ix_status": ["status"]})
    with caplog.at_level(logging.WARNING, "azure_functions_db"):
        health = source.check()
    sent = recorder.take()
    assert sent[0] == Sent(
        "SELECT count(*) AS rows, count(CASE WHEN (dbo.orders.rv IS NULL) THEN ? END) AS null_0 "
        "FROM dbo.orders WHERE dbo.orders.rv IS NULL",
        (1,),
    )
    # The rest is the index check: SQLAlchemy's reflection of SQL Server's catalog.
    assert len(sent) > 1
    assert all(" FROM sys." in s.sql for s in sent[1:])
    assert health.null_cursor_rows == 3
    assert health.warnings[0].startswith("3 row(s) of `dbo.orders` have a NULL cursor (`rv`)")
    assert health.warnings[1] == (
        "No index of `dbo.orders` starts with (rv, id): every batch may scan the table. Create "
        "one, e.g. `CREATE INDEX ix_orders_keyset ON dbo.orders (rv, id)`."
    )
    assert len(health.warnings) == 2


@pytest.mark.parametrize(
    ("primary_key", "indexes"),
    [
        (["id"], {"ix_orders_keyset": ["rv", "id"]}),
        (["rv", "id"], {}),  # a clustered primary key on (rv, id) serves too
        (["id"], {"ix_orders_wider": ["rv", "id", "status"]}),
    ],
    ids=["index", "primary-key", "wider-index"],
)
def test_check_finds_the_keyset_index_in_the_catalog(recorder, sources, primary_key, indexes):
    source = opened(sources, GivenTableSource(orders(), recorder, "rv", pk="id"))
    recorder.answer("count(*)", ["rows", "null_0"], [(0, 0)])
    recorder.catalog = Catalog("orders", primary_key=primary_key, indexes=indexes)
    assert source.check().warnings == ()


def test_where_text_and_clause_filters_are_bound_parameters(recorder, sources):
    text = opened(
        sources,
        GivenTableSource(
            orders(),
            recorder,
            "rv",
            where="status = :wanted OR id = :extra",
            params={"wanted": "paid", "extra": 2},
        ),
    )
    recorder.answer("SELECT TOP 5", ["id", "rv", "status"], [])
    text.fetch(Position(cursor=(RV[0],), pk=(1,)), 5, Horizon(bound=HORIZON_RV, method="test"))
    sent = only(recorder.take())
    assert sent.sql == (
        "SELECT TOP 5 dbo.orders.id, dbo.orders.rv, dbo.orders.status FROM dbo.orders WHERE "
        "dbo.orders.rv >= ? AND (dbo.orders.rv > ? OR dbo.orders.id > ?) AND dbo.orders.rv < ? "
        "AND (status = ? OR id = ?) ORDER BY dbo.orders.rv, dbo.orders.id"
    )
    assert sent.params == (RV[0], RV[0], 1, HORIZON_RV, "paid", 2)

    recorder.answer("count(*)", ["rows", "null_0"], [(0, 0)])
    recorder.catalog = Catalog("orders", primary_key=["id"], indexes={"ix": ["rv", "id"]})
    text.check()
    null_count = recorder.take()[0]
    assert null_count.sql.endswith("WHERE dbo.orders.rv IS NULL AND (status = ? OR id = ?)")
    assert null_count.params == (1, "paid", 2)

    clause = opened(
        sources,
        GivenTableSource(
            orders(),
            recorder,
            "rv",
            where=sa.column("status") == sa.bindparam("wanted"),
            params={"wanted": "x' OR '1'='1"},
        ),
    )
    recorder.answer("SELECT TOP 5", ["id", "rv", "status"], [])
    clause.fetch(None, 5, NO_HORIZON)
    sent = only(recorder.take())
    assert sent.sql == (
        "SELECT TOP 5 dbo.orders.id, dbo.orders.rv, dbo.orders.status FROM dbo.orders WHERE "
        "dbo.orders.rv IS NOT NULL AND dbo.orders.status = ? ORDER BY dbo.orders.rv, "
        "dbo.orders.id"
    )
    assert sent.params == ("x' OR '1'='1",)  # a value, never SQL


# --------------------------------------------------------------------------------------------
# the horizon: MIN_ACTIVE_ROWVERSION(), and the fallback of a datetime2 cursor
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rowversion_type", [mssql.ROWVERSION, mssql.TIMESTAMP])
def test_auto_horizon_uses_min_active_rowversion(recorder, sources, caplog, rowversion_type):
    horizon = AutoHorizon()
    with caplog.at_level(logging.INFO, "azure_functions_db"):
        source = opened(
            sources, GivenTableSource(orders(rowversion_type), recorder, "rv", horizon=horizon)
        )
    assert isinstance(horizon.chosen, MssqlRowversionHorizon)
    assert "horizon=mssql_min_active_rowversion" in caplog.text
    assert "horizon_fallback" not in caplog.text
    recorder.take()

    # pyodbc returns binary(8) as bytes; the bound is taken before the read and bound as is.
    recorder.answer("MIN_ACTIVE_ROWVERSION", ["value"], [(HORIZON_RV,)])
    bound = source.horizon()
    assert bound == Horizon(bound=HORIZON_RV, method="mssql_min_active_rowversion")
    assert only(recorder.take()) == Sent("SELECT MIN_ACTIVE_ROWVERSION()", ())
    recorder.answer("SELECT TOP 3", ["id", "rv", "status"], [(4, RV[0], "a"), (5, RV[1], "b")])
    rows = source.fetch(None, 3, bound)
    assert only(recorder.take()).params == (HORIZON_RV,)
    assert [r.position for r in rows] == [
        Position(cursor=(RV[0],), pk=(4,)),
        Position(cursor=(RV[1],), pk=(5,)),
    ]


def test_rowversion_horizon_refuses_a_lag(recorder):
    source = GivenTableSource(orders(), recorder, "rv", horizon=MssqlRowversionHorizon(), lag=5)
    with pytest.raises(ConfigurationError, match=r"Remove `lag=`"):
        source.open({})


@pytest.mark.parametrize(("lag", "fallback"), [(0, NoHorizon), (30, LagHorizon)])
def test_a_datetime2_cursor_falls_back_loudly_once(recorder, sources, caplog, lag, fallback):
    horizon = AutoHorizon()
    with caplog.at_level(logging.WARNING, "azure_functions_db"):
        source = opened(
            sources,
            GivenTableSource(orders(mssql.DATETIME2(6)), recorder, "rv", horizon=horizon, lag=lag),
        )
        first = source.horizon()
        second = source.horizon()
    (warning,) = [r for r in caplog.records if "action=horizon_fallback" in r.getMessage()]
    assert warning.levelno == logging.WARNING
    assert "dialect=mssql cursor=rv" in warning.getMessage()
    assert "fix: use a `rowversion` cursor" in warning.getMessage()
    assert isinstance(horizon.chosen, fallback)
    assert recorder.take() == []  # neither the choice nor the lag bound asks SQL Server
    if lag:
        # A naive datetime2 holds UTC wall-clock time unless cursor_timezone says otherwise.
        assert first.method == second.method == "lag"
        assert isinstance(first.bound, dt.datetime)
        assert first.bound.tzinfo is None
    else:
        assert first.bound is second.bound is None
        assert first.method == "none"


# --------------------------------------------------------------------------------------------
# rowversion values: checkpoint codec, resume, seek --cursor
# --------------------------------------------------------------------------------------------


def test_rowversion_positions_round_trip_through_the_checkpoint(recorder, sources):
    source = opened(sources, GivenTableSource(orders(), recorder, "rv"))
    returned = [(i, rv, "x") for i, rv in enumerate(RV)]
    recorder.answer("SELECT TOP 4", ["id", "rv", "status"], returned)
    rows = source.fetch(None, 4, NO_HORIZON)
    recorder.take()
    for row, (_, rv, _) in zip(rows, returned, strict=True):
        record = Checkpoint(key=KEY, position=row.position, fence=3, source=source.description)
        decoded = decode_checkpoint(encode_checkpoint(record)).position
        assert decoded == row.position
        assert decoded is not None
        assert type(decoded.cursor[0]) is bytes
        assert decoded.cursor[0] == rv
        assert len(decoded.cursor[0]) == 8
        recorder.answer("SELECT TOP 4", ["id", "rv", "status"], [])
        source.fetch(decoded, 4, NO_HORIZON)
        assert only(recorder.take()).params == (rv, rv, row.position.pk[0])
    assert [r.position.cursor[0] for r in rows] == RV  # the order SQL Server returned
    assert rows[0].position.key < rows[1].position.key < rows[3].position.key  # like binary


@pytest.mark.parametrize("text", ["0x00000000000007D1", "00000000000007d1", " 0X00000000000007d1 "])
def test_parse_cursor_reads_hex_with_or_without_0x(recorder, sources, text):
    source = opened(sources, GivenTableSource(orders(), recorder, "rv"))
    assert source.parse_cursor(text) == (RV[1],)
    recorder.answer("SELECT TOP 2", ["id", "rv", "status"], [])
    source.fetch(Position(cursor=source.parse_cursor(text), pk=()), 2, NO_HORIZON)
    assert only(recorder.take()).sql.startswith(
        "SELECT TOP 2 dbo.orders.id, dbo.orders.rv, dbo.orders.status FROM dbo.orders "
        "WHERE dbo.orders.rv >= ? ORDER BY"
    )


def test_parse_cursor_rejects_text_that_is_not_hex(recorder, sources):
    source = opened(sources, GivenTableSource(orders(), recorder, "rv"))
    with pytest.raises(ConfigurationError, match=r"hexadecimal bytes such as `0x"):
        source.parse_cursor("0x7D1Z")


# --------------------------------------------------------------------------------------------
# secrets: the password in the URL or in odbc_connect never shows
# --------------------------------------------------------------------------------------------


def _leaks(text: str) -> list[str]:
    forms = {SECRET, urllib.parse.quote_plus(SECRET), urllib.parse.quote(SECRET, safe="")}
    forms.add(SECRET.replace("}", "}}"))
    forms.add(urllib.parse.quote_plus(SECRET.replace("}", "}}")))
    return sorted(form for form in forms if form in text)


@pytest.mark.parametrize("url", [URL, ODBC_CONNECT_URL], ids=["password", "odbc_connect"])
def test_the_password_is_masked_in_repr_logs_and_errors(recorder, caplog, url):
    source = GivenTableSource(orders(), recorder, "rv", url=url)
    assert _leaks(repr(source)) == []
    with caplog.at_level(logging.DEBUG):
        source.open({})
        assert _leaks(repr(source)) == []
        source.close()
    assert "action=source_open" in caplog.text
    assert _leaks(caplog.text) == []
    assert "***" in repr(source)
    # The string pyodbc got holds the secret (it must), which is how the test knows the URL
    # carried one.
    assert _leaks(recorder.connection_strings[-1])

    # A driver that repeats its connection string in an error (the worst case) is scrubbed.
    recorder.connect_error = pyodbc.OperationalError(
        "08001", f"[08001] cannot connect with {recorder.connection_strings[-1]!r} (0)"
    )
    with pytest.raises(TransientSourceError) as raised:
        source.open({})
    assert "reflect" in str(raised.value)
    assert _leaks(str(raised.value)) == []


def test_a_driver_error_during_a_read_names_the_masked_url(recorder, sources):
    source = opened(sources, GivenTableSource(orders(), recorder, "rv"))
    recorder.answer("SELECT TOP 10", ["id", "rv", "status"], [])
    recorder.take()

    def fail(sql: str) -> Any:
        raise pyodbc.ProgrammingError("42S02", "[42S02] Invalid object name 'dbo.orders'. (208)")

    recorder.respond = fail  # type: ignore[method-assign]
    with pytest.raises(SourceError) as raised:
        source.fetch(None, 10, NO_HORIZON)
    message = str(raised.value)
    assert "Database fetch for table `dbo.orders`" in message
    assert "Invalid object name" in message
    assert "app:***@sql.example" in message
    assert _leaks(message) == []
    assert _leaks("".join(traceback.format_exception(raised.value))) == []  # causes included


# --------------------------------------------------------------------------------------------
# date-time types whose values Python cannot hold exactly
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cursor_type", [mssql.DATETIME2(7), mssql.DATETIME2(), mssql.DATETIMEOFFSET(7)]
)
def test_a_100ns_datetime_cursor_is_refused_when_the_source_opens(recorder, cursor_type):
    """datetime2(7) keeps 100 ns, Python 1 us: a position could not select its own row."""
    source = GivenTableSource(orders(cursor_type), recorder, "rv", horizon="none")
    with pytest.raises(SourceError, match=r"100 ns.*datetime2\(6\)"):
        source.open({})
    source.close()


@pytest.mark.parametrize("cursor_type", [mssql.DATETIME(), mssql.SMALLDATETIME(), sa.REAL()])
def test_rounded_types_bind_the_position_cast_to_the_column_type(recorder, sources, cursor_type):
    """DATETIME's 1/300 s ticks and REAL's float4 compare the bound in the column's own type."""
    source = opened(sources, GivenTableSource(orders(cursor_type), recorder, "rv", horizon="none"))
    recorder.take()
    after = Position(cursor=(dt.datetime(2026, 1, 1, 0, 0, 0, 3000),), pk=(7,))
    if isinstance(cursor_type, sa.REAL):
        after = Position(cursor=(0.1,), pk=(7,))
    recorder.answer("SELECT TOP 4", ["id", "rv", "status"], [])
    source.fetch(after, 4, NO_HORIZON)
    sql = only(recorder.take()).sql
    assert sql.count(f"CAST(? AS {cursor_type.compile(dialect=mssql.dialect())})") == 2, sql


def test_datetime2_6_binds_without_a_cast(recorder, sources):
    source = opened(
        sources, GivenTableSource(orders(mssql.DATETIME2(6)), recorder, "rv", horizon="none")
    )
    recorder.take()
    recorder.answer("SELECT TOP 4", ["id", "rv", "status"], [])
    source.fetch(Position(cursor=(dt.datetime(2026, 1, 1),), pk=(7,)), 4, NO_HORIZON)
    assert "CAST" not in only(recorder.take()).sql
