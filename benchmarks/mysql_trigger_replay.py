"""Azure's MySQL trigger and ours, side by side on its own recommended schema, with writers
committing late: how many final row versions each never delivers (counted, not timed).

The trigger (Azure Functions MySQL extension) is re-enacted by ``devkit/mysql_trigger.py`` with
the SQL of its current design (commit a28494bf, 2025-04-17): its state in ``az_func_mysql``
(``GlobalState`` and this function's leases table), each poll reading the rows with
``az_func_updated_at > LastPolledTime`` that no live lease holds, ordered by
``(az_func_updated_at, ProductId)``, ``LIMIT`` its batch size, leasing them in the same
transaction; after the function succeeded one REPEATABLE READ transaction releases the leases
and moves ``LastPolledTime`` to the batch's greatest stamp (whole seconds) if no unprocessed row
is left at or below it. The user's table has ``az_func_updated_at TIMESTAMP DEFAULT
CURRENT_TIMESTAMP ON UPDATE CURRENT_TIMESTAMP`` as its documentation asks, and nothing else.

Ours is a plain ``SqlSource(cursor="az_func_updated_at", pk="ProductId")`` with the default
horizon, on the same table at the same time. Writers update random products; half of their
transactions are held open 0.5-2.5 s before COMMIT, the others commit at once (the statement
stamps ``az_func_updated_at`` when it runs, the row becomes visible at COMMIT). After the
writers stop and both pollers drained, a product's final version counts as missed by a poller
that never delivered it; a version a poller delivered more than once counts as delivered twice.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pymysql

from azure_functions_db.core.clock import SystemClock
from azure_functions_db.core.engine import Engine, PollerConfig
from azure_functions_db.sources.sqlalchemy import SqlSource
from azure_functions_db.state.memory import MemoryStateStore
from benchmarks.harness import Benchmark, BenchmarkResult, BenchmarkSkipped, Context
from devkit.mysql_trigger import MAX_BATCH_SIZE, POLLING_INTERVAL_MS, MySqlTrigger, Row

SERVER = {"host": "127.0.0.1", "port": 3306, "user": "root", "password": "", "database": "test"}
URL = "mysql+pymysql://root@127.0.0.1:3306/test"
SITE = "afdb-bench"  # WEBSITE_SITE_NAME of the re-enacted function app
PRODUCTS = 100
POLL_EVERY = POLLING_INTERVAL_MS / 1000  # the trigger's default MySql_Trigger_PollingIntervalMs
BATCH = MAX_BATCH_SIZE  # its default MaxBatchSize
LATE = 0.5  # the share of writer transactions held open 0.5-2.5 s before COMMIT


@dataclass
class Outcome:
    """Final versions, and what each poller delivered (every delivery of a version counted)."""

    final: dict[int, int] = field(default_factory=dict)
    trigger_seen: dict[int, Counter[int]] = field(default_factory=dict)
    ours_seen: dict[int, Counter[int]] = field(default_factory=dict)
    late: set[tuple[int, int]] = field(default_factory=set)  # (pk, version) committed late

    def missed(self, seen: dict[int, Counter[int]], *, prompt_only: bool = False) -> int:
        """Final versions never delivered (only those whose writer committed at once)."""
        return sum(
            1
            for pk, v in self.final.items()
            if seen.get(pk, Counter())[v] == 0 and not (prompt_only and (pk, v) in self.late)
        )

    @staticmethod
    def twice(seen: dict[int, Counter[int]]) -> int:
        """Versions delivered more than once."""
        return sum(1 for versions in seen.values() for n in versions.values() if n > 1)


def _connect() -> Any:
    return pymysql.connect(**SERVER, autocommit=True)


def _setup(table: str) -> MySqlTrigger:
    """The table as the trigger's docs ask for it, the trigger started on it, then the rows."""
    with _connect() as conn, conn.cursor() as cur:
        cur.execute(
            f"CREATE TABLE `{table}` (ProductId int PRIMARY KEY, Version int NOT NULL, "
            "az_func_updated_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP ON UPDATE CURRENT_TIMESTAMP"
            ") ENGINE=InnoDB"
        )
    trigger = MySqlTrigger(_connect(), table, site=SITE, function=f"replay_{table}",
                           max_batch_size=BATCH)  # fmt: skip
    try:
        trigger.start()  # LastPolledTime := the server's CURRENT_TIMESTAMP
        time.sleep(1.1)  # the rows below are stamped after the trigger's start
        with _connect() as conn, conn.cursor() as cur:
            cur.executemany(
                f"INSERT INTO `{table}` (ProductId, Version) VALUES (%s, 0)",
                [(i,) for i in range(1, PRODUCTS + 1)],
            )
    except BaseException:
        _teardown(trigger, table)
        raise
    return trigger


def _teardown(trigger: MySqlTrigger, table: str) -> None:
    try:
        trigger.drop_state()
    finally:
        trigger.conn.close()
        with _connect() as conn, conn.cursor() as cur:
            cur.execute(f"DROP TABLE IF EXISTS `{table}`")


def _writer(table: str, stop: threading.Event, outcome: Outcome, lock: threading.Lock,
            seed: int) -> None:  # fmt: skip
    rng = random.Random(seed)
    versions = outcome.final
    with _connect() as conn, conn.cursor() as cur:
        while not stop.is_set():
            pk = rng.randint(1, PRODUCTS)
            cur.execute("BEGIN")
            cur.execute(f"UPDATE `{table}` SET Version = Version + 1 WHERE ProductId = %s", (pk,))
            cur.execute(f"SELECT Version FROM `{table}` WHERE ProductId = %s", (pk,))
            (version,) = cur.fetchone()
            late = rng.random() < LATE
            if late:
                time.sleep(rng.uniform(0.5, 2.5))  # a late commit
            else:
                time.sleep(rng.uniform(0.0, 0.05))
            cur.execute("COMMIT")
            with lock:
                versions[pk] = max(versions.get(pk, 0), version)
                if late:
                    outcome.late.add((pk, version))


def replay(seconds: float = 20.0, writers: int = 4, seed: int = 1) -> Outcome:
    """Run the workload with both pollers; what each delivered."""
    table = f"products_{uuid.uuid4().hex[:8]}"
    try:
        trigger = _setup(table)
    except pymysql.err.OperationalError as exc:
        raise BenchmarkSkipped(f"MariaDB/MySQL at 127.0.0.1:3306 is unreachable: {exc}") from exc
    outcome = Outcome(final=dict.fromkeys(range(1, PRODUCTS + 1), 0))
    lock = threading.Lock()
    stop_writers, stop_polls = threading.Event(), threading.Event()
    source = SqlSource(URL, table, "az_func_updated_at", "ProductId")
    seen = outcome.ours_seen

    def function(rows: list[Row]) -> None:  # the re-enacted function: it always succeeds
        for row in rows:
            outcome.trigger_seen.setdefault(row["ProductId"], Counter())[row["Version"]] += 1

    def handler(batch: Any) -> None:
        for change in batch:
            seen.setdefault(change.pk, Counter())[change.data["Version"]] += 1

    engine = Engine(PollerConfig(name="replay", batch_size=BATCH), source, MemoryStateStore(),
                    handler, SystemClock(), owner="replay")  # fmt: skip

    def poll_both() -> None:
        while not stop_polls.is_set():
            trigger.poll(function)
            engine.run({})
            stop_polls.wait(POLL_EVERY)
        # The drain: both pollers again until the trigger finds nothing and ours is caught up
        # with nothing held back (a transaction of another client of the server can hold the
        # horizon for a while), at least three polls each.
        deadline = time.monotonic() + 120
        for polls in itertools.count(1):
            time.sleep(POLL_EVERY)
            found = trigger.poll(function).rows
            report = engine.run({})
            done = polls >= 3 and not found and report.status == "caught_up"
            if done or time.monotonic() > deadline:
                break

    threads = [
        threading.Thread(target=_writer, args=(table, stop_writers, outcome, lock, seed + i))
        for i in range(writers)
    ]
    poller = threading.Thread(target=poll_both)
    try:
        poller.start()
        for thread in threads:
            thread.start()
        time.sleep(seconds)
        stop_writers.set()
        for thread in threads:
            thread.join()
        stop_polls.set()
        poller.join()
    finally:
        stop_writers.set()
        stop_polls.set()
        source.close()
        _teardown(trigger, table)
    return outcome


def run(ctx: Context) -> BenchmarkResult:
    result = BenchmarkResult(name=BENCHMARK.name, title=BENCHMARK.title, tier=BENCHMARK.tier)
    outcome = replay(seconds=10.0 if ctx.quick else 30.0)
    changed = sum(1 for v in outcome.final.values() if v > 0)
    result.metric("final_versions", "final row versions", len(outcome.final), "count",
                  f"{changed} rows changed by the writers")  # fmt: skip
    result.metric("trigger_missed", "missed by the MySQL trigger (re-enacted)", outcome.missed(
        outcome.trigger_seen), "count")  # fmt: skip
    result.metric("trigger_missed_prompt", "of which committed at once (within 50 ms)",
                  outcome.missed(outcome.trigger_seen, prompt_only=True), "count")  # fmt: skip
    result.metric("afdb_missed", "missed by azure-functions-db", outcome.missed(outcome.ours_seen),
                  "count")  # fmt: skip
    result.metric("trigger_twice", "versions the MySQL trigger delivered twice or more",
                  Outcome.twice(outcome.trigger_seen), "count")  # fmt: skip
    result.metric("afdb_twice", "versions azure-functions-db delivered twice or more",
                  Outcome.twice(outcome.ours_seen), "count")  # fmt: skip
    result.note(
        "Counted, not timed. The trigger is re-enacted with the SQL of extension commit a28494bf "
        "(devkit/mysql_trigger.py: LastPolledTime, leases table, count-gated advance; one "
        "worker; the function always succeeds)."
    )
    return result


BENCHMARK = Benchmark(
    name="mysql_trigger_replay",
    title="MariaDB: Azure's MySQL trigger vs ours with late commits (final versions missed)",
    tier="mysql",
    run=run,
)
