"""The SQLite tier's shared pieces: the ``orders`` table, the two baseline scans, the engine run,
and the counters (database round trips, state-store operations) the idle benchmark reads.

The table is a file on local disk: ``orders(id INTEGER PRIMARY KEY, note TEXT, updated_at
DATETIME)`` with an index on ``(updated_at, id)``. Date-times are stored the way SQLAlchemy writes
them (``YYYY-MM-DD HH:MM:SS.ffffff``). Cursor ties are realistic: most seconds hold a few rows,
some hold dozens, and rare bulk updates give more than a batch of rows one timestamp, so ties
straddle batch boundaries. Ids are shuffled against time (rows were updated after insert), so a
keyset scan visits the table in index order, not in rowid order.
"""

from __future__ import annotations

import datetime as dt
import random
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from azure_functions_db.core.checkpoint import Checkpoint, PollerKey
from azure_functions_db.core.ports import LeaseGrant, LeaseInfo, StateStore, StoredCheckpoint
from azure_functions_db.sources.sqlalchemy import SqlSource
from benchmarks import engine_runs as runs
from benchmarks.harness import Context, Timing, best_of, timed

T0 = dt.datetime(2026, 11, 1, 0, 0, 0)
SEED = 20261121
POLLER = "bench"
OWNER = "bench"

_FIRST = (
    "SELECT id, note, updated_at FROM orders WHERE updated_at IS NOT NULL "
    "ORDER BY updated_at, id LIMIT ?"
)
_NEXT = (
    "SELECT id, note, updated_at FROM orders "
    "WHERE updated_at >= ? AND (updated_at > ? OR id > ?) "
    "ORDER BY updated_at, id LIMIT ?"
)

#: The state-store methods the idle benchmark reports, in the order of a run.
STORE_METHODS = ("acquire", "read", "create", "replace", "renew", "release", "inspect")


# --------------------------------------------------------------------------------------------
# The table
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OrdersTable:
    """A built ``orders`` database file and the shape of its cursor ties."""

    path: Path
    rows: int
    distinct_cursors: int
    largest_tie: int

    @property
    def url(self) -> str:
        return f"sqlite:///{self.path}"

    @property
    def name(self) -> str:
        return "orders"

    def source(self, horizon: str | None = None) -> SqlSource:
        """The source a user would write for this table."""
        return SqlSource(self.url, table="orders", cursor="updated_at", pk="id", horizon=horizon)


def _tie_sizes(rng: random.Random, rows: int) -> Iterator[int]:
    """Rows per timestamp: mostly 1-5, sometimes 6-100, rarely a 1200-2500 row bulk update."""
    left = rows
    while left > 0:
        roll = rng.random()
        if roll < 0.0005:
            size = rng.randint(1200, 2500)
        elif roll < 0.10:
            size = rng.randint(6, 100)
        else:
            size = rng.randint(1, 5)
        size = min(size, left)
        left -= size
        yield size


def build_orders(path: Path, rows: int) -> OrdersTable:
    """Create ``path`` with ``rows`` orders (deterministic for a given size)."""
    rng = random.Random(SEED)
    ids = list(range(1, rows + 1))
    rng.shuffle(ids)
    records: list[tuple[int, str, str]] = []
    at = T0
    largest = distinct = 0
    position = 0
    for size in _tie_sizes(rng, rows):
        stamp = at.strftime("%Y-%m-%d %H:%M:%S.%f")
        for pk in ids[position : position + size]:
            records.append((pk, f"order {pk}: {rng.randrange(1, 99)} items for c{pk % 977}", stamp))
        position += size
        distinct += 1
        largest = max(largest, size)
        at += dt.timedelta(seconds=rng.randint(1, 3))
    records.sort()  # insert in id order: the table's rowid order differs from the index order
    path.unlink(missing_ok=True)
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, note TEXT, updated_at DATETIME)")
        conn.executemany("INSERT INTO orders (id, note, updated_at) VALUES (?, ?, ?)", records)
        conn.execute("CREATE INDEX ix_orders_keyset ON orders (updated_at, id)")
        conn.execute("ANALYZE")
    conn.close()
    return OrdersTable(path=path, rows=rows, distinct_cursors=distinct, largest_tie=largest)


def orders(ctx: Context, rows: int) -> OrdersTable:
    """The ``orders`` table of ``rows`` rows for this harness run (built once)."""

    def make() -> OrdersTable:
        ctx.progress(f"building SQLite table orders ({rows:,} rows)")
        return build_orders(ctx.workdir / f"orders_{rows}.db", rows)

    return ctx.memo(f"sqlite.orders.{rows}", make)


# --------------------------------------------------------------------------------------------
# Baselines and the engine
# --------------------------------------------------------------------------------------------


def raw_scan(db: OrdersTable, batch_size: int) -> int:
    """Baseline A: drain the table with ``sqlite3`` keyset batches; return the row count."""
    conn = sqlite3.connect(db.path)
    try:
        rows = conn.execute(_FIRST, (batch_size,)).fetchall()
        total = 0
        while rows:
            total += len(rows)
            if len(rows) < batch_size:
                break
            pk, _, cursor = rows[-1]
            rows = conn.execute(_NEXT, (cursor, cursor, pk, batch_size)).fetchall()
        return total
    finally:
        conn.close()


def core_scan(db: OrdersTable, batch_size: int) -> int:
    """Baseline B: the same keyset scan through SQLAlchemy Core (``DateTime`` values parsed)."""
    table = sa.Table(
        "orders",
        sa.MetaData(),
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("note", sa.Text),
        sa.Column("updated_at", sa.DateTime),
    )
    return core_keyset_scan(sa.create_engine(db.url), table, batch_size)


def core_keyset_scan(engine: sa.Engine, table: sa.Table, batch_size: int) -> int:
    """Rows of ``table`` read in nested-predicate keyset batches of ``(updated_at, id)`` on one
    connection of ``engine`` (disposed after): the Core baseline of every tier."""
    cursor_v = sa.bindparam("cursor_v", type_=table.c.updated_at.type)
    pk_v = sa.bindparam("pk_v", type_=table.c.id.type)
    order = (table.c.updated_at, table.c.id)
    first = (
        sa.select(table).where(table.c.updated_at.is_not(None)).order_by(*order).limit(batch_size)
    )
    following = (
        sa.select(table)
        .where(
            table.c.updated_at >= cursor_v,
            sa.or_(table.c.updated_at > cursor_v, table.c.id > pk_v),
        )
        .order_by(*order)
        .limit(batch_size)
    )
    try:
        with engine.connect() as conn:
            rows: Sequence[sa.Row[Any]] = conn.execute(first).all()
            total = 0
            while rows:
                total += len(rows)
                if len(rows) < batch_size:
                    break
                last = rows[-1]
                rows = conn.execute(following, {"cursor_v": last.updated_at, "pk_v": last.id}).all()
        return total
    finally:
        engine.dispose()


@dataclass(frozen=True)
class ScanTimings:
    """Best-of-N timings of the three scans of one table, measured interleaved."""

    db: OrdersTable
    raw: Timing
    core: Timing
    engine: Timing


def scans(ctx: Context, rows: int) -> ScanTimings:
    """Time the raw, Core and engine drains of the ``rows``-row table (once per harness run).

    Repetitions are interleaved (raw, Core, engine, raw, ...) so drift of the machine hits all
    three alike; the engine's state directory is emptied before each of its repetitions.
    """
    db = orders(ctx, rows)
    state_dir = ctx.workdir / f"state_{rows}"

    def measure() -> ScanTimings:
        raw, core, eng = [], [], []
        for i in range(ctx.repeats):
            ctx.progress(f"raw / Core / engine drains of {rows:,} rows ({i + 1}/{ctx.repeats})")
            raw.append(timed(lambda: raw_scan(db, ctx.batch_size)))
            core.append(timed(lambda: core_scan(db, ctx.batch_size)))
            eng.append(timed(runs.local_drain(db, state_dir, ctx.batch_size)))
        return ScanTimings(db=db, raw=best_of(raw), core=best_of(core), engine=best_of(eng))

    return ctx.memo(f"sqlite.scans.{rows}", measure)


# --------------------------------------------------------------------------------------------
# Counters
# --------------------------------------------------------------------------------------------


class CountingStore:
    """A :class:`~azure_functions_db.core.ports.StateStore` that counts calls per method.

    Delegates every call to the wrapped store. On a remote store (Blob, Table) each call is at
    least one request; how many exactly is for that store's own benchmark to count.
    """

    def __init__(self, inner: StateStore) -> None:
        self._inner = inner
        self._lock = threading.Lock()  # renew runs on the heartbeat thread
        self.calls: Counter[str] = Counter()
        self.times: dict[str, list[float]] = {}  # time.monotonic() of each call, per method

    def _count(self, method: str) -> None:
        with self._lock:
            self.calls[method] += 1
            self.times.setdefault(method, []).append(time.monotonic())

    def snapshot(self) -> dict[str, int]:
        """Counts of the reported methods (zeros included), then any other method called."""
        with self._lock:
            counts = {method: self.calls[method] for method in STORE_METHODS}
            counts.update({m: n for m, n in sorted(self.calls.items()) if m not in counts})
            return counts

    def reset(self) -> None:
        with self._lock:
            self.calls.clear()
            self.times.clear()

    def read(self, key: PollerKey) -> StoredCheckpoint | None:
        self._count("read")
        return self._inner.read(key)

    def create(self, checkpoint: Checkpoint) -> str:
        self._count("create")
        return self._inner.create(checkpoint)

    def replace(self, checkpoint: Checkpoint, etag: str) -> str:
        self._count("replace")
        return self._inner.replace(checkpoint, etag)

    def list_keys(self, namespace: str | None = None) -> Sequence[PollerKey]:
        self._count("list_keys")
        return self._inner.list_keys(namespace)

    def acquire(self, key: PollerKey, owner: str, duration: float) -> LeaseGrant | None:
        self._count("acquire")
        return self._inner.acquire(key, owner, duration)

    def renew(self, grant: LeaseGrant) -> None:
        self._count("renew")
        self._inner.renew(grant)

    def release(self, grant: LeaseGrant) -> None:
        self._count("release")
        self._inner.release(grant)

    def inspect(self, key: PollerKey) -> LeaseInfo:
        self._count("inspect")
        return self._inner.inspect(key)

    def describe(self) -> str:
        return f"counting({self._inner.describe()})"


class StatementLog:
    """Every statement SQLAlchemy sends to one database file, via ``before_cursor_execute``.

    Listening on the :class:`sqlalchemy.Engine` class (filtered by database file) also sees the
    reflection of ``SqlSource.open``, which happens before the source's engine is reachable.
    """

    def __init__(self, database: Path) -> None:
        self._database = str(database)
        self.statements: list[str] = []

    def _seen(self, conn: sa.Connection, cursor: object, statement: str, *_: object) -> None:
        # The rest of the event's arguments: parameters, context, executemany.
        if conn.engine.url.database == self._database:
            self.statements.append(" ".join(statement.split()))

    @contextmanager
    def listening(self) -> Iterator[StatementLog]:
        sa.event.listen(sa.Engine, "before_cursor_execute", self._seen)
        try:
            yield self
        finally:
            sa.event.remove(sa.Engine, "before_cursor_execute", self._seen)

    def take(self) -> list[str]:
        """The statements seen since the last ``take``."""
        seen, self.statements = self.statements, []
        return seen
