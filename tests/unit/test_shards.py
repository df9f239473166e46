"""Sharded pollers (``shards=N``) on SQLite: every row in exactly one shard, each version of a
row in the same shard and in order, the shard's index found or named, the errors a user meets.

The dialects without a server here (PostgreSQL, MySQL, MariaDB, SQL Server) are checked as SQL
text; tests/integration/test_shards.py runs the first three on the real servers.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import azure.functions as func
import pytest
import sqlalchemy as sa
from sqlalchemy.dialects import mssql, mysql, postgresql, sqlite

import azure_functions_db as afdb
from azure_functions_db.core.batch import event_id
from azure_functions_db.core.config import PollerConfig
from azure_functions_db.core.position import Position
from azure_functions_db.core.quarantine import QuarantineRecord
from azure_functions_db.errors import ConfigurationError, SourceDefinitionError
from azure_functions_db.sources import shards
from azure_functions_db.testing import MemorySource
from tests.support.sqlite_orders import T0, Orders


@pytest.fixture
def orders(tmp_path: Path):
    table = Orders(tmp_path / "orders.db")
    table.insert([*range(-7, 0), *range(1, 120)])
    yield table
    table.close()


def sharded(orders: Orders, tmp_path: Path, count: int, seen: list[Any], **kw: Any):
    db = afdb.PollerBlueprint()

    @db.poller(
        name="orders",
        schedule="*/5 * * * * *",
        source=afdb.SqlSource(url=orders.url, table="orders", cursor="updated_at", pk="id"),
        state=afdb.LocalStateStore(tmp_path / "state"),
        batch_size=7,
        shards=count,
        **kw,
    )
    def on_orders(batch: afdb.Batch) -> None:
        seen.extend((batch.poller, c.poller, c.pk, c.data["note"], c.event_id) for c in batch)

    return db


def test_every_row_is_delivered_by_exactly_one_shard_and_a_row_stays_in_its_shard(orders, tmp_path):
    seen: list[Any] = []
    db = sharded(orders, tmp_path, 3, seen)
    assert list(db.pollers) == [f"orders.shard-{i}-of-3" for i in range(3)]
    for definition in db.pollers.values():
        definition.run_once({})
    ids = [row[2] for row in seen]
    assert sorted(ids) == [*range(-7, 0), *range(1, 120)]  # each row once, none lost
    shard_of = {row[2]: row[0] for row in seen}
    assert len(set(shard_of.values())) == 3
    # The database's expression decides, negative keys included: ((id % 3) + 3) % 3.
    assert all(shard == f"orders.shard-{pk % 3}-of-3" for pk, shard in shard_of.items())
    # A new version of a row goes to the row's shard, after the one it had.
    orders.touch([5, -4, 100], T0 + dt.timedelta(days=1))
    before = len(seen)
    for definition in db.pollers.values():
        definition.run_once({})
    again = {row[2]: row[0] for row in seen[before:]}
    assert again == {pk: shard_of[pk] for pk in (5, -4, 100)}


def test_changes_carry_the_pollers_name_so_event_ids_match_an_unsharded_poller(orders, tmp_path):
    seen: list[Any] = []
    db = sharded(orders, tmp_path, 2, seen)
    for definition in db.pollers.values():
        definition.run_once({})
    for batch_poller, change_poller, pk, _, eid in seen:
        assert batch_poller.startswith("orders.shard-")
        assert change_poller == "orders"
        position = Position((T0 + dt.timedelta(seconds=pk // 3),), (pk,))
        assert eid == event_id("orders", position)


def test_each_shard_is_its_own_timer_function_checkpoint_and_health(orders, tmp_path):
    seen: list[Any] = []
    db = sharded(orders, tmp_path, 4, seen)
    app = func.FunctionApp()
    app.register_functions(db)
    names = sorted(f.get_function_name() for f in app.get_functions())
    assert names == [f"poll_orders_shard_{i}_of_4" for i in range(4)]
    definition = db.pollers["orders.shard-2-of-4"]
    definition.run_once({})
    store = definition.store({})
    assert store.inspect(definition.config.key).holder is None
    checkpoint = store.read(definition.config.key)
    assert checkpoint is not None
    assert "shard 2 of 4" in (checkpoint.checkpoint.source.where or "")
    assert store.read(db.pollers["orders.shard-1-of-4"].config.key) is None  # not run yet


def test_a_quarantine_replay_of_a_shard_carries_the_pollers_name(tmp_path):
    config = PollerConfig(name="orders.shard-0-of-2", group="orders")
    key = config.key
    changes = (afdb.Change({"id": 1}, Position((1,), (1,)), key.poller),)
    record = QuarantineRecord(
        key=key,
        id="q-1",
        before=None,
        after=Position((1,), (1,)),
        changes=changes,
        error="x",
        attempts=3,
        fence=1,
        at=T0,
    )
    assert [c.poller for c in record.batch(fence=2, attempt=1)] == ["orders.shard-0-of-2"]
    batch = record.batch(fence=2, attempt=1, poller=config.changes_poller)
    assert batch.poller == "orders.shard-0-of-2"
    assert [c.poller for c in batch] == ["orders"]
    assert batch.changes[0].event_id == event_id("orders", Position((1,), (1,)))


@pytest.mark.parametrize(
    ("dialect", "expected"),
    [
        (
            postgresql.dialect(),
            "mod(coalesce(hashtext(CAST(id AS text))::bigint, 0) + 2147483648, 4)",
        ),
        (mysql.dialect(), "MOD(COALESCE(CRC32(id), 0), 4)"),
        (mssql.dialect(), "(COALESCE(CAST(CHECKSUM(id) AS BIGINT), 0) + 2147483648) % 4"),
        (sqlite.dialect(), "((COALESCE(id, 0) % 4) + 4) % 4"),
    ],
    ids=["postgresql", "mysql", "mssql", "sqlite"],
)
def test_the_shard_expression_per_dialect(dialect, expected):
    table = sa.Table("t", sa.MetaData(), sa.Column("id", sa.Integer, primary_key=True))
    assert shards.expression_text(dialect, [table.c.id], 4) == expected


def test_composite_keys_hash_every_column_and_quote_odd_names():
    table = sa.Table(
        "t",
        sa.MetaData(),
        sa.Column("Tenant", sa.String(10), primary_key=True),
        sa.Column("order", sa.Integer, primary_key=True),
    )
    pk = [table.c.Tenant, table.c.order]
    assert shards.expression_text(postgresql.dialect(), pk, 2) == (
        'mod(coalesce(hashtext(CAST("Tenant" AS text) || \'|\' || CAST("order" AS text))'
        "::bigint, 0) + 2147483648, 2)"
    )
    assert shards.expression_text(mysql.dialect(), pk, 2) == (
        "MOD(COALESCE(CRC32(CONCAT_WS('|', WEIGHT_STRING(RTRIM(`Tenant`)), `order`)), 0), 2)"
    )
    with pytest.raises(SourceDefinitionError, match="SQLite has no hash function"):
        shards.expression_text(sqlite.dialect(), pk, 2)


def test_the_index_ddl_per_dialect():
    table = sa.Table("orders", sa.MetaData(), sa.Column("id", sa.Integer, primary_key=True))
    args: dict[str, Any] = {
        "table": "app.orders",
        "bare": "orders",
        "cursor": ["updated_at"],
        "pk": [table.c.id],
        "count": 3,
    }
    (pg,) = shards.ddl(postgresql.dialect(), **args)
    assert pg.startswith("CREATE INDEX CONCURRENTLY ix_orders_afdb_shard_3 ON app.orders ((mod(")
    assert pg.endswith("), updated_at, id)")
    maria = mysql.dialect()
    maria.is_mariadb = True
    (alter,) = shards.ddl(maria, **args)
    assert alter == (
        "ALTER TABLE app.orders ADD COLUMN afdb_shard_3 SMALLINT AS "
        "(MOD(COALESCE(CRC32(id), 0), 3)) VIRTUAL, ADD INDEX ix_orders_afdb_shard_3 "
        "(afdb_shard_3, updated_at, id)"
    )
    add, index = shards.ddl(mssql.dialect(), **args)
    assert add.startswith("ALTER TABLE app.orders ADD afdb_shard_3 AS (")
    assert add.endswith(") PERSISTED")
    assert (
        index == "CREATE INDEX ix_orders_afdb_shard_3 ON app.orders (afdb_shard_3, updated_at, id)"
    )


def test_check_names_the_missing_shard_index_and_finds_it_once_created(orders, tmp_path):
    source = afdb.SqlSource(url=orders.url, table="orders", cursor="updated_at", pk="id")
    part = source.shard(1, 3)
    part.open({})
    try:
        (warning,) = part.check().warnings
        expected = shards.ddl(
            part.engine.dialect,
            table="orders",
            bare="orders",
            cursor=["updated_at"],
            pk=part.pk_columns,
            count=3,
        )
        assert expected[0] in warning
        with orders.engine.begin() as conn:
            conn.exec_driver_sql(expected[0])
        assert part.check().warnings == ()
        # ... and SQLite plans the shard's batch as a range of that index.
        with part.engine.connect() as conn:
            plan = conn.exec_driver_sql(
                "EXPLAIN QUERY PLAN SELECT id FROM orders WHERE "
                f"{shards.expression_text(part.engine.dialect, part.pk_columns, 3)} = 1 "
                "AND updated_at > '2026' ORDER BY updated_at, id LIMIT 5"
            ).fetchall()
        detail = " ".join(str(row[-1]) for row in plan)
        assert "ix_orders_afdb_shard_3" in detail, detail
        assert "TEMP B-TREE" not in detail, detail  # no sort: the index gives the order
    finally:
        part.close()


def test_a_generated_shard_column_is_used_and_its_stray_values_reported(tmp_path):
    url = f"sqlite:///{tmp_path / 'g.db'}"
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "CREATE TABLE g (id TEXT PRIMARY KEY, updated_at INTEGER NOT NULL, "
            "afdb_shard_2 INTEGER GENERATED ALWAYS AS (length(id) - 1) VIRTUAL)"
        )
        conn.exec_driver_sql("CREATE INDEX ix_g ON g (afdb_shard_2, updated_at, id)")
        conn.exec_driver_sql(
            "INSERT INTO g (id, updated_at) VALUES ('a', 1), ('bb', 2), ('ccc', 3)"
        )
    parts = [
        afdb.SqlSource(url=url, table="g", cursor="updated_at", pk="id").shard(i, 2)
        for i in range(2)
    ]
    got = []
    for part in parts:
        part.open({})
        got.append([r.position.pk for r in part.fetch(None, 10, afdb_no_horizon())])
    assert got == [[("a",)], [("bb",)]]
    (warning,) = parts[0].check().warnings  # 'ccc' has shard value 2: no shard reads it
    assert "1 row(s) of `g` hold no shard's value in `afdb_shard_2`" in warning
    for part in parts:
        part.close()
    engine.dispose()


def test_a_plain_shard_column_is_refused(tmp_path):
    url = f"sqlite:///{tmp_path / 'p.db'}"
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "CREATE TABLE p (id INTEGER PRIMARY KEY, updated_at INTEGER, afdb_shard_2 INTEGER)"
        )
    part = afdb.SqlSource(url=url, table="p", cursor="updated_at", pk="id").shard(0, 2)
    with pytest.raises(SourceDefinitionError, match="must be a generated"):
        part.open({})
    engine.dispose()


@pytest.mark.parametrize("bad", [0, 1, 65, True, 2.0, "4"])
def test_shards_must_be_a_whole_number_from_2_to_64(orders, tmp_path, bad):
    with pytest.raises(
        ConfigurationError,
        match=r"`shards=.*` \(poller `orders`\) must be a whole number from 2 to 64",
    ):
        sharded(orders, tmp_path, bad, [])


def test_a_source_that_cannot_shard_and_a_name_too_long_are_named(tmp_path):
    db = afdb.PollerBlueprint()
    with pytest.raises(ConfigurationError, match="needs a source that can shard"):
        db.poller(name="m", schedule="* * * * * *", source=MemorySource("m", "c", "id"), shards=2)
    source = afdb.SqlSource(url="sqlite://", table="t", cursor="c", pk="id")
    with pytest.raises(ConfigurationError, match="too long for 10 shards"):
        db.poller(name="o" * 55, schedule="* * * * * *", source=source, shards=10)
    assert db.pollers == {}


def test_a_shard_is_its_own_unopened_source_and_not_sharded_again(orders):
    source = afdb.SqlSource(url=orders.url, table="orders", cursor="updated_at", pk="id")
    source.open({})
    part = source.shard(0, 2)
    assert part.description.where == "shard 0 of 2"  # not open: no term yet
    part.open({})
    assert part.engine is not source.engine
    assert len(part.fetch(None, 500, afdb_no_horizon())) < len(
        source.fetch(None, 500, afdb_no_horizon())
    )
    part.close()
    assert source.fetch(None, 1, afdb_no_horizon())  # the source it came from stays open
    source.close()
    with pytest.raises(ConfigurationError, match="shard an unsharded source"):
        part.shard(1, 2)
    with pytest.raises(ConfigurationError, match="shard 2 does not exist among 2"):
        source.shard(2, 2)


def afdb_no_horizon() -> Any:
    from tests.support.source_kit import NO_HORIZON

    return NO_HORIZON


def test_validate_names_the_shard_index_then_finds_it(orders, tmp_path):
    from azure_functions_db.ops.validate import validate_poller

    db = sharded(orders, tmp_path, 2, [])
    definition = db.pollers["orders.shard-1-of-2"]
    (index,) = [f for f in validate_poller(definition, {}).findings if f.check == "index"]
    assert index.level == "warning"
    assert index.fix == (
        "CREATE INDEX ix_orders_afdb_shard_2 ON orders "
        "((((COALESCE(id, 0) % 2) + 2) % 2), updated_at, id)"
    )
    with orders.engine.begin() as conn:
        conn.exec_driver_sql(index.fix)
    (index,) = [f for f in validate_poller(definition, {}).findings if f.check == "index"]
    assert index.level == "ok", index


@pytest.mark.parametrize(
    ("dialect", "column_type"),
    [
        (postgresql.dialect(), sa.DateTime(timezone=True)),  # text follows TimeZone, DateStyle
        (postgresql.dialect(), sa.LargeBinary()),  # bytea_output
        (postgresql.dialect(), sa.Float()),  # extra_float_digits
        (mysql.dialect(), sa.DateTime()),  # a TIMESTAMP follows time_zone
    ],
    ids=["pg-timestamptz", "pg-bytea", "pg-float", "mysql-datetime"],
)
def test_a_key_whose_text_depends_on_the_session_needs_a_generated_column(dialect, column_type):
    table = sa.Table(
        "t",
        sa.MetaData(),
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("at", column_type, primary_key=True),
    )
    with pytest.raises(SourceDefinitionError, match=r"Key column `at` .* add a generated column"):
        shards.expression_text(dialect, [table.c.id, table.c.at], 4)


@pytest.mark.parametrize(
    ("expression", "refused"),
    [("((COALESCE(id, 0) % 2) + 2) % 2", False), ("(id + 1) % 2", True)],
    ids=["the-shard-expression", "another-expression"],
)
def test_a_generated_shard_column_must_agree_with_the_shard_expression(
    tmp_path, expression, refused
):
    """Else a switch between the expression and the column (adding the column later, for its
    index) would move rows between shards: some skipped, others repeated."""
    url = f"sqlite:///{tmp_path / 'c.db'}"
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "CREATE TABLE c (id INTEGER PRIMARY KEY, updated_at INTEGER NOT NULL, "
            f"afdb_shard_2 INTEGER GENERATED ALWAYS AS ({expression}) VIRTUAL)"
        )
        conn.exec_driver_sql("CREATE INDEX ix_c ON c (afdb_shard_2, updated_at, id)")
        conn.exec_driver_sql("INSERT INTO c (id, updated_at) VALUES (1, 1), (2, 2), (3, 3)")
    part = afdb.SqlSource(url=url, table="c", cursor="updated_at", pk="id").shard(0, 2)
    part.open({})
    try:
        if refused:
            with pytest.raises(SourceDefinitionError, match=r"puts 3 of the newest 1000 rows"):
                part.check()
        else:
            assert part.check().warnings == ()
    finally:
        part.close()
        engine.dispose()
