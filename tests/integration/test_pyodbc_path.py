"""``SqlSource`` through pyodbc (SQL Server's driver) against the PostgreSQL and MariaDB servers.

SQL Server cannot run here; its driver can. These tests run the source end to end through
pyodbc and unixODBC with the drivers that do exist: psqlODBC for PostgreSQL (through the
test-only ``postgresql+pyodbc`` dialect of ``devkit/odbc_dialects.py``) and MariaDB
Connector/ODBC (through SQLAlchemy's own ``mysql+pyodbc``). Tables are set up with the native
drivers in the usual scratch namespaces; only the source goes through ODBC.

Covered: cursor types with ties across batch boundaries, each row delivered once and in order,
positions resumed from a decoded checkpoint; composite cursor and key; a run of the real engine;
the ``auto`` horizon chosen (and its bound) compared with the native driver's; secrets in a URL
password or in ``odbc_connect`` never shown. What the drivers cannot do is pinned by tests too
(``test_*_driver_*``), so a driver upgrade that changes it fails here and the docs get updated:

* MariaDB Connector/ODBC 3.1 drops the fractional seconds of every bound date-time (it reports
  ``TIMESTAMP`` with scale 0, so pyodbc truncates), so a ``DATETIME(n)`` position with sub-second
  values would re-read its own row for ever: the source refuses such a cursor or key column
  through ``mysql+pyodbc`` when it opens, and whole-second ``DATETIME``/``TIMESTAMP`` columns are
  used for its time cursors here.
* psqlODBC returns ``timestamptz`` as naive values in the session time zone and drops the offset
  of aware parameters; the source still orders and resumes exactly (the values go back as they
  came), but an operator's ``seek --cursor`` with an offset is read in the session zone.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
import traceback
import urllib.parse
import uuid
import zoneinfo
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.dialects import mysql, postgresql

from azure_functions_db import Batch, Change
from azure_functions_db.core.checkpoint import (
    Checkpoint,
    PollerKey,
    decode_checkpoint,
    encode_checkpoint,
)
from azure_functions_db.core.clock import SystemClock
from azure_functions_db.core.engine import Engine, PollerConfig
from azure_functions_db.core.position import Position
from azure_functions_db.errors import SourceDefinitionError, SourceError, TransientSourceError
from azure_functions_db.sources import AutoHorizon, SqlSource
from azure_functions_db.state.memory import MemoryStateStore
from devkit import dbservers
from devkit import odbc_dialects as odbc
from tests.support.source_kit import NO_HORIZON, Db, drain

pytestmark = pytest.mark.odbc

T0 = dt.datetime(2026, 1, 1, 12, 0, 0, 123456)
WHOLE = T0.replace(microsecond=0)
BIG = 2**53
KEY = PollerKey("live", "odbc")


# --------------------------------------------------------------------------------------------
# fixtures: the same scratch namespace, reached through ODBC
# --------------------------------------------------------------------------------------------


def as_odbc(native: Db, database: str | None = None) -> Db:
    """``native``'s namespace with the ODBC URL; ``engine`` stays native, for setting up."""
    if native.dialect == "postgres":
        return Db("postgres", odbc.pg_odbc_url(), native.schema, native.engine)
    assert database is not None
    return Db("mysql", odbc.mysql_odbc_url(database), None, native.engine)


@pytest.fixture(
    params=[
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("mysql", marks=pytest.mark.mysql),
    ]
)
def odb(request: pytest.FixtureRequest, odbc_drivers: None) -> Db:
    """A scratch namespace on either server, with the source's URL going through pyodbc."""
    if request.param == "postgres":
        return as_odbc(request.getfixturevalue("pg"))
    return as_odbc(request.getfixturevalue("maria"), request.getfixturevalue("mysql_db"))


@pytest.fixture
def pg_odbc(pg: Db, odbc_drivers: None) -> Db:
    return as_odbc(pg)


@pytest.fixture
def maria_odbc(maria: Db, mysql_db: str, odbc_drivers: None) -> Db:
    return as_odbc(maria, mysql_db)


def open_source(opened: list[SqlSource], db: Db, table: str, *args: Any, **kw: Any) -> SqlSource:
    source = SqlSource(db.url, table, *args, schema=db.schema, **kw)
    source.open({})
    opened.append(source)
    assert source.engine.dialect.driver == "pyodbc"
    return source


def through_checkpoint(source: SqlSource, position: Position) -> Position:
    """``position`` stored in a checkpoint record and read back, as the state stores do."""
    record = Checkpoint(key=KEY, position=position, fence=1, source=source.description)
    decoded = decode_checkpoint(encode_checkpoint(record)).position
    assert decoded is not None
    return decoded


def time_type(db: Db) -> Any:
    return postgresql.TIMESTAMP(precision=6) if db.dialect == "postgres" else mysql.DATETIME()


def stamp(db: Db, moment: dt.datetime) -> dt.datetime:
    """``moment`` as this test can use it on ``db`` (MariaDB ODBC: whole seconds, see above)."""
    return moment if db.dialect == "postgres" else moment.replace(microsecond=0)


# --------------------------------------------------------------------------------------------
# keyset order, ties and resuming
# --------------------------------------------------------------------------------------------


# (column type, values) per case; every value is stored three times.
COMMON_TYPES: dict[str, tuple[Any, list[Any]]] = {
    "int": (sa.Integer, [3, -1, 2, 2_000_000_000]),
    "bigint": (sa.BigInteger, [BIG + 1, BIG + 2, BIG, 2**62 + 1, -(2**60)]),
    "numeric": (
        sa.Numeric(20, 6),
        [Decimal("1.000001"), Decimal("1.000000"), Decimal("-2.250000"), Decimal("12345678.5")],
    ),
}
ROWVERSIONS = [
    bytes.fromhex(h) for h in ("00000000000007d1", "00000000000007d0", "0100000000000000")
]
PG_TYPES: dict[str, tuple[Any, list[Any]]] = {
    "timestamp": (
        postgresql.TIMESTAMP(precision=6),
        [T0, T0 + dt.timedelta(microseconds=1), T0 - dt.timedelta(days=400)],
    ),
    "timestamptz": (
        postgresql.TIMESTAMP(timezone=True, precision=6),
        [
            T0.replace(tzinfo=dt.UTC),
            T0.replace(tzinfo=dt.UTC) + dt.timedelta(microseconds=1),
            T0.replace(tzinfo=dt.timezone(dt.timedelta(hours=1))),  # an hour before the first
        ],
    ),
    "bytea": (postgresql.BYTEA, ROWVERSIONS),
}
MYSQL_TYPES: dict[str, tuple[Any, list[Any]]] = {
    "datetime": (
        mysql.DATETIME(),
        [WHOLE, WHOLE + dt.timedelta(seconds=1), WHOLE.replace(year=2020)],
    ),
    "timestamp": (
        mysql.TIMESTAMP(),
        [WHOLE, WHOLE + dt.timedelta(seconds=1), WHOLE.replace(year=2020)],
    ),
    "binary8": (mysql.BINARY(8), ROWVERSIONS),
}
CASES = [
    *(
        pytest.param("postgres", n, id=f"postgres-{n}", marks=pytest.mark.postgres)
        for n in (*COMMON_TYPES, *PG_TYPES)
    ),
    *(
        pytest.param("mysql", n, id=f"mysql-{n}", marks=pytest.mark.mysql)
        for n in (*COMMON_TYPES, *MYSQL_TYPES)
    ),
]


def pg_session_zone(db: Db) -> zoneinfo.ZoneInfo:
    with sa.create_engine(db.url, poolclass=sa.NullPool).connect() as conn:
        return zoneinfo.ZoneInfo(conn.exec_driver_sql("SHOW TimeZone").scalar_one())


@pytest.mark.parametrize(("dialect", "name"), CASES)
def test_cursor_types_resume_exactly_from_a_decoded_checkpoint(request, opened, dialect, name):
    db: Db = request.getfixturevalue("pg_odbc" if dialect == "postgres" else "maria_odbc")
    type_, values = {**COMMON_TYPES, **(PG_TYPES if dialect == "postgres" else MYSQL_TYPES)}[name]
    columns = [
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("cur", type_, nullable=False),
    ]
    rows = [{"id": i, "cur": v} for i, v in enumerate(values * 3)]
    db.table("typed", columns, rows, index=["cur", "id"])
    source = open_source(opened, db, "typed", "cur")
    read = drain(source, 2)  # every value's three rows are split across batches

    expected = [(r["cur"], r["id"]) for r in rows]
    if name == "timestamptz":
        # psqlODBC: timestamptz arrives naive, in the session time zone.
        zone = pg_session_zone(db)
        expected = [(v.astimezone(zone).replace(tzinfo=None), i) for v, i in expected]
    assert [r.position.key for r in read] == sorted(expected)
    assert sorted(r.position.pk[0] for r in read) == list(range(len(rows)))
    assert {type(r.position.cursor[0]) for r in read} == {type(expected[0][0])}
    for i, row in enumerate(read[:-1]):
        decoded = through_checkpoint(source, row.position)
        assert decoded == row.position
        assert type(decoded.cursor[0]) is type(row.position.cursor[0])
        if isinstance(row.position.cursor[0], Decimal):
            assert str(decoded.cursor[0]) == str(row.position.cursor[0])
        rest = source.fetch(decoded, len(read), NO_HORIZON)
        assert [r.position for r in rest] == [r.position for r in read[i + 1 :]], (i, row)


# --------------------------------------------------------------------------------------------
# the engine, end to end
# --------------------------------------------------------------------------------------------


class Recorder:
    def __init__(self) -> None:
        self.batches: list[list[Change]] = []

    def __call__(self, batch: Batch) -> None:
        self.batches.append(list(batch))


def test_the_engine_delivers_every_row_once_in_order_and_resumes(odb, opened):
    columns = [
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("updated_at", time_type(odb), nullable=False),
        sa.Column("amount", sa.Numeric(12, 2), nullable=False),
    ]
    first = [
        {"id": i, "updated_at": stamp(odb, T0 + dt.timedelta(seconds=i // 4)), "amount": i}
        for i in range(1, 23)
    ]
    table = odb.table("orders", columns, first, index=["updated_at", "id"])
    source = SqlSource(odb.url, "orders", "updated_at", schema=odb.schema)  # horizon="auto"
    opened.append(source)
    store, handler = MemoryStateStore(), Recorder()
    config = PollerConfig(name="odbc", batch_size=5, retry_delay=0.01)
    engine = Engine(config, source, store, handler, SystemClock(), owner="test")

    report = engine.run({})
    assert source.engine.dialect.driver == "pyodbc"
    assert (report.status, report.rows, report.batches) == ("caught_up", 22, 5)
    delivered = [c.position for batch in handler.batches for c in batch]
    assert [p.pk[0] for p in delivered] == list(range(1, 23))
    assert [len(b) for b in handler.batches] == [5, 5, 5, 5, 2]
    assert handler.batches[0][0].data["amount"] == Decimal("1.00")
    stored = store.read(config.key)
    assert stored is not None
    assert stored.checkpoint.position == delivered[-1]  # decoded from the stored bytes

    later = [
        {"id": i, "updated_at": stamp(odb, T0 + dt.timedelta(seconds=9)), "amount": i}
        for i in (30, 24, 23)
    ]
    with odb.engine.begin() as conn:
        conn.execute(table.insert(), later)
    report = engine.run({})
    assert (report.rows, [c.position.pk[0] for c in handler.batches[-1]]) == (3, [23, 24, 30])
    assert engine.run({}).rows == 0


# --------------------------------------------------------------------------------------------
# the auto horizon: the same choice as through the native driver
# --------------------------------------------------------------------------------------------

HORIZON_CASES = [
    pytest.param(
        "postgres", "timestamptz NOT NULL", id="postgres-timestamptz", marks=pytest.mark.postgres
    ),
    pytest.param(
        "postgres", "timestamp(6) NOT NULL", id="postgres-timestamp", marks=pytest.mark.postgres
    ),
    pytest.param("postgres", "xid8 NOT NULL", id="postgres-xid8", marks=pytest.mark.postgres),
    pytest.param("postgres", "bigint NOT NULL", id="postgres-bigint", marks=pytest.mark.postgres),
    pytest.param("mysql", "datetime NOT NULL", id="mysql-datetime", marks=pytest.mark.mysql),
    pytest.param("mysql", "bigint NOT NULL", id="mysql-bigint", marks=pytest.mark.mysql),
]


@pytest.fixture
def far_zone_process(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Run with the process 14 hours east of UTC, far from every server session's zone."""
    monkeypatch.setenv("TZ", "Pacific/Kiritimati")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.mark.usefixtures("far_zone_process")
@pytest.mark.parametrize(("dialect", "column"), HORIZON_CASES)
def test_auto_horizon_is_the_same_as_through_the_native_driver(
    request, opened, caplog, dialect, column
):
    # psqlODBC returns timestamptz naive; the horizon queries therefore read the server clocks
    # as naive UTC. The process runs 14 hours from UTC so a zone mix-up could not go unseen.
    native: Db = request.getfixturevalue("pg" if dialect == "postgres" else "maria")
    via_odbc: Db = request.getfixturevalue("pg_odbc" if dialect == "postgres" else "maria_odbc")
    with native.engine.begin() as conn:
        conn.exec_driver_sql(
            f"CREATE TABLE {native.qualified('h')} (id int PRIMARY KEY, cur {column})"
        )
    with caplog.at_level(logging.WARNING, "azure_functions_db"):
        a, b = AutoHorizon(), AutoHorizon()
        plain = SqlSource(native.url, "h", "cur", schema=native.schema, horizon=a)
        plain.open({})
        opened.append(plain)
        through = open_source(opened, via_odbc, "h", "cur", horizon=b)
        bounds = plain.horizon(), through.horizon()
    assert b.name == a.name
    assert type(b.chosen) is type(a.chosen)
    assert b.detail == a.detail
    assert bounds[1].method == bounds[0].method
    fallbacks = [r for r in caplog.records if "action=horizon_fallback" in r.getMessage()]
    if "bigint" in column:
        assert a.name == "none"
        assert len(fallbacks) == 2  # each source says so, once
        assert bounds[0].bound is bounds[1].bound is None
        return
    assert fallbacks == []
    assert a.name in ("pg_xact_start", "pg_snapshot_xmin", "mysql_innodb_trx")
    native_bound, odbc_bound = bounds[0].bound, bounds[1].bound
    assert type(odbc_bound) is type(native_bound)
    if isinstance(native_bound, dt.datetime):
        assert isinstance(odbc_bound, dt.datetime)
        assert (odbc_bound.tzinfo is None) == (native_bound.tzinfo is None)
        assert abs(odbc_bound - native_bound) < dt.timedelta(seconds=5)
    else:  # xid8: both drivers return the snapshot xmin as text
        assert abs(int(str(odbc_bound)) - int(str(native_bound))) < 1000


# --------------------------------------------------------------------------------------------
# what the drivers cannot do, pinned
# --------------------------------------------------------------------------------------------


@pytest.mark.mysql
def test_mariadb_driver_drops_the_fraction_of_bound_datetimes(maria_odbc, opened):
    engine = sa.create_engine(maria_odbc.url, poolclass=sa.NullPool)
    try:
        with engine.connect() as conn:
            echoed = conn.execute(sa.text("SELECT CAST(:t AS DATETIME(6))"), {"t": T0}).scalar()
    finally:
        engine.dispose()
    assert echoed == WHOLE  # the driver sent T0 without its .123456
    # So a sub-second date-time position could not select its own row: the source refuses the
    # column when it opens, naming the fix, rather than re-reading a row for ever.
    for type_ in (mysql.DATETIME(fsp=6), mysql.TIMESTAMP(fsp=3)):
        name = f"fraction{type_.fsp}"
        columns = [
            sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
            sa.Column("cur", type_, nullable=False),
        ]
        maria_odbc.table(name, columns, [{"id": 1, "cur": T0}])
        with pytest.raises(SourceDefinitionError, match=r"fractional seconds.*mysql\+pymysql"):
            open_source(opened, maria_odbc, name, "cur")


@pytest.mark.postgres
def test_psqlodbc_driver_reads_timestamptz_naive_and_drops_parameter_offsets(pg_odbc, opened):
    columns = [
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("cur", postgresql.TIMESTAMP(timezone=True, precision=6), nullable=False),
    ]
    moments = [T0.replace(tzinfo=dt.UTC) + dt.timedelta(hours=h) for h in range(3)]
    pg_odbc.table("moments", columns, [{"id": i, "cur": m} for i, m in enumerate(moments)])
    source = open_source(opened, pg_odbc, "moments", "cur")
    zone = pg_session_zone(pg_odbc)
    assert [r.position.cursor[0] for r in drain(source, 2)] == [
        m.astimezone(zone).replace(tzinfo=None) for m in moments
    ]
    # An operator seeks to moments[1], written in UTC+1. pyodbc sends the wall-clock digits
    # without the offset, and the server reads them in the session zone: unless that zone is
    # UTC+1, the seek lands elsewhere (in UTC, an hour late: [2] instead of [1, 2]).
    seek = source.parse_cursor("2026-01-01T14:00:00.123456+01:00")
    assert seek == (moments[1],)
    landed = seek[0].replace(tzinfo=None).replace(tzinfo=zone)
    found = [r.position.pk[0] for r in drain(source, 5, after=Position(cursor=seek, pk=()))]
    assert found == [i for i, m in enumerate(moments) if m >= landed]


# --------------------------------------------------------------------------------------------
# secrets: a password in the URL or in odbc_connect never shows
# --------------------------------------------------------------------------------------------

SECRET = "pw;7}x-" + uuid.uuid4().hex[:8]  # a ';' and a '}': braced and escaped in ODBC strings


def leaks(text: str) -> list[str]:
    """The forms of SECRET found in ``text``: raw, URL-encoded, ODBC-escaped."""
    forms = set()
    for written in (SECRET, SECRET.replace("}", "}}")):
        forms |= {written, urllib.parse.quote_plus(written), urllib.parse.quote(written, safe="")}
    return sorted(form for form in forms if form in text)


def everything_said(error: BaseException) -> str:
    """The message, the causes and the traceback, as a log handler would print them."""
    return "".join(traceback.format_exception(error))


@pytest.fixture
def maria_user(maria: Db, mysql_db: str, odbc_drivers: None) -> Iterator[str]:
    """A MariaDB user ``u_<hex>`` with password SECRET and every privilege on the scratch db."""
    user = f"u_{uuid.uuid4().hex[:10]}"
    secret = SECRET.replace("'", "''")
    with maria.engine.begin() as conn:
        conn.exec_driver_sql(f"CREATE USER '{user}'@'%%' IDENTIFIED BY '{secret}'")
        conn.exec_driver_sql(f"GRANT ALL ON `{mysql_db}`.* TO '{user}'@'%%'")
    try:
        yield user
    finally:
        with maria.engine.begin() as conn:
            conn.exec_driver_sql(f"DROP USER IF EXISTS '{user}'@'%%'")


def odbc_urls(dialect: str, database: str, user: str, port: int) -> dict[str, str]:
    """The same connection with the password in the URL, and as ``odbc_connect``."""
    if dialect == "postgres":
        driver, host = odbc.PG_DRIVER, dbservers.PG_HOST
        extra = [("BoolsAsChar", "0"), ("UseServerSidePrepare", "0")]  # see odbc_dialects
        url = odbc.pg_odbc_url(port=port, password=SECRET)
        scheme = "postgresql"
    else:
        driver, host, extra = odbc.MARIADB_DRIVER, dbservers.MYSQL_HOST, []
        url = odbc.mysql_odbc_url(database, port=port, password=SECRET).replace(
            f"//{dbservers.MYSQL_USER}:", f"//{user}:"
        )
        scheme = "mysql"
    braced = "{" + SECRET.replace("}", "}}") + "}"
    attributes = [
        ("DRIVER", "{" + driver + "}"),
        ("Server", host),
        ("Port", str(port)),
        ("Database", database),
        ("UID", user),
        ("PWD", braced),
        *extra,
    ]
    return {"password": url, "odbc_connect": odbc.odbc_connect_url(scheme, attributes)}


@pytest.mark.parametrize("form", ["password", "odbc_connect"])
@pytest.mark.parametrize(
    "dialect",
    [
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("mysql", marks=pytest.mark.mysql),
    ],
)
def test_a_secret_never_shows_in_repr_logs_or_errors(request, opened, caplog, dialect, form):
    # PostgreSQL trusts local connections, so its password is carried but not checked; the
    # MariaDB user needs it, so opening there proves the driver got it intact.
    if dialect == "postgres":
        db: Db = request.getfixturevalue("pg_odbc")
        database, user, port = dbservers.PG_DATABASE, dbservers.PG_USER, dbservers.PG_PORT
    else:
        db = request.getfixturevalue("maria_odbc")
        database, user = request.getfixturevalue("mysql_db"), request.getfixturevalue("maria_user")
        port = dbservers.MYSQL_PORT
    columns = [sa.Column("id", sa.Integer, primary_key=True), sa.Column("cur", sa.BigInteger)]
    db.table("t", columns)
    url = odbc_urls(dialect, database, user, port)[form]
    assert leaks(url), "the URL must carry the secret for this test to mean anything"
    with caplog.at_level(logging.DEBUG):
        source = SqlSource(url, "t", "cur", schema=db.schema, horizon="none")
        assert leaks(repr(source)) == []
        source.open({})
        opened.append(source)
        assert drain(source, 5) == []
        assert leaks(repr(source)) == []
        assert "***" in repr(source)

        refused = SqlSource(
            odbc_urls(dialect, database, user, 1)[form], "t", "cur", schema=db.schema
        )
        with pytest.raises(SourceError) as raised:
            refused.open({})
    # psqlODBC says SQLSTATE 08001 (pyodbc.OperationalError: transient, retried within the run);
    # MariaDB Connector/ODBC says HY000 (plain pyodbc.Error), so the refusal is a SourceError
    # and waits for the next run.
    kind = TransientSourceError if dialect == "postgres" else SourceError
    assert type(raised.value) is kind
    assert "reflect" in str(raised.value)
    assert leaks(everything_said(raised.value)) == []
    assert "action=source_open" in caplog.text
    assert leaks(caplog.text) == []


@pytest.mark.mysql
def test_a_wrong_password_is_reported_without_it(maria_odbc, mysql_db, maria_user):
    wrong = SECRET[::-1]
    url = odbc.mysql_odbc_url(mysql_db, password=wrong).replace("//root:", f"//{maria_user}:")
    assert wrong in urllib.parse.unquote_plus(url)
    source = SqlSource(url, "t", "cur")
    with pytest.raises(SourceError) as raised:
        source.open({})
    said = everything_said(raised.value)
    assert "Access denied" in said
    assert wrong not in said
    assert urllib.parse.quote_plus(wrong) not in said
