"""The handler contract: called with one positional argument (the batch), returns ``None``.

Checked twice. At decoration, :func:`check_handler` refuses what can never run as a handler (a
generator function, an async generator function, a callable that cannot take exactly one
positional argument). At run time, :func:`check_result` refuses a returned value the engine would
otherwise drop: a generator or async generator whose body never ran, or any other value that is
not ``None``. A refused result is a failed attempt of the batch, never an acknowledgement.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import os
import threading
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from azure_functions_db.errors import ConfigurationError, HandlerContractError

T = TypeVar("T")

_SHAPE = "`def {name}(batch): ...` or `async def {name}(batch): ...`"
_SINK_SHAPE = "`def {name}(batch, sink): ...` or `async def {name}(batch, sink): ...`"


def handler_name(handler: object) -> str:
    """A readable name of ``handler`` for messages."""
    name = getattr(handler, "__qualname__", None) or getattr(handler, "__name__", None)
    return str(name) if name else type(handler).__name__


def _is_generator_function(handler: Callable[..., Any]) -> str | None:
    """``"a generator"``/``"an async generator"`` if calling ``handler`` makes one, else None."""
    candidates: list[object] = [handler]
    if not inspect.isroutine(handler) and not inspect.isclass(handler):
        candidates.append(getattr(type(handler), "__call__", None))  # noqa: B004 - the method
    for candidate in candidates:
        if inspect.isasyncgenfunction(candidate):
            return "an async generator"
        if inspect.isgeneratorfunction(candidate):
            return "a generator"
    return None


def check_handler(handler: object, poller: str, *, sink: bool = False) -> None:
    """Raise :class:`ConfigurationError` unless ``handler`` can be called as ``handler(batch)``
    (``handler(batch, sink)`` for a poller with a sink).

    Refuses a non-callable, a generator or async generator function (calling it only creates a
    generator: the body would never run and the batch would look handled), and a callable whose
    signature cannot bind exactly one positional argument. A callable without an inspectable
    signature (some builtins) is accepted; its result is still checked on every call.
    """
    name = handler_name(handler)
    if not callable(handler):
        raise ConfigurationError(
            f"@poller(name=`{poller}`) must decorate a function, not `{handler!r}`: write "
            + _SHAPE.format(name="on_rows")
            + "."
        )
    kind = _is_generator_function(handler)
    if kind is not None:
        raise ConfigurationError(
            f"Handler `{name}` of poller `{poller}` is {kind} function (it uses `yield`): "
            "calling it only creates a generator, so its body would never run and the batch "
            f"would be acknowledged unprocessed. Remove the `yield` and write "
            + _SHAPE.format(name=name)
            + "."
        )
    try:
        signature = inspect.signature(handler)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(*((object(), object()) if sink else (object(),)))
    except TypeError:
        what = (
            "two positional arguments, the batch and the sink"
            if sink
            else ("one positional argument, the batch")
        )
        shape = _SINK_SHAPE if sink else _SHAPE
        raise ConfigurationError(
            f"Handler `{name}{signature}` of poller `{poller}` cannot be called with {what}: "
            "write " + shape.format(name=name) + " (further parameters need defaults)."
        ) from None


def check_result(result: object, handler: object, *, awaited: bool) -> None:
    """Raise :class:`HandlerContractError` unless a handler call's ``result`` is ``None``.

    ``awaited`` says whether ``result`` is what an awaitable returned (an ``async def``
    handler's return value) rather than the call's own return value.
    """
    if result is None:
        return
    name = handler_name(handler)
    if inspect.isgenerator(result) or inspect.isasyncgen(result):
        kind = "an async generator" if inspect.isasyncgen(result) else "a generator"
        raise HandlerContractError(
            f"Handler `{name}` returned {kind} instead of running: its body never ran, so the "
            "batch is not acknowledged. Remove the `yield` (or do not return a generator) and "
            "return None."
        )
    what = "its awaitable returned" if awaited else "it returned"
    raise HandlerContractError(
        f"Handler `{name}` must return None, but {what} a `{type(result).__name__}`: the engine "
        "cannot tell whether work it describes was done (a lazy `map`, an un-awaited task), so "
        "the batch is not acknowledged. Do the work inside the handler and return None."
    )


class HandlerLoop:
    """The event loop ``async def`` handlers run on: one per process, for its whole life.

    A handler that keeps a client made on first use (an aiohttp session, an asyncpg pool, an
    Azure SDK aio client) needs every batch to run on the loop that client is bound to; a new
    loop per batch would make it fail from the second batch on ("bound to a different event
    loop"), a failure the framework caused. The loop runs in a daemon thread, so pollers
    running in several threads (a Functions host invoking two timers at once, ``afdb run``)
    share it; a forked process (Spark's Python workers) starts its own.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pid = 0
        # The batch each task was created for: tasks a handler leaves running are its own.
        self._creators: weakref.WeakKeyDictionary[asyncio.Task[Any], object] = (
            weakref.WeakKeyDictionary()
        )

    def run(self, awaitable: Awaitable[T]) -> T:
        """Run the handler's ``awaitable`` on the loop and wait for it and its tasks."""
        future = asyncio.run_coroutine_threadsafe(self._await_all(awaitable), self._running())
        try:
            return future.result()
        except BaseException:
            future.cancel()  # e.g. Ctrl-C while waiting: stop the handler too
            raise

    def _running(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._pid != os.getpid() or self._loop.is_closed():
                loop = asyncio.new_event_loop()
                loop.set_task_factory(self._task_factory)
                thread = threading.Thread(
                    target=loop.run_forever, name="afdb-handler-loop", daemon=True
                )
                thread.start()
                self._loop, self._pid = loop, os.getpid()
            return self._loop

    def _task_factory(
        self, loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any
    ) -> asyncio.Task[Any]:
        task: asyncio.Task[Any] = asyncio.Task(coro, loop=loop, **kwargs)
        creator = _BATCH.get()
        if creator is not None:
            self._creators[task] = creator
        return task

    async def _await_all(self, awaitable: Awaitable[T]) -> T:
        """Await the handler, then every task it started and left running.

        Work the handler started with ``asyncio.create_task`` and did not await would otherwise
        run on after the batch was acknowledged, or be lost with the process. Such tasks are
        awaited here, before the commit; one that fails fails the batch.
        """
        token = object()
        _BATCH.set(token)
        result = await awaitable
        while pending := [
            task for task, creator in list(self._creators.items()) if creator is token
        ]:
            outcomes = await asyncio.gather(*pending, return_exceptions=True)
            for task in pending:
                self._creators.pop(task, None)
            failures = [o for o in outcomes if isinstance(o, BaseException)]
            if failures:
                raise HandlerContractError(
                    f"{len(failures)} task(s) the handler started and left running failed "
                    f"(first: {type(failures[0]).__name__}: {failures[0]}); the batch is not "
                    "acknowledged. Await the tasks you start inside the handler."
                ) from failures[0]
        return result


_BATCH: contextvars.ContextVar[object | None] = contextvars.ContextVar("afdb_batch", default=None)

#: The process's handler loop (see :class:`HandlerLoop`).
HANDLER_LOOP = HandlerLoop()
