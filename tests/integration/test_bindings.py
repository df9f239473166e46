"""SqlOutput and SqlInput from functions that are not pollers: an HTTP-triggered function writes
and reads rows, a queue-triggered one retried by the host leaves one row (upsert), on SQLite
and PostgreSQL; one engine per database for every binding of a process."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import azure.functions as func
import pytest
import sqlalchemy as sa

import azure_functions_db as afdb
from azure_functions_db.errors import ConfigurationError, SinkError
from azure_functions_db.sinks.bindings import EngineProvider
from devkit import dbservers

ORDERS = "CREATE TABLE orders (id integer PRIMARY KEY, note varchar(40) NOT NULL)"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, str]]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'app.db'}"
        engine = sa.create_engine(url)
        with engine.begin() as conn:
            conn.exec_driver_sql(ORDERS)
        engine.dispose()
        yield {"ORDERS_DB_URL": url}
        return
    with dbservers.pg_schema(dbservers.pg_url()) as schema:
        url = dbservers.pg_url() + f"?options=-csearch_path%3D{schema}"
        engine = sa.create_engine(url)
        with engine.begin() as conn:
            conn.exec_driver_sql(ORDERS)
        engine.dispose()
        yield {"ORDERS_DB_URL": url}


@pytest.fixture
def provider() -> Iterator[EngineProvider]:
    made = EngineProvider()
    yield made
    made.dispose()


def test_an_http_function_writes_and_reads_rows(
    database: dict[str, str], provider: EngineProvider
) -> None:
    orders_out = afdb.SqlOutput("%ORDERS_DB_URL%", "orders", provider=provider)
    orders_in = afdb.SqlInput("%ORDERS_DB_URL%", "orders", provider=provider)

    def create_order(req: func.HttpRequest) -> func.HttpResponse:
        orders_out.upsert([req.get_json()], database)
        return func.HttpResponse(status_code=201)

    def read_order(req: func.HttpRequest) -> func.HttpResponse:
        row = orders_in.get(database, id=int(req.route_params["id"]))
        if row is None:
            return func.HttpResponse(status_code=404)
        return func.HttpResponse(json.dumps(row), mimetype="application/json")

    post = func.HttpRequest("POST", "/api/orders", body=b'{"id": 7, "note": "first"}')
    assert create_order(post).status_code == 201
    again = func.HttpRequest("POST", "/api/orders", body=b'{"id": 7, "note": "second"}')
    assert create_order(again).status_code == 201  # a client retry with new data: one row
    got = read_order(func.HttpRequest("GET", "/api/orders/7", body=b"", route_params={"id": "7"}))
    assert json.loads(got.get_body()) == {"id": 7, "note": "second"}
    missing = func.HttpRequest("GET", "/api/orders/8", body=b"", route_params={"id": "8"})
    assert read_order(missing).status_code == 404
    assert orders_in.query("SELECT id FROM orders WHERE note = :note", database, note="second") == [
        {"id": 7}
    ]


def test_a_queue_function_retried_by_the_host_leaves_one_row(
    database: dict[str, str], provider: EngineProvider
) -> None:
    orders_out = afdb.SqlOutput("%ORDERS_DB_URL%", "orders", provider=provider)
    attempts: list[int] = []

    def on_message(msg: func.QueueMessage) -> None:
        orders_out.upsert([json.loads(msg.get_body())], database)
        attempts.append(1)
        if len(attempts) == 1:
            raise RuntimeError("fails after writing: the host delivers the message again")

    message = func.QueueMessage(body=b'{"id": 1, "note": "paid"}')
    with pytest.raises(RuntimeError):
        on_message(message)
    on_message(message)
    rows = afdb.SqlInput("%ORDERS_DB_URL%", provider=provider).query(
        "SELECT id, note FROM orders", database
    )
    assert rows == [{"id": 1, "note": "paid"}]


def test_an_insert_is_not_idempotent_and_says_so(
    database: dict[str, str], provider: EngineProvider
) -> None:
    orders_out = afdb.SqlOutput("%ORDERS_DB_URL%", "orders", provider=provider)
    orders_out.insert([{"id": 1, "note": "a"}], database)
    with pytest.raises(SinkError, match=r"SqlOutput could not insert into `orders`"):
        orders_out.insert([{"id": 1, "note": "a"}], database)


def test_bindings_of_one_database_share_one_engine(tmp_path: Path) -> None:
    provider = EngineProvider()
    settings = {"DB": f"sqlite:///{tmp_path / 'x.db'}"}
    first, _, _ = provider.engine("%DB%", settings)
    second, _, _ = provider.engine("%DB%", settings)
    assert first is second
    provider.dispose()


def test_declaring_bindings_does_no_io_and_errors_hide_the_password(
    provider: EngineProvider,
) -> None:
    out = afdb.SqlOutput(
        "postgresql+psycopg://app:pw-s3cr3t@127.0.0.1:1/db?connect_timeout=1",
        "t",
        provider=provider,
    )
    assert "pw-s3cr3t" not in repr(out)
    with pytest.raises(SinkError) as caught:
        out.upsert([{"id": 1}], {})
    assert "pw-s3cr3t" not in str(caught.value)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: afdb.SqlOutput("", "t"), "`url=''` must be the database's SQLAlchemy URL"),
        (lambda: afdb.SqlOutput("sqlite://", " "), "`table=' '` must be a table name"),
        (lambda: afdb.SqlInput("sqlite://").get(id=1), "`SqlInput.get` needs `table=`"),
    ],
)
def test_bad_use_names_the_fix(make: object, message: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        make()  # type: ignore[operator]
    assert message in str(caught.value)
