"""Commit-safe horizons (SPEC §5.3, case J) against real PostgreSQL and MariaDB.

The late-commit scenario: a slow writer stamps its row with the database clock and holds its
transaction open; another starts its transaction (and reads ``now()``) long before it inserts;
meanwhile fast writers commit rows with later cursors and a poller drains the table again and
again. After the slow writers commit and a final drain, every committed row must have been
delivered. The same scenario without a horizon must lose rows, which proves the test can fail.
Steps are ordered with events, not sleeps; only the final drain waits for the settle margin.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.dialects import mssql

from azure_functions_db.core.position import Position
from azure_functions_db.errors import ConfigurationError
from azure_functions_db.sources import (
    AutoHorizon,
    HorizonStrategy,
    HorizonTarget,
    LagHorizon,
    NoHorizon,
    SqlSource,
)
from azure_functions_db.sources._dialect_horizons import (
    MSSQL_ROWVERSION_SQL,
    MssqlRowversionHorizon,
    PgXactStartHorizon,
)
from azure_functions_db.sources._mysql_horizon import MysqlTrxHorizon

PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
MY_URL = "mysql+pymysql://root@127.0.0.1:3306/test"
SETTLE = dt.timedelta(milliseconds=300)
STEP = 10.0  # seconds any one step may take before the test fails instead of hanging


def _server(url: str) -> sa.Engine:
    engine = sa.create_engine(url, pool_pre_ping=True)
    try:
        with engine.connect():
            pass
    except sa.exc.OperationalError as exc:
        engine.dispose()
        pytest.skip(f"database server at {url} is unreachable: {str(exc.orig).splitlines()[0]}")
    return engine


@pytest.fixture(scope="module")
def pg() -> Iterator[sa.Engine]:
    engine = _server(PG_URL)
    yield engine
    engine.dispose()


@pytest.fixture(scope="module")
def my() -> Iterator[sa.Engine]:
    engine = _server(MY_URL)
    yield engine
    engine.dispose()


@pytest.fixture
def table_name() -> str:
    return f"hz_{uuid.uuid4().hex[:10]}"


def open_source(opened: list[SqlSource], url: str, table: str, cursor: str, **kwargs: Any) -> Any:
    source = SqlSource(url, table, cursor, **kwargs)
    with warnings.catch_warnings():
        # SQLAlchemy does not know PostgreSQL's xid8 and says so while reflecting.
        warnings.filterwarnings("ignore", "Did not recognize type 'xid8'", sa.exc.SAWarning)
        source.open({})
    opened.append(source)
    return source


# --------------------------------------------------------------------------------------------
# the late-commit scenario
# --------------------------------------------------------------------------------------------


@dataclass
class Dialect:
    """How to create the table and stamp a row on one server."""

    url: str
    create: str  # {t} is the table name
    stamp: str  # SQL expression of the database clock in the cursor column's type
    early_read: str  # statement a slow writer runs long before it inserts; {t} the table
    session: str = ""  # statement run first on every writer connection
    source_options: dict[str, Any] = field(default_factory=dict)


PG_TZ = Dialect(
    url=PG_URL,
    create="CREATE TABLE {t} (id int PRIMARY KEY, updated_at timestamptz NOT NULL)",
    stamp="now()",
    early_read="SELECT now()",
)
PG_NAIVE = Dialect(
    url=PG_URL,
    create="CREATE TABLE {t} (id int PRIMARY KEY, updated_at timestamp(6) NOT NULL)",
    stamp="now()",
    early_read="SELECT now()",
    session="SET TIME ZONE 'Asia/Tokyo'",
    source_options={"cursor_timezone": "Asia/Tokyo"},
)
PG_XID8 = Dialect(
    url=PG_URL,
    create="CREATE TABLE {t} (id int PRIMARY KEY, updated_at xid8 NOT NULL)",
    stamp="pg_current_xact_id()",
    early_read="SELECT pg_current_xact_id()",
)
# NOW(6) is the statement's start; the early read touches the InnoDB table, so the transaction
# is listed in innodb_trx from then on (a transaction that never touched InnoDB is not).
MY_NAIVE = Dialect(
    url=MY_URL,
    create="CREATE TABLE {t} (id int PRIMARY KEY, updated_at datetime(6) NOT NULL) ENGINE=InnoDB",
    stamp="NOW(6)",
    early_read="SELECT NOW(6), COUNT(*) FROM {t}",
    session="SET time_zone = '+09:00'",
    source_options={"cursor_timezone": "Asia/Tokyo"},
)


class Poller:
    """Drains ``source`` the way the engine does: horizon, then fetch after the last position."""

    def __init__(self, source: SqlSource) -> None:
        self.source = source
        self.after: Position | None = None
        self.delivered: list[int] = []
        self.bounds: list[Any] = []

    def drain(self) -> None:
        while True:
            horizon = self.source.horizon()
            self.bounds.append(horizon.bound)
            rows = self.source.fetch(self.after, 3, horizon)
            for row in rows:
                self.delivered.append(int(row.data["id"]))
                self.after = row.position
            if len(rows) < 3:
                return


class Writers:
    """Writer connections; each slow writer runs in its own thread, driven by events."""

    def __init__(self, engine: sa.Engine, dialect: Dialect, table: str) -> None:
        self.engine, self.dialect, self.table = engine, dialect, table
        self.committed: list[int] = []
        self.errors: list[BaseException] = []
        self.threads: list[threading.Thread] = []

    def _connect(self) -> sa.Connection:
        conn = self.engine.connect()
        if self.dialect.session:
            conn.exec_driver_sql(self.dialect.session)
            conn.commit()
        return conn

    def _insert(self, conn: sa.Connection, row_id: int, stamp: Any = None) -> None:
        value = self.dialect.stamp if stamp is None else ":stamp"
        statement = sa.text(f"INSERT INTO {self.table} (id, updated_at) VALUES (:id, {value})")
        conn.execute(statement, {"id": row_id} if stamp is None else {"id": row_id, "stamp": stamp})

    def fast(self, *ids: int) -> None:
        """Each row in its own short transaction, stamped now."""
        with self._connect() as conn:
            for row_id in ids:
                self._insert(conn, row_id)
                conn.commit()
                self.committed.append(row_id)

    def slow(self, row_id: int, *, early: bool) -> tuple[threading.Event, threading.Event]:
        """Start a transaction that stamps row ``row_id`` and waits; returns (ready, release).

        ``early``: read the clock first, insert with that value only after ``release``. Otherwise
        insert at once (stamped by the database) and commit after ``release``.
        """
        ready, release = threading.Event(), threading.Event()

        def run() -> None:
            try:
                with self._connect() as conn:
                    early_value = None
                    if early:
                        read = self.dialect.early_read.format(t=self.table)
                        early_value = conn.exec_driver_sql(read).first()[0]  # type: ignore[index]
                    else:
                        self._insert(conn, row_id)
                    ready.set()
                    if not release.wait(STEP):
                        raise TimeoutError("slow writer was never released")
                    if early:
                        if self.dialect.stamp == "pg_current_xact_id()":
                            self._insert(conn, row_id)  # the xid was assigned by the early read
                        else:
                            self._insert(conn, row_id, early_value)
                    conn.commit()
                    self.committed.append(row_id)
            except BaseException as exc:  # reported by join()
                self.errors.append(exc)
                ready.set()

        thread = threading.Thread(target=run, name=f"slow-writer-{row_id}", daemon=True)
        self.threads.append(thread)
        thread.start()
        assert ready.wait(STEP)
        assert not self.errors, self.errors
        return ready, release

    def join(self) -> None:
        for thread in self.threads:
            thread.join(STEP)
            assert not thread.is_alive()
        assert not self.errors, self.errors


def late_commit_scenario(
    engine: sa.Engine,
    dialect: Dialect,
    table: str,
    horizon: HorizonStrategy,
    opened: list[SqlSource],
) -> tuple[Poller, list[int]]:
    """Run the scenario; return the poller and the ids committed."""
    with engine.begin() as conn:
        conn.exec_driver_sql(dialect.create.format(t=table))
    try:
        source = open_source(
            opened, dialect.url, table, "updated_at", horizon=horizon, **dialect.source_options
        )
        poller = Poller(source)
        writers = Writers(engine, dialect, table)
        writers.fast(1, 2)
        poller.drain()
        # 10 stamps at its start and holds; 11 starts (reads the clock) and inserts much later.
        _, release_10 = writers.slow(10, early=False)
        _, release_11 = writers.slow(11, early=True)
        for batch in ((20, 21), (22, 23, 24), (25,)):
            writers.fast(*batch)
            poller.drain()
        release_11.set()  # inserts its old stamp now and commits
        writers.threads[1].join(STEP)
        writers.fast(30, 31)
        poller.drain()
        release_10.set()
        writers.join()
        writers.fast(40)
        # The final drain: wait (at most STEP) until the settle margin has passed the last row.
        deadline = time.monotonic() + STEP
        while True:
            poller.drain()
            if poller.bounds[-1] is None or set(poller.delivered) >= set(writers.committed):
                break  # no horizon: nothing to wait for; else: everything is in
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        return poller, writers.committed
    finally:
        for src in opened:
            src.close()
        with engine.begin() as conn:
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS {table}")


SCENARIOS = [
    pytest.param("pg", PG_TZ, "pg_xact_start", marks=pytest.mark.postgres, id="pg-timestamptz"),
    pytest.param("pg", PG_NAIVE, "pg_xact_start", marks=pytest.mark.postgres, id="pg-timestamp"),
    pytest.param("pg", PG_XID8, "pg_snapshot_xmin", marks=pytest.mark.postgres, id="pg-xid8"),
    pytest.param("my", MY_NAIVE, "mysql_innodb_trx", marks=pytest.mark.mysql, id="mariadb"),
]


@pytest.mark.parametrize(("server", "dialect", "method"), SCENARIOS)
def test_auto_horizon_delivers_every_late_committed_row(
    request: pytest.FixtureRequest,
    *,
    server: str,
    dialect: Dialect,
    method: str,
    table_name: str,
    opened: list[SqlSource],
) -> None:
    engine = request.getfixturevalue(server)
    horizon = AutoHorizon(settle=SETTLE)
    poller, committed = late_commit_scenario(engine, dialect, table_name, horizon, opened)
    assert horizon.name == method
    assert horizon.detail == ""
    assert sorted(poller.delivered) == sorted(committed)
    assert len(poller.delivered) == len(set(poller.delivered))  # nothing twice
    assert set(committed) >= {10, 11, 40}


@pytest.mark.parametrize(("server", "dialect", "method"), SCENARIOS)
def test_without_a_horizon_the_same_scenario_loses_rows(
    request: pytest.FixtureRequest,
    *,
    server: str,
    dialect: Dialect,
    method: str,
    table_name: str,
    opened: list[SqlSource],
) -> None:
    engine = request.getfixturevalue(server)
    poller, committed = late_commit_scenario(engine, dialect, table_name, NoHorizon(), opened)
    lost = set(committed) - set(poller.delivered)
    assert lost, "the scenario must be able to lose rows, or it proves nothing"
    assert lost <= {10, 11}


# --------------------------------------------------------------------------------------------
# privileges and fallbacks
# --------------------------------------------------------------------------------------------


def _fallbacks(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if "action=horizon_fallback" in r.getMessage()]


@pytest.fixture
def pg_low_role(pg: sa.Engine, table_name: str) -> Iterator[str]:
    """A login role that may read the table but not other sessions' activity."""
    role = f"afdb_{table_name}"
    with pg.begin() as conn:
        conn.exec_driver_sql(
            f"CREATE TABLE {table_name} (id int PRIMARY KEY, updated_at timestamptz NOT NULL)"
        )
        conn.exec_driver_sql(f"CREATE ROLE {role} LOGIN")
        conn.exec_driver_sql(f"GRANT SELECT ON {table_name} TO {role}")
    yield role
    with pg.begin() as conn:
        conn.exec_driver_sql(f"DROP TABLE {table_name}")
        conn.exec_driver_sql(f"DROP ROLE {role}")


@pytest.mark.postgres
def test_pg_auto_falls_back_to_lag_once_loudly_without_pg_read_all_stats(
    pg_low_role: str, table_name: str, opened: list[SqlSource], caplog: pytest.LogCaptureFixture
) -> None:
    url = f"postgresql+psycopg://{pg_low_role}@127.0.0.1:5432/test"
    horizon = AutoHorizon()
    with caplog.at_level(logging.WARNING):
        source = open_source(opened, url, table_name, "updated_at", lag=30, horizon=horizon)
        source.horizon()
        source.horizon()
    (record,) = _fallbacks(caplog)
    assert record.levelno == logging.WARNING
    assert f"GRANT pg_read_all_stats TO {pg_low_role}" in record.getMessage()
    assert horizon.name == "lag"
    assert isinstance(horizon.chosen, LagHorizon)
    assert "pg_read_all_stats" in horizon.detail
    assert "lag=30s" in horizon.detail
    assert source.horizon().method == "lag"

    with pytest.raises(ConfigurationError, match=r"GRANT pg_read_all_stats"):
        open_source(opened, url, table_name, "updated_at", horizon=PgXactStartHorizon())


@pytest.mark.postgres
def test_pg_auto_sees_the_privilege_granted(
    pg: sa.Engine, pg_low_role: str, table_name: str, opened: list[SqlSource]
) -> None:
    with pg.begin() as conn:
        conn.exec_driver_sql(f"GRANT pg_read_all_stats TO {pg_low_role}")
    url = f"postgresql+psycopg://{pg_low_role}@127.0.0.1:5432/test"
    horizon = AutoHorizon()
    open_source(opened, url, table_name, "updated_at", horizon=horizon)
    assert horizon.name == "pg_xact_start"


@pytest.mark.postgres
def test_pg_lag_is_an_extra_margin_on_the_safe_bound(
    pg: sa.Engine, table_name: str, opened: list[SqlSource]
) -> None:
    with pg.begin() as conn:
        conn.exec_driver_sql(
            f"CREATE TABLE {table_name} (id int PRIMARY KEY, updated_at timestamptz NOT NULL)"
        )
    try:
        source = open_source(opened, PG_URL, table_name, "updated_at", lag=3600)
        source._horizon = horizon = AutoHorizon()  # what `horizon="auto"` will do
        horizon.prepare(source.horizon_target())
        bound = source.horizon().bound
        assert isinstance(bound, dt.datetime)
        assert bound < dt.datetime.now(dt.UTC) - dt.timedelta(minutes=59)
        # Without lag the bound is the server's clock less the settle margin.
        plain = AutoHorizon(settle=dt.timedelta(0))
        exact = open_source(opened, PG_URL, table_name, "updated_at", horizon=plain)
        safe = exact.horizon().bound
        assert isinstance(safe, dt.datetime)
        assert abs(safe - dt.datetime.now(dt.UTC)) < dt.timedelta(seconds=5)
    finally:
        for src in opened:
            src.close()
        with pg.begin() as conn:
            conn.exec_driver_sql(f"DROP TABLE {table_name}")


@pytest.mark.postgres
def test_pg_integer_cursor_has_no_safe_method_and_says_so(
    pg: sa.Engine, table_name: str, opened: list[SqlSource], caplog: pytest.LogCaptureFixture
) -> None:
    with pg.begin() as conn:
        conn.exec_driver_sql(f"CREATE TABLE {table_name} (id int PRIMARY KEY, seq bigint)")
    try:
        horizon = AutoHorizon()
        with caplog.at_level(logging.WARNING):
            source = open_source(opened, PG_URL, table_name, "seq", horizon=horizon)
        (record,) = _fallbacks(caplog)
        assert "no commit-safe horizon for cursor `seq`" in record.getMessage()
        assert horizon.name == "none"
        assert "xid8" in horizon.detail
        assert source.horizon().bound is None
    finally:
        for src in opened:
            src.close()
        with pg.begin() as conn:
            conn.exec_driver_sql(f"DROP TABLE {table_name}")


@pytest.fixture
def my_low_user(my: sa.Engine, table_name: str) -> Iterator[str]:
    """A user that may read the table but lacks PROCESS."""
    user = f"afdb_{table_name}"
    with my.begin() as conn:
        conn.exec_driver_sql(
            f"CREATE TABLE {table_name} (id int PRIMARY KEY, updated_at datetime(6) NOT NULL)"
        )
        conn.exec_driver_sql(f"CREATE USER '{user}'@'%%'")
        conn.exec_driver_sql(f"CREATE USER '{user}'@'localhost'")
        conn.exec_driver_sql(f"GRANT SELECT ON test.{table_name} TO '{user}'@'%%'")
        conn.exec_driver_sql(f"GRANT SELECT ON test.{table_name} TO '{user}'@'localhost'")
    yield user
    with my.begin() as conn:
        conn.exec_driver_sql(f"DROP TABLE {table_name}")
        conn.exec_driver_sql(f"DROP USER '{user}'@'%%'")
        conn.exec_driver_sql(f"DROP USER '{user}'@'localhost'")


@pytest.mark.mysql
def test_mysql_auto_falls_back_to_lag_once_loudly_without_process(
    my_low_user: str, table_name: str, opened: list[SqlSource], caplog: pytest.LogCaptureFixture
) -> None:
    url = f"mysql+pymysql://{my_low_user}@127.0.0.1:3306/test"
    horizon = AutoHorizon()
    with caplog.at_level(logging.WARNING):
        source = open_source(opened, url, table_name, "updated_at", lag=5, horizon=horizon)
        source.horizon()
    (record,) = _fallbacks(caplog)
    assert "GRANT PROCESS" in record.getMessage()
    assert horizon.name == "lag"
    assert "PROCESS" in horizon.detail

    with pytest.raises(ConfigurationError, match=r"GRANT PROCESS"):
        open_source(opened, url, table_name, "updated_at", horizon=MysqlTrxHorizon())


# --------------------------------------------------------------------------------------------
# SQLite and SQL Server (no server here: the statement is compiled and the choice checked)
# --------------------------------------------------------------------------------------------


def test_sqlite_auto_uses_its_clock_quietly(
    tmp_path: Any, opened: list[SqlSource], caplog: pytest.LogCaptureFixture
) -> None:
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE t (id integer PRIMARY KEY, updated_at datetime)")
    engine.dispose()
    plain, lagged = AutoHorizon(), AutoHorizon()
    with caplog.at_level(logging.WARNING):
        assert open_source(opened, url, "t", "updated_at", horizon=plain).horizon().bound
        open_source(opened, url, "t", "updated_at", horizon=lagged, lag=10)
    assert not _fallbacks(caplog)
    assert (plain.name, lagged.name) == ("sqlite_clock", "sqlite_clock")


def test_mssql_rowversion_statement_compiles() -> None:
    compiled = MSSQL_ROWVERSION_SQL.compile(dialect=mssql.dialect())
    assert str(compiled) == "SELECT MIN_ACTIVE_ROWVERSION()"


def _mssql_stub(column: sa.Column[Any], bound: bytes = b"") -> Any:
    """Enough of an open SqlSource on SQL Server for prepare() and bound()."""
    sa.Table("orders", sa.MetaData(), sa.Column("id", sa.Integer, primary_key=True), column)

    class Connection:
        def __enter__(self) -> Connection:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

        def execute(self, statement: Any) -> Any:
            assert str(statement.compile(dialect=mssql.dialect())) == (
                "SELECT MIN_ACTIVE_ROWVERSION()"
            )
            return SimpleNamespace(scalar_one=lambda: bytearray(bound))

    engine = SimpleNamespace(dialect=mssql.dialect(), connect=Connection)
    return HorizonTarget(
        engine=engine,  # type: ignore[arg-type]
        cursor=column,
        zone=dt.UTC,
        lag=dt.timedelta(0),
        table="dbo.orders",
    )


def test_mssql_auto_picks_min_active_rowversion_for_a_rowversion_cursor() -> None:
    source = _mssql_stub(sa.Column("rv", mssql.ROWVERSION), bound=b"\x00" * 7 + b"\x09")
    horizon = AutoHorizon()
    horizon.prepare(source)
    assert horizon.name == "mssql_min_active_rowversion"
    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    assert horizon.bound(source, now) == b"\x00\x00\x00\x00\x00\x00\x00\x09"


def test_mssql_rowversion_horizon_rejects_other_cursors() -> None:
    with pytest.raises(ConfigurationError, match=r"needs a `rowversion` cursor"):
        MssqlRowversionHorizon().prepare(_mssql_stub(sa.Column("n", sa.Integer)))


def test_mssql_time_cursor_falls_back_to_lag(caplog: pytest.LogCaptureFixture) -> None:
    source = dataclasses.replace(
        _mssql_stub(sa.Column("at", mssql.DATETIME2)), lag=dt.timedelta(seconds=20)
    )
    horizon = AutoHorizon()
    with caplog.at_level(logging.WARNING):
        horizon.prepare(source)
    (record,) = _fallbacks(caplog)
    assert "rowversion" in record.getMessage()
    assert horizon.name == "lag"


def test_strategies_satisfy_the_protocol() -> None:
    strategies: list[Callable[[], object]] = [
        AutoHorizon,
        PgXactStartHorizon,
        MysqlTrxHorizon,
        MssqlRowversionHorizon,
    ]
    for make in strategies:
        assert isinstance(make(), HorizonStrategy)
