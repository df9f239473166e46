"""``afdb migrate mysql-trigger`` on the real MariaDB: the trigger's state (its exact DDL, in
``az_func_mysql``) read in the server's default zone, the checkpoint created where nothing can
have been skipped (the last polled second, unfinished and given-up rows, open transactions),
what comes again named, create-only, and the trigger's state left as it was.

Each test uses its own database (so its own ``UserTableID``) and drops only its own rows and
leases table in ``az_func_mysql``, which other tests and a real trigger may share.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from azure_functions_db.core.batch import Batch
from azure_functions_db.core.config import PollerConfig
from azure_functions_db.errors import ConfigurationError, SourceError
from azure_functions_db.ops.migrate_mysql import (
    Request,
    take_over,
    user_function_id,
    user_table_id,
)
from azure_functions_db.runtime.poller import PollerDefinition
from azure_functions_db.sources.sqlalchemy import SqlSource
from azure_functions_db.state.memory import MemoryStateStore
from tests.support.source_kit import Db

pytestmark = pytest.mark.mysql

SITE, FUNCTION = "contoso-orders", "ProductsTrigger"
#: The table the trigger's docs describe, with the column they tell users to add.
PRODUCTS = (
    "CREATE TABLE Products (ProductId int PRIMARY KEY, Name varchar(100), Cost int, "
    "az_func_updated_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP ON UPDATE CURRENT_TIMESTAMP)"
)


class Trigger:
    """The trigger's state for one function and table, as its listener creates it."""

    def __init__(self, db: Db, site: str = SITE, function: str = FUNCTION) -> None:
        self.db = db
        self.database = db.url.rsplit("/", 1)[1]
        self.fid = user_function_id(site, function)
        self.tid = user_table_id(self.database, "Products")
        self.leases = f"az_func_mysql.`Leases_{self.fid}_{self.tid}`"

    def create(self) -> None:
        with self.db.engine.begin() as conn:
            conn.exec_driver_sql("CREATE DATABASE IF NOT EXISTS az_func_mysql")
            conn.exec_driver_sql(
                "CREATE TABLE IF NOT EXISTS az_func_mysql.GlobalState ( UserFunctionID char(16) "
                "NOT NULL, UserTableID char(64) NOT NULL, LastPolledTime Datetime NOT NULL "
                "DEFAULT CURRENT_TIMESTAMP, PRIMARY KEY (UserFunctionID, UserTableID) )"
            )
            conn.exec_driver_sql(
                f"CREATE TABLE IF NOT EXISTS {self.leases} ( ProductId int, "
                "_az_func_AttemptCount int NOT NULL, _az_func_LeaseExpirationTime datetime, "
                "_az_func_SyncCompletedTime datetime, PRIMARY KEY (ProductId) )"
            )
            conn.exec_driver_sql(
                "INSERT IGNORE INTO az_func_mysql.GlobalState (UserFunctionID, UserTableID) "
                f"VALUES ('{self.fid}', '{self.tid}')"
            )

    def polled_up_to(self, product: int) -> None:
        """``LastPolledTime`` := that row's stamp, as the trigger writes it (its session is
        in the server's default zone)."""
        with self.db.engine.begin() as conn:
            conn.exec_driver_sql("SET time_zone = @@global.time_zone")
            conn.exec_driver_sql(
                "UPDATE az_func_mysql.GlobalState SET LastPolledTime = (SELECT "
                f"az_func_updated_at FROM Products WHERE ProductId = {product}) "
                f"WHERE UserFunctionID = '{self.fid}' AND UserTableID = '{self.tid}'"
            )

    def leased(self, product: int, attempts: int) -> None:
        with self.db.engine.begin() as conn:
            conn.exec_driver_sql(
                f"INSERT INTO {self.leases} VALUES ({product}, {attempts}, "
                "DATE_ADD(CURRENT_TIMESTAMP, INTERVAL 60 SECOND), NULL)"
            )

    def state(self) -> list[Any]:
        with self.db.engine.connect() as conn:
            rows = conn.exec_driver_sql(
                "SELECT LastPolledTime FROM az_func_mysql.GlobalState "
                f"WHERE UserFunctionID = '{self.fid}' AND UserTableID = '{self.tid}'"
            ).all()
            leases = conn.exec_driver_sql(f"SELECT * FROM {self.leases} ORDER BY 1").all()
        return [rows, leases]

    def drop(self) -> None:
        with self.db.engine.begin() as conn:
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS {self.leases}")
            conn.exec_driver_sql(
                "DELETE FROM az_func_mysql.GlobalState "
                f"WHERE UserFunctionID = '{self.fid}' AND UserTableID = '{self.tid}'"
            )


@pytest.fixture
def trigger(maria: Db) -> Iterator[Trigger]:
    with maria.engine.begin() as conn:
        conn.exec_driver_sql(PRODUCTS)
    found = Trigger(maria)
    found.create()
    try:
        yield found
    finally:
        found.drop()


def _stamp(db: Db, rows: dict[int, str]) -> None:
    """Products stamped at these times, written from a session in +05:30 (TIMESTAMP keeps
    the instant; the trigger and the poller read it in their own zones)."""
    with db.engine.begin() as conn:
        conn.exec_driver_sql("SET time_zone = '+05:30'")
        for product, at in rows.items():
            conn.execute(
                sa.text(
                    "INSERT INTO Products (ProductId, Name, Cost, az_func_updated_at) "
                    "VALUES (:p, :n, 1, :at)"
                ),
                {"p": product, "n": f"p{product}", "at": at},
            )


def _poller(
    db: Db,
    seen: list[int],
    store: MemoryStateStore,
    cursor: str = "az_func_updated_at",
    pk: str = "ProductId",
) -> PollerDefinition:
    def handler(batch: Batch) -> None:
        seen.extend(int(c.pk) for c in batch)

    return PollerDefinition(
        config=PollerConfig(name="products"),
        schedule="* * * * * *",
        source=SqlSource(url=db.url, table="Products", cursor=cursor, pk=pk),
        handler=handler,
        state=store,
    )


# Wall-clock times in +05:30, one second apart: 10:00:01 .. 10:00:09.
TIMES = {p: f"2026-03-01 10:00:0{p}" for p in range(1, 10)}


def test_the_takeover_starts_at_the_last_polled_second_or_earlier_and_says_what_comes_again(
    trigger: Trigger,
) -> None:
    db = trigger.db
    _stamp(db, TIMES)
    _stamp(db, {10: "2026-03-01 10:00:05"})  # same second as 5, after it in key order
    trigger.polled_up_to(5)  # the trigger finished rows up to 5's second
    seen: list[int] = []
    store = MemoryStateStore()
    definition = _poller(db, seen, store)
    settings = {"WEBSITE_SITE_NAME": SITE}
    before = trigger.state()

    exact = Request(function=FUNCTION, overlap=0, dry_run=True)
    plan = take_over(definition, settings, exact)
    assert plan.dry_run
    assert not plan.written
    assert store.read(definition.config.key) is None  # nothing written
    assert "LastPolledTime" in plan.start_reason
    assert plan.again == 2  # 5 and 10, stamped in the last polled second
    assert sorted(pk[0] for pk in plan.again_examples) == [5, 10]
    assert plan.unfinished == []
    assert plan.given_up == []
    lines = "\n".join(plan.lines())
    assert "dry run" in lines
    assert "DROP TABLE az_func_mysql.`Leases_" in lines

    # A row it leased and had not finished (below its LastPolledTime), one it gave up on.
    # By default a minute before it comes again too: transactions that stamped rows before its
    # last poll and committed after it (the trigger passed them over).
    plan = take_over(definition, settings, Request(function=FUNCTION, dry_run=True))
    assert "60 s overlap" in plan.start_reason
    assert plan.again == 6  # 1-5 and 10

    trigger.leased(3, attempts=2)
    trigger.leased(8, attempts=5)
    plan = take_over(definition, settings, exact)
    assert "did not finish (key (3,))" in plan.start_reason
    assert [(r.pk, r.attempts) for r in plan.unfinished] == [((3,), 2)]
    assert [(r.pk, r.attempts) for r in plan.given_up] == [((8,), 5)]
    assert plan.again == 4  # 3, 4, 5, 10

    done = take_over(definition, settings, Request(function=FUNCTION, overlap=0))
    assert done.written
    assert done.fence is not None
    definition.engine(settings).run(settings)
    assert seen == [3, 4, 5, 10, 6, 7, 8, 9]  # from 3 on, in (cursor, key) order; 8 too
    assert trigger.state()[0] == before[0]  # GlobalState untouched

    with pytest.raises(ConfigurationError, match="already has a checkpoint"):
        take_over(definition, settings, Request(function=FUNCTION, overlap=0))


def test_a_transaction_open_across_the_switch_is_waited_for_and_its_rows_delivered(
    trigger: Trigger,
) -> None:
    """A writer's transaction stamped its row before the trigger's last poll and is still open:
    the takeover waits until it ends (naming it if it does not), and the row, committed after
    the trigger's last poll, reaches the handler (the trigger would have passed it over)."""
    db = trigger.db
    _stamp(db, {1: "2020-01-01 00:00:01"})
    late = db.engine.connect()
    outcome: list[Any] = []
    seen: list[int] = []
    definition = _poller(db, seen, MemoryStateStore())
    try:
        late.exec_driver_sql("BEGIN")
        late.exec_driver_sql("INSERT INTO Products (ProductId, Name, Cost) VALUES (2, 'late', 1)")
        time.sleep(1.1)
        with db.engine.begin() as conn:
            conn.exec_driver_sql("INSERT INTO Products (ProductId, Name, Cost) VALUES (3, 'p', 1)")
        trigger.polled_up_to(3)  # the trigger's last poll: after row 2 was stamped
        with pytest.raises(SourceError, match=r"still open .*thread \d+.*--wait SECONDS"):
            take_over(definition, {}, Request(function_id=trigger.fid, wait=1, dry_run=True))
        waiting = threading.Thread(
            target=lambda: outcome.append(
                take_over(definition, {}, Request(function_id=trigger.fid, wait=30))
            )
        )
        waiting.start()
        time.sleep(1.5)
        assert not outcome  # still waiting for the transaction
        late.exec_driver_sql("COMMIT")
        waiting.join(30)
    finally:
        late.close()
    assert outcome
    assert outcome[0].written
    definition.engine({}).run({})
    assert seen == [2, 3]


def test_what_does_not_fit_is_named_with_the_fix(trigger: Trigger, maria: Db) -> None:
    seen: list[int] = []
    definition = _poller(maria, seen, MemoryStateStore())
    with pytest.raises(ConfigurationError, match="--site NAME"):
        take_over(definition, {}, Request(function=FUNCTION))
    with pytest.raises(ConfigurationError, match="no row for function"):
        take_over(definition, {}, Request(function="Other", site=SITE))
    # Without a name: the table's only row is the one.
    assert take_over(definition, {}, Request(dry_run=True)).function_id == trigger.fid
    other = Trigger(maria, function="Second")
    other.create()
    try:
        with pytest.raises(ConfigurationError, match="2 function"):
            take_over(definition, {}, Request(dry_run=True))
    finally:
        other.drop()
    wrong = _poller(maria, [], MemoryStateStore(), cursor="Cost")
    with pytest.raises(ConfigurationError, match='cursor="az_func_updated_at"'):
        take_over(wrong, {}, Request(function_id=trigger.fid))


def test_validate_recognises_the_triggers_table_and_its_state(trigger: Trigger) -> None:
    from azure_functions_db.ops.validate import validate_poller

    definition = _poller(trigger.db, [], MemoryStateStore())
    found = [f for f in validate_poller(definition, {}, app="app.py").findings]
    mine = [f for f in found if f.check == "mysql_trigger"]
    assert [f.level for f in mine] == ["ok", "warning"], found
    assert "reads it as its cursor" in mine[0].message
    assert "No schema change is needed" in mine[0].message
    assert trigger.fid in mine[1].message
    assert mine[1].fix is not None
    assert mine[1].fix.startswith("afdb migrate mysql-trigger app.py --poller products")
    trigger.drop()  # no state left: the table's column alone is reported
    found = validate_poller(definition, {}, app="app.py").findings
    assert [f.level for f in found if f.check == "mysql_trigger"] == ["ok"]


# -- what an adversarial review found (2026-11-27) ------------------------------------------


def test_a_poller_without_a_commit_safe_horizon_may_not_take_over(trigger: Trigger) -> None:
    """Without PROCESS the horizon falls back to `none`: the takeover could not prove that no
    transaction still open commits a row below its start, so it refuses, naming the grant."""
    db = trigger.db
    user = f"u{trigger.fid[:8]}"
    with db.engine.begin() as conn:
        conn.exec_driver_sql(f"CREATE USER '{user}'@'%%'")
        conn.exec_driver_sql(f"GRANT SELECT ON `{trigger.database}`.* TO '{user}'@'%%'")
        conn.exec_driver_sql(f"GRANT SELECT ON az_func_mysql.* TO '{user}'@'%%'")
    try:
        url = db.url.replace("mysql+pymysql://root@", f"mysql+pymysql://{user}@", 1)
        definition = _poller(Db("mysql", url, None, db.engine), [], MemoryStateStore())
        with pytest.raises(SourceError, match=r"commit-safe horizon.*GRANT PROCESS"):
            take_over(definition, {}, Request(function_id=trigger.fid, dry_run=True))
    finally:
        with db.engine.begin() as conn:
            conn.exec_driver_sql(f"DROP USER '{user}'@'%%'")


def test_rows_the_trigger_delivered_behind_a_row_it_gave_up_on_are_counted(maria: Db) -> None:
    """A row given up stops LastPolledTime for good, while the trigger goes on delivering the
    rows after it: those come again too, and the dry run counts them."""
    from devkit.mysql_trigger import MySqlTrigger

    with maria.engine.begin() as conn:
        conn.exec_driver_sql(PRODUCTS)
    raw = _raw(maria)
    live = MySqlTrigger(raw, "Products", site=SITE, function="GivesUp", lease_seconds=0)
    live.start()
    try:
        time.sleep(1.1)
        with raw.cursor() as cur:
            cur.execute("INSERT INTO Products (ProductId, Name, Cost) VALUES (1, 'bad', 1)")

        def function(rows: list[dict[str, Any]]) -> None:
            if any(row["Name"] == "bad" for row in rows):
                raise ValueError("fails on this row")

        for _ in range(5):
            live.poll(function)
            time.sleep(1.05)
        time.sleep(1.1)
        with raw.cursor() as cur:
            cur.executemany(
                "INSERT INTO Products (ProductId, Name, Cost) VALUES (%s, 'ok', 1)",
                [(pk,) for pk in range(2, 6)],
            )
        assert live.poll(function).succeeded
        plan = take_over(
            _poller(maria, [], MemoryStateStore()),
            {},
            Request(function_id=live.function_id, overlap=0, dry_run=True),
        )
        assert [r.pk for r in plan.given_up] == [(1,)]
        assert plan.after == 4
        assert sorted(pk[0] for pk in plan.after_examples) == [2, 3, 4, 5]
        assert "4 it delivered after its LastPolledTime" in "\n".join(plan.lines())
    finally:
        live.drop_state()
        raw.close()


def _raw(db: Db) -> Any:
    import urllib.parse

    import pymysql

    url = urllib.parse.urlsplit(db.url.replace("mysql+pymysql://", "mysql://", 1))
    return pymysql.connect(
        host=url.hostname, port=url.port or 3306, user=url.username, database=url.path[1:]
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"overlap": -2}, "`--overlap -2` must be a number of seconds, 0 or more"),
        ({"overlap": float("nan")}, "`--overlap nan`"),
        ({"wait": float("inf")}, "`--wait inf`"),
    ],
)
def test_a_bad_overlap_or_wait_is_refused(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        Request(**options)


def test_a_missing_leases_table_asks_for_the_name_the_binding_gave(trigger: Trigger) -> None:
    with trigger.db.engine.begin() as conn:
        conn.exec_driver_sql(f"RENAME TABLE {trigger.leases} TO az_func_mysql.`mine_{trigger.fid}`")
    definition = _poller(trigger.db, [], MemoryStateStore())
    try:
        with pytest.raises(ConfigurationError, match="--leases-table NAME"):
            take_over(definition, {}, Request(function_id=trigger.fid, dry_run=True))
        named = Request(function_id=trigger.fid, leases_table=f"mine_{trigger.fid}", dry_run=True)
        assert take_over(definition, {}, named).leases_table == f"mine_{trigger.fid}"
    finally:
        with trigger.db.engine.begin() as conn:
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS az_func_mysql.`mine_{trigger.fid}`")


def test_the_leases_are_joined_on_the_tables_primary_key_not_the_pollers(
    trigger: Trigger,
) -> None:
    db = trigger.db
    with db.engine.begin() as conn:
        conn.exec_driver_sql("ALTER TABLE Products ADD COLUMN Sku int, ADD UNIQUE KEY (Sku)")
    _stamp(db, {1: "2026-03-01 10:00:01", 2: "2026-03-01 10:00:02"})
    with db.engine.begin() as conn:
        conn.exec_driver_sql("UPDATE Products SET Sku = ProductId + 100")
    trigger.polled_up_to(1)
    trigger.leased(2, attempts=5)
    definition = _poller(db, [], MemoryStateStore(), pk="Sku")
    plan = take_over(definition, {}, Request(function_id=trigger.fid, dry_run=True))
    assert [r.pk for r in plan.given_up] == [(2,)]


def test_a_datetime_column_is_not_taken_for_the_triggers_timestamp(maria: Db) -> None:
    with maria.engine.begin() as conn:
        conn.exec_driver_sql(
            "CREATE TABLE Products (ProductId int PRIMARY KEY, az_func_updated_at DATETIME)"
        )
    definition = _poller(maria, [], MemoryStateStore())
    with pytest.raises(ConfigurationError, match="not the `TIMESTAMP` the MySQL trigger asks"):
        take_over(definition, {}, Request(function_id="0" * 16, dry_run=True))


def test_validate_names_the_grant_it_needs_to_see_the_triggers_state(trigger: Trigger) -> None:
    from azure_functions_db.ops.validate import validate_poller

    db = trigger.db
    user = f"v{trigger.fid[:8]}"
    with db.engine.begin() as conn:
        conn.exec_driver_sql(f"CREATE USER '{user}'@'%%'")
        conn.exec_driver_sql(f"GRANT SELECT ON `{trigger.database}`.* TO '{user}'@'%%'")
    try:
        url = db.url.replace("mysql+pymysql://root@", f"mysql+pymysql://{user}@", 1)
        definition = _poller(Db("mysql", url, None, db.engine), [], MemoryStateStore())
        found = validate_poller(definition, {}, app="app.py").findings
        mine = [f for f in found if f.check == "mysql_trigger"]
        assert [f.level for f in mine] == ["ok", "warning"], found
        assert mine[1].fix == f"GRANT SELECT ON az_func_mysql.* TO '{user}'@'%'"
    finally:
        with db.engine.begin() as conn:
            conn.exec_driver_sql(f"DROP USER '{user}'@'%%'")
