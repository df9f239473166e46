"""The handler contract: called with one positional argument (the batch), returns ``None``.

Checked twice. At decoration, :func:`check_handler` refuses what can never run as a handler (a
generator function, an async generator function, a callable that cannot take exactly one
positional argument). At run time, :func:`check_result` refuses a returned value the engine would
otherwise drop: a generator or async generator whose body never ran, or any other value that is
not ``None``. A refused result is a failed attempt of the batch, never an acknowledgement.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from azure_functions_db.errors import ConfigurationError, HandlerContractError

T = TypeVar("T")

_SHAPE = "`def {name}(batch): ...` or `async def {name}(batch): ...`"


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


def check_handler(handler: object, poller: str) -> None:
    """Raise :class:`ConfigurationError` unless ``handler`` can be called as ``handler(batch)``.

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
        signature.bind(object())
    except TypeError:
        raise ConfigurationError(
            f"Handler `{name}{signature}` of poller `{poller}` cannot be called with one "
            "positional argument, the batch: write " + _SHAPE.format(name=name) + " (further "
            "parameters need defaults)."
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


async def await_all(awaitable: Awaitable[T]) -> T:
    """Await the handler, then every task it started and left running.

    ``asyncio.run`` cancels tasks still pending when the handler returns: work the handler
    started with ``asyncio.create_task`` and did not await would be cancelled, and the batch
    acknowledged anyway. They are awaited here, before the commit; one that fails fails the
    batch.
    """
    before = asyncio.all_tasks()
    result = await awaitable
    current = asyncio.current_task()
    while pending := asyncio.all_tasks() - before - {current}:
        outcomes = await asyncio.gather(*pending, return_exceptions=True)
        before |= pending
        failures = [o for o in outcomes if isinstance(o, BaseException)]
        if failures:
            raise HandlerContractError(
                f"{len(failures)} task(s) the handler started and left running failed "
                f"(first: {type(failures[0]).__name__}: {failures[0]}); the batch is not "
                "acknowledged. Await the tasks you start inside the handler."
            ) from failures[0]
    return result
