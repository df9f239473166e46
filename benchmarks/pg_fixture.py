"""The PostgreSQL tier's shared pieces: a scratch schema, the ``orders`` table, the baseline scans
and the engine drains.

The server is the one the tests use (PostgreSQL on 127.0.0.1:5432, trust auth, database
``test``, user ``postgres``); ``AFDB_BENCH_PG_URL`` points the benchmarks at another one. Every
run creates a schema of its own (``afdb_bench_`` + 10 hex digits) and drops it afterwards.

The table is ``orders(id bigint PRIMARY KEY, note text, updated_at timestamptz)`` with an index on
``(updated_at, id)``, built in one ``INSERT ... SELECT`` over ``generate_series`` (seconds for 1M
rows, deterministic: ``setseed`` and a serial plan). Cursor ties are realistic, as in the SQLite
tier: most timestamps hold 1-5 rows, one in ten 6-100, a rare bulk update 1,200-2,500 (more than
a batch), so ties straddle batch boundaries. Ids are spread against time by a multiplicative
permutation (``id = (n - 1) * P mod N + 1``, ``P / N`` near the golden ratio) and the rows are
inserted in id order, so the heap is in id order and a keyset scan, which follows the index,
visits a different heap page for almost every row, as on a table whose rows were updated after
they were inserted.
"""

from __future__ import annotations

import math
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import sqlalchemy as sa

from azure_functions_db.sources.sqlalchemy import SqlSource
from benchmarks import sqlite_fixture as sfx
from benchmarks.harness import BenchmarkSkipped, Context

#: The tests' server; override with ``AFDB_BENCH_PG_URL`` (a SQLAlchemy ``postgresql+psycopg``
#: URL).
DEFAULT_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
URL_ENV = "AFDB_BENCH_PG_URL"
CONNECT_TIMEOUT = 3

#: Table sizes: N by default and with ``--quick``; ``--rows`` sets N for every tier.
FULL_ROWS = 1_000_000
QUICK_ROWS = 100_000

#: Where ``python -m benchmarks`` leaves the ``--rows`` the user gave (``None``: not given).
ROWS_MEMO = "harness.rows"

SEED = 0.20261121
T0 = "2020-01-01 00:00:00+00"

Horizon = Literal["none", "auto"]
Predicate = Literal["nested", "row"]

_BUILD = """
INSERT INTO {table} (id, note, updated_at)
WITH rolls AS (
    SELECT g, random() AS roll, random() AS r_size, random() AS r_gap
    FROM generate_series(1, %(groups)s) AS g
), sized AS (
    SELECT g,
           CASE WHEN roll < 0.0005 THEN 1200 + floor(r_size * 1301)::int
                WHEN roll < 0.10 THEN 6 + floor(r_size * 95)::int
                ELSE 1 + floor(r_size * 5)::int END AS size,
           1 + floor(r_gap * 3)::int AS gap
    FROM rolls
), placed AS (
    SELECT size, sum(gap) OVER w AS secs, sum(size) OVER w - size AS before
    FROM sized WINDOW w AS (ORDER BY g)
), numbered AS (
    SELECT before + i AS n, secs
    FROM placed, generate_series(1, size) AS i
    WHERE before < %(rows)s
)
SELECT ((n - 1) * %(p)s) %% %(rows)s + 1,
       'order ' || n || ': ' || (n %% 97 + 1) || ' items for c' || (n %% 977),
       timestamptz '{t0}' + secs * interval '1 second'
FROM numbered
WHERE n <= %(rows)s
ORDER BY 1
"""

_SHAPE = """
SELECT count(*), count(DISTINCT updated_at),
       (SELECT max(c) FROM (SELECT count(*) AS c FROM {table} GROUP BY updated_at) AS ties),
       pg_total_relation_size(%(name)s)
FROM {table}
"""


def server_url() -> str:
    return os.environ.get(URL_ENV, DEFAULT_URL)


def table_rows(ctx: Context) -> int:
    """N of this tier: ``--rows`` if given, else 100,000 with ``--quick``, else 1,000,000."""
    given = ctx.memoized(ROWS_MEMO)
    if isinstance(given, int):
        return given
    return QUICK_ROWS if ctx.quick else FULL_ROWS


# --------------------------------------------------------------------------------------------
# The server, the schema, the table
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Server:
    """The server and this run's scratch schema."""

    url: str
    schema: str

    @property
    def conninfo(self) -> str:
        """The URL as a libpq connection string (for raw psycopg)."""
        url = sa.make_url(self.url)
        parts = {
            "host": url.host,
            "port": url.port,
            "user": url.username,
            "password": url.password,
            "dbname": url.database,
        }
        return " ".join(f"{k}={v}" for k, v in parts.items() if v is not None)

    def connect(self) -> Any:
        """A raw psycopg connection in autocommit mode (one round trip per statement)."""
        import psycopg

        return psycopg.connect(self.conninfo, autocommit=True, connect_timeout=CONNECT_TIMEOUT)


@contextmanager
def scratch_schema(url: str | None = None) -> Iterator[Server]:
    """A fresh schema on the server, dropped with CASCADE afterwards; skips if unreachable."""
    url = url or server_url()
    try:
        import psycopg
    except ImportError as exc:
        raise BenchmarkSkipped(f"needs psycopg (the `postgres` extra): {exc}") from exc
    server = Server(url=url, schema=f"afdb_bench_{uuid.uuid4().hex[:10]}")
    try:
        conn = server.connect()
    except psycopg.Error as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        raise BenchmarkSkipped(
            f"PostgreSQL at {sa.make_url(url).render_as_string(hide_password=True)} does not "
            f"answer ({type(exc).__name__}: {first}); set {URL_ENV} to use another server"
        ) from exc
    with conn:
        conn.execute(f'CREATE SCHEMA "{server.schema}"')
    try:
        yield server
    finally:
        with server.connect() as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{server.schema}" CASCADE')


@dataclass(frozen=True)
class OrdersTable:
    """A built ``orders`` table and the shape of its cursor ties."""

    server: Server
    name: str
    rows: int
    distinct_cursors: int
    largest_tie: int
    total_bytes: int

    @property
    def qualified(self) -> str:
        return f'"{self.server.schema}"."{self.name}"'

    def source(self, horizon: str | None = None, *, kind: type[SqlSource] = SqlSource) -> SqlSource:
        """The source a user would write for this table (``kind``: a subclass to make)."""
        return kind(
            self.server.url,
            table=self.name,
            schema=self.server.schema,
            cursor="updated_at",
            pk="id",
            horizon=horizon,
        )


def multiplier(rows: int) -> int:
    """A multiplier coprime with ``rows`` near ``rows`` times the golden ratio (a permutation)."""
    p = max(1, round(rows * 0.6180339887))
    while math.gcd(p, rows) != 1:
        p += 1
    return p


def build_orders(server: Server, rows: int) -> OrdersTable:
    """Create ``orders_<rows>`` in the schema with ``rows`` rows (deterministic for a size)."""
    name = f"orders_{rows}"
    qualified = f'"{server.schema}"."{name}"'
    with server.connect() as conn:
        conn.execute(
            f"CREATE TABLE {qualified} "
            "(id bigint PRIMARY KEY, note text NOT NULL, updated_at timestamptz)"
        )
        with conn.transaction():
            conn.execute("SET LOCAL max_parallel_workers_per_gather = 0")  # one random() stream
            conn.execute("SELECT setseed(%s)", (SEED,))
            # The mean tie is about 8.9 rows; a quarter of N groups is always enough.
            conn.execute(
                _BUILD.format(table=qualified, t0=T0),
                {"groups": rows // 4 + 10, "rows": rows, "p": multiplier(rows)},
            )
        conn.execute(f'CREATE INDEX "ix_{name}_keyset" ON {qualified} (updated_at, id)')
        conn.execute(f"VACUUM ANALYZE {qualified}")
        count, distinct, largest, size = conn.execute(
            _SHAPE.format(table=qualified), {"name": f"{server.schema}.{name}"}
        ).fetchone()
    if count != rows:
        raise RuntimeError(f"built {count} rows instead of {rows}")
    return OrdersTable(
        server=server,
        name=name,
        rows=rows,
        distinct_cursors=distinct,
        largest_tie=largest or 0,
        total_bytes=size,
    )


# --------------------------------------------------------------------------------------------
# Baselines
# --------------------------------------------------------------------------------------------


def raw_statements(db: OrdersTable, predicate: Predicate) -> tuple[str, str]:
    """The first and the following batch statements of the raw psycopg scan."""
    select = f"SELECT id, note, updated_at FROM {db.qualified} "
    first = select + "WHERE updated_at IS NOT NULL ORDER BY updated_at, id LIMIT %s"
    if predicate == "nested":
        after = "WHERE updated_at >= %s AND (updated_at > %s OR id > %s) "
    else:
        after = "WHERE (updated_at, id) > (%s, %s) "
    return first, select + after + "ORDER BY updated_at, id LIMIT %s"


def raw_scan(
    db: OrdersTable, batch_size: int, predicate: Predicate = "nested", *, column: bool = False
) -> int:
    """Baseline A: drain the table with psycopg keyset batches; return the row count.

    One autocommit connection, ``fetchall()`` into tuples (psycopg's default row factory);
    psycopg prepares the repeated statement on the server after its fifth execution.
    ``column``: also read one column (``note``) of every row from its tuple, as the baseline of
    a handler that reads one.
    """
    first, following = raw_statements(db, predicate)
    with db.server.connect() as conn:
        cur = conn.cursor()
        rows = cur.execute(first, (batch_size,)).fetchall()
        total = 0
        while rows:
            total += len(rows)
            if column:
                for row in rows:
                    row[1]
            if len(rows) < batch_size:
                break
            pk, _, cursor = rows[-1]
            params = (cursor, cursor, pk) if predicate == "nested" else (cursor, pk)
            rows = cur.execute(following, (*params, batch_size)).fetchall()
        return total


def core_scan(db: OrdersTable, batch_size: int) -> int:
    """Baseline B: the nested keyset scan through SQLAlchemy Core on one connection."""
    table = sa.Table(
        db.name,
        sa.MetaData(),
        sa.Column("id", sa.BigInteger, primary_key=True),
        sa.Column("note", sa.Text),
        sa.Column("updated_at", sa.DateTime(timezone=True)),
        schema=db.server.schema,
    )
    return sfx.core_keyset_scan(sa.create_engine(db.server.url), table, batch_size)


# --------------------------------------------------------------------------------------------
# The engine
# --------------------------------------------------------------------------------------------
