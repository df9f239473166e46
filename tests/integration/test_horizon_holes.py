"""Writers the commit-safe horizons used not to see, each reproduced on the real server.

- MariaDB: a statement that read ``NOW(6)`` and is delayed before it touches InnoDB (a slow
  subquery, a metadata-lock wait) is not in ``innodb_trx`` yet; the process list has it.
- MariaDB: once that statement has ended, its transaction still open, ``innodb_trx`` lists it
  with a ``trx_started`` later than the row's stamp by the whole wait, and the process list no
  longer has the statement: the transaction's floor (from the reading before the one that first
  listed it) holds the bound; one already open at the horizon's first reading holds it entirely.
- PostgreSQL: a session with ``track_activities = off`` shows no ``xact_start``.

Each scenario commits the late row after the poller has moved past its stamp: with the fix it
is delivered, with the horizon off (the control) it is lost.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import sqlalchemy as sa

from azure_functions_db.sources import AutoHorizon, NoHorizon
from azure_functions_db.sources.sqlalchemy import SqlSource
from devkit import dbservers

SETTLE = dt.timedelta(milliseconds=300)


def drain(source: SqlSource, state: dict[str, object]) -> None:
    """Read everything below the horizon, as the engine does, from ``state['after']``."""
    delivered: list[int] = state.setdefault("delivered", [])  # type: ignore[assignment]
    while True:
        rows = source.fetch(state.get("after"), 50, source.horizon())  # type: ignore[arg-type]
        delivered.extend(int(r.data["id"]) for r in rows)
        if rows:
            state["after"] = rows[-1].position
        if len(rows) < 50:
            return


def late_row_scenario(
    url: str,
    table: str,
    horizon: object,
    slow_writer: Callable[[sa.Engine], None],
    *,
    schema: str | None = None,
) -> list[int]:
    """Rows 1, 2 fast; the slow writer stamps row 100 and commits ~2 s later, while rows 3-6
    are written and polled; then a final poll. Returns the ids delivered."""
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    source = SqlSource(url, table, "updated_at", "id", schema=schema, horizon=horizon)  # type: ignore[arg-type]
    state: dict[str, object] = {}
    qualified = f'"{schema}".{table}' if schema else table

    stamp = "now()" if engine.dialect.name == "postgresql" else "NOW(6)"

    def fast(row_id: int) -> None:
        with engine.begin() as conn:
            conn.exec_driver_sql(f"INSERT INTO {qualified} VALUES ({row_id}, {stamp})")

    try:
        source.open({})
        fast(1)
        fast(2)
        worker = threading.Thread(target=slow_writer, args=(engine,), daemon=True)
        worker.start()
        time.sleep(0.3)  # the slow writer has read its clock
        for row_id in (3, 4, 5, 6):
            fast(row_id)
            time.sleep(0.4)
            drain(source, state)
        worker.join(30)
        assert not worker.is_alive()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            drain(source, state)
            if 100 in state["delivered"] and 6 in state["delivered"]:  # type: ignore[operator]
                break
            time.sleep(0.2)
        return list(state["delivered"])  # type: ignore[call-overload]
    finally:
        source.close()
        engine.dispose()


@pytest.fixture
def maria_table(mysql_db: str) -> tuple[str, str]:
    url = dbservers.mysql_url(mysql_db)
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "CREATE TABLE t (id int PRIMARY KEY, updated_at datetime(6) NOT NULL) ENGINE=InnoDB"
        )
        conn.exec_driver_sql("CREATE TABLE side (x int) ENGINE=InnoDB")
        conn.exec_driver_sql("INSERT INTO side VALUES (1)")
    engine.dispose()
    return url, "t"


def _sleepy_insert(engine: sa.Engine) -> None:
    # NOW(6) is fixed when the statement starts; InnoDB hears of it only after the sleep.
    with engine.begin() as conn:
        conn.exec_driver_sql("INSERT INTO t SELECT 100, NOW(6) FROM (SELECT SLEEP(2)) AS s")


def _mdl_waiting_insert(engine: sa.Engine) -> None:
    blocker = engine.connect()
    blocker.exec_driver_sql("LOCK TABLES side WRITE")  # the insert below waits for this

    def unlock() -> None:
        blocker.exec_driver_sql("UNLOCK TABLES")
        blocker.close()

    release = threading.Timer(2.0, unlock)
    release.start()
    with engine.begin() as conn:
        conn.exec_driver_sql("INSERT INTO t SELECT 100, NOW(6) FROM side LIMIT 1")
    release.join()


@pytest.mark.mysql
@pytest.mark.parametrize("writer", [_sleepy_insert, _mdl_waiting_insert], ids=["sleep", "mdl"])
def test_mariadb_statement_delayed_before_innodb_is_not_passed(maria_table, writer):
    url, table = maria_table
    delivered = late_row_scenario(url, table, AutoHorizon(settle=SETTLE), writer)
    assert sorted(delivered) == [1, 2, 3, 4, 5, 6, 100]


@pytest.mark.mysql
def test_mariadb_control_without_a_horizon_loses_the_delayed_row(maria_table):
    url, table = maria_table
    delivered = late_row_scenario(url, table, NoHorizon(), _sleepy_insert)
    assert 100 not in delivered, "the scenario must be able to lose the row"


@pytest.fixture
def pg_table(pg_schema: str) -> tuple[str, str, str]:
    url = dbservers.pg_url()
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            f'CREATE TABLE "{pg_schema}".t (id int PRIMARY KEY, updated_at timestamptz NOT NULL)'
        )
    engine.dispose()
    return url, "t", pg_schema


def _untracked_writer(schema: str) -> Callable[[sa.Engine], None]:
    def write(engine: sa.Engine) -> None:
        with engine.connect() as conn:
            conn.exec_driver_sql("SET track_activities = off")  # a per-role/database setting
            conn.commit()
            conn.exec_driver_sql(f'INSERT INTO "{schema}".t VALUES (100, now())')
            time.sleep(2)
            conn.commit()

    return write


@pytest.mark.postgres
def test_pg_session_with_track_activities_off_holds_the_bound(pg_table):
    url, table, schema = pg_table
    delivered = late_row_scenario(
        url, table, AutoHorizon(settle=SETTLE), _untracked_writer(schema), schema=schema
    )
    assert sorted(delivered) == [1, 2, 3, 4, 5, 6, 100]


@pytest.mark.postgres
def test_pg_control_without_a_horizon_loses_the_untracked_row(pg_table):
    url, table, schema = pg_table
    delivered = late_row_scenario(url, table, NoHorizon(), _untracked_writer(schema), schema=schema)
    assert 100 not in delivered, "the scenario must be able to lose the row"


# -- MariaDB: the transaction stays open after the statement that waited -----------------------


class _WaitedThenOpen:
    """A writer whose first statement stamps row 100 with NOW(6), then waits ``wait`` seconds
    for a table lock before InnoDB registers its transaction (trx_started is then ``wait``
    later than the stamp), and whose transaction stays open ``open_for`` seconds after it."""

    def __init__(self, engine: sa.Engine, wait: float = 2.0, open_for: float = 2.5) -> None:
        self.engine, self.wait, self.open_for = engine, wait, open_for
        self.statement_done = threading.Event()
        self.committed = threading.Event()

    def __call__(self) -> None:
        blocker = self.engine.connect()
        blocker.exec_driver_sql("LOCK TABLES side WRITE")

        def unlock() -> None:
            blocker.exec_driver_sql("UNLOCK TABLES")
            blocker.close()

        release = threading.Timer(self.wait, unlock)
        release.start()
        with self.engine.connect() as conn:
            conn.exec_driver_sql("BEGIN")
            conn.exec_driver_sql("INSERT INTO t SELECT 100, NOW(6) FROM side LIMIT 1")
            self.statement_done.set()
            time.sleep(self.open_for)
            conn.exec_driver_sql("COMMIT")
        self.committed.set()
        release.join()


def _poll_while_writing(
    url: str, horizon: object, writer: _WaitedThenOpen, *, late_start: bool = False
) -> tuple[list[int], list[str]]:
    """Fast rows every 0.25 s, each followed by a poll, while ``writer`` runs (``late_start``:
    the source is opened, and so first reads the horizon, only once the writer's statement has
    ended); then polls until row 100 arrives. The ids delivered, and the holds the horizon
    reported while the writer's transaction was open."""
    engine = writer.engine
    source = SqlSource(url, "t", "updated_at", "id", horizon=horizon)  # type: ignore[arg-type]
    state: dict[str, object] = {}
    holds: list[str] = []
    try:
        worker = threading.Thread(target=writer, daemon=True)
        began = time.monotonic()
        worker.start()
        row_id, opened = 0, False
        while not writer.committed.is_set() and time.monotonic() - began < 15:
            row_id += 1
            with engine.begin() as conn:
                conn.exec_driver_sql(f"INSERT INTO t VALUES ({row_id}, NOW(6))")
            if not late_start or writer.statement_done.is_set():
                if not opened:
                    source.open({})
                    opened = True
                drain(source, state)
                hold = source.horizon().hold
                if hold is not None and not writer.committed.is_set():
                    holds.append(hold.holder)
            time.sleep(0.25)
        worker.join(30)
        assert not worker.is_alive()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            drain(source, state)
            if 100 in state["delivered"] and row_id in state["delivered"]:  # type: ignore[operator]
                break
            time.sleep(0.2)
        delivered = list(state["delivered"])  # type: ignore[call-overload]
        assert set(range(1, row_id + 1)) <= set(delivered), "a fast row was lost"
        return delivered, holds
    finally:
        source.close()
        engine.dispose()


@pytest.mark.mysql
@pytest.mark.parametrize("settle", [SETTLE, None], ids=["settle-0.3s", "default"])
def test_mariadb_row_of_a_statement_that_waited_before_innodb_is_not_passed_after_it(
    maria_table, settle
):
    """The statement waits 2 s for a table lock after reading NOW(6); once it ends, InnoDB lists
    its transaction with a trx_started 2 s after the row's stamp, and the process list no longer
    has the statement. Until the fix, the default horizon (settle 1 s) passed the row here (seen
    2026-11-27 06:03: 25 of 26 rows). The transaction's floor, from the reading that saw its
    statement running, holds the bound until it commits."""
    url, _ = maria_table
    writer = _WaitedThenOpen(sa.create_engine(url, poolclass=sa.NullPool))
    horizon = AutoHorizon() if settle is None else AutoHorizon(settle=settle)
    delivered, holds = _poll_while_writing(url, horizon, writer)
    assert 100 in delivered
    assert holds, "the open transaction held the bound, and said so"


@pytest.mark.mysql
def test_mariadb_transaction_open_before_the_first_reading_holds_the_bound_until_it_ends(
    maria_table,
):
    """The poller's first reading comes after the waiting statement ended, its transaction
    still open: nothing says how old its rows are, so the bound holds entirely (and says why)
    until it commits; then every row is delivered."""
    url, _ = maria_table
    writer = _WaitedThenOpen(sa.create_engine(url, poolclass=sa.NullPool), open_for=3.0)
    delivered, holds = _poll_while_writing(url, AutoHorizon(settle=SETTLE), writer, late_start=True)
    assert 100 in delivered
    assert any("first reading" in hold for hold in holds), holds


@pytest.mark.mysql
def test_mariadb_control_without_a_horizon_loses_the_row_of_the_statement_that_waited(
    maria_table,
):
    url, _ = maria_table
    writer = _WaitedThenOpen(sa.create_engine(url, poolclass=sa.NullPool))
    delivered, _ = _poll_while_writing(url, NoHorizon(), writer)
    assert 100 not in delivered, "the scenario must be able to lose the row"


def _event_insert(engine: sa.Engine) -> None:
    """The event scheduler runs the delayed insert: its worker's command reads `Connect` in the
    process list while it runs the statement (it used to be left out: the row was lost)."""
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "CREATE EVENT ev ON SCHEDULE AT CURRENT_TIMESTAMP "
            "DO INSERT INTO t SELECT 100, NOW(6) FROM (SELECT SLEEP(2)) AS s"
        )
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        with engine.connect() as conn:
            if conn.exec_driver_sql("SELECT COUNT(*) FROM t WHERE id = 100").scalar():
                return
        time.sleep(0.1)
    raise AssertionError("the event never inserted row 100")


@pytest.fixture
def event_scheduler(maria_table: tuple[str, str]) -> Iterator[tuple[str, str]]:
    """The event scheduler on for the test (a server-wide setting, put back after)."""
    url, table = maria_table
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    with engine.begin() as conn:
        was = conn.exec_driver_sql("SELECT @@GLOBAL.event_scheduler").scalar()
        conn.exec_driver_sql("SET GLOBAL event_scheduler = ON")
    try:
        yield url, table
    finally:
        with engine.begin() as conn:
            conn.exec_driver_sql(f"SET GLOBAL event_scheduler = {was}")
        engine.dispose()


@pytest.mark.mysql
def test_mariadb_event_statement_delayed_before_innodb_is_not_passed(event_scheduler):
    url, table = event_scheduler
    delivered = late_row_scenario(url, table, AutoHorizon(), _event_insert)
    assert sorted(delivered) == [1, 2, 3, 4, 5, 6, 100]


@pytest.mark.mysql
def test_mariadb_transactions_that_have_not_written_do_not_hold_the_bound(maria_table):
    """Sessions that read in transactions and never write (autocommit off, as SQLAlchemy runs)
    overlap all the time, one of them open at the poller's first reading: MariaDB lists them
    all as trx_id 0. They cannot have stamped a row, so they hold nothing, and rows committed
    meanwhile are delivered (they used to share one remembered floor, unknown, for good)."""
    url, _ = maria_table
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    stop = threading.Event()

    def reader(offset: float) -> None:
        time.sleep(offset)
        with engine.connect() as conn:
            while not stop.is_set():
                conn.exec_driver_sql("SELECT COUNT(*) FROM t").all()
                time.sleep(0.6)
                conn.rollback()
                time.sleep(0.05)

    readers = [threading.Thread(target=reader, args=(o,), daemon=True) for o in (0, 0.3)]
    for thread in readers:
        thread.start()
    time.sleep(0.2)
    source = SqlSource(url, "t", "updated_at", "id", horizon=AutoHorizon(settle=SETTLE))
    state: dict[str, object] = {}
    try:
        source.open({})
        for row_id in range(1, 9):
            with engine.begin() as conn:
                conn.exec_driver_sql(f"INSERT INTO t VALUES ({row_id}, NOW(6))")
            time.sleep(0.7)
            drain(source, state)
        assert set(range(1, 8)) <= set(state["delivered"]), state["delivered"]  # type: ignore[arg-type]
    finally:
        stop.set()
        for thread in readers:
            thread.join(5)
        source.close()
        engine.dispose()
