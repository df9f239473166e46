"""The app a backfill's driver replays: resolved for the executors, loaded once per version.

``backfill()`` is given a path, a module or a poller definition. The executors import the app
themselves (by its resolved path or module name); the driver loads it too, for the poller's
source (planning), state store and configuration, and keeps it loaded for the next backfill
of the same app in the process, as long as the file and the settings are the same.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from azure_functions_db.core.ports import Source
from azure_functions_db.errors import ConfigurationError, SourceError
from azure_functions_db.runtime.poller import PollerDefinition, with_shards
from azure_functions_db.sources import SqlSource
from azure_functions_db.spark.task import AppVersion, app_version


@dataclass(frozen=True)
class _DriverApp:
    """An app a ``backfill()`` call of this process loaded, and what it was loaded from."""

    spec: str
    version: AppVersion
    settings: tuple[tuple[str, str], ...]
    definition: PollerDefinition


#: The apps ``backfill()`` loaded in this driver process, by the app and poller it was given.
#: Another call with the same app file (same modification time and size) and the same settings
#: uses the same definition and its source, already open: a notebook's next backfill does not
#: import the app and reflect the table again (Spark's workers keep theirs the same way).
_driver_apps: dict[tuple[str, str | None], _DriverApp] = {}
_driver_lock = threading.Lock()


def driver_definition(
    app: str | os.PathLike[str] | PollerDefinition, poller: str | None, env: Mapping[str, str]
) -> tuple[str, PollerDefinition]:
    """:func:`resolve`, loading an app given by its path or module once per version and
    settings in this process (a changed file or other settings load it again)."""
    if isinstance(app, PollerDefinition):
        return resolve(app, poller)
    key = (os.fspath(app), poller)
    settings = tuple(sorted(env.items()))
    with _driver_lock:
        known = _driver_apps.get(key)
        if (
            known is not None
            and known.settings == settings
            and known.version == app_version(known.spec)
        ):
            return known.spec, known.definition
        if known is not None:  # the app or the settings changed: let the old source go
            del _driver_apps[key]
            known.definition.source.close()
        spec, definition = resolve(app, poller)
        _driver_apps[key] = _DriverApp(spec, app_version(spec), settings, definition)
        return spec, definition


def release(source: Source) -> None:
    """Give the driver's database connections back at the end of a backfill.

    A :class:`SqlSource` stays open (its reflected table is kept for the next backfill of the
    same app in this process) with its connection pool emptied, so no idle connection is left
    for the server to drop; other sources are closed.
    """
    if isinstance(source, SqlSource):
        with contextlib.suppress(SourceError):  # not open: nothing to give back
            source.engine.dispose()
    else:
        source.close()


def resolve(
    app: str | os.PathLike[str] | PollerDefinition, poller: str | None
) -> tuple[str, PollerDefinition]:
    """The importable app spec for the executors, and the poller's definition on the driver."""
    from azure_functions_db.runtime.loader import load_pollers

    if isinstance(app, PollerDefinition):
        module = sys.modules.get(getattr(app.handler, "__module__", "") or "")
        path = getattr(module, "__file__", None)
        if module is None or module.__name__ == "__main__" or path is None:
            raise ConfigurationError(
                f"Poller `{app.name}` is defined in `__main__` (a notebook or script), which "
                "Spark executors cannot import: define it in a module or function_app.py and "
                "pass that path to backfill()."
            )
        return str(Path(path).resolve()), app
    text = os.fspath(app)
    spec = _spec(text)
    pollers = load_pollers(spec)
    if poller is None:
        if len(pollers) != 1:
            raise ConfigurationError(
                f"`{text}` defines {len(pollers)} pollers ({', '.join(sorted(pollers))}): "
                "name one with `--poller`."
            )
        (poller,) = pollers
    if poller not in pollers:
        shards = with_shards(pollers, [poller])
        if shards != [poller]:
            raise ConfigurationError(
                f"Poller `{poller}` is split over {len(shards)} shards ({', '.join(shards)}): "
                f"a backfill runs one shard, up to its own live position; name it, e.g. "
                f"`{shards[0]}`, or run `afdb backfill {text} --poller {poller}`, which "
                "backfills each shard in turn."
            )
        raise ConfigurationError(
            f"Unknown poller `{poller}` in `{text}`; defined: {', '.join(sorted(pollers))}"
        )
    return spec, pollers[poller]


def backfill_names(app: str | os.PathLike[str], poller: str | None) -> list[str | None]:
    """The pollers ``afdb backfill --poller NAME`` runs, in turn: a sharded poller's name
    stands for its shards; any other name (or none) for itself."""
    from azure_functions_db.runtime.loader import load_pollers

    if poller is None:
        return [None]
    return list(with_shards(load_pollers(_spec(os.fspath(app))), [poller]))


def _spec(text: str) -> str:
    """An app given by path (``path[:attr]``) as its resolved path, so executors find it
    from any working directory; a module name as it is."""
    module_part, colon, attr = text.partition(":")
    if Path(module_part).exists():
        return str(Path(module_part).resolve()) + colon + attr
    return text
