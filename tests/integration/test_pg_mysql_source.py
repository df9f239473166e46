"""``SqlSource`` against the real PostgreSQL 15 and MariaDB 10.11 servers (SPEC §5.2-5.3).

No mocks: each test creates its tables in a scratch namespace of its own (a PostgreSQL schema, a
MariaDB database; see ``devkit/dbservers.py``) and reads them through the source the way the
engine does. Covered here, per dialect: ties split across batches, cursor types round-tripped
through the checkpoint codec, NULL cursors, ``latest``/``parse_cursor``/``where``, transient
errors, and the plan of the exact keyset statement on 100k rows (an index *range*, not a scan).
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import uuid
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.dialects import mysql, postgresql

from azure_functions_db.core.checkpoint import (
    Checkpoint,
    PollerKey,
    decode_checkpoint,
    encode_checkpoint,
)
from azure_functions_db.core.ports import Horizon
from azure_functions_db.core.position import Position
from azure_functions_db.errors import TransientSourceError
from azure_functions_db.sources import SqlSource
from devkit import dbservers
from tests.support.source_kit import NO_HORIZON, Db, drain, open_source

T0 = dt.datetime(2026, 1, 1, 12, 0, 0, 123456)
KEY = PollerKey("test", "poller")


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


def through_checkpoint(source: SqlSource, position: Position) -> Position:
    """``position`` stored in a checkpoint record and read back, as the state stores do."""
    record = Checkpoint(key=KEY, position=position, fence=1, source=source.description)
    decoded = decode_checkpoint(encode_checkpoint(record)).position
    assert decoded is not None
    return decoded


def orders_columns(cursor_type: Any = sa.DateTime) -> list[sa.Column[Any]]:
    return [
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("updated_at", cursor_type, nullable=True),
        sa.Column("status", sa.String(40)),
    ]


def micro_datetime(db: Db) -> Any:
    """A naive date-time type with microseconds on either server."""
    return postgresql.TIMESTAMP(precision=6) if db.dialect == "postgres" else mysql.DATETIME(fsp=6)


# --------------------------------------------------------------------------------------------
# keyset order and ties
# --------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------
# cursor types through the checkpoint codec
# --------------------------------------------------------------------------------------------

BIG = 2**53
UTC = dt.UTC
PLUS_ONE = dt.timezone(dt.timedelta(hours=1))

# (id, column type or a callable of the Db giving one, values)
TYPE_CASES: dict[str, tuple[Any, list[Any]]] = {
    "int": (sa.Integer, [3, -1, 2, 2_000_000_000]),
    "bigint": (sa.BigInteger, [BIG + 1, BIG + 2, BIG, 2**62 + 1, -(2**60)]),
    "numeric": (
        sa.Numeric(20, 6),
        [Decimal("1.000001"), Decimal("1.000000"), Decimal("-2.250000"), Decimal("12345678.5")],
    ),
}
PG_TYPES: dict[str, tuple[Any, list[Any]]] = {
    "timestamp": (
        postgresql.TIMESTAMP(precision=6),
        [T0, T0 + dt.timedelta(microseconds=1), T0 - dt.timedelta(days=400), T0.replace(year=2038)],
    ),
    "timestamptz": (
        postgresql.TIMESTAMP(timezone=True, precision=6),
        [
            T0.replace(tzinfo=UTC),
            T0.replace(tzinfo=UTC) + dt.timedelta(microseconds=1),
            T0.replace(tzinfo=PLUS_ONE),  # one hour *before* the first
            dt.datetime(1999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
        ],
    ),
    "uuid": (
        postgresql.UUID(as_uuid=True),
        [uuid.UUID(int=2**127 + 5), uuid.UUID(int=1), uuid.UUID(int=2**127 + 4), uuid.uuid4()],
    ),
}
MYSQL_TYPES: dict[str, tuple[Any, list[Any]]] = {
    "datetime6": (
        mysql.DATETIME(fsp=6),
        [T0, T0 + dt.timedelta(microseconds=1), T0 - dt.timedelta(days=400), T0.replace(year=2037)],
    ),
    "timestamp6": (
        mysql.TIMESTAMP(fsp=6),
        [T0, T0 + dt.timedelta(microseconds=1), T0 - dt.timedelta(days=400), T0.replace(year=2037)],
    ),
}
CASES = [
    *(
        pytest.param("postgres", n, id=f"postgres-{n}", marks=pytest.mark.postgres)
        for n in TYPE_CASES
    ),
    *(
        pytest.param("postgres", n, id=f"postgres-{n}", marks=pytest.mark.postgres)
        for n in PG_TYPES
    ),
    *(pytest.param("mysql", n, id=f"mysql-{n}", marks=pytest.mark.mysql) for n in TYPE_CASES),
    *(pytest.param("mysql", n, id=f"mysql-{n}", marks=pytest.mark.mysql) for n in MYSQL_TYPES),
]


@pytest.mark.parametrize(("dialect", "name"), CASES)
def test_cursor_types_resume_exactly_from_a_decoded_checkpoint(request, opened, dialect, name):
    db: Db = request.getfixturevalue("pg" if dialect == "postgres" else "maria")
    type_, values = {**TYPE_CASES, **(PG_TYPES if dialect == "postgres" else MYSQL_TYPES)}[name]
    columns = [
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("cur", type_, nullable=False),
    ]
    rows = [{"id": i, "cur": v} for i, v in enumerate(values * 3)]  # every value three times
    db.table("typed", columns, rows, index=["cur", "id"])
    source = open_source(opened, db, "typed", "cur")
    read = drain(source, 2)
    # (UUIDs compare by their integer, i.e. their 16 bytes: the server's order.)
    assert [r.position.key for r in read] == sorted((r["cur"], r["id"]) for r in rows)
    assert sorted(r.position.pk[0] for r in read) == list(range(len(rows)))
    expected_type = type(values[0])
    assert {type(r.position.cursor[0]) for r in read} == {expected_type}
    for i, row in enumerate(read[:-1]):
        decoded = through_checkpoint(source, row.position)
        assert decoded == row.position
        assert type(decoded.cursor[0]) is type(row.position.cursor[0])
        if isinstance(row.position.cursor[0], dt.datetime):
            assert decoded.cursor[0].utcoffset() == row.position.cursor[0].utcoffset()
        if isinstance(row.position.cursor[0], Decimal):
            assert str(decoded.cursor[0]) == str(row.position.cursor[0])  # exponent kept
        rest = source.fetch(decoded, len(read), NO_HORIZON)
        assert [r.position for r in rest] == [r.position for r in read[i + 1 :]], (i, row)


def test_uuid_order_is_the_servers_and_matches_the_position_order(pg, opened):
    # PostgreSQL orders uuid by its 16 bytes; Position orders UUIDs the same way.
    values = [uuid.UUID(int=2**127 + 5), uuid.UUID(int=1), uuid.UUID(int=255 << 120)]
    columns = [
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("cur", postgresql.UUID(as_uuid=True), nullable=False),
    ]
    pg.table("typed", columns, [{"id": i, "cur": v} for i, v in enumerate(values)])
    read = drain(open_source(opened, pg, "typed", "cur"), 1)
    assert [r.position.cursor[0] for r in read] == sorted(values, key=lambda u: u.bytes)


def test_xid8_cursor_reads_as_int_orders_numerically_and_resumes(pg, opened):
    # SQLAlchemy's PostgreSQL dialect has no xid8 type; the source registers one on its own
    # engine. As text, the values would be strings ("10" < "9") and `seek --cursor` could not
    # parse them as numbers.
    with pg.engine.begin() as conn:
        conn.exec_driver_sql(
            f"CREATE TABLE {pg.qualified('tx')} (id int PRIMARY KEY, cur xid8 NOT NULL)"
        )
        conn.exec_driver_sql(
            f"INSERT INTO {pg.qualified('tx')} VALUES (1, '9'), (2, '10'), (3, '9007199254740993')"
        )
    source = SqlSource(pg.url, "tx", "cur", schema=pg.schema)
    source.open({})  # no SAWarning (warnings are errors in this suite)
    opened.append(source)
    read = drain(source, 1)
    assert [r.position.cursor for r in read] == [(9,), (10,), (9007199254740993,)]
    assert all(a.position.key < b.position.key for a, b in itertools.pairwise(read))
    after = through_checkpoint(source, read[0].position)
    assert [r.position.pk for r in source.fetch(after, 10, NO_HORIZON)] == [(2,), (3,)]
    assert source.parse_cursor("10") == (10,)
    at = Position(cursor=source.parse_cursor("10"), pk=())
    assert [r.position.pk for r in source.fetch(at, 10, NO_HORIZON)] == [(2,), (3,)]


# --------------------------------------------------------------------------------------------
# NULL cursors, latest, parse_cursor, where
# --------------------------------------------------------------------------------------------


def test_latest_and_seek_from_a_parsed_cursor(db, opened):
    rows = [
        {"id": i, "updated_at": T0 + dt.timedelta(microseconds=i // 3), "status": "x"}
        for i in range(12)
    ]
    db.table("orders", orders_columns(micro_datetime(db)), rows, index=["updated_at", "id"])
    source = open_source(opened, db, "orders", "updated_at", "id")
    assert source.latest(NO_HORIZON) == Position(
        cursor=(T0 + dt.timedelta(microseconds=3),), pk=(11,)
    )
    bound = Horizon(bound=T0 + dt.timedelta(microseconds=2), method="lag")
    assert source.latest(bound) == Position(cursor=(T0 + dt.timedelta(microseconds=1),), pk=(5,))
    value = source.parse_cursor("2026-01-01T12:00:00.123458")
    assert value == (T0 + dt.timedelta(microseconds=2),)
    # A naive column holds UTC wall time: an offset is converted.
    assert source.parse_cursor("2026-01-01T13:00:00.123458+01:00") == value
    after = drain(source, 2, after=Position(cursor=value, pk=()))
    assert [r.position.pk[0] for r in after] == [6, 7, 8, 9, 10, 11]
    assert [r.position.pk[0] for r in drain(source, 2, bound)] == [0, 1, 2, 3, 4, 5]


def test_the_reflected_primary_key_keeps_its_own_order_and_the_columns_their_types(db, opened):
    """The source reflects columns and the primary key alone (no full autoload): a key declared
    ``(b, a)`` over columns ``a, b`` stays ``(b, a)`` (checkpoints store it in that order), a
    column name with a space and capitals is read, and the text column keeps its type."""
    columns = [
        sa.Column("a", sa.Integer, autoincrement=False),
        sa.Column("b", sa.Integer, autoincrement=False),
        sa.Column("Note Mixed", sa.String(40)),
        sa.Column("updated_at", micro_datetime(db)),
        sa.PrimaryKeyConstraint("b", "a"),
    ]
    rows = [
        {"a": a, "b": b, "Note Mixed": f"n{a}{b}", "updated_at": T0}
        for a, b in [(2, 1), (1, 2), (1, 1), (2, 2)]
    ]
    db.table("keyorder", columns, rows, index=["updated_at", "b", "a"])
    source = open_source(opened, db, "keyorder", "updated_at")
    assert source.description.pk == ("b", "a")
    assert source.description.columns == ("a", "b", "Note Mixed", "updated_at")
    read = drain(source, 3)
    assert [r.position.pk for r in read] == [(1, 1), (1, 2), (2, 1), (2, 2)]
    assert [r.data["Note Mixed"] for r in read] == ["n11", "n21", "n12", "n22"]
    assert isinstance(source._require_open().table.c["Note Mixed"].type, sa.String)


def test_parse_cursor_per_postgres_type(pg, opened):
    columns = [
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("tz", postgresql.TIMESTAMP(timezone=True)),
        sa.Column("u", postgresql.UUID(as_uuid=True)),
        sa.Column("n", sa.Numeric(20, 6)),
        sa.Column("big", sa.BigInteger),
    ]
    pg.table("kinds", columns, [])
    tz = open_source(opened, pg, "kinds", "tz")
    assert tz.parse_cursor("2026-01-01T13:00:00.000001+01:00") == (
        dt.datetime(2026, 1, 1, 12, 0, 0, 1, tzinfo=UTC),
    )
    assert tz.parse_cursor("2026-01-01T12:00:00")[0].tzinfo is not None  # read in UTC
    u = uuid.uuid4()
    assert open_source(opened, pg, "kinds", "u").parse_cursor(str(u)) == (u,)
    assert open_source(opened, pg, "kinds", "n").parse_cursor("1.000001") == (Decimal("1.000001"),)
    assert open_source(opened, pg, "kinds", "big").parse_cursor(str(BIG + 1)) == (BIG + 1,)


def test_parse_cursor_timestamptz_seeks_the_same_instant(pg, opened):
    columns = [
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("tz", postgresql.TIMESTAMP(timezone=True), nullable=False),
    ]
    moments = [T0.replace(tzinfo=UTC) + dt.timedelta(microseconds=i) for i in range(4)]
    pg.table("moments", columns, [{"id": i, "tz": m} for i, m in enumerate(moments)])
    source = open_source(opened, pg, "moments", "tz")
    value = source.parse_cursor("2026-01-01T13:00:00.123458+01:00")  # moments[2] in Paris time
    assert [r.position.pk[0] for r in drain(source, 1, after=Position(cursor=value, pk=()))] == [
        2,
        3,
    ]


def test_parse_cursor_per_mysql_type(maria, opened):
    columns = [
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("ts", mysql.TIMESTAMP(fsp=6), nullable=True),
        sa.Column("n", sa.Numeric(20, 6)),
        sa.Column("big", sa.BigInteger),
    ]
    maria.table("kinds", columns, [])
    ts = open_source(opened, maria, "kinds", "ts")
    assert ts.parse_cursor("2026-01-01T13:00:00.000001+01:00") == (
        dt.datetime(2026, 1, 1, 12, 0, 0, 1),
    )
    assert open_source(opened, maria, "kinds", "n").parse_cursor("-2.5") == (Decimal("-2.5"),)
    assert open_source(opened, maria, "kinds", "big").parse_cursor(str(BIG + 1)) == (BIG + 1,)


def test_where_with_bound_parameters(db, opened):
    rows = [
        {"id": i, "updated_at": T0, "status": "paid" if i % 2 else "open"} for i in range(1, 21)
    ]
    db.table("orders", orders_columns(micro_datetime(db)), rows, index=["updated_at", "id"])
    text = open_source(
        opened,
        db,
        "orders",
        "updated_at",
        "id",
        where="status = :wanted OR id = :extra",
        params={"wanted": "paid", "extra": 2},
    )
    assert [r.position.pk[0] for r in drain(text, 3)] == [1, 2, 3, 5, 7, 9, 11, 13, 15, 17, 19]
    assert text.latest(NO_HORIZON) == Position(cursor=(T0,), pk=(19,))
    clause = open_source(
        opened,
        db,
        "orders",
        "updated_at",
        "id",
        where=sa.column("status") == sa.bindparam("wanted"),
        params={"wanted": "open"},
    )
    assert [r.position.pk[0] for r in drain(clause, 4)] == list(range(2, 21, 2))
    # Quotes in a value are data, never SQL.
    hostile = open_source(
        opened, db, "orders", "updated_at", where="status = :s", params={"s": "x' OR '1'='1"}
    )
    assert hostile.fetch(None, 10, NO_HORIZON) == []


# --------------------------------------------------------------------------------------------
# transient errors
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        pytest.param(dbservers.pg_url(port=1), id="postgres", marks=pytest.mark.postgres),
        pytest.param(dbservers.mysql_url(port=1), id="mysql", marks=pytest.mark.mysql),
    ],
)
def test_unreachable_server_is_a_transient_error(url):
    source = SqlSource(
        url, "orders", "updated_at", engine_options={"connect_args": {"connect_timeout": 2}}
    )
    with pytest.raises(TransientSourceError, match=r"reflect.*orders"):
        source.open({})
    source.close()


def test_server_gone_after_open_is_a_transient_fetch_error(db, opened):
    db.table("orders", orders_columns(micro_datetime(db)), [], index=["updated_at", "id"])
    source = open_source(opened, db, "orders", "updated_at", "id")
    with source.engine.connect() as conn:  # the pooled connection the next fetch will take
        backend = conn.exec_driver_sql(
            "SELECT pg_backend_pid()" if db.dialect == "postgres" else "SELECT CONNECTION_ID()"
        ).scalar_one()
    with db.engine.connect() as admin:
        if db.dialect == "postgres":
            admin.exec_driver_sql(f"SELECT pg_terminate_backend({int(backend)})")
        else:
            admin.exec_driver_sql(f"KILL {int(backend)}")
    with pytest.raises(TransientSourceError, match="fetch"):
        source.fetch(None, 10, NO_HORIZON)
    assert source.fetch(None, 10, NO_HORIZON) == []  # the pool took a fresh connection


# --------------------------------------------------------------------------------------------
# the plan of the keyset statement on 100k rows
# --------------------------------------------------------------------------------------------

ROWS = 100_000
MID = Position(cursor=(dt.datetime(2026, 1, 1) + dt.timedelta(seconds=5_000),), pk=(50_005,))


def big_table(db: Db) -> None:
    """``big(id, updated_at, status)``: 100k rows, 10 per second, index on (updated_at, id)."""
    db.table("big", orders_columns(micro_datetime(db)), [], index=["updated_at", "id"])
    table = db.qualified("big")
    with db.engine.begin() as conn:
        if db.dialect == "postgres":
            conn.exec_driver_sql(
                f"INSERT INTO {table} (id, updated_at, status) SELECT g, "
                "timestamp '2026-01-01' + (g / 10) * interval '1 second', 'x' "
                f"FROM generate_series(1, {ROWS}) AS g"
            )
            conn.exec_driver_sql(f"ANALYZE {table}")
        else:
            conn.exec_driver_sql(
                f"INSERT INTO {table} (id, updated_at, status) SELECT seq, "
                "TIMESTAMP'2026-01-01 00:00:00' + INTERVAL (seq DIV 10) SECOND, 'x' "
                f"FROM seq_1_to_{ROWS}"
            )
            conn.exec_driver_sql(f"ANALYZE TABLE {table}")


def captured_fetch(source: SqlSource, after: Position, horizon: Horizon) -> tuple[str, Any]:
    """The exact SQL and parameters the source sends for ``fetch(after, 100, horizon)``."""
    seen: list[tuple[str, Any]] = []

    def capture(*args: Any) -> None:  # (conn, cursor, statement, parameters, context, many)
        seen.append((args[2], args[3]))

    sa.event.listen(source.engine, "before_cursor_execute", capture)
    try:
        rows = source.fetch(after, 100, horizon)
    finally:
        sa.event.remove(source.engine, "before_cursor_execute", capture)
    assert rows[0].position.pk == (after.pk[0] + 1,)
    return next((s, p) for s, p in seen if "ORDER BY" in s)


def pg_nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", ()):
        yield from pg_nodes(child)


def pg_plan(db: Db, statement: str, parameters: Any) -> list[dict[str, Any]]:
    with db.engine.connect() as conn:
        raw = conn.exec_driver_sql(f"EXPLAIN (FORMAT JSON) {statement}", parameters).scalar_one()
    document = json.loads(raw) if isinstance(raw, str) else raw
    return list(pg_nodes(document[0]["Plan"]))


def maria_plan(db: Db, statement: str, parameters: Any) -> list[dict[str, Any]]:
    with db.engine.connect() as conn:
        result = conn.exec_driver_sql(f"EXPLAIN {statement}", parameters)
        return [dict(row._mapping) for row in result]


@pytest.mark.parametrize("bounded", [False, True], ids=["no-horizon", "horizon"])
def test_keyset_statement_is_an_index_range_on_postgres(pg, opened, bounded):
    big_table(pg)
    source = open_source(opened, pg, "big", "updated_at", "id")
    assert source.check().warnings == ()
    horizon = Horizon(bound=dt.datetime(2026, 1, 1, 3), method="lag") if bounded else NO_HORIZON
    statement, parameters = captured_fetch(source, MID, horizon)
    nodes = pg_plan(pg, statement, parameters)
    shown = json.dumps(nodes, default=str)[:3000]
    scans = [n for n in nodes if n["Node Type"] in ("Index Scan", "Index Only Scan")]
    assert [n["Index Name"] for n in scans] == ["ix_big_keyset"], shown
    # The whole key is the index condition (a range start at the exact position, not a full
    # scan), so a batch that starts inside a run of tied cursor values does not re-read them.
    assert "ROW(updated_at, id) > ROW(" in scans[0]["Index Cond"], shown
    assert "Filter" not in scans[0] or "id >" not in scans[0]["Filter"], shown
    assert not [n for n in nodes if n["Node Type"] in ("Seq Scan", "Sort")], shown
    assert scans[0]["Plan Rows"] < ROWS, shown
    # Contrast: the nested form (what MariaDB and SQL Server get) bounds only `updated_at` in
    # the index and filters `id` row by row, so the assertion above tells the forms apart.
    nested = (
        f"SELECT id, updated_at, status FROM {pg.qualified('big')} WHERE updated_at >= %(c)s "
        "AND (updated_at > %(c)s OR id > %(i)s) ORDER BY updated_at, id LIMIT 100"
    )
    contrast = pg_plan(pg, nested, {"c": MID.cursor[0], "i": MID.pk[0]})
    (scan,) = [n for n in contrast if n["Node Type"] == "Index Scan"]
    assert "ROW(" not in scan["Index Cond"], contrast
    assert "id >" in scan["Filter"], contrast


@pytest.mark.parametrize("bounded", [False, True], ids=["no-horizon", "horizon"])
def test_keyset_statement_is_an_index_range_on_mariadb(maria, opened, bounded):
    big_table(maria)
    source = open_source(opened, maria, "big", "updated_at", "id")
    assert source.check().warnings == ()
    horizon = Horizon(bound=dt.datetime(2026, 1, 1, 3), method="lag") if bounded else NO_HORIZON
    statement, parameters = captured_fetch(source, MID, horizon)
    (row,) = maria_plan(maria, statement, parameters)
    assert (row["type"], row["key"]) == ("range", "ix_big_keyset"), row
    assert "Using index condition" in (row["Extra"] or ""), row
    assert int(row["rows"]) < ROWS, row
    assert "filesort" not in (row["Extra"] or ""), row  # the index delivers the order
    # Contrast: the row-value form on the same table and position is not a range, so the
    # assertion above really tells the forms apart.
    row_value = (
        f"SELECT id, updated_at, status FROM {maria.qualified('big')} "
        "WHERE (updated_at, id) > (%(c)s, %(i)s) ORDER BY updated_at, id LIMIT 100"
    )
    (contrast,) = maria_plan(maria, row_value, {"c": MID.cursor[0], "i": MID.pk[0]})
    assert contrast["type"] in ("index", "ALL"), contrast
