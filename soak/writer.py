"""One soak writer process: ``python -m soak.writer INDEX`` (started by ``soak.run``).

Writes transactions of 1-8 row changes (inserts of its own new ids, updates of ids it inserted)
on the soak table, each change stamping ``updated_at = now()`` (the transaction's start time)
and a ``version`` from this writer's own counter, so versions of one id grow in commit order.
Some transactions are held open for seconds before COMMIT (late commits), some roll back. Every
change is also recorded in the history table in the same transaction, which is how a COMMIT with
an unknown outcome (its connection was killed) is resolved afterwards.

Evidence (``writer-<index>.jsonl``): ``commit`` (after COMMIT returned), ``rollback``,
``aborted`` (the transaction failed before COMMIT was sent: nothing committed) and ``unknown``
(COMMIT was sent and its answer lost), each with the (id, version) pairs. The writer stops after
its current transaction when the stop flag file appears or on SIGTERM.

``python -m soak.writer INDEX --burst ROWS`` is the soak's burst: it inserts ROWS new rows
(ids from ``BURST_IDS`` on) in transactions of ``BURST_BATCH`` rows as fast as the database
takes them, with the same late commits, rollbacks and evidence, then stops.

Environment: ``SOAK_PG`` (libpq URI), ``SOAK_TABLE``, ``SOAK_EVIDENCE`` (folder),
``SOAK_STOP`` (flag file), ``SOAK_SEED``, ``SOAK_WRITERS`` (how many writers share the ids).
"""

from __future__ import annotations

import os
import random
import signal
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import psycopg
from psycopg import sql

from devkit.evidence import EvidenceLog
from soak.check import Row, poisoned

#: The burst's first id (above every other writer's) and rows per transaction.
BURST_IDS, BURST_BATCH = 10**12, 500
#: Of the burst's rows the handler would refuse (``soak.check.poisoned``), one in this many is
#: written: about 20 in 200,000 rows, not 200 (each costs a poller three failed runs).
BURST_POISON_KEPT = 10


def burst_keeps(row: Row, n: int) -> bool:
    """Whether the burst writes its ``n``-th candidate id ``row`` (version 1)."""
    return not poisoned(row, 1) or n % BURST_POISON_KEPT == 0


P_ROLLBACK = 0.08
P_LATE = 0.15
P_SLOW_COMMIT = 0.2
LATE_SECONDS = (0.3, 3.5)


@dataclass
class Ending:
    """How a soak writer's transaction ends, once its changes are made: held open for a while
    (late for ``P_LATE`` of them), then rolled back (``P_ROLLBACK``) or committed, each outcome
    logged with ``rows``; an error while ending it is ``aborted`` before COMMIT and ``unknown``
    (COMMIT was sent, its answer lost) after it, and closes the connection."""

    log: EvidenceLog
    rng: random.Random
    rows: list[list[Any]]
    error: type[Exception]
    close: Callable[[], None]

    def finish(self, rollback: Callable[[], None], commit: Callable[[], None]) -> bool:
        """End the transaction; whether it committed."""
        rng = self.rng
        try:
            late = rng.random() < P_LATE
            time.sleep(rng.uniform(*LATE_SECONDS) if late else rng.uniform(0.0, 0.05))
            if rng.random() < P_ROLLBACK:
                rollback()
                self.log.write("rollback", rows=self.rows)
                return False
        except self.error as exc:
            self.log.write("aborted", rows=self.rows, error=type(exc).__name__)
            self.close()
            return False
        try:
            commit()
        except self.error as exc:
            self.log.write("unknown", rows=self.rows, error=type(exc).__name__)
            self.close()
            return False
        self.log.write("commit", rows=self.rows)
        return True


class Writer:
    """One writer: its ids (``index + writers * n``), its version counter, its connection."""

    def __init__(self, index: int, env: Mapping[str, str]) -> None:
        self.index = index
        self.env = env
        self.writers = int(env["SOAK_WRITERS"])
        self.log = EvidenceLog(Path(env["SOAK_EVIDENCE"]) / f"writer-{index}.jsonl")
        self.rng = random.Random(f"{env.get('SOAK_SEED', '0')}:writer:{index}")  # noqa: S311
        table = sql.Identifier(env["SOAK_TABLE"])
        self.insert = sql.SQL(
            "INSERT INTO {t} (id, version, writer, updated_at) VALUES (%s, %s, %s, now())"
        ).format(t=table)
        self.update = sql.SQL(
            "UPDATE {t} SET version = %s, updated_at = now() WHERE id = %s"
        ).format(t=table)
        self.history = sql.SQL("INSERT INTO {h} (id, version, slow) VALUES (%s, %s, %s)").format(
            h=sql.Identifier(f"{env['SOAK_TABLE']}_history")
        )
        self.owned: list[int] = []  # ids whose insert is known committed
        self.next_id = 0
        self.version = 0
        self.conn: psycopg.Connection[Any] | None = None

    def connect(self) -> psycopg.Connection[Any] | None:
        if self.conn is None or self.conn.closed:
            try:
                self.conn = psycopg.connect(
                    self.env["SOAK_PG"],
                    application_name=f"{self.env['SOAK_TABLE']}-writer-{self.index}",
                )
            except psycopg.Error as exc:
                self.log.write("connect_failed", error=type(exc).__name__)
                time.sleep(0.5)
                return None
        return self.conn

    def transaction(self, conn: psycopg.Connection[Any]) -> None:
        """One transaction: changes, maybe a long hold, then ROLLBACK or COMMIT, logged."""
        rng = self.rng
        pairs: list[list[int]] = []
        fresh: list[int] = []
        # A slow COMMIT (a deferred trigger sleeps in it) gives a terminated session a real
        # chance to lose COMMIT's answer: an unknown outcome, resolved from the history table.
        slow = rng.random() < P_SLOW_COMMIT
        try:
            with conn.cursor() as cur:
                for _ in range(rng.randint(1, 8)):
                    self.version += 1
                    if self.owned and rng.random() < 0.6:
                        row = rng.choice(self.owned)
                        cur.execute(self.update, (self.version, row))
                    else:
                        row = self.index + self.writers * self.next_id
                        self.next_id += 1
                        cur.execute(self.insert, (row, self.version, self.index))
                        fresh.append(row)
                    cur.execute(self.history, (row, self.version, slow and not pairs))
                    pairs.append([row, self.version])
        except psycopg.Error as exc:
            self.log.write("aborted", rows=pairs, error=type(exc).__name__)
            conn.close()
            return
        ending = Ending(self.log, rng, pairs, psycopg.Error, conn.close)
        if ending.finish(conn.rollback, conn.commit):
            self.owned.extend(fresh)

    def burst(self, conn: psycopg.Connection[Any], count: int) -> int:
        """One burst transaction of ``count`` new rows; how many it committed."""
        pairs: list[list[int]] = []
        while len(pairs) < count:
            row = BURST_IDS + self.next_id
            self.next_id += 1
            if burst_keeps(row, self.next_id):
                pairs.append([row, 1])
        try:
            with conn.cursor() as cur:
                cur.executemany(self.insert, [(row, 1, self.index) for row, _ in pairs])
                cur.executemany(self.history, [(row, 1, False) for row, _ in pairs])
        except psycopg.Error as exc:
            self.log.write("aborted", rows=pairs, error=type(exc).__name__)
            conn.close()
            return 0
        committed = Ending(self.log, self.rng, pairs, psycopg.Error, conn.close).finish(
            conn.rollback, conn.commit
        )
        return count if committed else 0

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


class Writes(Protocol):
    log: EvidenceLog

    def connect(self) -> Any: ...

    def transaction(self, conn: Any) -> None: ...

    def burst(self, conn: Any, count: int) -> int: ...

    def close(self) -> None: ...


def run(writer: Writes, index: int, env: Mapping[str, str], burst: int = 0) -> int:
    """Write transactions until the stop flag appears or SIGTERM (with ``burst``: until that
    many new rows are written, each attempt of a batch counting once), then close and log."""
    stop_flag = Path(env["SOAK_STOP"])
    stopping = False

    def on_term(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_term)
    writer.log.write("started", index=index, burst=burst)
    left = burst
    while not stopping and not stop_flag.exists() and (not burst or left > 0):
        conn = writer.connect()
        if conn is not None:
            if burst:
                writer.burst(conn, min(BURST_BATCH, left))
                left -= min(BURST_BATCH, left)
            else:
                writer.transaction(conn)
    writer.close()
    writer.log.write("stopped", index=index)
    writer.log.close()
    return 0


def arguments(argv: list[str]) -> tuple[int, int]:
    """``INDEX [--burst ROWS]``: the writer's index and its burst (0: none)."""
    burst = int(argv[argv.index("--burst") + 1]) if "--burst" in argv else 0
    return int(argv[0]), burst


def main(argv: list[str]) -> int:
    index, burst = arguments(argv)
    return run(Writer(index, os.environ), index, os.environ, burst)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
