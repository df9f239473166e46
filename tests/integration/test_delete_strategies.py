"""Deletes (SPEC §3.7), source definition changes (case L) and MySQL/MariaDB session time zones.

Real databases only: SQLite files, and the PostgreSQL and MariaDB servers of the service tier.
The engine runs for real (memory state store, system clock) so that each test sees what a
handler sees and what is left in the table after the commit.

- Soft delete: ``SqlSource(soft_delete=...)`` delivers ``Change.op == "delete"``.
- Outbox: ``OutboxSource(delete_delivered=True)`` deletes exactly the delivered rows after the
  commit, never a range, and reports rows left below the checkpoint.
- Case L: changed ``columns`` (or a table that gained a column) continue with a warning.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from azure_functions_db import Batch, Change, OutboxSource, SqlSource
from azure_functions_db.core.clock import SystemClock
from azure_functions_db.core.engine import Engine, PollerConfig, RunReport
from azure_functions_db.core.ports import ChangeSource
from azure_functions_db.core.position import Position
from azure_functions_db.errors import HandlerError, SourceDefinitionError
from azure_functions_db.sources import outbox as outbox_module
from azure_functions_db.state.memory import MemoryStateStore
from tests.support.source_kit import Db

T0 = dt.datetime(2026, 3, 1, 9, 0, 0, 250000)


@pytest.fixture(
    params=[
        "sqlite",
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("mysql", marks=pytest.mark.mysql),
    ]
)
def anydb(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Db]:
    """SQLite, or one of the server scratch namespaces from conftest's ``db``-style fixtures."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'db.sqlite'}"
        engine = sa.create_engine(url, poolclass=sa.NullPool)
        try:
            yield Db("sqlite", url, None, engine)
        finally:
            engine.dispose()
        return
    yield request.getfixturevalue("pg" if request.param == "postgres" else "maria")


class Recorder:
    """A handler that keeps every change it was given, and can fail on demand."""

    def __init__(self) -> None:
        self.changes: list[Change] = []
        self.fail_on_call: int | None = None
        self.calls = 0

    def __call__(self, batch: Batch) -> None:
        self.calls += 1
        if self.calls == self.fail_on_call:
            raise RuntimeError("handler failed on purpose")
        self.changes.extend(batch)


class Poller:
    """One poller over ``source``: the engine with a memory store that outlives its runs."""

    def __init__(self, source: SqlSource, *, batch_size: int = 4) -> None:
        self.source = source
        self.store = MemoryStateStore()
        self.handler = Recorder()
        self.batch_size = batch_size

    def run(self, source: SqlSource | None = None) -> RunReport:
        if source is not None:
            self.source.close()
            self.source = source
        config = PollerConfig(name="p", batch_size=self.batch_size, retry_delay=0.01)
        engine = Engine(config, self.source, self.store, self.handler, SystemClock(), owner="t")
        return engine.run({})

    def close(self) -> None:
        self.source.close()


@pytest.fixture
def pollers() -> Iterator[list[Poller]]:
    made: list[Poller] = []
    yield made
    for poller in made:
        poller.close()


@pytest.fixture
def opened_sources() -> Iterator[list[SqlSource]]:
    made: list[SqlSource] = []
    yield made
    for source in made:
        source.close()


def poller_for(pollers: list[Poller], source: SqlSource, **kwargs: Any) -> Poller:
    poller = Poller(source, **kwargs)
    pollers.append(poller)
    return poller


def remaining_ids(db: Db, table: sa.Table) -> list[int]:
    with db.engine.connect() as conn:
        return [row[0] for row in conn.execute(sa.select(table.c.id).order_by(table.c.id))]


# --------------------------------------------------------------------------------------------
# soft delete
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("flag", ["boolean", "timestamp"])
def test_soft_deleted_rows_arrive_as_delete_changes(anydb, pollers, flag):
    flag_type: Any = sa.Boolean if flag == "boolean" else sa.DateTime
    table = anydb.table(
        "items",
        [
            sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
            sa.Column("updated_at", sa.DateTime, nullable=False),
            sa.Column("gone", flag_type, nullable=flag == "timestamp"),
        ],
        [
            {"id": i, "updated_at": T0 + dt.timedelta(seconds=i), "gone": _alive(flag)}
            for i in (1, 2, 3)
        ]
        + [{"id": 4, "updated_at": T0 + dt.timedelta(seconds=4), "gone": _dead(flag)}],
        index=["updated_at", "id"],
    )
    source = SqlSource(
        anydb.url,
        "items",
        "updated_at",
        "id",
        schema=anydb.schema,
        soft_delete="gone",
        horizon="none",
    )
    poller = poller_for(pollers, source)
    poller.run()
    assert [(c.pk, c.op) for c in poller.handler.changes] == [
        (1, "upsert"),
        (2, "upsert"),
        (3, "upsert"),
        (4, "delete"),
    ]
    # Deleting row 2 is an update that sets the flag and moves the cursor: one delete change.
    with anydb.engine.begin() as conn:
        conn.execute(
            table.update()
            .where(table.c.id == 2)
            .values(gone=_dead(flag), updated_at=T0 + dt.timedelta(minutes=5))
        )
    poller.handler.changes.clear()
    poller.run()
    assert [(c.pk, c.op) for c in poller.handler.changes] == [(2, "delete")]
    assert poller.handler.changes[0].data["gone"] == _dead(flag)


def _alive(flag: str) -> Any:
    return False if flag == "boolean" else None


def _dead(flag: str) -> Any:
    return True if flag == "boolean" else dt.datetime(2026, 3, 2, 9, 0, 0)


def test_soft_delete_column_must_exist(anydb, opened):
    anydb.table(
        "items",
        [
            sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
            sa.Column("updated_at", sa.DateTime),
        ],
    )
    source = SqlSource(anydb.url, "items", "updated_at", schema=anydb.schema, soft_delete="gone")
    with pytest.raises(SourceDefinitionError, match=r"Column `gone` \(in `soft_delete=`\)"):
        source.open({})


def test_fetch_changes_returns_what_fetch_returns_as_the_pollers_changes(anydb, opened_sources):
    anydb.table(
        "items",
        [
            sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
            sa.Column("updated_at", sa.DateTime, nullable=False),
            sa.Column("gone", sa.Boolean, nullable=False),
        ],
        [
            {"id": i, "updated_at": T0 + dt.timedelta(seconds=i // 3), "gone": i % 4 == 0}
            for i in range(1, 12)
        ],
        index=["updated_at", "id"],
    )
    source = SqlSource(
        anydb.url, "items", "updated_at", "id", schema=anydb.schema, soft_delete="gone"
    )
    source.open({})
    opened_sources.append(source)
    assert isinstance(source, ChangeSource)
    after, delivered = None, list[Change]()
    while True:  # batch by batch, across cursor ties, as the engine reads
        horizon = source.horizon()
        rows = source.fetch(after, 4, horizon)
        changes = source.fetch_changes(after, 4, horizon, "p")
        assert [Change(r.data, r.position, "p", r.op) for r in rows] == list(changes)
        # Row changes (a lazy Change subclass) with real positions; equal to plain ones above.
        assert all(isinstance(c, Change) and type(c.position) is Position for c in changes)
        delivered.extend(changes)
        if len(rows) < 4:
            break
        after = rows[-1].position
    assert [(c.pk, c.op) for c in delivered] == [
        (i, "delete" if i % 4 == 0 else "upsert") for i in range(1, 12)
    ]


# --------------------------------------------------------------------------------------------
# outbox
# --------------------------------------------------------------------------------------------


def outbox_table(db: Db, ids: Sequence[int]) -> sa.Table:
    return db.table(
        "outbox",
        [
            sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
            sa.Column("topic", sa.String(40), nullable=False),
        ],
        [{"id": i, "topic": f"event-{i}"} for i in ids],
    )


def outbox(db: Db, **kwargs: Any) -> OutboxSource:
    return OutboxSource(db.url, "outbox", schema=db.schema, horizon="none", **kwargs)


def test_outbox_delivers_in_order_and_deletes_exactly_what_was_delivered(anydb, pollers):
    table = outbox_table(anydb, range(1, 11))
    poller = poller_for(pollers, outbox(anydb, delete_delivered=True), batch_size=4)
    report = poller.run()
    assert (report.batches, report.rows) == (3, 10)
    assert [c.pk for c in poller.handler.changes] == list(range(1, 11))
    assert [c.data["topic"] for c in poller.handler.changes][:2] == ["event-1", "event-2"]
    assert remaining_ids(anydb, table) == []


def test_outbox_keeps_rows_without_delete_delivered(anydb, pollers):
    table = outbox_table(anydb, range(1, 6))
    poller = poller_for(pollers, outbox(anydb), batch_size=4)
    poller.run()
    assert [c.pk for c in poller.handler.changes] == [1, 2, 3, 4, 5]
    assert remaining_ids(anydb, table) == [1, 2, 3, 4, 5]


def test_outbox_rows_of_a_failed_batch_stay_until_it_succeeds(anydb, pollers):
    table = outbox_table(anydb, range(1, 9))
    poller = poller_for(pollers, outbox(anydb, delete_delivered=True), batch_size=4)
    poller.handler.fail_on_call = 2
    with pytest.raises(HandlerError):
        poller.run()
    assert remaining_ids(anydb, table) == [5, 6, 7, 8]  # the acknowledged batch only
    poller.run()
    assert [c.pk for c in poller.handler.changes] == list(range(1, 9))
    assert remaining_ids(anydb, table) == []


def test_outbox_never_deletes_a_late_row_below_the_checkpoint_and_reports_it(
    anydb, pollers, caplog
):
    table = outbox_table(anydb, [1, 2, 4, 5])
    poller = poller_for(pollers, outbox(anydb, delete_delivered=True), batch_size=10)
    poller.run()
    assert remaining_ids(anydb, table) == []
    # A transaction that took id 3 commits only now, below the checkpoint (5), with id 6.
    with anydb.engine.begin() as conn:
        conn.execute(table.insert(), [{"id": 3, "topic": "late"}, {"id": 6, "topic": "new"}])
    caplog.set_level(logging.WARNING)
    poller.run()
    assert [c.pk for c in poller.handler.changes] == [1, 2, 4, 5, 6]
    assert remaining_ids(anydb, table) == [3]  # kept for the operator, not deleted unseen
    (line,) = [r.getMessage() for r in caplog.records if "outbox_rows_left" in r.getMessage()]
    assert "rows=1 " in line
    assert "afdb seek" in line


def test_outbox_delete_failure_is_logged_and_the_run_goes_on(tmp_path, pollers, caplog):
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    db = Db("sqlite", url, None, engine)
    table = outbox_table(db, range(1, 6))
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "CREATE TRIGGER keep BEFORE DELETE ON outbox BEGIN SELECT RAISE(ABORT, 'kept'); END"
        )
    poller = poller_for(pollers, outbox(db, delete_delivered=True), batch_size=10)
    caplog.set_level(logging.WARNING)
    report = poller.run()
    assert (report.status, report.rows) == ("caught_up", 5)
    assert any("action=acknowledge_failed" in r.getMessage() for r in caplog.records)
    assert remaining_ids(db, table) == [1, 2, 3, 4, 5]
    poller.handler.changes.clear()
    poller.run()  # acknowledged already: never redelivered
    assert poller.handler.changes == []
    engine.dispose()


def test_reads_autocommit_and_the_outbox_deletes_run_in_one_transaction(
    anydb, pollers, monkeypatch
):
    monkeypatch.setattr(outbox_module, "_DELETE_CHUNK", 3)  # several DELETE statements a batch
    table = outbox_table(anydb, range(1, 11))
    source = outbox(anydb, delete_delivered=True)
    source.open({})
    seen: list[tuple[str, bool]] = []

    def capture(conn: sa.Connection, *args: Any) -> None:  # (cursor, statement, params, ...)
        dbapi_connection = conn.connection.dbapi_connection
        autocommit = conn.dialect.detect_autocommit_setting(dbapi_connection)
        seen.append((args[1].lstrip().split()[0].upper(), autocommit))

    sa.event.listen(source.engine, "before_cursor_execute", capture)
    poller = poller_for(pollers, source, batch_size=4)
    poller.run()
    assert remaining_ids(anydb, table) == []
    # Every read (horizon, health check, batches) autocommits: no BEGIN/ROLLBACK around it. The
    # deletes of a batch and the count of rows left after them share one real transaction.
    deletes = [i for i, (verb, _) in enumerate(seen) if verb == "DELETE"]
    assert len(deletes) == 2 + 2 + 1  # batches of 4, 4, 2 rows in chunks of 3
    in_transaction = {*deletes, *(d + 1 for d in deletes if seen[d + 1][0] == "SELECT")}
    assert all(not seen[i][1] for i in in_transaction)
    assert all(autocommit for i, (_, autocommit) in enumerate(seen) if i not in in_transaction)
    if anydb.dialect == "mysql":  # the connection back from the transaction: still in UTC
        with source.engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT @@session.time_zone").scalar_one() == "+00:00"
            assert conn.dialect.detect_autocommit_setting(conn.connection.dbapi_connection)


def test_outbox_deletes_of_a_batch_are_all_or_nothing(tmp_path, pollers, monkeypatch, caplog):
    monkeypatch.setattr(outbox_module, "_DELETE_CHUNK", 2)
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    db = Db("sqlite", url, None, engine)
    table = outbox_table(db, range(1, 6))
    with engine.begin() as conn:  # the third DELETE statement (ids 5) fails
        conn.exec_driver_sql(
            "CREATE TRIGGER keep BEFORE DELETE ON outbox WHEN old.id = 5 "
            "BEGIN SELECT RAISE(ABORT, 'kept'); END"
        )
    poller = poller_for(pollers, outbox(db, delete_delivered=True), batch_size=10)
    caplog.set_level(logging.WARNING)
    assert poller.run().rows == 5
    assert any("action=acknowledge_failed" in r.getMessage() for r in caplog.records)
    assert remaining_ids(db, table) == [1, 2, 3, 4, 5]  # the first two DELETEs rolled back
    engine.dispose()


@pytest.mark.postgres
def test_outbox_with_a_composite_key_deletes_by_row_value(pg, pollers):
    table = pg.table(
        "outbox",
        [
            sa.Column("tenant", sa.Integer, primary_key=True, autoincrement=False),
            sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        ],
        [{"tenant": t, "id": i} for t in (1, 2) for i in (1, 2, 3)],
    )
    source = OutboxSource(
        pg.url, "outbox", cursor="id", schema=pg.schema, horizon="none", delete_delivered=True
    )
    poller = poller_for(pollers, source, batch_size=4)
    poller.run()
    assert [c.pk for c in poller.handler.changes] == [
        (1, 1),
        (2, 1),
        (1, 2),
        (2, 2),
        (1, 3),
        (2, 3),
    ]
    with pg.engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(table)).scalar_one() == 0


def test_outbox_rejects_a_non_boolean_delete_delivered():
    with pytest.raises(Exception, match=r"`delete_delivered='yes'` must be `True`"):
        OutboxSource("sqlite://", "outbox", delete_delivered="yes")  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# case L: columns
# --------------------------------------------------------------------------------------------


def orders(db: Db) -> sa.Table:
    return db.table(
        "orders",
        [
            sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
            sa.Column("updated_at", sa.DateTime, nullable=False),
            sa.Column("status", sa.String(20)),
        ],
        [{"id": i, "updated_at": T0 + dt.timedelta(seconds=i), "status": "new"} for i in (1, 2)],
    )


def sqlite_db(tmp_path: Path) -> Db:
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    return Db("sqlite", url, None, sa.create_engine(url, poolclass=sa.NullPool))


def test_case_l_changed_columns_continue_with_a_warning(tmp_path, pollers, caplog):
    db = sqlite_db(tmp_path)
    table = orders(db)
    narrow = SqlSource(db.url, "orders", "updated_at", columns=["id"], horizon="none")
    poller = poller_for(pollers, narrow)
    poller.run()
    assert set(poller.handler.changes[0].data) == {"id", "updated_at"}
    with db.engine.begin() as conn:
        conn.execute(table.insert(), [{"id": 3, "updated_at": T0 + dt.timedelta(minutes=1)}])
    caplog.set_level(logging.WARNING)
    wide = SqlSource(db.url, "orders", "updated_at", columns=["id", "status"], horizon="none")
    poller.run(wide)
    (line,) = [r.getMessage() for r in caplog.records if "source_columns_changed" in r.getMessage()]
    assert "added=status" in line
    assert "removed=-" in line
    assert [c.pk for c in poller.handler.changes] == [1, 2, 3]  # continued, nothing re-read
    assert "status" in poller.handler.changes[-1].data
    stored = poller.store.read(PollerConfig(name="p").key)
    assert stored is not None
    assert stored.checkpoint.source is not None
    assert stored.checkpoint.source.columns == ("id", "status", "updated_at")
    caplog.clear()
    poller.run()  # the new definition is recorded: no second warning
    assert "source_columns_changed" not in caplog.text
    db.engine.dispose()


def test_case_l_a_table_that_gained_a_column_continues_with_a_warning(tmp_path, pollers, caplog):
    db = sqlite_db(tmp_path)
    orders(db)
    poller = poller_for(pollers, SqlSource(db.url, "orders", "updated_at", horizon="none"))
    poller.run()
    with db.engine.begin() as conn:
        conn.exec_driver_sql("ALTER TABLE orders ADD COLUMN note TEXT")
        conn.exec_driver_sql(
            "INSERT INTO orders VALUES (3, '2026-03-01 10:00:00.000000', 'x', 'hi')"
        )
    caplog.set_level(logging.WARNING)
    poller.run(SqlSource(db.url, "orders", "updated_at", horizon="none"))
    assert "action=source_columns_changed" in caplog.text
    assert "added=note" in caplog.text
    assert poller.handler.changes[-1].data["note"] == "hi"
    db.engine.dispose()


# --------------------------------------------------------------------------------------------
# MySQL/MariaDB: TIMESTAMP cursors read in UTC whatever the server's zone
# --------------------------------------------------------------------------------------------


@pytest.mark.mysql
def test_mariadb_timestamp_cursor_reads_in_utc_whatever_the_session_default(maria, opened):
    table = maria.table(
        "events",
        [
            sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
            sa.Column("stamped", sa.dialects.mysql.TIMESTAMP(fsp=6), nullable=False),
        ],
    )
    instant = dt.datetime(2026, 10, 25, 0, 30, 0, 500)  # UTC, naive: the hour DST repeats
    with maria.engine.begin() as conn:
        conn.exec_driver_sql("SET time_zone = '+00:00'")
        conn.execute(table.insert(), [{"id": 1, "stamped": instant}])
    # A server whose default zone is not UTC: every new connection starts in +05:00.
    source = SqlSource(
        maria.url,
        "events",
        "stamped",
        horizon="none",
        engine_options={"connect_args": {"init_command": "SET time_zone = '+05:00'"}},
    )
    source.open({})
    opened.append(source)
    with source.engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT @@session.time_zone").scalar_one() == "+00:00"
    (row,) = source.fetch(None, 10, source.horizon())
    assert row.position.cursor == (instant,)
    assert source.fetch(row.position, 10, source.horizon()) == []
