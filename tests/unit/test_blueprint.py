"""The decorator API: what the Functions host sees, and validation at decoration time."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

import azure.functions as func
import pytest
import sqlalchemy as sa
from azure.functions.timer import TimerRequest

import azure_functions_db as afdb
from azure_functions_db.errors import (
    ConfigurationError,
    SettingNotFoundError,
    SourceDefinitionError,
)
from azure_functions_db.runtime.runner import run_one
from tests.support.sqlite_orders import Orders


@pytest.fixture
def orders(tmp_path: Path):
    table = Orders(tmp_path / "orders.db")
    table.insert(range(1, 8))
    yield table
    table.close()


def source(url: str, **kw) -> afdb.SqlSource:
    return afdb.SqlSource(
        url=url,
        table=kw.pop("table", "orders"),
        cursor=kw.pop("cursor", "updated_at"),
        pk="id",
        **kw,
    )


def test_one_timer_function_per_poller_with_only_the_timer_parameter(orders, tmp_path):
    db = afdb.PollerBlueprint()

    @db.poller(
        name="orders",
        schedule="*/30 * * * * *",
        source=source(orders.url),
        state=afdb.LocalStateStore(tmp_path / "s"),
    )
    def on_orders(batch: afdb.Batch) -> None:
        pass

    @db.poller(
        name="orders-audit",
        schedule="%AUDIT_SCHEDULE%",
        source=source(orders.url),
        state=afdb.LocalStateStore(tmp_path / "s"),
        run_on_startup=True,
    )
    async def on_audit(batch: afdb.Batch) -> None:
        pass

    app = func.FunctionApp()
    app.register_functions(db)
    functions = app.get_functions()
    assert sorted(f.get_function_name() for f in functions) == ["poll_orders", "poll_orders_audit"]
    for f in functions:
        (binding,) = f.get_bindings()
        assert binding.type == "timerTrigger"
        assert binding.name == "timer"
        user = f.get_user_function()
        assert list(user.__code__.co_varnames[: user.__code__.co_argcount]) == ["timer"]
    by_name = {f.get_function_name(): f.get_bindings()[0] for f in functions}
    assert by_name["poll_orders"].schedule == "*/30 * * * * *"
    assert by_name["poll_orders_audit"].schedule == "%AUDIT_SCHEDULE%"
    assert by_name["poll_orders_audit"].run_on_startup is True
    # The decorator returns the user's function untouched (unit-testable on its own).
    assert on_orders.__name__ == "on_orders"
    assert set(db.pollers) == {"orders", "orders-audit"}


def test_invoking_the_timer_function_delivers_rows(orders, tmp_path, monkeypatch):
    monkeypatch.setenv("ORDERS_DB_URL", orders.url)
    seen: list[int] = []
    db = afdb.PollerBlueprint()

    @db.poller(
        name="orders",
        schedule="0 * * * * *",
        batch_size=3,
        source=source("%ORDERS_DB_URL%"),
        state=afdb.LocalStateStore(tmp_path / "s"),
    )
    def on_orders(batch: afdb.Batch) -> None:
        seen.extend(c.pk for c in batch)

    app = func.FunctionApp()
    app.register_functions(db)
    (function,) = app.get_functions()
    timer = TimerRequest(past_due=True)
    asyncio.run(function.get_user_function()(timer))
    assert seen == list(range(1, 8))


def test_setting_resolved_at_run_time_not_import_time(orders, tmp_path, monkeypatch):
    monkeypatch.delenv("LATE_DB_URL", raising=False)
    db = afdb.PollerBlueprint()

    @db.poller(
        name="late",
        schedule="0 * * * * *",
        source=source("%LATE_DB_URL%"),
        state=afdb.LocalStateStore(tmp_path / "s"),
    )
    def handler(batch: afdb.Batch) -> None:
        pass

    with pytest.raises(SettingNotFoundError, match="LATE_DB_URL"):
        db.pollers["late"].run_once({})
    report = db.pollers["late"].run_once({"LATE_DB_URL": orders.url})
    assert report.rows == 7


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"schedule": "*/5 * * * *"}, "*/5 * * * *"),  # five fields: Unix cron, not NCRONTAB
        ({"schedule": "61 * * * * *"}, "61 * * * * *"),
        ({"schedule": "every minute"}, "every minute"),
        ({"batch_size": 0}, "batch_size=0"),
        ({"batch_size": -1}, "batch_size=-1"),
        ({"name": "bad name"}, "bad name"),
        ({"name": ""}, "''"),
        ({"lease_duration": 0}, "lease_duration=0"),
    ],
)
def test_bad_configuration_fails_at_decoration_naming_the_value(orders, kwargs, needle):
    db = afdb.PollerBlueprint()
    args = {"name": "orders", "schedule": "0 * * * * *", "source": source(orders.url), **kwargs}
    with pytest.raises(ConfigurationError) as info:
        db.poller(**args)
    assert needle in str(info.value)


def test_duplicate_poller_names_are_rejected(orders):
    db = afdb.PollerBlueprint()
    db.poller(name="orders", schedule="0 * * * * *", source=source(orders.url))(lambda b: None)
    with pytest.raises(ConfigurationError, match="Duplicate poller name `orders`"):
        db.poller(name="orders", schedule="0 * * * * *", source=source(orders.url))
    # Names that map to the same Functions function name clash too.
    db.poller(name="a-b", schedule="0 * * * * *", source=source(orders.url))(lambda b: None)
    with pytest.raises(ConfigurationError, match="a_b"):
        db.poller(name="a_b", schedule="0 * * * * *", source=source(orders.url))


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Fail any network connection or engine creation; returns what was attempted."""
    attempts: list[str] = []

    def refuse(what: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            attempts.append(what)
            raise AssertionError(f"I/O at decoration: {what}")

        return call

    monkeypatch.setattr(socket.socket, "connect", refuse("socket.connect"))
    monkeypatch.setattr(socket, "create_connection", refuse("socket.create_connection"))
    monkeypatch.setattr(sa, "create_engine", refuse("sqlalchemy.create_engine"))
    return attempts


@pytest.mark.parametrize(
    "url",
    [
        "postgresql+psycopg://postgres@127.0.0.1:5432/test",  # reachable, no `orders` table
        "postgresql+psycopg://postgres@127.0.0.1:1/test",  # no server at all
        "%ORDERS_DB_URL%",
    ],
)
def test_decorating_does_no_io_whatever_the_database(no_network, monkeypatch, url):
    monkeypatch.setenv("ORDERS_DB_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
    db = afdb.PollerBlueprint()
    db.poller(name="x", schedule="0 * * * * *", source=source(url, table="no_such_table"))(
        lambda batch: None
    )
    app = func.FunctionApp()
    app.register_functions(db)
    assert [f.get_function_name() for f in app.get_functions()] == ["poll_x"]
    assert no_network == []


def test_a_missing_table_fails_only_that_pollers_run_and_writes_nothing(orders, tmp_path):
    store = afdb.LocalStateStore(tmp_path / "state")
    db = afdb.PollerBlueprint()
    seen: list[int] = []
    db.poller(name="good", schedule="0 * * * * *", source=source(orders.url), state=store)(
        lambda batch: seen.extend(c.pk for c in batch)
    )
    db.poller(
        name="later", schedule="0 * * * * *", source=source(orders.url, table="ordrs"), state=store
    )(lambda batch: None)
    good = run_one(db.pollers["good"], {})
    later = run_one(db.pollers["later"], {})
    try:
        assert good.ok
        assert seen
        assert isinstance(later.error, SourceDefinitionError)
        assert "`ordrs`" in str(later.error)
        assert store.read(db.pollers["later"].config.key) is None  # nothing written
        missing_column = source(orders.url, cursor="changed_at")
        with pytest.raises(SourceDefinitionError, match="changed_at"):
            missing_column.open({})
    finally:
        for definition in db.pollers.values():
            definition.source.close()


def test_disclosure_is_in_the_decorator_docstring():
    doc = afdb.PollerBlueprint.poller.__doc__ or ""
    assert "not a native database trigger" in doc
    assert "at-least-once" in doc
    assert "idempotent" in doc


def test_default_state_is_blob_under_a_functions_host_and_local_elsewhere(orders, tmp_path):
    from azure_functions_db.runtime.poller import default_state_store
    from azure_functions_db.state.blob import BlobStateStore
    from azure_functions_db.state.local import LocalStateStore

    azure = {"WEBSITE_INSTANCE_ID": "abc", "AzureWebJobsStorage__accountName": "acct"}
    store = default_state_store(azure)
    assert isinstance(store, BlobStateStore)
    assert store.describe() == "blob:acct/afdb-state"
    func_start = {"FUNCTIONS_WORKER_RUNTIME": "python", "AzureWebJobsStorage": "x=y"}
    assert isinstance(default_state_store(func_start), BlobStateStore)
    # Flex Consumption may not expose FUNCTIONS_WORKER_RUNTIME to the worker: any one host
    # marker is enough, and a marker that is set but empty is not.
    for marker in ("WEBSITE_SITE_NAME", "AzureWebJobsScriptRoot"):
        marked = {marker: "x", "AzureWebJobsStorage__accountName": "acct"}
        assert isinstance(default_state_store(marked), BlobStateStore), marker
    empty = {"WEBSITE_SITE_NAME": "", "CONTAINER_NAME": "x", "AFDB_STATE_DIR": str(tmp_path / "e")}
    assert isinstance(default_state_store(empty), LocalStateStore)
    local = default_state_store({"AFDB_STATE_DIR": str(tmp_path / "s")})
    assert isinstance(local, LocalStateStore)
    assert local.describe() == f"local:{tmp_path / 's'}"


def test_missing_storage_setting_under_a_host_names_it(orders):
    db = afdb.PollerBlueprint()
    db.poller(name="orders", schedule="0 * * * * *", source=source(orders.url))(lambda b: None)
    with pytest.raises(ConfigurationError, match="AzureWebJobsStorage"):
        db.pollers["orders"].run_once({"WEBSITE_INSTANCE_ID": "abc"})


def test_functions_retry_policy_reaches_the_function_settings(orders, tmp_path):
    db = afdb.PollerBlueprint()

    @db.poller(
        name="orders",
        schedule="0 0 * * * *",
        source=source(orders.url),
        state=afdb.LocalStateStore(tmp_path / "s"),
        retry=afdb.FunctionsRetry("fixed_delay", max_retry_count=2, delay_interval="00:00:30"),
    )
    def on_orders(batch: afdb.Batch) -> None:
        pass

    @db.poller(
        name="plain",
        schedule="0 0 * * * *",
        source=source(orders.url),
        state=afdb.LocalStateStore(tmp_path / "s"),
    )
    def on_plain(batch: afdb.Batch) -> None:
        pass

    app = func.FunctionApp()
    app.register_functions(db)
    by_name = {f.get_function_name(): f for f in app.get_functions()}
    policy = by_name["poll_orders"].get_settings_dict("retry_policy")
    assert policy is not None
    assert (policy["strategy"], policy["max_retry_count"], policy["delay_interval"]) == (
        "fixed_delay",
        "2",
        "00:00:30",
    )
    assert by_name["poll_plain"].get_settings_dict("retry_policy") is None
    (binding,) = by_name["poll_orders"].get_bindings()  # still only the timer
    assert binding.type == "timerTrigger"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"strategy": "linear", "max_retry_count": 2}, r"strategy='linear'.*`\"fixed_delay\"`"),
        (
            {"strategy": "fixed_delay", "max_retry_count": 0, "delay_interval": "00:00:10"},
            r"max_retry_count=0.*from 1 to 10",
        ),
        ({"strategy": "fixed_delay", "max_retry_count": 2}, r"delay_interval=None.*HH:MM:SS"),
        (  # the worker parses intervals with strptime("%H:%M:%S"), so 24 hours is refused there
            {"strategy": "fixed_delay", "max_retry_count": 2, "delay_interval": "24:00:00"},
            r"delay_interval='24:00:00'.*under 24 hours",
        ),
        (
            {"strategy": "exponential_backoff", "max_retry_count": 2, "minimum_interval": "5s"},
            r"minimum_interval='5s'",
        ),
        (
            {
                "strategy": "exponential_backoff",
                "max_retry_count": 2,
                "minimum_interval": "00:05:00",
                "maximum_interval": "00:00:10",
            },
            r"longer than `maximum_interval='00:00:10'`",
        ),
    ],
)
def test_bad_functions_retry_is_refused_naming_the_value(kwargs, message):
    with pytest.raises(afdb.ConfigurationError, match=message):
        afdb.FunctionsRetry(**kwargs)


def test_retry_must_be_a_functions_retry(orders):
    db = afdb.PollerBlueprint()
    with pytest.raises(afdb.ConfigurationError, match=r"`retry=3` is not a host retry policy"):
        db.poller(name="x", schedule="0 0 * * * *", source=source(orders.url), retry=3)  # type: ignore[arg-type]


def test_a_sink_is_checked_at_decoration_and_does_no_io(orders, monkeypatch):
    bp = afdb.PollerBlueprint()
    with pytest.raises(ConfigurationError, match=r"`sink='nope'` is not a transactional sink"):
        bp.poller(name="a", schedule="0 * * * * *", source=source(orders.url), sink="nope")  # type: ignore[arg-type]

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("I/O at decoration")

    monkeypatch.setattr(sa, "create_engine", refuse)
    sink = afdb.SqlSink(url="%TARGET_DB_URL%")
    with pytest.raises(ConfigurationError, match=r"on_rows\(batch, sink\): \.\.\.`"):

        @bp.poller(name="b", schedule="0 * * * * *", source=source(orders.url), sink=sink)
        def on_rows(batch):  # the sink's writer has nowhere to go
            pass

    @bp.poller(name="c", schedule="0 * * * * *", source=source(orders.url), sink=sink)
    def copy(batch, writer):
        writer.upsert("copy", batch)

    assert bp.pollers["c"].sink is sink
