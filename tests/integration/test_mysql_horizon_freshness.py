"""The MySQL/MariaDB horizon trusts only a reading of ``innodb_trx`` it can prove fresh.

InnoDB serves ``information_schema.innodb_trx`` from one server-wide cache, refreshed only when
no session read it in the last 0.1 s. Other readers (more pollers of one server, monitoring)
that read it less than 0.1 s apart freeze it: a transaction begun since is missing, one ended
since is still listed. These tests run against the real MariaDB:

- with the cache pinned by two readers 75 ms apart, a row whose transaction began during the
  freeze is not passed over (the bound holds, and says why), and the hold never names a session
  whose transaction has ended;
- several pollers of one server (low-latency runs and timer runs, on several tables) with
  writers committing late deliver every committed row, and every hold that names a session
  names one whose transaction was open.
"""

from __future__ import annotations

import datetime as dt
import random
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
import sqlalchemy as sa

from azure_functions_db.core.clock import SystemClock
from azure_functions_db.core.engine import Engine, PollerConfig
from azure_functions_db.core.position import Position
from azure_functions_db.sources._mysql_horizon import MysqlTrxHorizon
from azure_functions_db.sources.sqlalchemy import SqlSource
from azure_functions_db.state.memory import MemoryStateStore
from devkit import dbservers

pytestmark = pytest.mark.mysql

SETTLE = dt.timedelta(milliseconds=300)
STEP = 10.0


def _create(url: str, *tables: str) -> None:
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    with engine.begin() as conn:
        for table in tables:
            conn.exec_driver_sql(
                f"CREATE TABLE {table} (id int PRIMARY KEY, updated_at datetime(6) NOT NULL) "
                "ENGINE=InnoDB"
            )
    engine.dispose()


class CachePinner:
    """Sessions that read ``innodb_trx`` every ``gap`` seconds, staggered: the cache never goes
    0.1 s unread, so InnoDB never refreshes it while they run."""

    def __init__(self, url: str, readers: int = 2, gap: float = 0.075) -> None:
        self.url, self.readers, self.gap = url, readers, gap
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self.reads = 0

    def _read(self) -> None:
        engine = sa.create_engine(self.url, poolclass=sa.NullPool)
        with engine.connect() as conn:
            while not self.stop.is_set():
                conn.exec_driver_sql(
                    "SELECT trx_mysql_thread_id FROM information_schema.innodb_trx"
                ).all()
                conn.rollback()
                self.reads += 1
                self.stop.wait(self.gap)
        engine.dispose()

    def __enter__(self) -> CachePinner:
        for _ in range(self.readers):
            thread = threading.Thread(target=self._read, daemon=True)
            thread.start()
            self.threads.append(thread)
            time.sleep(self.gap / self.readers)
        time.sleep(0.2)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(STEP)


class Drain:
    """Reads a source as the engine does: horizon first, then the rows after the last position."""

    def __init__(self, source: SqlSource) -> None:
        self.source = source
        self.after: Position | None = None
        self.delivered: list[int] = []
        self.holders: list[str] = []

    def __call__(self) -> None:
        while True:
            horizon = self.source.horizon()
            if horizon.hold is not None:
                self.holders.append(horizon.hold.holder)
            rows = self.source.fetch(self.after, 100, horizon)
            for row in rows:
                self.delivered.append(int(row.data["id"]))
                self.after = row.position
            if len(rows) < 100:
                return


def test_a_transaction_begun_while_the_cache_is_pinned_is_not_passed_over(mysql_db: str) -> None:
    url = dbservers.mysql_url(mysql_db)
    _create(url, "t")
    writers = sa.create_engine(url, poolclass=sa.NullPool)
    source = SqlSource(
        url, "t", "updated_at", "id", horizon=MysqlTrxHorizon(SETTLE, proof_timeout=0.5)
    )
    source.open({})
    drain = Drain(source)
    slow = writers.connect()
    try:
        with writers.begin() as conn:
            conn.exec_driver_sql("INSERT INTO t VALUES (1, NOW(6))")
        time.sleep(SETTLE.total_seconds() + 0.1)
        drain()
        assert drain.delivered == [1]
        with CachePinner(url):
            # Begins while the cache is frozen: the frozen snapshot does not list it.
            slow_thread = slow.exec_driver_sql("SELECT CONNECTION_ID()").scalar_one()
            slow.exec_driver_sql("INSERT INTO t VALUES (10, NOW(6))")
            time.sleep(0.05)
            with writers.begin() as conn:
                conn.exec_driver_sql("INSERT INTO t VALUES (20, NOW(6))")
            time.sleep(SETTLE.total_seconds() + 0.3)
            drain()
            # 20 is stamped after 10's transaction began: it must wait for 10.
            assert 20 not in drain.delivered, "a bound from a frozen innodb_trx passed row 10"
            assert drain.holders
            assert "innodb_trx not refreshed" in drain.holders[-1]
            slow.commit()
            time.sleep(0.2)
            drain.holders.clear()
            drain()
            # The transaction has ended: no hold may name its session.
            assert not [h for h in drain.holders if f"thread {slow_thread}," in h], drain.holders
        deadline = time.monotonic() + STEP
        while set(drain.delivered) != {1, 10, 20} and time.monotonic() < deadline:
            time.sleep(0.1)
            drain()
        assert sorted(drain.delivered) == [1, 10, 20]
    finally:
        slow.close()
        source.close()
        writers.dispose()


# --------------------------------------------------------------------------------------------
# several pollers of one server, writers committing late
# --------------------------------------------------------------------------------------------


@dataclass
class Ledger:
    """What the writers did: committed ids per table, and each writer transaction's session and
    open interval (monotonic seconds) to judge the holds."""

    committed: dict[str, set[int]] = field(default_factory=dict)
    open_spans: dict[int, list[tuple[float, float]]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    errors: list[BaseException] = field(default_factory=list)


def _writer(url: str, tables: list[str], ledger: Ledger, stop: threading.Event, seed: int) -> None:
    rng = random.Random(seed)
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    next_id = seed * 1_000_000
    try:
        with engine.connect() as conn:
            thread_id = int(conn.exec_driver_sql("SELECT CONNECTION_ID()").scalar_one())
            conn.commit()
            while not stop.is_set():
                table = rng.choice(tables)
                ids = [next_id + i for i in range(rng.randint(1, 3))]
                next_id += len(ids)
                begun = time.monotonic()
                conn.exec_driver_sql("START TRANSACTION")
                if rng.random() < 0.3:
                    # Touches InnoDB first and stamps much later.
                    conn.exec_driver_sql(f"SELECT COUNT(*) FROM {table}").all()
                    time.sleep(rng.uniform(0.1, 0.8))
                for row_id in ids:
                    conn.exec_driver_sql(f"INSERT INTO {table} VALUES ({row_id}, NOW(6))")
                time.sleep(rng.choice([0.0, 0.0, rng.uniform(0.2, 1.5)]))
                if rng.random() < 0.1:
                    conn.exec_driver_sql("ROLLBACK")
                    committed: list[int] = []
                else:
                    conn.exec_driver_sql("COMMIT")
                    committed = ids
                ended = time.monotonic()
                with ledger.lock:
                    ledger.committed.setdefault(table, set()).update(committed)
                    ledger.open_spans.setdefault(thread_id, []).append((begun, ended))
                conn.rollback()
    except BaseException as exc:  # reported by the test
        ledger.errors.append(exc)
    finally:
        engine.dispose()


@dataclass
class Holds:
    """Holds seen by pollers: (monotonic before the horizon, after it, holder)."""

    seen: list[tuple[float, float, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


class WatchedSource(SqlSource):
    """A SqlSource that records every hold its horizon names, with when it was computed."""

    holds: Holds

    def horizon(self):  # type: ignore[no-untyped-def]
        before = time.monotonic()
        horizon = super().horizon()
        if horizon.hold is not None:
            with self.holds.lock:
                self.holds.seen.append((before, time.monotonic(), horizon.hold.holder))
        return horizon


def _poller(
    url: str,
    *,
    table: str,
    name: str,
    low_latency: bool,
    delivered: dict[str, list[int]],
    holds: Holds,
    stop: threading.Event,
    errors: list[BaseException],
) -> None:
    source = WatchedSource(url, table, "updated_at", "id", horizon=MysqlTrxHorizon(SETTLE))
    source.holds = holds
    store = MemoryStateStore()
    seen = delivered.setdefault(name, [])
    config = PollerConfig(
        name=name,
        batch_size=50,
        lease_duration=15.0,
        time_budget=6.0 if low_latency else 30.0,
        poll_interval=0.05 if low_latency else None,
    )
    engine = Engine(
        config, source, store, lambda b: seen.extend(c.pk for c in b), SystemClock(), owner=name
    )
    try:
        while not stop.is_set():
            engine.run({})
            if not low_latency:
                stop.wait(0.1)  # a timer run every 0.1 s
        # the final drain: everything committed is older than the settle margin by now
        engine.run({})
    except BaseException as exc:
        errors.append(exc)
    finally:
        source.close()


def test_several_pollers_of_one_server_lose_nothing_and_never_name_a_finished_session(
    mysql_db: str,
) -> None:
    url = dbservers.mysql_url(mysql_db)
    tables = ["a", "b", "c"]
    _create(url, *tables)
    ledger, holds = Ledger(), Holds()
    delivered: dict[str, list[int]] = {}
    errors: list[BaseException] = []
    stop_writers, stop_pollers = threading.Event(), threading.Event()
    # Four pollers: two in low-latency mode, two as timer runs; two of them share table `c`.
    plan = [("a", "pa", True), ("b", "pb", True), ("c", "pc", False), ("c", "pc2", False)]
    pollers = [
        threading.Thread(
            target=_poller,
            args=(url,),
            kwargs={
                "table": table,
                "name": name,
                "low_latency": low,
                "delivered": delivered,
                "holds": holds,
                "stop": stop_pollers,
                "errors": errors,
            },
            daemon=True,
        )
        for table, name, low in plan
    ]
    writers = [
        threading.Thread(
            target=_writer, args=(url, tables, ledger, stop_writers, seed), daemon=True
        )
        for seed in range(1, 5)
    ]
    for thread in pollers + writers:
        thread.start()
    time.sleep(12)
    stop_writers.set()
    for thread in writers:
        thread.join(STEP)
    time.sleep(SETTLE.total_seconds() + 1.5)
    stop_pollers.set()
    for thread in pollers:
        thread.join(3 * STEP)
        assert not thread.is_alive()
    assert not ledger.errors, ledger.errors
    assert not errors, errors
    for table, name, _ in plan:
        committed = ledger.committed.get(table, set())
        lost = committed - set(delivered[name])
        assert not lost, f"poller {name} lost {len(lost)} of {len(committed)} rows: {sorted(lost)}"
    assert sum(len(v) for v in ledger.committed.values()) > 50
    # Every hold naming a writer's session was computed while one of its transactions was open
    # (the other sessions that can appear are the pollers' own, which never write: they are
    # left out as read-only).
    false_holds = []
    for before, after, holder in holds.seen:
        match = re.match(r"thread (\d+),", holder)
        if match is None or int(match.group(1)) not in ledger.open_spans:
            continue  # not one of this test's writers (another client of the server)
        spans = ledger.open_spans[int(match.group(1))]
        if not any(begun <= after and ended >= before for begun, ended in spans):
            false_holds.append(holder)
    assert not false_holds, false_holds[:5]
    stale = [h for _, _, h in holds.seen if "not refreshed" in h]
    # Our own pollers take turns: they never keep each other from a fresh reading.
    assert not stale, f"{len(stale)} holds for a cache our own pollers kept frozen"


@pytest.fixture(autouse=True)
def _no_named_lock_left(mysql_db: str) -> Iterator[None]:
    """No session of this test keeps the named lock: a leaked one is held by the same idle
    session for good (another client of the server may hold it for a moment)."""
    yield
    engine = sa.create_engine(dbservers.mysql_url(mysql_db), poolclass=sa.NullPool)
    holders = set()
    with engine.connect() as conn:
        for _ in range(20):
            holder = conn.exec_driver_sql("SELECT IS_USED_LOCK('afdb.innodb_trx')").scalar()
            if holder is None:
                break
            command = conn.exec_driver_sql(
                f"SELECT COMMAND FROM information_schema.PROCESSLIST WHERE ID = {int(holder)}"
            ).scalar()
            holders.add((holder, command))
            time.sleep(0.1)
        else:
            leaked = len(holders) == 1 and next(iter(holders))[1] == "Sleep"
            assert not leaked, f"session {holders} kept the named lock after its reading"
    engine.dispose()
