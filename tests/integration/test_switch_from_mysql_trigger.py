"""The switch from Azure's MySQL trigger, end to end on the real MariaDB: the trigger's own SQL
(re-enacted, ``devkit/mysql_trigger.py``) delivers a table while writers update it, commit late
and plant a row its function always fails on; the trigger is stopped in the middle of a call
(rows leased, not released) with a writer's transaction still open; ``afdb migrate
mysql-trigger`` creates the poller's checkpoint; the poller runs. Every row version committed
after the trigger's last delivery reaches our handler (or a later version of its row does),
the rows the trigger held and the one it gave up on included."""

from __future__ import annotations

import random
import threading
import time
import urllib.parse
from typing import Any

import pymysql
import pytest

from azure_functions_db.core.batch import Batch
from azure_functions_db.core.config import PollerConfig
from azure_functions_db.ops.migrate_mysql import Request, take_over
from azure_functions_db.runtime.poller import PollerDefinition
from azure_functions_db.sources.sqlalchemy import SqlSource
from azure_functions_db.state.memory import MemoryStateStore
from devkit.mysql_trigger import MySqlTrigger, Row
from tests.support.source_kit import Db

pytestmark = [pytest.mark.mysql, pytest.mark.slow]

SITE, FUNCTION = "contoso-shop", "OnProducts"
PRODUCTS = 24
POISON = 13  # the function fails on every batch holding this row
#: The longest a writer holds a transaction open before COMMIT, and the takeover's overlap.
HOLD, OVERLAP = 1.0, 2.0


def _connect(db: Db) -> Any:
    url = urllib.parse.urlsplit(db.url.replace("mysql+pymysql://", "mysql://", 1))
    return pymysql.connect(
        host=url.hostname, port=url.port or 3306, user=url.username, database=url.path[1:]
    )


class Writers:
    """Writes versions of the products (``Cost`` = a growing version number) in transactions
    of 1-3 rows, some held open before COMMIT; records each (id, version) with the monotonic
    time its COMMIT returned."""

    def __init__(self, db: Db) -> None:
        self.db = db
        self.version = 0
        self.lock = threading.Lock()
        self.committed: list[tuple[int, int, float]] = []
        self.rng = random.Random(7)

    def next_version(self) -> int:
        with self.lock:
            self.version += 1
            return self.version

    def transaction(self, conn: Any, pks: list[int], hold: float) -> None:
        written = []
        try:
            with conn.cursor() as cur:
                for pk in sorted(pks):  # one order: fewer deadlocks between the writers
                    version = self.next_version()
                    name = "poison" if pk == POISON else f"p{pk}"
                    cur.execute(
                        "INSERT INTO Products (ProductId, Name, Cost) VALUES (%s, %s, %s) "
                        "ON DUPLICATE KEY UPDATE Name = VALUES(Name), Cost = VALUES(Cost)",
                        (pk, name, version),
                    )
                    written.append((pk, version))
            time.sleep(hold)
            conn.commit()
        except pymysql.err.OperationalError:  # a deadlock or lock wait: nothing committed
            conn.rollback()
            return
        now = time.monotonic()
        with self.lock:
            self.committed.extend((pk, v, now) for pk, v in written)

    def run(self, until: threading.Event) -> None:
        conn = _connect(self.db)
        try:
            while not until.is_set():
                pks = self.rng.sample(range(1, PRODUCTS + 1), self.rng.randint(1, 3))
                late = self.rng.random() < 0.3
                self.transaction(conn, pks, self.rng.uniform(0.3, HOLD) if late else 0.01)
        finally:
            conn.close()


@pytest.fixture
def products(maria: Db) -> Db:
    with maria.engine.begin() as conn:
        conn.exec_driver_sql(
            "CREATE TABLE Products (ProductId int PRIMARY KEY, Name varchar(100), Cost int, "
            "az_func_updated_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP ON UPDATE "
            "CURRENT_TIMESTAMP)"
        )
    return maria


def test_every_version_committed_after_the_triggers_last_delivery_reaches_the_poller(
    products: Db,
) -> None:
    db = products
    trigger_conn = _connect(db)
    trigger = MySqlTrigger(
        trigger_conn, "Products", site=SITE, function=FUNCTION, max_batch_size=5, lease_seconds=1
    )
    trigger.start()
    try:
        _scenario(db, trigger)
    finally:
        trigger.drop_state()
        trigger_conn.close()


def _scenario(db: Db, trigger: MySqlTrigger) -> None:
    time.sleep(1.1)  # rows stamped after the trigger's first LastPolledTime
    writers = Writers(db)
    stop = threading.Event()
    threads = [threading.Thread(target=writers.run, args=(stop,)) for _ in range(3)]
    for thread in threads:
        thread.start()
    delivered_by_trigger: list[tuple[int, int]] = []
    last_delivery = 0.0

    def function(rows: list[Row]) -> None:
        if any(row["Name"] == "poison" for row in rows):
            raise RuntimeError("the function fails on this row")
        delivered_by_trigger.extend((int(r["ProductId"]), int(r["Cost"])) for r in rows)

    deadline = time.monotonic() + 6
    while time.monotonic() < deadline:
        began = time.monotonic()
        poll = trigger.poll(function)
        if poll.succeeded and poll.rows:
            last_delivery = began
        time.sleep(0.2)
    # A writer's transaction is open across the switch; the host stops mid-call.
    straddling = _connect(db)
    writers_pk = [PRODUCTS + 1]
    opened = threading.Event()
    committed_late: list[tuple[int, int, float]] = []

    def straddle() -> None:
        with straddling.cursor() as cur:
            version = writers.next_version()
            cur.execute(
                "INSERT INTO Products (ProductId, Name, Cost) VALUES (%s, 'late', %s)",
                (writers_pk[0], version),
            )
            opened.set()
            time.sleep(2.5)
        straddling.commit()
        committed_late.append((writers_pk[0], version, time.monotonic()))

    late = threading.Thread(target=straddle)
    late.start()
    opened.wait(10)
    time.sleep(0.3)
    stopped = trigger.poll(lambda rows: (_ for _ in ()).throw(RuntimeError("host stopped")))
    assert stopped.succeeded is False
    assert trigger.lease_rows(), "rows must be in flight when the trigger stops"

    seen: list[tuple[int, int]] = []

    def handler(batch: Batch) -> None:
        seen.extend((int(c.pk), int(c.data["Cost"])) for c in batch)  # type: ignore[call-overload]

    definition = PollerDefinition(
        config=PollerConfig(name="products", batch_size=50),
        schedule="* * * * * *",
        source=SqlSource(url=db.url, table="Products", cursor="az_func_updated_at", pk="ProductId"),
        handler=handler,
        state=MemoryStateStore(),
    )
    plan = take_over(
        definition,
        {"WEBSITE_SITE_NAME": SITE},
        Request(function=FUNCTION, overlap=OVERLAP, wait=30),
    )
    assert plan.written
    assert POISON in {r.pk[0] for r in plan.given_up + plan.unfinished}
    late.join(10)
    straddling.close()
    time.sleep(1.0)  # the writers go on after the switch
    stop.set()
    for thread in threads:
        thread.join(10)
    # The horizon passes a second only once it is over (whole-second stamps): run the poller
    # until it has read each row's final version, or for 15 s (a lost row is never read).
    with db.engine.connect() as conn:
        rows = conn.exec_driver_sql("SELECT ProductId, Cost FROM Products").all()
    final = {int(pk): int(cost) for pk, cost in rows}
    newest_seen: dict[int, int] = {}
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        definition.engine({}).run({})
        for pk, version in seen:
            newest_seen[pk] = max(version, newest_seen.get(pk, 0))
        if all(newest_seen.get(pk, 0) >= version for pk, version in final.items()):
            break
        time.sleep(0.3)

    committed = writers.committed + committed_late
    after = [(pk, v) for pk, v, at in committed if at > last_delivery]
    missing = [(pk, v) for pk, v in after if newest_seen.get(pk, 0) < v]
    assert after, "the writers must commit after the trigger's last delivery"
    assert missing == []
    assert (PRODUCTS + 1) in newest_seen  # the transaction open across the switch
    assert POISON in newest_seen  # the row the trigger gave up on
