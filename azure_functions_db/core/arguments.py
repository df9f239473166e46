"""Keyword arguments checked by name before a call, with an answer for the names Functions users
already know.

Azure's SQL and MySQL triggers take ``connection_string_setting=``, ``table_name=`` and
``leases_table_name=``, and batch sizes set as ``max_batch_size``; Python would answer
``TypeError: unexpected keyword argument``. :func:`known_arguments` wraps a function (or a
class's ``__init__``) so that an unknown keyword raises ``ConfigurationError`` naming our
equivalent, or the closest of the function's own names. The signature is unchanged for type
checkers and IDEs.
"""

from __future__ import annotations

import difflib
import functools
import inspect
from collections.abc import Callable, Mapping
from typing import ParamSpec, TypeVar

from azure_functions_db.errors import ConfigurationError

P = ParamSpec("P")
R = TypeVar("R")

#: Names from Azure's SQL and MySQL triggers (and their settings), and what to write here.
TRIGGER_NAMES: Mapping[str, str] = {
    "connection_string_setting": "`connection=` (the name of the app setting holding the "
    'database URL, e.g. `connection="ORDERS_DB"`)',
    "connectionStringSetting": "`connection=`",
    "table_name": "`table=`",
    "tableName": "`table=`",
    "leases_table_name": "nothing: the poller's state lives in its state store (`state=`), "
    "never in your database; remove it",
    "max_batch_size": "`batch_size=` on the poller",
    "maxBatchSize": "`batch_size=` on the poller",
    "polling_interval_ms": "`poll_interval=` on the poller, in seconds (or `schedule=`)",
    "arg_name": "nothing: the handler's first parameter is the batch; remove it",
}


def known_arguments(what: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Make ``what``'s unknown keyword arguments a ``ConfigurationError`` that names the fix."""

    def decorate(function: Callable[P, R]) -> Callable[P, R]:
        signature = inspect.signature(function)
        names = [n for n, p in signature.parameters.items() if p.kind is not p.VAR_POSITIONAL]

        @functools.wraps(function)
        def checked(*args: P.args, **kwargs: P.kwargs) -> R:
            unknown = [name for name in kwargs if name not in signature.parameters]
            if unknown:
                raise ConfigurationError(_message(what, unknown, names))
            return function(*args, **kwargs)

        return checked

    return decorate


def _message(what: str, unknown: list[str], names: list[str]) -> str:
    parts = []
    for name in unknown:
        if name in TRIGGER_NAMES:
            parts.append(
                f"`{name}=` is the Azure SQL/MySQL trigger's name; here use {TRIGGER_NAMES[name]}."
            )
            continue
        close = difflib.get_close_matches(name, [n for n in names if n != "self"], n=1)
        hint = f" Did you mean `{close[0]}=`?" if close else ""
        parts.append(f"`{what}` takes no argument `{name}=`.{hint}")
    return " ".join(parts)
