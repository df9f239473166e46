"""The settle margin, measured: what it protected against, and why PostgreSQL needs none now.

A PostgreSQL transaction's ``now()`` is read from the clock when its first statement arrives, a
moment before the backend publishes anything in ``pg_stat_activity``. These tests stop a real
backend inside that moment, with gdb at ``pgstat_report_activity`` (the clock is read, nothing is
published), for as long as they like, and run the late-commit workload around it:

- the horizon at its default margin (0) waits for the stopped backend (it is idle and not
  reading from its client) and nothing is lost;
- a bound from the server's clock and the open transactions alone (the method before, kept here
  as the control) passes the stopped backend's row over unless its margin is longer than the
  stop: the margin measured what the clock alone cannot see;
- a bound above the clock (a margin below 0) loses a late row: 0 is the smallest margin.

MariaDB shows a statement in its process list before it reads its clock, so its margin is 0 too,
except where a trigger or stored function runs inside the statement: NOW() stays the statement's
start while the process list's time restarts after each statement inside the function. A server
with triggers or stored functions keeps the 1 s margin; at 0 such a row is lost.
"""

from __future__ import annotations

import datetime as dt
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from azure_functions_db.core.position import KeyValue
from azure_functions_db.sources import AutoHorizon
from azure_functions_db.sources._dialect_horizons import PgXactStartHorizon
from azure_functions_db.sources._target import HorizonTarget
from azure_functions_db.sources.sqlalchemy import SqlSource
from azure_functions_db.sources.values import time_bound
from devkit import dbservers

# Seconds the writer's backend stays stopped between its clock read and publishing: longer than
# the 1 s margin pg_xact_start used to keep.
STOP = 1.5
STATE_RUNNING = 2  # BackendState.STATE_RUNNING, pgstat_report_activity's first argument


class ClockAndTransactions:
    """The control: the server's clock less ``settle`` and the oldest ``xact_start``, the bound
    ``pg_xact_start`` gave before it looked at idle backends."""

    name = "clock_and_transactions"

    def __init__(self, settle: float) -> None:
        self.settle = dt.timedelta(seconds=settle)

    def prepare(self, target: HorizonTarget) -> None:
        """Nothing to check."""

    def bound(self, target: HorizonTarget, now: dt.datetime) -> KeyValue | None:
        sql = (
            "SELECT clock_timestamp() AT TIME ZONE 'UTC', (SELECT min(xact_start) AT TIME ZONE "
            "'UTC' FROM pg_stat_activity WHERE pid <> pg_backend_pid() "
            "AND datname = current_database())"
        )
        with target.engine.connect() as conn:
            clock, oldest = conn.execute(sa.text(sql)).one()
        bound = clock - self.settle if oldest is None else min(clock - self.settle, oldest)
        return time_bound(bound.replace(tzinfo=dt.UTC), target.cursor, target.zone)


@contextmanager
def stopped_after_its_clock(pid: int, folder: Path) -> Iterator[threading.Event]:
    """gdb attached to backend ``pid``: the next statement it receives stops it after it read
    its clock and before it published anything; the event is set once it has; it goes on when
    the block ends."""
    gdb = shutil.which("gdb")
    if gdb is None:
        pytest.skip("gdb is not installed: `make debian-packages` installs it")
    hit, release = folder / "hit", folder / "release"
    process = subprocess.Popen(
        [
            gdb,
            "-p",
            str(pid),
            "-batch",
            "-nx",
            "-ex",
            f"break pgstat_report_activity if $rdi == {STATE_RUNNING}",
            "-ex",
            "continue",
            "-ex",
            f"shell touch '{hit}'; while [ ! -e '{release}' ]; do sleep 0.01; done",
            "-ex",
            "delete",
            "-ex",
            "detach",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    stopped = threading.Event()

    def watch() -> None:
        while process.poll() is None and not hit.exists():
            time.sleep(0.005)
        if hit.exists():
            stopped.set()

    watcher = threading.Thread(target=watch, daemon=True)
    try:
        _wait_attached(process, pid)
        watcher.start()
        yield stopped
    finally:
        release.touch()
        try:
            output, _ = process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            # Still in `continue` (the breakpoint never hit): interrupt it, so that the batch
            # goes on to delete the breakpoint and detach. Killing gdb instead would leave the
            # breakpoint in the backend, whose next pass would crash the whole server.
            process.send_signal(signal.SIGINT)
            try:
                output, _ = process.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                output, _ = process.communicate()
        watcher.join(5)
    if not stopped.is_set():
        pytest.fail(f"gdb never stopped backend {pid} at pgstat_report_activity:\n{output}")


def _wait_attached(process: subprocess.Popen[str], pid: int) -> None:
    """Until gdb has attached (the backend is traced) and set its breakpoint."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            output = process.stdout.read() if process.stdout else ""
            pytest.skip(f"gdb cannot attach to backend {pid} (ptrace not permitted?): {output}")
        status = Path(f"/proc/{pid}/status").read_text()
        traced = next(line for line in status.splitlines() if line.startswith("TracerPid"))
        if traced.split()[1] != "0":
            time.sleep(0.5)  # the breakpoint is set right after attaching
            return
        time.sleep(0.05)
    pytest.fail(f"gdb did not attach to backend {pid} within 30 s")


@dataclass(frozen=True)
class Pg:
    """A database of its own (the horizon counts the sessions of one database: nothing else
    running on the server can hold it) with ``public.t``."""

    url: str
    dsn: str
    schema: str = "public"


@pytest.fixture
def pg(pg_url: str) -> Iterator[Pg]:
    name = dbservers.scratch_name()
    with dbservers.admin_engine(pg_url) as admin, admin.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT")
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    url = dbservers.pg_url(database=name)
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "CREATE TABLE public.t (id int PRIMARY KEY, "
            "updated_at timestamptz NOT NULL DEFAULT now())"
        )
    engine.dispose()
    dsn = sa.make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    try:
        yield Pg(url, dsn)
    finally:
        with dbservers.admin_engine(pg_url) as admin, admin.connect() as conn:
            conn.execution_options(isolation_level="AUTOCOMMIT")
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _drain(source: SqlSource, state: dict[str, Any]) -> None:
    while True:
        rows = source.fetch(state.get("after"), 50, source.horizon())
        state["delivered"].extend(int(r.data["id"]) for r in rows)
        if rows:
            state["after"] = rows[-1].position
        if len(rows) < 50:
            return


def _drain_until(source: SqlSource, state: dict[str, Any], rows: int, seconds: float) -> None:
    """Drain until ``rows`` ids were delivered or ``seconds`` passed (a late row commits), and
    6 s more: a loaded machine is slower to get there (a row passed over never comes)."""
    deadline = time.monotonic() + seconds + 6
    while time.monotonic() < deadline and len(state["delivered"]) < rows:
        time.sleep(0.1)
        _drain(source, state)


def _run_stopped_writer(pg: Pg, horizon: object, folder: Path) -> dict[str, Any]:
    """The late-commit workload around a backend stopped in its window: row 100's transaction
    reads its clock, is stopped STOP seconds, then inserts and commits; meanwhile rows 1-3 are
    written and the poller reads twice. Returns what was delivered and the holds seen."""
    schema = pg.schema
    source = SqlSource(pg.url, "t", "updated_at", "id", schema=schema, horizon=horizon)  # type: ignore[arg-type]
    state: dict[str, Any] = {"delivered": [], "holds": []}
    fast = psycopg.connect(pg.dsn, autocommit=True)
    writer = psycopg.connect(pg.dsn, autocommit=True)
    try:
        source.open({})
        pid = writer.execute("SELECT pg_backend_pid()").fetchone()[0]  # type: ignore[index]

        def late() -> None:
            writer.execute("BEGIN")  # stopped here, after its clock read
            writer.execute(f'INSERT INTO "{schema}".t (id) VALUES (100)')
            time.sleep(0.3)
            writer.execute("COMMIT")

        with stopped_after_its_clock(pid, folder) as stopped:
            thread = threading.Thread(target=late, daemon=True)
            thread.start()
            assert stopped.wait(30), "the writer's backend never reached the window"
            for row_id in (1, 2, 3):
                time.sleep(STOP / 4)
                fast.execute(f'INSERT INTO "{schema}".t (id) VALUES ({row_id})')
            time.sleep(STOP / 4)
            _drain(source, state)
            state["holds"].append(source.horizon().hold)
        thread.join(30)
        assert not thread.is_alive()
        _drain_until(source, state, 4, 3.5)
        stamps = dict(fast.execute(f'SELECT id, updated_at FROM "{schema}".t').fetchall())
        state["late_before_fast"] = stamps[100] < min(stamps[i] for i in (1, 2, 3))
    finally:
        source.close()
        fast.close()
        writer.close()
    return state


@pytest.mark.postgres
def test_pg_default_margin_waits_for_a_backend_stopped_after_its_clock_read(
    pg: Pg, tmp_path: Path
) -> None:
    state = _run_stopped_writer(pg, AutoHorizon(), tmp_path)
    assert state["late_before_fast"]  # row 100 carries the oldest stamp, and commits last
    assert sorted(state["delivered"]) == [1, 2, 3, 100]
    hold = state["holds"][0]
    assert hold is not None
    assert "idle, between statements" in hold.holder


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("settle", "lost"),
    [(0.0, True), (STOP / 2, True), (STOP + 0.7, False)],
    ids=["clock-0", "clock-half-the-stop", "clock-longer-than-the-stop"],
)
def test_pg_clock_alone_needs_a_margin_longer_than_the_stop(
    pg: Pg, tmp_path: Path, settle: float, lost: bool
) -> None:
    state = _run_stopped_writer(pg, ClockAndTransactions(settle), tmp_path)
    assert state["late_before_fast"]
    assert (100 not in state["delivered"]) is lost
    assert sorted(set(state["delivered"]) - {100}) == [1, 2, 3]


@pytest.mark.postgres
def test_pg_a_bound_above_the_clock_loses_a_late_row(pg: Pg) -> None:
    """Below the default margin of 0: the bound is the horizon's, moved 5 s ahead."""
    schema = pg.schema
    ahead = dt.timedelta(seconds=-5)
    horizon = PgXactStartHorizon(settle=ahead)
    source = SqlSource(pg.url, "t", "updated_at", "id", schema=schema, horizon=horizon)
    late = psycopg.connect(pg.dsn, autocommit=True)
    fast = psycopg.connect(pg.dsn, autocommit=True)
    state: dict[str, Any] = {"delivered": []}
    try:
        source.open({})
        bound = source.horizon()  # read before the late transaction begins
        late.execute("BEGIN")
        late.execute(f'INSERT INTO "{schema}".t (id) VALUES (100)')
        fast.execute(f'INSERT INTO "{schema}".t (id) VALUES (1)')
        rows = source.fetch(None, 50, bound)
        state["delivered"].extend(int(r.data["id"]) for r in rows)
        state["after"] = rows[-1].position
        late.execute("COMMIT")
        time.sleep(0.6)
        _drain(source, state)
    finally:
        source.close()
        late.close()
        fast.close()
    assert state["delivered"] == [1]  # row 100, stamped before row 1, is lost


@pytest.mark.postgres
def test_pg_idle_backends_reading_from_their_client_do_not_hold_the_bound(pg: Pg) -> None:
    """A pool of idle connections (blocked reading) costs no latency: the bound is the clock."""
    source = SqlSource(pg.url, "t", "updated_at", "id", schema=pg.schema)
    idle = [psycopg.connect(pg.dsn, autocommit=True) for _ in range(5)]
    try:
        for conn in idle:
            conn.execute("SELECT 1")
        source.open({})
        time.sleep(0.2)
        before = dt.datetime.now(dt.UTC)
        horizon = source.horizon()
        assert horizon.hold is None
        assert isinstance(horizon.bound, dt.datetime)
        assert horizon.bound >= before - dt.timedelta(milliseconds=50)
    finally:
        source.close()
        for conn in idle:
            conn.close()


# -- MariaDB: the margin covers what a stored function runs before its statement's first write ---

SLOW_FUNCTION = (
    "CREATE FUNCTION slow_one() RETURNS int NOT DETERMINISTIC NO SQL "
    "BEGIN DO SLEEP(0.8); DO SLEEP(0.8); RETURN 1; END"
)


@pytest.fixture
def maria_orders(mysql_db: str) -> Iterator[str]:
    url = dbservers.mysql_url(mysql_db)
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "CREATE TABLE t (id int PRIMARY KEY, updated_at datetime(6) NOT NULL) ENGINE=InnoDB"
        )
    engine.dispose()
    return url


def _function_workload(
    url: str,
    horizon: object,
    function: str = "slow_one",
    rows: tuple[range, range] = (range(1, 3), range(3, 7)),
    pause: float = 0.4,
) -> tuple[list[int], object]:
    """Rows ``rows[0]``; then row 100 stamped by NOW(6) in a statement that calls ``function``
    (which runs seconds before the insert), while rows ``rows[1]`` are written and read, one
    every ``pause`` seconds. Returns the ids delivered and the margin the horizon used."""
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    source = SqlSource(url, "t", "updated_at", "id", horizon=horizon)  # type: ignore[arg-type]
    state: dict[str, Any] = {"delivered": []}

    def insert(sql: str) -> None:
        with engine.begin() as conn:
            conn.exec_driver_sql(sql)

    first, later = rows
    try:
        source.open({})
        insert("INSERT INTO t VALUES " + ", ".join(f"({i}, NOW(6))" for i in first))
        _drain(source, state)
        statement = f"INSERT INTO t VALUES (100 * {function}(), NOW(6))"
        writer = threading.Thread(target=insert, args=(statement,), daemon=True)
        writer.start()
        for row_id in later:
            time.sleep(pause)
            insert(f"INSERT INTO t VALUES ({row_id}, NOW(6))")
            _drain(source, state)
        writer.join(30)
        _drain_until(source, state, len(first) + len(later) + 1, 4)
        chosen = getattr(horizon, "chosen", horizon)
        return state["delivered"], getattr(chosen, "settle", None)
    finally:
        source.close()
        engine.dispose()


@pytest.mark.mysql
def test_mariadb_margin_is_0_without_routines_and_1s_with_a_stored_function(
    maria_orders: str,
) -> None:
    plain = AutoHorizon()
    source = SqlSource(maria_orders, "t", "updated_at", "id", horizon=plain)
    try:
        source.open({})
        source.horizon()
    finally:
        source.close()
    assert getattr(plain.chosen, "settle", None) == dt.timedelta(0)
    engine = sa.create_engine(maria_orders, poolclass=sa.NullPool)
    with engine.begin() as conn:
        conn.exec_driver_sql(SLOW_FUNCTION)
    engine.dispose()
    delivered, settle = _function_workload(maria_orders, AutoHorizon())
    assert settle == dt.timedelta(seconds=1)
    assert sorted(delivered) == [1, 2, 3, 4, 5, 6, 100]


@pytest.mark.mysql
def test_mariadb_stored_function_row_is_lost_at_a_margin_of_0(maria_orders: str) -> None:
    engine = sa.create_engine(maria_orders, poolclass=sa.NullPool)
    with engine.begin() as conn:
        conn.exec_driver_sql(SLOW_FUNCTION)
    engine.dispose()
    delivered, settle = _function_workload(maria_orders, AutoHorizon(settle=dt.timedelta(0)))
    assert settle == dt.timedelta(0)
    assert 100 not in delivered
    assert sorted(delivered) == [1, 2, 3, 4, 5, 6]


@pytest.mark.mysql
def test_mariadb_open_transaction_holds_from_its_uncommitted_row_not_from_its_floor(
    maria_orders: str,
) -> None:
    """A transaction first listed after row 1 was stamped has a floor below row 1 (the reading
    before); its uncommitted row, read at READ UNCOMMITTED, is the bound: row 1 is delivered
    while it stays open, and its own row once it commits."""
    engine = sa.create_engine(maria_orders, poolclass=sa.NullPool)
    source = SqlSource(maria_orders, "t", "updated_at", "id")
    state: dict[str, Any] = {"delivered": []}
    late = engine.connect()
    try:
        source.open({})
        _drain(source, state)  # the reading before: the late transaction's floor
        time.sleep(0.05)
        with engine.begin() as conn:
            conn.exec_driver_sql("INSERT INTO t VALUES (1, NOW(6))")
        time.sleep(0.05)
        late.exec_driver_sql("INSERT INTO t VALUES (100, NOW(6))")  # stays open
        time.sleep(0.05)
        with engine.begin() as conn:
            conn.exec_driver_sql("INSERT INTO t VALUES (2, NOW(6))")
        _drain(source, state)
        hold = source.horizon().hold
        assert state["delivered"] == [1]
        assert hold is not None
        late.commit()
        _drain_until(source, state, 3, 3)
        assert state["delivered"] == [1, 100, 2]
    finally:
        late.close()
        source.close()
        engine.dispose()


# -- Whole-second cursors: the database cuts the stamp below the instant the bound is read at ---


def _early_in_a_second() -> None:
    while not 0.05 < time.time() % 1 < 0.15:
        time.sleep(0.005)


@pytest.mark.mysql
def test_mariadb_whole_second_cursor_bound_is_cut_to_the_second(mysql_db: str) -> None:
    """Row 5's statement starts early in a second and runs 1.2 s (stored: that second, cut);
    row 6 of the same second, higher pk, commits first. The bound, held at row 5's start, must
    not let row 6 pass before row 5 commits."""
    url = dbservers.mysql_url(mysql_db)
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "CREATE TABLE s (id int PRIMARY KEY, updated_at datetime NOT NULL "
            "DEFAULT CURRENT_TIMESTAMP) ENGINE=InnoDB"
        )
    horizon = AutoHorizon()
    source = SqlSource(url, "s", "updated_at", "id", horizon=horizon)
    state: dict[str, Any] = {"delivered": []}

    def insert(sql: str) -> None:
        with engine.begin() as conn:
            conn.exec_driver_sql(sql)

    try:
        source.open({})
        _drain(source, state)
        _early_in_a_second()
        slow = threading.Thread(
            target=insert, args=("INSERT INTO s (id) SELECT 5 FROM (SELECT SLEEP(1.2)) AS z",)
        )
        slow.start()
        time.sleep(0.15)
        insert("INSERT INTO s (id) VALUES (6)")
        time.sleep(0.1)
        _drain(source, state)
        slow.join(30)
        _drain_until(source, state, 2, 3.5)
        with engine.connect() as conn:
            stamps = dict(conn.exec_driver_sql("SELECT id, updated_at FROM s").all())
    finally:
        source.close()
        engine.dispose()
    assert getattr(horizon.chosen, "settle", None) == dt.timedelta(0)  # else no test of the cut
    if stamps[5] != stamps[6]:
        pytest.skip("not applicable: the two inserts fell in different seconds (a slow machine)")
    assert state["delivered"] == [5, 6]


@pytest.mark.postgres
def test_pg_whole_second_cursor_bound_is_cut_to_the_second(pg: Pg) -> None:
    """``timestamptz(0)`` rounds: row 6 (committed first) and row 5 (lower pk, after the poll)
    get the same second; a bound at the server's clock would have let row 6 pass."""
    schema = pg.schema
    fast = psycopg.connect(pg.dsn, autocommit=True)
    fast.execute(f'ALTER TABLE "{schema}".t ALTER COLUMN updated_at TYPE timestamptz(0)')
    source = SqlSource(pg.url, "t", "updated_at", "id", schema=schema)
    state: dict[str, Any] = {"delivered": []}
    try:
        source.open({})
        _drain(source, state)
        while not 0.02 < time.time() % 1 < 0.3:
            time.sleep(0.002)
        fast.execute(f'INSERT INTO "{schema}".t (id) VALUES (6)')
        _drain(source, state)
        fast.execute(f'INSERT INTO "{schema}".t (id) VALUES (5)')
        _drain_until(source, state, 2, 3)
        stamps = dict(fast.execute(f'SELECT id, updated_at FROM "{schema}".t').fetchall())
    finally:
        source.close()
        fast.close()
    if stamps[5] != stamps[6]:
        pytest.skip("not applicable: the two inserts fell in different seconds (a slow machine)")
    assert state["delivered"] == [5, 6]


@pytest.mark.postgres
def test_pg_replication_connection_running_sql_is_waited_for(pg: Pg, tmp_path: Path) -> None:
    """A ``replication=database`` connection (a walsender) runs SQL too: stopped after its
    clock read, it is waited for like a client backend."""
    psql_path = shutil.which("psql")
    if psql_path is None:
        pytest.skip("psql is not installed (the PostgreSQL client)")
    schema = pg.schema
    fast = psycopg.connect(pg.dsn, autocommit=True)
    psql = subprocess.Popen(
        [psql_path, pg.dsn + "?replication=database", "-X", "-q", "-A", "-t"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        bufsize=1,
    )
    assert psql.stdin is not None
    assert psql.stdout is not None
    source = SqlSource(pg.url, "t", "updated_at", "id", schema=schema)
    state: dict[str, Any] = {"delivered": []}
    try:
        psql.stdin.write(
            "SELECT pg_backend_pid(), "
            "(SELECT backend_type FROM pg_stat_activity WHERE pid = pg_backend_pid());\n"
        )
        pid, kind = psql.stdout.readline().strip().split("|")
        assert kind == "walsender"
        source.open({})
        with stopped_after_its_clock(int(pid), tmp_path) as stopped:
            psql.stdin.write(f'INSERT INTO "{schema}".t (id) VALUES (100);\n')
            assert stopped.wait(30)
            for row_id in (1, 2, 3):
                time.sleep(0.3)
                fast.execute(f'INSERT INTO "{schema}".t (id) VALUES ({row_id})')
            time.sleep(0.2)
            _drain(source, state)
        _drain_until(source, state, 4, 3)
        stamps = dict(fast.execute(f'SELECT id, updated_at FROM "{schema}".t').fetchall())
    finally:
        source.close()
        psql.stdin.close()
        psql.wait(10)
        psql.stdout.close()
        fast.close()
    assert stamps[100] < stamps[1]
    assert sorted(state["delivered"]) == [1, 2, 3, 100]


@pytest.mark.mysql
def test_mariadb_floor_is_not_narrowed_on_a_server_with_stored_functions(
    maria_orders: str,
) -> None:
    """The function writes another table first (the transaction is listed, with its floor),
    then runs 2.3 s of statements before its caller inserts row 100 stamped at the caller's
    start: the process list's time restarted meanwhile, so only the floor protects the row."""
    engine = sa.create_engine(maria_orders, poolclass=sa.NullPool)
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE other (id int AUTO_INCREMENT PRIMARY KEY)")
        conn.exec_driver_sql(
            "CREATE FUNCTION writes_first() RETURNS int NOT DETERMINISTIC MODIFIES SQL DATA "
            "BEGIN INSERT INTO other () VALUES (); DO SLEEP(1.5); DO SLEEP(0.8); RETURN 1; END"
        )
    engine.dispose()
    delivered, _ = _function_workload(
        maria_orders, AutoHorizon(), "writes_first", (range(1, 2), range(2, 12)), 0.2
    )
    assert sorted(delivered) == [1, *range(2, 12), 100]


@pytest.mark.mysql
def test_mariadb_margin_is_0_only_for_a_user_who_can_see_every_trigger_and_function(
    maria_orders: str, caplog: pytest.LogCaptureFixture
) -> None:
    """information_schema lists only what the user may see: with SELECT and PROCESS alone,
    "no trigger, no function" is not proven and the margin stays 1 s (the log names the
    grants); with TRIGGER on *.* and SELECT on mysql.proc it is 0."""
    url = sa.make_url(maria_orders)
    user = f"afdb_{url.database}"[:32]
    admin = sa.create_engine(maria_orders, poolclass=sa.NullPool)
    with admin.begin() as conn:
        conn.exec_driver_sql(f"CREATE USER '{user}'@'%%' IDENTIFIED BY 'pw'")
        conn.exec_driver_sql(f"GRANT SELECT ON `{url.database}`.* TO '{user}'@'%%'")
        conn.exec_driver_sql(f"GRANT PROCESS ON *.* TO '{user}'@'%%'")
    as_user = url.set(username=user, password="pw").render_as_string(hide_password=False)

    def margin() -> object:
        horizon = AutoHorizon()
        source = SqlSource(as_user, "t", "updated_at", "id", horizon=horizon)
        try:
            source.open({})
            source.horizon()
        finally:
            source.close()
        return getattr(horizon.chosen, "settle", None)

    try:
        with caplog.at_level("INFO", logger="azure_functions_db"):
            assert margin() == dt.timedelta(seconds=1)
        assert "cannot_see_every_trigger_and_function" in caplog.text
        assert "GRANT_TRIGGER_ON_*.*" in caplog.text
        with admin.begin() as conn:
            conn.exec_driver_sql(f"GRANT TRIGGER ON *.* TO '{user}'@'%%'")
            conn.exec_driver_sql(f"GRANT SELECT ON mysql.proc TO '{user}'@'%%'")
        assert margin() == dt.timedelta(0)
    finally:
        with admin.begin() as conn:
            conn.exec_driver_sql(f"DROP USER IF EXISTS '{user}'@'%%'")
        admin.dispose()
