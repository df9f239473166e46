"""PostgreSQL: a poller writing through ``SqlSink`` against the same handler inserting through its
own connection, same run.

One ``orders`` table of N/5 rows (200,000; 20,000 with ``--quick``) in a scratch schema is drained
by an engine (``SqlSource``, ``horizon="none"``, a ``LocalStateStore`` from an empty directory,
batches of ``--batch-size``) whose handler copies each batch into ``orders_copy`` (same columns,
``id`` primary key), emptied before every drain:

PostgreSQL unreachable: ``BenchmarkSkipped`` (from :func:`benchmarks.pg_fixture.scratch_schema`).

- ``own``, the baseline of SPEC §9: the handler inserts the batch through its own psycopg
  connection, opened once per drain: ``executemany`` of one ``INSERT`` (psycopg 3 pipelines it)
  of a tuple per row (``itemgetter("id", "note", "updated_at")(change.data)``) and ``commit()``
  per batch;
- ``core``: the same through SQLAlchemy, ``conn.execute(insert(table), rows)`` and
  ``conn.commit()`` per batch on one connection;
- ``sink``: ``SqlSink`` (a new one per drain, as a new worker process builds it) and
  ``writer.insert("orders_copy", batch)``: the rows and the poller's position record in one
  transaction, fenced.

If MariaDB answers (``AFDB_BENCH_MYSQL_URL``, default the tests' server), the same three drains
write into a scratch database there (``own``: PyMySQL ``executemany``, which sends one multi-row
``INSERT``). Repetitions are interleaved (own, core, sink, own, ...), the best of ``--repeats`` is
kept, and every drain is checked to have copied every row.
"""

from __future__ import annotations

import operator
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from azure_functions_db.core.batch import Batch
from azure_functions_db.core.clock import SystemClock
from azure_functions_db.core.engine import Engine, Handler
from azure_functions_db.sinks.sql import SqlSink
from azure_functions_db.sinks.writes import SqlWriter
from benchmarks import engine_runs as runs
from benchmarks import maria_fixture as maria
from benchmarks import pg_fixture as pg
from benchmarks.harness import (
    Benchmark,
    BenchmarkResult,
    Context,
    Timing,
    best_of,
    timed,
)

TARGET = "issue 31: >= 0.9"
COPY = "orders_copy"
POSITIONS = "afdb_positions"
#: The source table is N / ``SHARE`` rows: every drain inserts each of its rows once more.
SHARE = 5


def sink_rows(ctx: Context) -> int:
    """The source table's size: a fifth of the tier's N."""
    return max(pg.table_rows(ctx) // SHARE, 10)


@dataclass(frozen=True)
class Target:
    """Where the handlers copy the rows: a SQLAlchemy URL (``schema``: the tables' schema on
    PostgreSQL; on MariaDB the URL names the scratch database) and a raw DBAPI connector."""

    name: str
    url: str
    schema: str | None
    connect: Callable[[], Any]  # a DBAPI connection in a transaction (not autocommit)

    @property
    def qualified(self) -> str:
        return f'"{self.schema}"."{COPY}"' if self.schema else f"`{COPY}`"

    def execute(self, *statements: str) -> list[Any]:
        """Run ``statements`` in one committed transaction; the first column of each last row."""
        results = []
        conn = self.connect()
        try:
            cur = conn.cursor()
            for statement in statements:
                cur.execute(statement)
                row = cur.fetchone() if cur.description else None
                results.append(row[0] if row else None)
            conn.commit()
        finally:
            conn.close()
        return results

    def empty(self) -> None:
        """Empty the copy and the sink's position table (if the sink created it)."""
        tables = [self.qualified]
        positions = f'"{self.schema}"."{POSITIONS}"' if self.schema else f"`{POSITIONS}`"
        exists = self.execute(self._exists(POSITIONS))[0]
        if exists:
            tables.append(positions)
        self.execute(*(f"DELETE FROM {t}" for t in tables))

    def count(self) -> int:
        return int(self.execute(f"SELECT count(*) FROM {self.qualified}")[0])

    def _exists(self, table: str) -> str:
        if self.schema:
            return f'SELECT to_regclass(\'"{self.schema}"."{table}"\') IS NOT NULL'
        return (
            "SELECT count(*) FROM information_schema.TABLES "
            f"WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = '{table}'"
        )


def pg_target(server: pg.Server) -> Target:
    import psycopg

    target = Target(
        name="pg",
        url=server.url,
        schema=server.schema,
        connect=lambda: psycopg.connect(server.conninfo, connect_timeout=pg.CONNECT_TIMEOUT),
    )
    target.execute(
        f"CREATE TABLE {target.qualified} "
        "(id bigint PRIMARY KEY, note text NOT NULL, updated_at timestamptz)"
    )
    return target


@contextmanager
def mysql_target() -> Iterator[Target | str]:
    """A scratch database on MariaDB with ``orders_copy``, dropped afterwards; or why not."""
    with maria.scratch_database() as scratch:
        if isinstance(scratch, str):
            yield scratch
            return
        target = Target(name="maria", url=scratch.url, schema=None, connect=scratch.connect)
        target.execute(
            f"CREATE TABLE {target.qualified} (id bigint PRIMARY KEY, note text NOT NULL, "
            "updated_at datetime(6)) ENGINE=InnoDB"
        )
        yield target


#: The baseline's values of a row: ``change.data`` read once per row (not once per column).
_VALUES = operator.itemgetter("id", "note", "updated_at")


def _params(batch: Batch) -> list[tuple[Any, Any, Any]]:
    return [_VALUES(c.data) for c in batch]


def own_drain(db: pg.OrdersTable, target: Target, ctx: Context, tag: str) -> int:
    """Baseline: the handler's own DBAPI connection, ``executemany`` + ``commit()`` per batch."""
    conn = target.connect()
    insert = f"INSERT INTO {target.qualified} (id, note, updated_at) VALUES (%s, %s, %s)"

    def handler(batch: Batch) -> None:
        with conn.cursor() as cur:
            cur.executemany(insert, _params(batch))
        conn.commit()

    try:
        return _drain(db, ctx, tag, handler)
    finally:
        conn.close()


def core_drain(db: pg.OrdersTable, target: Target, ctx: Context, tag: str) -> int:
    """SQLAlchemy: ``conn.execute(insert(table), rows)`` + ``conn.commit()`` per batch."""
    engine = sa.create_engine(target.url, poolclass=sa.NullPool)
    table = sa.Table(COPY, sa.MetaData(), autoload_with=engine, schema=target.schema)
    insert = sa.insert(table)
    try:
        with engine.connect() as conn:

            def handler(batch: Batch) -> None:
                conn.execute(insert, [c.data for c in batch])
                conn.commit()

            return _drain(db, ctx, tag, handler)
    finally:
        engine.dispose()


def sink_drain(db: pg.OrdersTable, target: Target, ctx: Context, tag: str) -> int:
    """``SqlSink`` and ``writer.insert``: rows and position record in one transaction."""

    def handler(batch: Batch, writer: SqlWriter) -> None:
        writer.insert(COPY, batch)

    sink = SqlSink(target.url, schema=target.schema)
    try:
        return _drain(db, ctx, tag, handler, sink)
    finally:
        sink.close()


def _drain(
    db: pg.OrdersTable, ctx: Context, tag: str, handler: Handler, sink: SqlSink | None = None
) -> int:
    source = db.source("none")
    config = runs.poller_config(ctx.batch_size)
    store = runs.fresh_local_store(ctx.workdir / f"sinks_state_{tag}")
    engine = Engine(config, source, store, handler, SystemClock(), owner=runs.OWNER, sink=sink)
    try:
        return runs.drained(engine.run({}), db)
    finally:
        source.close()


Drain = Callable[[pg.OrdersTable, Target, Context, str], int]
DRAINS: dict[str, tuple[Drain, str]] = {
    "own": (own_drain, "handler's own connection: executemany + commit per batch"),
    "core": (core_drain, "SQLAlchemy conn.execute(insert(t), rows) + commit per batch"),
    "sink": (sink_drain, "SqlSink, writer.insert(table, batch)"),
}


def _timed_drain(
    drain: Drain, db: pg.OrdersTable, target: Target, ctx: Context
) -> tuple[float, float]:
    """One drain into an emptied ``target``: its wall time and this process's CPU time."""
    target.empty()  # untimed
    cpu = time.process_time()
    rows, seconds = timed(lambda: drain(db, target, ctx, target.name))
    cpu = time.process_time() - cpu
    copied = target.count()
    if copied != rows:
        raise RuntimeError(f"{drain.__name__} copied {copied} of {rows} rows into {target.name}")
    return seconds, cpu


def _detail(timing: Timing) -> str:
    each = ", ".join(f"{s:.3f}" for s in timing.all_seconds)
    return f"best of {timing.repeats}: {timing.seconds:.3f} s (runs {each})"


def _load() -> str:
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        return "load average unknown"
    return f"load average {one:.2f}, {five:.2f}, {fifteen:.2f}"


def run(ctx: Context) -> BenchmarkResult:
    result = BenchmarkResult(name=BENCHMARK.name, title=BENCHMARK.title, tier=BENCHMARK.tier)
    rows = sink_rows(ctx)
    with pg.scratch_schema() as server, mysql_target() as maria:
        ctx.progress(f"building PostgreSQL table orders_{rows} ({rows:,} rows)")
        db = pg.build_orders(server, rows)
        targets = [pg_target(server)]
        if isinstance(maria, Target):
            targets.append(maria)
        else:
            result.note(f"The MariaDB target was not measured: {maria}")
        for target in targets:  # warm the caches and the code paths once, untimed
            for drain, _ in DRAINS.values():
                _timed_drain(drain, db, target, ctx)
        load_before = _load()
        samples: dict[tuple[str, str], list[tuple[int, float]]] = {}
        cpu: dict[tuple[str, str], list[float]] = {}
        for i in range(ctx.repeats):
            for target in targets:
                ctx.progress(f"{target.name}: own, core, sink drains ({i + 1}/{ctx.repeats})")
                for name, (drain, _) in DRAINS.items():
                    seconds, used = _timed_drain(drain, db, target, ctx)
                    samples.setdefault((target.name, name), []).append((rows, seconds))
                    cpu.setdefault((target.name, name), []).append(used)
        load_after = _load()

    result.metric("rows", "source table rows (N/5)", rows, "rows", f"batch {ctx.batch_size}")
    for target in targets:
        where = "PostgreSQL" if target.name == "pg" else "MariaDB"
        prefix = "" if target.name == "pg" else "maria_"
        for name, (_, label) in DRAINS.items():
            timing = best_of(samples[(target.name, name)])
            result.metric(
                f"{prefix}{name}_rps",
                f"{where}: {label}",
                timing.rows_per_second,
                "rows/s",
                _detail(timing),
            )
            result.metric(
                f"{prefix}{name}_cpu",
                f"{where}: client CPU time, {name}",
                min(cpu[(target.name, name)]) / rows * 1e6,
                "µs/row",
                f"least of {ctx.repeats}; this process only (not the servers')",
            )
        result.ratio(
            f"{prefix}sqlsink_insert_vs_own_connection",
            f"{where}: SqlSink writer.insert / own connection",
            f"{prefix}sink_rps",
            f"{prefix}own_rps",
            TARGET,
        )
        result.ratio(
            f"{prefix}sqlsink_insert_vs_sqlalchemy",
            f"{where}: SqlSink writer.insert / plain SQLAlchemy",
            f"{prefix}sink_rps",
            f"{prefix}core_rps",
        )
        result.ratio(
            f"{prefix}sqlalchemy_vs_own_connection",
            f"{where}: plain SQLAlchemy / own connection",
            f"{prefix}core_rps",
            f"{prefix}own_rps",
        )
    result.note(f"Machine {load_before} before the timed drains, {load_after} after.")
    result.note(
        "Each drain is a whole engine run from an empty local state store (source open, lease, "
        'fence, every batch read with horizon="none", the handler, the fsync\'d checkpoint '
        "commit, the release); the sink drains also open a new SqlSink (position table check, "
        "reflection of the copy) and claim its record. The copy and the position table are "
        "emptied before each drain, untimed."
    )
    return result


BENCHMARK = Benchmark(
    name="pg_sinks",
    title="PostgreSQL (+ MariaDB): SqlSink vs the handler's own connection, same run",
    tier="postgres",
    run=run,
)
