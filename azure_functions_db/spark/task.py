"""What a Spark task runs on an executor: load the app, then run one chunk.

A task carries only picklable values (the app's path or module, the poller's name, the run, the
chunk's index, the app settings); the executor imports the app itself, exactly as the Functions
host does, so the chunk calls the poller's own handler with its own source and state store.
Loaded apps are cached per Python worker process (Spark reuses workers across tasks).
"""

from __future__ import annotations

import os
import sys
import threading
import zipimport
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

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


#: The modification time (ns) and size of an app file, ``None`` for an app given as a module.
AppVersion = tuple[int, int] | None


def app_version(spec: str) -> AppVersion:
    """The version of the app file ``spec`` names (a ``.py`` file or a folder holding
    ``function_app.py``, optionally ``:attr``); ``None`` for a module name."""
    path = Path(spec.partition(":")[0])
    if path.is_dir():
        path = path / "function_app.py"
    if path.suffix != ".py":
        return None
    try:
        stat = path.stat()
    except OSError:  # not there: loading it says so
        return None
    return stat.st_mtime_ns, stat.st_size


@dataclass(frozen=True)
class ChunkTask:
    """One chunk for one Spark task (picklable)."""

    app: str
    poller: str
    namespace: str
    run_id: str
    index: int
    settings: tuple[tuple[str, str], ...] = field(repr=False)  # holds secrets
    #: The driver's version of the app file: a worker that loaded another version loads it again.
    app_version: AppVersion = None


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


_loaded: dict[tuple[str, str, tuple[tuple[str, str], ...], AppVersion], PollerDefinition] = {}
_lock = threading.Lock()


def definition_for(
    app: str, poller: str, settings: tuple[tuple[str, str], ...], version: AppVersion = None
) -> PollerDefinition:
    """The poller ``poller`` of ``app``, imported once per process, settings and app version
    (the driver's: a changed app file is imported again)."""
    from azure_functions_db.runtime.loader import load_pollers

    cache_key = (app, poller, settings, version)
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
    try:
        return _run(task)
    finally:
        forget_zip_importers()


def forget_zip_importers() -> None:
    """Drop the zip importers the interpreter keeps for ``sys.path`` entries (Python < 3.13).

    Before every task a PySpark worker calls ``importlib.invalidate_caches()`` (so that files a
    job added become importable). Before Python 3.13 that makes each cached
    ``zipimporter`` read its archive's whole directory again at once, one read per importer:
    a reused worker has about a dozen of them (``pyspark.zip`` and each of its packages, the
    py4j zip, the spark-core jar), and the re-reads took 0.1-0.2 s of every task here before
    the task's own code ran. Without them in the cache the next task's invalidation costs
    nothing; an import that needs an archive later makes its importer again, which reads the
    archive's directory once (its cached directory is dropped too, as Python 3.13's
    invalidation does), so a changed archive is still seen. Modules already imported keep
    their own loaders.
    """
    if sys.version_info >= (3, 13):  # invalidation is lazy there: nothing is read again
        return
    directories = getattr(zipimport, "_zip_directory_cache", None)
    for entry, finder in list(sys.path_importer_cache.items()):
        if isinstance(finder, zipimport.zipimporter):
            del sys.path_importer_cache[entry]
            if isinstance(directories, dict):
                directories.pop(finder.archive, None)


def _run(task: ChunkTask) -> ChunkResult:
    settings = dict(task.settings)
    _apply(settings)
    definition = definition_for(task.app, task.poller, task.settings, task.app_version)
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
