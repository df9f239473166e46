"""The handler contract: one positional argument, returns None; nothing else is acknowledged.

A generator handler used to be accepted: calling it made a generator that never ran, the engine
saw no error and committed, so rows were acknowledged without the handler's body running.
"""

from __future__ import annotations

import functools
import textwrap
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

import azure_functions_db as afdb
from azure_functions_db.cli import EXIT_USAGE, main
from azure_functions_db.core.batch import Batch
from azure_functions_db.core.engine import Engine, PollerConfig
from azure_functions_db.core.handler import check_handler
from azure_functions_db.errors import ConfigurationError, HandlerContractError, HandlerError
from azure_functions_db.sources.sqlalchemy import SqlSource
from azure_functions_db.state.memory import MemoryStateStore
from azure_functions_db.testing.clock import FakeClock
from tests.support.sqlite_orders import Orders

SOURCE = afdb.SqlSource(
    url="%HANDLER_TEST_UNSET_URL%", table="orders", cursor="updated_at", pk="id"
)


def decorate(handler: Any) -> None:
    afdb.PollerBlueprint().poller(name="orders", schedule="0 * * * * *", source=SOURCE)(handler)


# -- at decoration ----------------------------------------------------------------------------


def gen_handler(batch: Batch) -> Iterator[int]:
    yield len(batch)


async def agen_handler(batch: Batch) -> AsyncIterator[int]:
    yield len(batch)


class GeneratorCall:
    def __call__(self, batch: Batch) -> Iterator[int]:
        yield len(batch)


def two_args(batch: Batch, other: int) -> None: ...


def no_args() -> None: ...


def keyword_only(*, batch: Batch) -> None: ...


@pytest.mark.parametrize(
    ("handler", "needle"),
    [
        (gen_handler, "is a generator function"),
        (agen_handler, "is an async generator function"),
        (GeneratorCall(), "is a generator function"),
        (functools.partial(gen_handler), "is a generator function"),
        (two_args, "cannot be called with one positional argument"),
        (no_args, "cannot be called with one positional argument"),
        (keyword_only, "cannot be called with one positional argument"),
        (lambda: None, "cannot be called with one positional argument"),
        ("not a function", "must decorate a function"),
    ],
)
def test_decoration_refuses_what_cannot_run_as_a_handler(handler: Any, needle: str) -> None:
    with pytest.raises(ConfigurationError, match=needle) as err:
        decorate(handler)
    assert "orders" in str(err.value)


def sync_ok(batch: Batch) -> None: ...


async def async_ok(batch: Batch) -> None: ...


def with_default(batch: Batch, retries: int = 3) -> None: ...


class CallableOk:
    def __call__(self, batch: Batch) -> None: ...

    def method(self, batch: Batch) -> None: ...


@pytest.mark.parametrize(
    "handler",
    [
        sync_ok,
        async_ok,
        with_default,
        CallableOk(),
        CallableOk().method,
        functools.partial(with_default, retries=1),
        lambda batch: None,
        print,  # a builtin: no generator, result checked at run time
    ],
)
def test_decoration_accepts_callables_of_one_positional_argument(handler: Any) -> None:
    decorate(handler)
    check_handler(handler, "orders")


# -- at run time ------------------------------------------------------------------------------


@pytest.fixture
def orders(tmp_path: Path) -> Iterator[Orders]:
    table = Orders(tmp_path / "orders.db")
    table.insert(range(1, 10))
    yield table
    table.close()


def run_engine(orders: Orders, handler: Any) -> tuple[MemoryStateStore, Engine]:
    clock = FakeClock()
    store = MemoryStateStore(clock)
    source = SqlSource(url=orders.url, table="orders", cursor="updated_at", pk="id")
    engine = Engine(
        PollerConfig(name="orders", batch_size=4, max_attempts=9),
        source,
        store,
        handler,
        clock,
        owner="test",
        heartbeat_interval=3600,
    )
    return store, engine


def wraps_generator(batch: Batch) -> Any:
    """Not a generator function itself, but returns the generator of one."""
    return gen_handler(batch)


def wraps_async_generator(batch: Batch) -> Any:
    return agen_handler(batch)


async def returns_value(batch: Batch) -> int:
    return len(batch)


@pytest.mark.parametrize(
    ("handler", "needle"),
    [
        (wraps_generator, "returned a generator"),
        (wraps_async_generator, "returned an async generator"),
        (lambda batch: map(print, batch), "returned a `map`"),
        (len, "returned a `int`"),
        (returns_value, "its awaitable returned a `int`"),
    ],
)
def test_a_returned_value_is_a_failed_attempt_never_an_ack(orders, handler, needle):
    store, engine = run_engine(orders, handler)
    with pytest.raises(HandlerError) as err:
        engine.run({})
    assert isinstance(err.value.__cause__, HandlerContractError)
    assert needle in str(err.value.__cause__)
    record = store.read(engine.config.key)
    assert record is not None
    assert record.checkpoint.position is None  # nothing acknowledged
    assert record.checkpoint.attempts == 1  # counted as a failed attempt


def test_generator_handler_app_fails_under_afdb_run(tmp_path, monkeypatch, capsys):
    """The reported repro: `afdb run --once` said `caught_up, 3 batch(es), 9 row(s)`."""
    orders = Orders(tmp_path / "orders.db")
    orders.insert(range(1, 10))
    orders.close()
    app = tmp_path / "function_app.py"
    app.write_text(
        textwrap.dedent(
            f"""
            import azure_functions_db as afdb
            db = afdb.PollerBlueprint()

            @db.poller(name="orders", schedule="0 * * * * *", batch_size=4,
                       source=afdb.SqlSource(url={orders.url!r}, table="orders",
                                             cursor="updated_at", pk="id"))
            def on_orders(batch):
                for change in batch:
                    yield change
            """
        )
    )
    monkeypatch.setenv("AFDB_STATE_DIR", str(tmp_path / "state"))
    assert main(["run", str(app), "--once"]) == EXIT_USAGE
    captured = capsys.readouterr()
    assert "generator function" in captured.err
    assert "caught_up" not in captured.out
