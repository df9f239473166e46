"""What a Spark task runs on an executor: load the app, then run one chunk.

A task carries only picklable values (the app's path or module, the poller's name, the run, the
chunk's index, the app settings); the executor imports the app itself, exactly as the Functions
host does, so the chunk calls the poller's own handler with its own source and state store.
Loaded apps are cached per Python worker process (Spark reuses workers across tasks).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

from azure_functions_db.errors import ConfigurationError
from azure_functions_db.runtime.poller import PollerDefinition
from azure_functions_db.spark.chunk import ChunkResult, run_chunk

#: Driver environment variables that describe the driver's machine or process, not the app; they
#: are never shipped to executors (which have their own).
_MACHINE_PREFIXES = (
    "PYSPARK_",
    "SPARK_",
    "JAVA_",
    "HADOOP_",
    "PYTHON",
    "VIRTUAL_ENV",
    "CONDA",
    "LD_",
    "DYLD_",
    "PYTEST_",
    "LC_",
)
_MACHINE_NAMES = frozenset(
    {
        "PATH",
        "HOME",
        "PWD",
        "OLDPWD",
        "SHELL",
        "SHLVL",
        "USER",
        "LOGNAME",
        "HOSTNAME",
        "TMPDIR",
        "TERM",
        "LANG",
        "MASTER",
        "_",
    }
)


def app_settings(environment: Mapping[str, str]) -> dict[str, str]:
    """The app settings to ship to executors: ``environment`` minus machine/process variables."""
    return {
        name: value
        for name, value in environment.items()
        if name not in _MACHINE_NAMES and not name.startswith(_MACHINE_PREFIXES)
    }


@dataclass(frozen=True)
class ChunkTask:
    """One chunk for one Spark task (picklable)."""

    app: str
    poller: str
    namespace: str
    run_id: str
    index: int
    settings: tuple[tuple[str, str], ...] = field(repr=False)  # holds secrets


_applied: set[str] = set()


def _apply(settings: Mapping[str, str]) -> None:
    """Make ``settings`` this worker's app settings, as environment variables.

    App settings are environment variables under the Functions host and the app may read them
    at import, so they are set before it is imported. Spark reuses a worker for the tasks of
    later jobs: settings an earlier task applied and this one lacks are removed again.
    """
    with _lock:
        for name in _applied - settings.keys():
            os.environ.pop(name, None)
        os.environ.update(settings)
        _applied.clear()
        _applied.update(settings)


_loaded: dict[tuple[str, str, tuple[tuple[str, str], ...]], PollerDefinition] = {}
_lock = threading.Lock()


def definition_for(
    app: str, poller: str, settings: tuple[tuple[str, str], ...]
) -> PollerDefinition:
    """The poller ``poller`` of ``app``, imported once per process and settings."""
    from azure_functions_db.runtime.loader import load_pollers

    cache_key = (app, poller, settings)
    with _lock:
        definition = _loaded.get(cache_key)
        if definition is None:
            pollers = load_pollers(app)
            if poller not in pollers:
                raise ConfigurationError(
                    f"`{app}` on this executor defines no poller `{poller}` (defined: "
                    f"{', '.join(sorted(pollers))}): deploy the same app to the executors."
                )
            definition = _loaded[cache_key] = pollers[poller]
        return definition


def run_chunk_task(task: ChunkTask) -> ChunkResult:
    """The function Spark maps over the chunks (runs on an executor)."""
    settings = dict(task.settings)
    _apply(settings)
    definition = definition_for(task.app, task.poller, task.settings)
    attempt = 0
    try:
        from pyspark import TaskContext

        context = TaskContext.get()
        attempt = context.attemptNumber() if context is not None else 0
    except ImportError:  # run outside Spark (tests, a plain process pool)
        pass
    return run_chunk(
        definition,
        definition.store(settings),
        settings,
        namespace=task.namespace,
        run_id=task.run_id,
        index=task.index,
        attempt=attempt,
    )
