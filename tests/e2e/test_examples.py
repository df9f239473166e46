"""Every app in examples/ runs as its README says, against the kind of service it names: the
SQL sink into SQLite, the Delta sink into a local Delta table, the queue sink on Azurite, the
HTTP bindings through azure.functions' own request objects, and the async handler with its
shared client on the real PostgreSQL (two runs in one process, one client)."""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.support.sqlite_orders import T0, Orders

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
pytestmark = pytest.mark.slow


def afdb_run(app: str, cwd: Path, **settings: str) -> str:
    path = os.pathsep.join(filter(None, [str(EXAMPLES.parent), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "AFDB_STATE_DIR": str(cwd / "state"), "PYTHONPATH": path, **settings}
    env.pop("FUNCTIONS_WORKER_RUNTIME", None)
    env.pop("AFDB_STATE", None)
    done = subprocess.run(
        [sys.executable, "-m", "azure_functions_db", "run", str(EXAMPLES / app), "--once"],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.fixture
def orders(tmp_path: Path) -> Orders:
    table = Orders(tmp_path / "orders.db")
    table.insert(range(1, 11))
    yield table
    table.close()


def test_sql_sink(orders: Orders, tmp_path: Path) -> None:
    warehouse = sa.create_engine(f"sqlite:///{tmp_path / 'warehouse.db'}")
    with warehouse.begin() as conn:
        conn.exec_driver_sql(
            "CREATE TABLE orders_copy (id integer PRIMARY KEY, note varchar(50), "
            "updated_at timestamp)"
        )
    settings = {"ORDERS_DB_URL": orders.url, "WAREHOUSE_DB_URL": str(warehouse.url)}
    assert "10 row(s)" in afdb_run("sql_sink/function_app.py", tmp_path, **settings)
    orders.touch([3], T0.replace(hour=13))
    afdb_run("sql_sink/function_app.py", tmp_path, **settings)
    with warehouse.connect() as conn:
        rows = dict(conn.exec_driver_sql("SELECT id, note FROM orders_copy").all())
    warehouse.dispose()
    assert sorted(rows) == list(range(1, 11))
    assert rows[3] == "upd"


def test_delta_sink(orders: Orders, tmp_path: Path) -> None:
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    lake = tmp_path / "lake"
    schema = pa.schema(
        [("id", pa.int64()), ("note", pa.string()), ("updated_at", pa.timestamp("us"))]
    )
    write_deltalake(str(lake), pa.Table.from_pylist([], schema=schema))
    settings = {"ORDERS_DB_URL": orders.url, "ORDERS_LAKE_URI": str(lake)}
    afdb_run("delta_sink/function_app.py", tmp_path, **settings)
    afdb_run("delta_sink/function_app.py", tmp_path, **settings)  # nothing new: no commit
    table = DeltaTable(str(lake))
    assert sorted(table.to_pyarrow_table().column("id").to_pylist()) == list(range(1, 11))


def test_queue_sink(orders: Orders, tmp_path: Path) -> None:
    from azure.storage.queue import QueueClient

    from devkit.azurite import Azurite, unavailable_reason

    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    with Azurite(tmp_path / "azurite") as azurite:
        settings = {"ORDERS_DB_URL": orders.url, "AzureWebJobsStorage": azurite.connection_string}
        afdb_run("queue_sink/function_app.py", tmp_path, **settings)
        client = QueueClient.from_connection_string(azurite.connection_string, "orders-out")
        bodies = [
            json.loads(base64.b64decode(m.content))
            for m in client.receive_messages(messages_per_page=32, max_messages=32)
        ]
    assert sorted(b["data"]["id"] for b in bodies) == list(range(1, 11))
    assert len({b["event_id"] for b in bodies}) == 10


def test_fan_out_the_consumer_does_each_row_version_once(
    orders: Orders, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The poller sends every change (then all of them again, as after a lost commit); the
    queue-triggered consumer gets each message twice, as the host redelivers one whose function
    outlived its visibility: the work is done once per row version, by its `event_id`."""
    import azure.functions as func
    from azure.storage.queue import QueueClient

    from azure_functions_db.runtime.loader import _import_file
    from devkit.azurite import Azurite, unavailable_reason

    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    work = sa.create_engine(f"sqlite:///{tmp_path / 'work.db'}")
    with work.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE processed (event_id text PRIMARY KEY, order_id int)")
        conn.exec_driver_sql("CREATE TABLE shipments (order_id int, note text)")
    monkeypatch.setenv("WORK_DB_URL", f"sqlite:///{tmp_path / 'work.db'}")
    module = _import_file(EXAMPLES / "fan_out" / "function_app.py")
    functions = {f.get_function_name(): f for f in module.app.get_functions()}
    trigger = functions["do_work"].get_bindings()[0]
    assert (trigger.type, trigger.queue_name) == ("queueTrigger", "orders-work")
    do_work = functions["do_work"].get_user_function()

    def consume(client: QueueClient) -> int:
        taken = 0
        while batch := list(client.receive_messages(messages_per_page=32, max_messages=32)):
            for message in batch:
                body = base64.b64decode(message.content)  # what the host hands the function
                do_work(func.QueueMessage(body=body))
                do_work(func.QueueMessage(body=body))  # redelivered
                client.delete_message(message)
                taken += 1
        return taken

    with Azurite(tmp_path / "azurite") as azurite:
        settings = {"ORDERS_DB_URL": orders.url, "AzureWebJobsStorage": azurite.connection_string}
        afdb_run("fan_out/function_app.py", tmp_path, **settings)
        client = QueueClient.from_connection_string(azurite.connection_string, "orders-work")
        assert consume(client) == 10
        env = {**os.environ, "AFDB_STATE_DIR": str(tmp_path / "state"), **settings}
        seek = [sys.executable, "-m", "azure_functions_db", "seek"]
        app = str(EXAMPLES / "fan_out" / "function_app.py")
        subprocess.run(
            [*seek, app, "--poller", "orders-fanout", "--beginning"], env=env, check=True
        )
        afdb_run("fan_out/function_app.py", tmp_path, **settings)  # every change sent again
        orders.touch([2, 5], T0 + dt.timedelta(hours=1))
        afdb_run("fan_out/function_app.py", tmp_path, **settings)
        assert consume(client) == 12
    with work.connect() as conn:
        shipments = conn.exec_driver_sql("SELECT order_id, note FROM shipments").all()
        processed = conn.exec_driver_sql("SELECT count(*) FROM processed").scalar_one()
    work.dispose()
    assert processed == 12
    assert sorted(order_id for order_id, _ in shipments) == sorted([*range(1, 11), 2, 5])


def test_sql_bindings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import azure.functions as func

    from azure_functions_db.runtime.loader import _import_file

    db = sa.create_engine(f"sqlite:///{tmp_path / 'shop.db'}")
    with db.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE orders (id integer PRIMARY KEY, note text)")
    db.dispose()
    monkeypatch.setenv("ORDERS_DB_URL", f"sqlite:///{tmp_path / 'shop.db'}")
    module = _import_file(EXAMPLES / "sql_bindings" / "function_app.py")
    functions = {f.get_function_name(): f.get_user_function() for f in module.app.get_functions()}
    body = json.dumps({"id": 7, "note": "paid"}).encode()
    for _ in range(2):  # a client's retry: harmless
        created = functions["create_order"](
            func.HttpRequest("POST", "/api/orders", body=body, headers={})
        )
        assert created.status_code == 201
    found = functions["read_order"](
        func.HttpRequest("GET", "/api/orders/7", body=b"", route_params={"id": "7"})
    )
    assert found.status_code == 200
    assert json.loads(found.get_body()) == {"id": 7, "note": "paid"}
    missing = functions["read_order"](
        func.HttpRequest("GET", "/api/orders/8", body=b"", route_params={"id": "8"})
    )
    assert missing.status_code == 404


@pytest.mark.postgres
def test_async_handler_with_a_shared_client(
    pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from azure_functions_db.runtime.loader import _import_file
    from azure_functions_db.state.memory import MemoryStateStore
    from devkit import dbservers

    engine = sa.create_engine(dbservers.pg_url(), poolclass=sa.NullPool)
    with engine.begin() as conn:
        conn.exec_driver_sql(f'SET search_path TO "{pg_schema}"')
        conn.exec_driver_sql(
            "CREATE TABLE orders (id int PRIMARY KEY, updated_at timestamptz NOT NULL)"
        )
        conn.exec_driver_sql(
            "INSERT INTO orders SELECT i, now() - interval '1 hour' FROM generate_series(1, 5) i"
        )
        conn.exec_driver_sql(
            "CREATE TABLE notifications (event_id text PRIMARY KEY, order_id int NOT NULL)"
        )
    conninfo = dbservers.pg_url().replace("postgresql+psycopg://", "postgresql://", 1)
    monkeypatch.setenv("NOTIFY_DB_URL", f"{conninfo}?options=-csearch_path%3D{pg_schema}")
    search_path = f"?options=-csearch_path%3D{pg_schema}"
    monkeypatch.setenv("ORDERS_DB_URL", dbservers.pg_url() + search_path)
    module = _import_file(EXAMPLES / "async_handler" / "function_app.py")
    (poller,) = module.db.pollers.values()
    poller.state = MemoryStateStore()
    settings = {**os.environ}
    assert poller.run_once(settings).rows == 5
    first = module.notify_db.connection
    with engine.begin() as conn:
        conn.exec_driver_sql(f'SET search_path TO "{pg_schema}"')
        conn.exec_driver_sql("UPDATE orders SET updated_at = now() - interval '10 minutes'")
    poller.run_once(settings)
    assert first is not None
    assert module.notify_db.connection is first  # one client for every batch of the process
    with engine.connect() as conn:
        conn.exec_driver_sql(f'SET search_path TO "{pg_schema}"')
        count = conn.exec_driver_sql("SELECT count(*) FROM notifications").scalar_one()
    engine.dispose()
    assert count == 10  # five rows, two versions each, each once
