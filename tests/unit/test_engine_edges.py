"""Ways out of a handler that must never acknowledge a batch, and one poller's crash.

Issue 18, item 6: a handler ending in a ``BaseException`` is a counted, logged failed attempt;
tasks an ``async`` handler leaves running are awaited before the commit (or fail the batch); a
cursor column whose type changed is refused before the handler runs; an error that is not the
library's own fails that poller's run only; backfill record names cannot collide.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from azure_functions_db.core.batch import Batch
from azure_functions_db.core.engine import Engine, PollerConfig
from azure_functions_db.errors import (
    HandlerContractError,
    HandlerError,
    SourceDefinitionError,
    UnexpectedRunError,
)
from azure_functions_db.runtime.poller import PollerDefinition
from azure_functions_db.runtime.runner import run_one
from azure_functions_db.sources.sqlalchemy import SqlSource
from azure_functions_db.spark.records import chunk_key, run_key
from azure_functions_db.state.memory import MemoryStateStore
from azure_functions_db.testing.clock import FakeClock
from tests.support.sqlite_orders import Orders


@pytest.fixture
def orders(tmp_path: Path) -> Iterator[Orders]:
    table = Orders(tmp_path / "orders.db")
    table.insert(range(1, 7))
    yield table
    table.close()


def make(orders: Orders, handler: Any, store: MemoryStateStore | None = None) -> Engine:
    clock = FakeClock()
    return Engine(
        PollerConfig(name="orders", batch_size=3, max_attempts=9),
        SqlSource(url=orders.url, table="orders", cursor="updated_at", pk="id"),
        store or MemoryStateStore(clock),
        handler,
        clock,
        owner="test",
        heartbeat_interval=3600,
    )


def attempts(engine: Engine) -> tuple[int, object]:
    stored = engine.store.read(engine.config.key)
    assert stored is not None
    return stored.checkpoint.attempts, stored.checkpoint.position


@pytest.mark.parametrize(
    ("raised", "escapes"),
    [
        (asyncio.CancelledError(), HandlerError),
        (KeyboardInterrupt(), KeyboardInterrupt),
        (SystemExit(3), SystemExit),
    ],
)
def test_a_base_exception_is_a_logged_failed_attempt_counted_unless_ctrl_c(
    orders, caplog, raised, escapes
):
    def handler(batch: Batch) -> None:
        raise raised

    engine = make(orders, handler)
    with caplog.at_level(logging.INFO, "azure_functions_db"), pytest.raises(escapes):
        engine.run({})
    # Ctrl-C stops the run; it is not a failure of the batch, so it is not counted.
    counted = 0 if isinstance(raised, KeyboardInterrupt) else 1
    stored = engine.store.read(engine.config.key)
    assert stored is not None
    assert (stored.checkpoint.attempts, stored.checkpoint.position) == (counted, None)
    assert f"error={type(raised).__name__}" in caplog.text
    # A cancelled handler is an ERROR; Ctrl-C and sys.exit() are logged at INFO.
    action = "handler_failed" if escapes is HandlerError else "handler_interrupted"
    assert f"action={action}" in caplog.text
    # The lease was released on the way out: the next run may start at once.
    assert engine.store.inspect(engine.config.key).holder is None


def test_tasks_an_async_handler_leaves_running_are_awaited_before_the_commit(orders):
    done: list[int] = []

    async def write(ids: list[int]) -> None:
        await asyncio.sleep(0.05)
        done.extend(ids)

    async def handler(batch: Batch) -> None:
        asyncio.create_task(write([c.pk for c in batch]))  # noqa: RUF006 - the point of the test

    report = make(orders, handler).run({})
    assert report.rows == 6
    assert sorted(done) == [1, 2, 3, 4, 5, 6]  # nothing acknowledged was cancelled


def test_a_failing_task_left_running_fails_the_batch(orders):
    async def fail() -> None:
        await asyncio.sleep(0.01)
        raise ConnectionError("sink refused the write")

    async def handler(batch: Batch) -> None:
        asyncio.create_task(fail())  # noqa: RUF006 - the point of the test

    engine = make(orders, handler)
    with pytest.raises(HandlerError) as err:
        engine.run({})
    assert isinstance(err.value.__cause__, HandlerContractError)
    assert "sink refused the write" in str(err.value.__cause__)
    assert attempts(engine) == (1, None)


def test_a_cursor_whose_type_changed_is_refused_before_the_handler(orders, tmp_path):
    seen: list[int] = []
    store = MemoryStateStore(FakeClock())
    make(orders, lambda batch: seen.extend(c.pk for c in batch), store).run({})
    assert seen == [1, 2, 3, 4, 5, 6]
    # The cursor column becomes text (a migration): the stored naive datetime no longer fits.
    orders.close()
    with sqlite3.connect(tmp_path / "orders.db") as conn:
        conn.executescript(
            "ALTER TABLE orders RENAME COLUMN updated_at TO old;"
            "ALTER TABLE orders ADD COLUMN updated_at TEXT;"
            "UPDATE orders SET updated_at = 'v' || id;"
        )
    conn.close()
    seen.clear()
    with pytest.raises(SourceDefinitionError, match="its type changed"):
        make(orders, lambda batch: seen.extend(c.pk for c in batch), store).run({})
    assert seen == []


def test_a_non_library_error_fails_only_that_pollers_run(orders, tmp_path):
    class Exploding(SqlSource):
        def fetch(self, *args: Any, **kwargs: Any) -> Any:
            raise ZeroDivisionError("driver bug")

    def definition(name: str, source: SqlSource) -> PollerDefinition:
        return PollerDefinition(
            config=PollerConfig(name=name),
            schedule="0 * * * * *",
            source=source,
            handler=lambda batch: None,
            state=MemoryStateStore(FakeClock()),
        )

    broken = definition("broken", Exploding(orders.url, "orders", "updated_at", "id"))
    healthy = definition("healthy", SqlSource(orders.url, "orders", "updated_at", "id"))
    try:
        first = run_one(broken, {})
        second = run_one(healthy, {})
    finally:
        broken.source.close()
        healthy.source.close()
    assert isinstance(first.error, UnexpectedRunError)
    assert isinstance(first.error.__cause__, ZeroDivisionError)
    assert "driver bug" in str(first.error)
    assert second.ok
    assert second.report is not None
    assert second.report.rows == 6


def test_backfill_record_names_cannot_collide():
    """`orders.r1` run `0` and `orders` run `r1` chunk 0 were both `orders.r1.0`."""
    assert run_key("backfill", "orders.r1", "0") != chunk_key("backfill", "orders", "r1", 0)
    assert run_key("backfill", "orders", "r1.0") != chunk_key("backfill", "orders", "r1", 0)


# -- one event loop for async handlers (issue 11, item 4) ----------------------------------


class SharedClient:
    """A client made on first use and bound to the loop it was made on, as aiohttp sessions,
    asyncpg pools and the Azure SDK's aio clients are."""

    instances: int = 0

    def __init__(self) -> None:
        SharedClient.instances += 1
        self.lock = asyncio.Lock()
        self.queue: asyncio.Queue[int] = asyncio.Queue()
        self.loop = asyncio.get_running_loop()

    async def send(self, ids: list[int]) -> None:
        assert asyncio.get_running_loop() is self.loop, "bound to a different event loop"
        async with self.lock:  # a Lock raises when used from another loop than its first
            for i in ids:
                await self.queue.put(i)
            await asyncio.sleep(0)


def test_an_async_handler_keeps_one_loop_across_batches_and_runs(orders):
    client: list[SharedClient] = []
    sent: list[int] = []

    async def handler(batch: Batch) -> None:
        if not client:
            client.append(SharedClient())
        await client[0].send([c.pk for c in batch])
        while not client[0].queue.empty():
            sent.append(client[0].queue.get_nowait())

    store = MemoryStateStore(FakeClock())
    first = make(orders, handler, store).run({})  # two batches of 3
    orders.insert(range(7, 12))
    second = make(orders, handler, store).run({})  # a later run, a new engine: same loop
    assert (first.batches, second.batches) == (2, 2)
    assert sent == list(range(1, 12))
    assert len(client) == 1


def test_handlers_of_pollers_in_two_threads_share_the_loop_safely(orders, tmp_path):
    import threading

    loops: set[int] = set()

    async def handler(batch: Batch) -> None:
        loops.add(id(asyncio.get_running_loop()))
        await asyncio.sleep(0.01)

    other = Orders(tmp_path / "other.db")
    other.insert(range(1, 10))
    engines = [make(orders, handler), make(other, handler)]
    errors: list[BaseException] = []

    def run(engine: Engine) -> None:
        try:
            engine.run({})
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(e,)) for e in engines]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    other.close()
    assert errors == []
    assert len(loops) == 1
