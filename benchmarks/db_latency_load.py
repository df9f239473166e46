"""The load of :mod:`benchmarks.db_latency`: the databases, the ``orders`` table, the writers and
the figures taken from what they recorded.

PostgreSQL is the tier's server (:func:`benchmarks.pg_fixture.scratch_schema`: a scratch schema,
``BenchmarkSkipped`` when it does not answer); MariaDB is the one of ``AFDB_BENCH_MYSQL_URL``
(default the tests' server) with a scratch database, or the reason it was not measured. Every
mode gets a new ``orders(id bigint PRIMARY KEY, updated_at NOT NULL, note text)`` with an index on
``(updated_at, id)``; ``updated_at`` is stamped by the database in the ``INSERT`` (``now()``, the
transaction's start, on PostgreSQL; ``NOW(6)``, the statement's start, on MariaDB).

Writers (:class:`Load`): a fast writer inserts one row every :data:`EVERY` seconds, each in its
own transaction, paced on a schedule (a slow commit is caught up, not added to the period); each
of :data:`LATE_WRITERS` late writers waits 0.25-1.25 s, inserts one row, holds its transaction
open 0.5-2.0 s and commits (seeded RNGs: about one late transaction a second, two may overlap).
For every id they record ``sent`` (monotonic, just before the ``INSERT``: when its stamp is taken)
and ``committed`` (just after ``COMMIT`` returned).

A row is *due* once it is committed and every late transaction stamped before it that was still
open at its commit has committed too (a commit-safe reader must wait for those: they may hold
rows with a smaller cursor). Latency is the handler's first sight of the row minus its due time.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

from azure_functions_db.core.batch import Batch
from benchmarks import maria_fixture as maria
from benchmarks import pg_fixture as pg

EVERY = 0.005  # seconds between the fast writer's inserts: 200 rows/s
LATE_WRITERS = 2
LATE_GAP = (0.25, 1.25)  # seconds a late writer waits before its next transaction
LATE_HOLD = (0.5, 2.0)  # seconds a late transaction stays open after its INSERT


@dataclass(frozen=True)
class Database:
    """One server: its SQLAlchemy URL, the schema of the table (PostgreSQL; on MariaDB the URL
    names the scratch database), the SQL of its clock, and a DBAPI connector."""

    key: str  # metric prefix: ``pg`` or ``maria``
    label: str
    url: str
    schema: str | None
    now: str
    column: str  # the type of ``updated_at``
    connect: Callable[[bool], Any]  # autocommit -> a DBAPI connection

    @property
    def table(self) -> str:
        return f'"{self.schema}".orders' if self.schema else "orders"

    def execute(self, *statements: str) -> list[tuple[Any, ...]]:
        """Run ``statements`` in autocommit; the rows of the last one."""
        conn = self.connect(True)
        try:
            cur = conn.cursor()
            rows: list[tuple[Any, ...]] = []
            for statement in statements:
                cur.execute(statement)
                rows = list(cur.fetchall()) if cur.description else []
            return rows
        finally:
            conn.close()

    def create_orders(self) -> None:
        """A new, empty ``orders`` table (the previous mode's is dropped)."""
        self.execute(
            f"DROP TABLE IF EXISTS {self.table}",
            f"CREATE TABLE {self.table} (id bigint PRIMARY KEY, "
            f"updated_at {self.column} NOT NULL, note text)",
            f"CREATE INDEX ix_orders_keyset ON {self.table} (updated_at, id)",
        )

    def ids(self) -> set[int]:
        """Every id committed in ``orders``."""
        return {int(row[0]) for row in self.execute(f"SELECT id FROM {self.table}")}


@contextmanager
def postgres() -> Iterator[Database]:
    """PostgreSQL with a scratch schema, dropped afterwards (``BenchmarkSkipped`` if it does not
    answer)."""
    import psycopg

    with pg.scratch_schema() as server:

        def connect(autocommit: bool) -> Any:
            return psycopg.connect(
                server.conninfo, autocommit=autocommit, connect_timeout=pg.CONNECT_TIMEOUT
            )

        yield Database(
            key="pg",
            label="PostgreSQL",
            url=server.url,
            schema=server.schema,
            now="now()",
            column="timestamptz",
            connect=connect,
        )


@contextmanager
def mariadb() -> Iterator[Database | str]:
    """MariaDB with a scratch database, dropped afterwards; or why it was not measured."""
    with maria.scratch_database() as scratch:
        if isinstance(scratch, str):
            yield scratch
            return

        def connect(autocommit: bool) -> Any:
            return scratch.connect(autocommit=autocommit)

        yield Database(
            key="maria",
            label="MariaDB",
            url=scratch.url,
            schema=None,
            now="NOW(6)",
            column="datetime(6)",
            connect=connect,
        )


@contextmanager
def databases(note: Callable[[str], None]) -> Iterator[list[Database]]:
    """PostgreSQL, and MariaDB when it answers (``note`` says why not otherwise), each with its
    scratch schema or database for the time of the ``with``."""
    with ExitStack() as stack:
        found = [stack.enter_context(postgres())]
        maria = stack.enter_context(mariadb())
        if isinstance(maria, Database):
            found.append(maria)
        else:
            note(f"MariaDB was not measured: {maria}")
        yield found


class Load:
    """One mode's table, its writers, and when the mode's reader first saw each id."""

    def __init__(self, db: Database, seconds: float, seed: int) -> None:
        db.create_orders()
        self.db = db
        self.seconds = seconds
        self.seed = seed
        self.sent: dict[int, float] = {}
        self.committed: dict[int, float] = {}
        self.late: set[int] = set()
        self.arrived: dict[int, float] = {}
        self.errors: list[BaseException] = []
        self.started = self.ended = 0.0
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._insert = f"INSERT INTO {db.table} (id, updated_at, note) VALUES (%s, {db.now}, %s)"
        self._threads = [threading.Thread(target=self._guarded, args=(self._fast,))] + [
            threading.Thread(target=self._guarded, args=(self._late, i))
            for i in range(LATE_WRITERS)
        ]

    def start(self) -> None:
        self.started = time.monotonic()
        for thread in self._threads:
            thread.start()

    def running(self) -> bool:
        return any(thread.is_alive() for thread in self._threads)

    def join(self) -> None:
        """Wait for the writers (the late ones commit their open transaction); raise theirs."""
        for thread in self._threads:
            thread.join()
        self.ended = self.ended or time.monotonic()
        if self.errors:
            raise RuntimeError(f"a writer of {self.db.label} failed") from self.errors[0]

    def handler(self, batch: Batch) -> None:
        self.saw((int(change.pk) for change in batch), time.monotonic())

    def saw(self, ids: Iterable[int], at: float) -> None:
        for pk in ids:
            self.arrived.setdefault(pk, at)

    def undelivered(self) -> int:
        return sum(1 for pk in self.committed if pk not in self.arrived)

    def _next_id(self) -> int:
        with self._lock:
            return next(self._ids)

    def _guarded(self, work: Callable[..., None], *args: Any) -> None:
        try:
            work(*args)
        except BaseException as exc:  # noqa: BLE001 - raised again by join()
            self.errors.append(exc)

    def _fast(self) -> None:
        conn = self.db.connect(False)
        try:
            cur = conn.cursor()
            deadline = self.started + self.seconds
            due = self.started
            while (now := time.monotonic()) < deadline:
                if due > now:
                    time.sleep(due - now)
                pk = self._next_id()
                self.sent[pk] = time.monotonic()
                cur.execute(self._insert, (pk, "fast"))
                conn.commit()
                self.committed[pk] = time.monotonic()
                due += EVERY
        finally:
            conn.close()

    def _late(self, index: int) -> None:
        rng = random.Random(self.seed * 100 + index)
        conn = self.db.connect(False)
        try:
            cur = conn.cursor()
            deadline = self.started + self.seconds
            time.sleep(index * sum(LATE_GAP) / 2)  # the writers take turns, about
            while time.monotonic() + LATE_GAP[1] < deadline:
                time.sleep(rng.uniform(*LATE_GAP))
                pk = self._next_id()
                self.sent[pk] = time.monotonic()
                cur.execute(self._insert, (pk, "late"))
                time.sleep(rng.uniform(*LATE_HOLD))
                conn.commit()
                self.committed[pk] = time.monotonic()
                self.late.add(pk)
        finally:
            conn.close()


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile of sorted ``values`` (nearest rank), NaN for none."""
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


@dataclass(frozen=True)
class Figures:
    """What one mode measured on one database."""

    due: list[float]  # arrival - due, sorted
    commit: list[float]  # arrival - committed, sorted
    rows: int
    lost: int
    lost_late: int  # of the lost rows, rows of late transactions
    late: int
    rate: float  # rows/s the writers achieved (all of them)
    holds: tuple[float, float]  # shortest and longest late transaction, s


def figures(load: Load) -> Figures:
    """The latencies of the rows the mode delivered, and the committed rows it never did."""
    lates = [(load.sent[pk], load.committed[pk]) for pk in load.late]
    due_lat, commit_lat = [], []
    for pk, committed in load.committed.items():
        if pk not in load.arrived:
            continue
        due = committed
        for sent, done in lates:
            if sent < load.sent[pk] and done > due:
                due = done
        due_lat.append(load.arrived[pk] - due)
        commit_lat.append(load.arrived[pk] - committed)
    lost = load.db.ids() - load.arrived.keys()
    holds = [done - sent for sent, done in lates] or [float("nan")]
    return Figures(
        due=sorted(due_lat),
        commit=sorted(commit_lat),
        rows=len(load.committed),
        lost=len(lost),
        lost_late=len(lost & load.late),
        late=len(load.late),
        rate=len(load.committed) / load.seconds,
        holds=(min(holds), max(holds)),
    )
