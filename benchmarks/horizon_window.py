"""PostgreSQL (+ MariaDB): how wide is the window the horizon's settle margin has to cover?

The commit-safe horizons bound each batch below the oldest start of a transaction that may still
write, or the server's clock, less ``settle`` (1 s by default). The margin covers a writer that
read its clock for a row's stamp but is not yet visible to the horizon's query (PostgreSQL:
between the statement's start time and ``xact_start`` in ``pg_stat_activity``; MariaDB: between
the statement's ``NOW()`` and the process list). This measures that window under stress, per
database, instead of assuming it:

- :data:`WRITERS` threads, each on its own connection, insert one row after the other for
  :data:`SECONDS` (:data:`QUICK_SECONDS` with ``--quick``), each row its own transaction, stamped
  by the database (``now()`` / ``NOW(6)``): more writers than cores, so backends are descheduled
  at every point of their work, the window's included;
- a probe reads the horizon with ``settle = 0`` (the strategy ``horizon="auto"`` picks:
  ``PgXactStartHorizon`` / ``MysqlTrxHorizon``), then, in a later statement as the engine does,
  the ids visible with a stamp in the second below that bound; again and again;
- a control probe does the same every few milliseconds with the server's clock alone as the
  bound (no open transaction waited for): it must see rows passed over, or the meter could not
  see any.

Afterwards every committed row is read. A row stamped below a probe's bound that the probe did
not see is one a poller at that margin would have passed over: lost. For each margin of
:data:`MARGINS`, the number of such (probe, row) pairs whose stamp lies below the bound less the
margin, and the deepest one (how far below the bound it was stamped): the smallest margin that
would have lost nothing here is just above it. A measurement on this machine, not a proof: a
writer can be descheduled for longer elsewhere (a CPU quota's throttling period is 100 ms).
"""

from __future__ import annotations

import datetime as dt
import itertools
import threading
import time
from collections.abc import Callable
from typing import Any

from azure_functions_db.sources import MysqlTrxHorizon, PgXactStartHorizon
from azure_functions_db.sources.sqlalchemy import SqlSource
from benchmarks.db_latency_load import Database, databases
from benchmarks.harness import Benchmark, BenchmarkResult, Context

SECONDS = 20.0
QUICK_SECONDS = 6.0
WRITERS = 12
#: Margins (seconds) the violations are counted at.
MARGINS = (0.0, 0.001, 0.01, 0.1, 1.0)
#: How far below a probe's bound its visible ids are read (seconds).
LOOK = 1.0


def _naive_utc(value: dt.datetime) -> dt.datetime:
    if value.tzinfo is None:
        return value
    return value.astimezone(dt.UTC).replace(tzinfo=None)


class _Run:
    """The writers, the probe, and what the probe saw."""

    def __init__(self, db: Database, seconds: float) -> None:
        db.create_orders()
        self.db, self.seconds = db, seconds
        self.stop = threading.Event()
        self.ids = itertools.count(1)
        self.lock = threading.Lock()
        self.errors: list[BaseException] = []
        self.probes: list[tuple[dt.datetime, set[int]]] = []
        self.controls: list[tuple[dt.datetime, set[int]]] = []  # the clock alone as the bound

    def _guarded(self, work: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                work()
            except BaseException as exc:  # noqa: BLE001 - reported by measure()
                self.errors.append(exc)
                self.stop.set()

        return run

    def write(self) -> None:
        conn = self.db.connect(True)
        insert = f"INSERT INTO {self.db.table} (id, updated_at) VALUES (%s, {self.db.now})"
        try:
            cur = conn.cursor()
            while not self.stop.is_set():
                with self.lock:
                    row = next(self.ids)
                cur.execute(insert, (row,))
        finally:
            conn.close()

    def probe(self) -> None:
        zero = dt.timedelta(0)
        strategy: Any = (
            PgXactStartHorizon(settle=zero) if self.db.key == "pg" else MysqlTrxHorizon(settle=zero)
        )
        source = SqlSource(
            self.db.url, "orders", "updated_at", "id", schema=self.db.schema, horizon=strategy
        )
        source.open({})
        conn = self.db.connect(True)
        try:
            cur = conn.cursor()
            while not self.stop.is_set():
                bound = source.horizon().bound
                assert isinstance(bound, dt.datetime), bound
                self.probes.append(self._below(cur, bound))
                time.sleep(0.02)
        finally:
            conn.close()
            source.close()

    def control(self) -> None:
        """The server's clock alone as the bound (no open transaction waited for), read the
        same way, every few milliseconds: the meter must see it pass rows over."""
        conn = self.db.connect(True)
        clock = "SELECT clock_timestamp()" if self.db.key == "pg" else "SELECT UTC_TIMESTAMP(6)"
        try:
            cur = conn.cursor()
            while not self.stop.is_set():
                cur.execute(clock)
                self.controls.append(self._below(cur, cur.fetchone()[0]))
                time.sleep(0.005)
        finally:
            conn.close()

    def _below(self, cur: Any, bound: dt.datetime) -> tuple[dt.datetime, set[int]]:
        """``bound`` (naive UTC) and the ids visible in the second below it, read now."""
        cur.execute(
            f"SELECT id FROM {self.db.table} WHERE updated_at >= %s AND updated_at < %s",
            (bound - dt.timedelta(seconds=LOOK), bound),
        )
        return _naive_utc(bound), {int(row[0]) for row in cur.fetchall()}

    def measure(self) -> dict[str, Any]:
        threads = [threading.Thread(target=self._guarded(self.write)) for _ in range(WRITERS)]
        threads.append(threading.Thread(target=self._guarded(self.probe)))
        threads.append(threading.Thread(target=self._guarded(self.control)))
        for thread in threads:
            thread.start()
        self.stop.wait(self.seconds)
        self.stop.set()
        for thread in threads:
            thread.join(60)
        if self.errors:
            raise RuntimeError(f"{self.db.label}: {self.errors[0]!r}") from self.errors[0]
        stamps = sorted(
            (_naive_utc(at), int(row))
            for row, at in self.db.execute(f"SELECT id, updated_at FROM {self.db.table}")
        )
        judged = self._judge(stamps, self.probes)
        judged["control"] = self._judge(stamps, self.controls)
        return judged

    @staticmethod
    def _judge(
        stamps: list[tuple[dt.datetime, int]], probes: list[tuple[dt.datetime, set[int]]]
    ) -> dict[str, Any]:
        import bisect

        depths: list[float] = []
        look = dt.timedelta(seconds=LOOK)
        for bound, seen in probes:
            low = bisect.bisect_left(stamps, (bound - look, -1))
            high = bisect.bisect_left(stamps, (bound, -1))
            depths.extend(
                (bound - at).total_seconds() for at, row in stamps[low:high] if row not in seen
            )
        return {
            "rows": len(stamps),
            "probes": len(probes),
            "violations": {m: sum(1 for d in depths if d > m) for m in MARGINS},
            "deepest": max(depths, default=0.0),
        }


def run(ctx: Context) -> BenchmarkResult:
    result = BenchmarkResult(name=BENCHMARK.name, title=BENCHMARK.title, tier=BENCHMARK.tier)
    seconds = QUICK_SECONDS if ctx.quick else SECONDS
    with databases(result.note) as found:
        for db in found:
            ctx.progress(f"{db.label}: {WRITERS} writers and a probe for {seconds:g} s")
            got = _Run(db, seconds).measure()
            rate = got["rows"] / seconds
            result.metric(
                f"{db.key}_rows", f"{db.label}: rows written", got["rows"], "rows", f"{rate:,.0f}/s"
            )
            result.metric(
                f"{db.key}_probes", f"{db.label}: horizon readings", got["probes"], "count"
            )
            for margin in MARGINS:
                result.metric(
                    f"{db.key}_lost_at_{margin * 1000:g}ms",
                    f"{db.label}: rows passed over at settle {margin * 1000:g} ms",
                    got["violations"][margin],
                    "rows",
                    "(probe, row) pairs: stamped below the bound less the margin, not yet visible",
                )
            control = got["control"]["violations"][0.0]
            result.metric(
                f"{db.key}_control_lost",
                f"{db.label}: control, the clock alone as the bound: rows passed over",
                control,
                "rows",
                f"deepest {got['control']['deepest'] * 1000:.3f} ms; must be > 0: the meter sees "
                "rows of transactions in flight",
            )
            result.metric(
                f"{db.key}_deepest",
                f"{db.label}: deepest passed-over stamp below a settle-0 bound",
                round(got["deepest"] * 1000, 3),
                "ms",
                "0: none passed over at settle 0",
            )
    result.note(
        f"{WRITERS} writer threads on 2 cores insert one row per transaction as fast as they can, "
        "stamped by the database; a probe reads the horizon with settle 0, then the rows visible "
        f"in the {LOOK:g} s below it. A stamp below the bound that the probe did not see would "
        "have been passed over at that margin. A measurement under this machine's stress, not a "
        "proof: elsewhere a writer can be descheduled longer (CPU quotas throttle for up to "
        "100 ms)."
    )
    return result


BENCHMARK = Benchmark(
    name="horizon_window",
    title="PostgreSQL (+ MariaDB): the window the horizon's settle margin covers, measured",
    tier="postgres",
    run=run,
)
