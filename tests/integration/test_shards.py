"""Sharded sources on the real PostgreSQL and MariaDB: the shards split the table exactly, the
index ``check()`` names is the one each shard's batch is planned on (an index range, no sort),
with and without it.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest
import sqlalchemy as sa

from azure_functions_db.core.position import Position
from azure_functions_db.sources import SqlSource
from tests.integration.test_pg_mysql_source import MID, ROWS, big_table, maria_plan, pg_plan
from tests.support.source_kit import NO_HORIZON, Db

pytestmark = pytest.mark.slow

SHARDS = 4


def shard_sources(db: Db, opened: list[SqlSource]) -> list[SqlSource]:
    parts = []
    for index in range(SHARDS):
        part = SqlSource(db.url, "big", "updated_at", "id", schema=db.schema).shard(index, SHARDS)
        part.open({})
        opened.append(part)
        parts.append(part)
    return parts


def batch_statement(source: SqlSource, after: Position) -> tuple[str, Any, list[Any]]:
    """The SQL and parameters of ``fetch(after, 100)``, and the pks it returned."""
    seen: list[tuple[str, Any]] = []

    def capture(*args: Any) -> None:  # (conn, cursor, statement, parameters, context, many)
        seen.append((args[2], args[3]))

    sa.event.listen(source.engine, "before_cursor_execute", capture)
    try:
        rows = source.fetch(after, 100, NO_HORIZON)
    finally:
        sa.event.remove(source.engine, "before_cursor_execute", capture)
    statement, parameters = next((s, p) for s, p in seen if "ORDER BY" in s)
    return statement, parameters, [row.position.pk[0] for row in rows]


def split_exactly(db: Db, parts: list[SqlSource]) -> None:
    """Each row in one shard: the shards' counts add up to the table, and their first batches
    after ``MID`` share no row."""
    counts = [part.rows_after(None, NO_HORIZON, cap=ROWS + 1) for part in parts]
    assert sum(counts) == ROWS, counts
    assert min(counts) > ROWS / SHARDS / 2, counts  # a hash, not one shard taking all
    firsts = [batch_statement(part, MID)[2] for part in parts]
    assert len({pk for first in firsts for pk in first}) == 100 * SHARDS
    assert all(pk > MID.pk[0] for first in firsts for pk in first)


def test_postgres_shards_split_the_table_and_each_batch_is_an_index_range(pg, opened):
    big_table(pg)
    parts = shard_sources(pg, opened)
    split_exactly(pg, parts)
    (warning,) = parts[1].check().warnings
    assert f"CREATE INDEX CONCURRENTLY ix_big_afdb_shard_{SHARDS}" in warning
    ddl = warning[warning.index("`CREATE") + 1 : warning.rindex("`")]
    with pg.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql(ddl)
        conn.exec_driver_sql(f"ANALYZE {pg.qualified('big')}")
    assert parts[1].check().warnings == ()
    statement, parameters, _ = batch_statement(parts[1], MID)
    nodes = pg_plan(pg, statement, parameters)
    shown = json.dumps(nodes, default=str)[:3000]
    scans = [n for n in nodes if n["Node Type"] in ("Index Scan", "Index Only Scan")]
    assert [n["Index Name"] for n in scans] == [f"ix_big_afdb_shard_{SHARDS}"], shown
    assert "hashtext" in scans[0]["Index Cond"], shown  # the shard bounds the index range...
    assert "ROW(updated_at, id) > ROW(" in scans[0]["Index Cond"], shown  # ...and so the key
    assert not [n for n in nodes if n["Node Type"] in ("Seq Scan", "Sort")], shown
    split_exactly(pg, parts)  # the index changes the plan, not the split


def test_mariadb_shards_use_the_generated_column_and_its_index(maria, opened):
    big_table(maria)
    parts = shard_sources(maria, opened)
    split_exactly(maria, parts)  # the expression works without the column (a scan)
    (warning,) = parts[2].check().warnings
    assert f"ADD COLUMN afdb_shard_{SHARDS} SMALLINT AS (MOD(COALESCE(CRC32" in warning
    ddl = warning[warning.index("`ALTER") + 1 : warning.rindex("`")]
    with maria.engine.begin() as conn:
        conn.exec_driver_sql(ddl)
        conn.exec_driver_sql(f"ANALYZE TABLE {maria.qualified('big')}")
    for part in parts:
        part.close()
    opened.clear()
    parts = shard_sources(maria, opened)  # the term is chosen when a source opens
    assert f"afdb_shard_{SHARDS}" in (parts[2].description.where or "")
    assert parts[2].check().warnings == ()
    statement, parameters, _ = batch_statement(parts[2], MID)
    (row,) = maria_plan(maria, statement, parameters)
    assert row["key"] == f"ix_big_afdb_shard_{SHARDS}", row
    assert row["type"] in ("range", "ref"), row
    assert "filesort" not in (row["Extra"] or ""), row  # the index delivers the order
    assert int(row["rows"]) < ROWS / 2, row
    split_exactly(maria, parts)


def test_mariadb_keys_the_collation_holds_equal_stay_in_one_shard(maria, opened):
    """Under the default case-insensitive PAD SPACE collation `k7-x`, `K7-X` and `k7-X  ` are
    one key: a row whose key is updated between them stays in its shard (the hash reads the
    collation's weights), so its versions keep their order; keys the collation tells apart
    still spread over the shards."""
    keys = [f"k{i}-x" for i in range(200)]
    maria.table(
        "cased",
        [
            sa.Column("id", sa.String(40), primary_key=True),
            sa.Column("updated_at", sa.DateTime, nullable=False),
        ],
        [{"id": k, "updated_at": dt.datetime(2026, 1, 1)} for k in keys],
        index=["updated_at", "id"],
    )
    parts = []
    for index in range(SHARDS):
        part = SqlSource(maria.url, "cased", "updated_at", "id").shard(index, SHARDS)
        part.open({})
        opened.append(part)
        parts.append(part)

    def shards_of(key: str) -> list[int]:
        return [
            i
            for i, part in enumerate(parts)
            if key in {r.position.pk[0] for r in part.fetch(None, 1000, NO_HORIZON)}
        ]

    spread = [len(part.fetch(None, 1000, NO_HORIZON)) for part in parts]
    assert sum(spread) == len(keys)
    assert min(spread) > len(keys) / SHARDS / 2, spread
    (home,) = shards_of("k7-x")
    for spelled in ("K7-X", "k7-X  "):
        with maria.engine.begin() as conn:
            update = sa.text("UPDATE cased SET id = :new WHERE id = 'k7-x'")
            conn.execute(update, {"new": spelled})
        assert shards_of(spelled) == [home], spelled
        with maria.engine.begin() as conn:
            conn.execute(sa.text("UPDATE cased SET id = 'k7-x' WHERE id = :old"), {"old": spelled})
