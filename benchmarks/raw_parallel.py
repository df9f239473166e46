"""The database's own limit for a backfill: raw psycopg keyset scans of the backfill's chunk
ranges, one per process, all at once.

A backfill of P chunks on ``local[P]`` reads P key ranges in P processes. The fastest a client
can read the same rows is P plain keyset scans over the same ranges in P processes: psycopg,
one autocommit connection each, ``fetchall()`` into tuples, the statement PostgreSQL gets from
``SqlSource`` (the row-value keyset ``(updated_at, id) > (...)`` and the chunk's inclusive end
``(updated_at, id) <= (...)``, ``ORDER BY updated_at, id LIMIT batch``). Nothing is done per
row. The worker processes are started (``spawn``) and warmed by one untimed scan before any
timed one, so a timing is the scans and their connections, not Python's start-up.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from azure_functions_db.core.position import Position
from azure_functions_db.spark.records import ChunkRange

#: One key of the orders table: ``(updated_at, id)``.
Key = tuple[Any, Any]


def ranged_scan(
    conninfo: str, table: str, start: Key | None, end: Key, batch_size: int
) -> tuple[int, float, float]:
    """Rows after ``start`` (from the first row when ``None``) up to and including ``end``, in
    keyset batches; returns ``(rows, started, ended)`` (``perf_counter``, which is the machine's
    monotonic clock on Linux: comparable across processes)."""
    import psycopg

    started = time.perf_counter()
    select = f"SELECT id, note, updated_at FROM {table} WHERE "
    tail = "(updated_at, id) <= (%s, %s) ORDER BY updated_at, id LIMIT %s"
    following = select + "(updated_at, id) > (%s, %s) AND " + tail
    total = 0
    with psycopg.connect(conninfo, autocommit=True) as conn:
        cur = conn.cursor()
        if start is None:
            first = select + "updated_at IS NOT NULL AND " + tail
            rows = cur.execute(first, (*end, batch_size)).fetchall()
        else:
            rows = cur.execute(following, (*start, *end, batch_size)).fetchall()
        while rows:
            total += len(rows)
            if len(rows) < batch_size:
                break
            pk, _, cursor = rows[-1]
            rows = cur.execute(following, (cursor, pk, *end, batch_size)).fetchall()
    return total, started, time.perf_counter()


def _key(position: Position) -> Key:
    if len(position.cursor) != 1 or len(position.pk) != 1:
        raise ValueError(f"not a key of the orders table: {position}")
    return position.cursor[0], position.pk[0]


@dataclass
class RawParallel:
    """Raw keyset scans of ``ranges``, one per process, started together (a callable: rows).

    ``windows`` keeps, per call, the time from the first scan's start to the last one's end as
    the processes measured it (without the dispatch to them).
    """

    conninfo: str
    table: str
    ranges: Sequence[ChunkRange]
    batch_size: int
    windows: list[float] = field(default_factory=list)
    _pool: ProcessPoolExecutor | None = None

    def start(self) -> None:
        """Start the processes and warm them (and the server) with one untimed scan."""
        context = multiprocessing.get_context("spawn")
        self._pool = ProcessPoolExecutor(len(self.ranges), mp_context=context)
        self()
        self.windows.clear()

    def __call__(self) -> int:
        assert self._pool is not None, "start() first"
        futures = [
            self._pool.submit(
                ranged_scan,
                self.conninfo,
                self.table,
                None if chunk.start is None else _key(chunk.start),
                _key(chunk.end),
                self.batch_size,
            )
            for chunk in self.ranges
        ]
        done = [f.result() for f in futures]
        self.windows.append(max(d[2] for d in done) - min(d[1] for d in done))
        return sum(d[0] for d in done)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
