"""The backfill driver: plan on the driver, one Spark task per chunk, progress, final report.

Usable from ``afdb backfill``, ``spark-submit`` and a Databricks/Synapse notebook (pass the
notebook's ``spark`` session). See ``docs/backfill.md``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from azure_functions_db.core.logs import log_event
from azure_functions_db.core.ports import StateStore
from azure_functions_db.core.position import KeyValue, Position
from azure_functions_db.errors import BackfillError, ConfigurationError
from azure_functions_db.runtime.poller import PollerDefinition
from azure_functions_db.runtime.settings import STATE_DIR_SETTING
from azure_functions_db.spark._apps import driver_definition, release
from azure_functions_db.spark._session import session_for
from azure_functions_db.spark.chunk import ChunkResult
from azure_functions_db.spark.plan import parse_bounds, prepare_run
from azure_functions_db.spark.records import (
    ChunkRange,
    RunRecord,
    check_run_id,
    chunk_key,
    unfinished_runs,
)
from azure_functions_db.spark.task import ChunkTask, app_settings, app_version, run_chunk_task

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BackfillProgress:
    """A snapshot of a running backfill, as the driver sees it in the state store."""

    run_id: str
    rows_done: int
    rows_estimated: int
    chunks_done: int
    chunks_total: int
    elapsed: float
    rate: float
    eta: float | None
    final: bool = False


@dataclass(frozen=True)
class BackfillReport:
    """The final report of a backfill run (``--json`` prints :meth:`to_json`)."""

    poller: str
    namespace: str
    run_id: str
    store: str
    h0: Position | None
    start: Position | None
    end: Position | None
    chunks: int
    chunks_run: int
    chunks_skipped: int
    rows: int
    rows_total: int
    rows_estimated: int
    batches: int
    retries: int
    seconds: float
    resumed: bool = False  # an unfinished run taken up without its id
    planned: bool = False  # ``plan_only``: planned and recorded, no chunk run

    @property
    def rate(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        """A stable, JSON-ready form for scripts (keys never renamed, only added)."""

        def pos(p: Position | None) -> dict[str, Any] | None:
            return p.to_json() if p else None

        return {
            "poller": self.poller,
            "namespace": self.namespace,
            "run_id": self.run_id,
            "status": "planned" if self.planned else "finished",
            "store": self.store,
            "h0": pos(self.h0),
            "h0_text": str(self.h0) if self.h0 else None,
            "range": {"from": pos(self.start), "to": pos(self.end)},
            "chunks": self.chunks,
            "chunks_run": self.chunks_run,
            "chunks_skipped": self.chunks_skipped,
            "rows": self.rows,
            "rows_total": self.rows_total,
            "rows_estimated": self.rows_estimated,
            "batches": self.batches,
            "retries": self.retries,
            "seconds": round(self.seconds, 3),
            "resumed": self.resumed,
            "rows_per_second": round(self.rate, 1),
        }


ProgressCallback = Callable[[BackfillProgress], None]


def backfill(
    app: str | os.PathLike[str] | PollerDefinition,
    poller: str | None = None,
    *,
    start: str | Sequence[KeyValue] | None = None,
    end: str | Sequence[KeyValue] | None = None,
    partitions: int | None = None,
    master: str = "local[*]",
    namespace: str = "backfill",
    run_id: str | None = None,
    new_run: bool = False,
    plan_only: bool = False,
    spark: Any = None,
    settings: Mapping[str, str] | None = None,
    progress: ProgressCallback | None = None,
    progress_interval: float = 1.0,
) -> BackfillReport:
    """Replay a poller's history on Spark through its own handler, then hand off to live polling.

    Args:
        app: ``function_app.py`` (or its folder, or ``module[:attr]``) that executors can import
            too, or a ``PollerDefinition`` defined in such a module.
        poller: The poller's name (optional when the app defines one poller).
        start: Only rows whose cursor is at or after this value (text is parsed like
            ``afdb seek --cursor``).
        end: Only rows whose cursor is before this value (exclusive).
        partitions: Most chunks to plan (one Spark task each); default twice the session's
            default parallelism.
        master: Spark master when this call creates the session (ignored with ``spark=``).
        namespace: Checkpoint namespace of the run and chunk records.
        run_id: Names the run; rerun with the same id to resume. Default: the poller's
            unfinished run in ``namespace`` if there is one (resumed, and logged as
            ``backfill_resumed``; with ``start``/``end`` given, refused naming its id), else a
            new run named by the UTC start time.
        new_run: Start a new run even when an unfinished one exists.
        plan_only: Plan and record the run (seeding the live checkpoint with H0 when it has
            none) and run no chunk; the next call with the run's id runs it. `afdb backfill`
            plans every shard of a sharded poller this way before running any.
        spark: An existing ``SparkSession`` (a notebook's), used and left running.
        settings: App settings (``%NAME%`` values), default the environment; shipped to the
            executors, which set them as environment variables before importing the app.
        progress: Called on the driver about every ``progress_interval`` seconds and once at the
            end with a :class:`BackfillProgress`.

    Returns the final :class:`BackfillReport`; raises :class:`BackfillError` when a chunk task
    failed (rerun with the same ``run_id`` to resume).
    """
    began = time.monotonic()
    env = dict(os.environ if settings is None else settings)
    spec, definition = driver_definition(app, poller, env)
    loaded_here = not isinstance(app, PollerDefinition)
    if namespace == definition.config.namespace:
        raise ConfigurationError(
            f"`namespace={namespace!r}` is the live poller's own namespace: a backfill needs a "
            'separate one (the default is "backfill").'
        )
    dataclasses.replace(definition.config, namespace=namespace)  # validates the name
    default_store = definition.state is None
    store = definition.store(env)
    resumed = False
    if run_id is None and not new_run:
        run_id = _unfinished_run(
            store, namespace, definition.name, bounded=(start, end) != (None, None)
        )
        resumed = run_id is not None
    run_id = check_run_id(run_id or dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ"))
    root = getattr(store, "root", None)
    if default_store and isinstance(root, Path):
        env[STATE_DIR_SETTING] = str(root)  # executors must find the same directory
    source = definition.source
    source.open(env)
    source.check()
    session, owned = session_for(spark, master)
    try:
        context = session.sparkContext
        partitions = partitions or 2 * int(context.defaultParallelism)
        if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
            raise ConfigurationError(f"`partitions={partitions!r}` must be a positive integer.")
        lo, hi = parse_bounds(source, start, end)
        from azure_functions_db.ops.seek import operator_identity

        record, chunks = prepare_run(
            definition,
            store,
            namespace=namespace,
            run_id=run_id,
            start=lo,
            end=hi,
            partitions=partitions,
            by=f"afdb-backfill:{operator_identity()}",
            now=definition.clock.now(),
        )
        if plan_only:  # (prepare_run logged `backfill_planned` if it made the plan now)
            log_event(
                logger,
                logging.INFO,
                "backfill_ready",
                poller=definition.name,
                namespace=namespace,
                run=run_id,
                h0=record.h0,
                chunks=len(chunks),
            )
            return _report(
                store,
                record,
                [],
                rows_total=0,
                batches=0,
                began=began,
                resumed=resumed,
                planned=True,
            )
        pending = [c for c in chunks if not _finished(store, record, c)]
        log_event(
            logger,
            logging.INFO,
            "backfill_start",
            poller=definition.name,
            namespace=namespace,
            run=run_id,
            h0=record.h0,
            chunks=len(chunks),
            pending=len(pending),
        )
        watcher = _Watcher(store, record, chunks, progress, progress_interval)
        shipped = tuple(sorted(app_settings(env).items()))
        version = app_version(spec)
        tasks = [
            ChunkTask(spec, definition.name, namespace, run_id, c.index, shipped, version)
            for c in pending
        ]
        results = _run_tasks(context, tasks, watcher, run_id)
        rows_total, batches = _finish(store, record, definition.clock.now())
    finally:
        if owned:
            session.stop()
        if loaded_here:
            release(source)  # the driver's connections; executors keep their own
    report = _report(
        store, record, results, rows_total=rows_total, batches=batches, began=began, resumed=resumed
    )
    if progress is not None:
        progress(watcher.snapshot(final=True))
    log_event(
        logger,
        logging.INFO,
        "backfill_done",
        poller=definition.name,
        namespace=namespace,
        run=run_id,
        rows=report.rows,
        chunks=report.chunks,
        seconds=f"{report.seconds:.1f}",
    )
    return report


def _report(
    store: StateStore,
    record: RunRecord,
    results: Sequence[ChunkResult],
    *,
    rows_total: int,
    batches: int,
    began: float,
    resumed: bool,
    planned: bool = False,
) -> BackfillReport:
    """The report of ``record``'s run: ``results`` of the chunks this call ran (none when it
    only ``planned`` the run, which skipped none either)."""
    return BackfillReport(
        poller=record.poller,
        namespace=record.namespace,
        run_id=record.run_id,
        store=store.describe(),
        h0=record.h0,
        start=record.start,
        end=record.end,
        chunks=record.chunks,
        chunks_run=len(results),
        chunks_skipped=0 if planned else record.chunks - len(results),
        rows=sum(r.rows for r in results),
        rows_total=rows_total,
        rows_estimated=record.estimate,
        batches=batches,
        retries=sum(r.attempt for r in results),
        seconds=time.monotonic() - began,
        resumed=resumed,
        planned=planned,
    )


def _run_tasks(
    context: Any, tasks: list[ChunkTask], watcher: _Watcher, run_id: str
) -> list[ChunkResult]:
    """One Spark task per chunk; progress polled from the state store meanwhile."""
    if not tasks:
        return []
    watcher.start()
    try:
        results: list[ChunkResult] = (
            context.parallelize(tasks, len(tasks)).map(run_chunk_task).collect()
        )
    except Exception as exc:  # Py4J/Spark errors carry the task's error in their text
        raise BackfillError(_task_error(run_id, exc)) from exc
    finally:
        watcher.stop()
    return results


def _unfinished_run(store: StateStore, namespace: str, poller: str, *, bounded: bool) -> str | None:
    """The id of the poller's latest unfinished run, to resume when no id was given; raises
    when the caller asked for other bounds (resuming would ignore them)."""
    runs = unfinished_runs(store, namespace, poller)
    if not runs:
        return None
    latest = runs[-1]
    if bounded:
        raise ConfigurationError(
            f"Backfill run `{latest.run_id}` of poller `{poller}` (namespace `{namespace}`) "
            "is unfinished. Resume it with `--run-id "
            f"{latest.run_id}` (its own range), or start another with `--new-run`."
        )
    log_event(
        logger,
        logging.WARNING,
        "backfill_resumed",
        poller=poller,
        namespace=namespace,
        run=latest.run_id,
        note="an_unfinished_run_was_taken_up;_--new-run_starts_another",
    )
    return latest.run_id


def _finished(store: StateStore, record: RunRecord, chunk: ChunkRange) -> bool:
    stored = store.read(chunk_key(record.namespace, record.poller, record.run_id, chunk.index))
    return stored is not None and chunk.finished(stored.checkpoint)


def _finish(store: StateStore, record: RunRecord, now: dt.datetime) -> tuple[int, int]:
    """Mark the run finished in its record (once); return rows and batches over every chunk."""
    rows = batches = 0
    for index in range(record.chunks):
        stored = store.read(chunk_key(record.namespace, record.poller, record.run_id, index))
        if stored is not None:
            rows += stored.checkpoint.stats.rows
            batches += stored.checkpoint.stats.batches
    current = store.read(record.key)
    if current is not None and record.phase != "finished":
        done = dataclasses.replace(
            record, phase="finished", finished_at=now, rows=rows, batches=batches
        )
        store.replace(done.to_checkpoint(current.checkpoint.source), current.etag)
    return rows, batches


_PY_ERROR = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception): .+$", re.MULTILINE)


def _task_error(run_id: str, exc: BaseException) -> str:
    """The first line of the task's own Python error inside a Spark/Py4J error text."""
    text = str(exc)
    ours = [m for m in _PY_ERROR.findall(text) if "azure_functions_db" in m]
    lines = ours or [m for m in _PY_ERROR.findall(text) if "Py4J" not in m]
    detail = (lines[-1] if lines else text.strip().splitlines()[0] if text.strip() else "")[:500]
    return (
        f"Backfill run `{run_id}` failed in a chunk task: {detail}. Finished chunks keep their "
        f"checkpoints; rerun with `--run-id {run_id}` to resume."
    )


class _Watcher:
    """Polls the chunk checkpoints from the driver while the Spark job runs."""

    def __init__(
        self,
        store: StateStore,
        record: RunRecord,
        chunks: Sequence[ChunkRange],
        callback: ProgressCallback | None,
        interval: float,
    ) -> None:
        self._store, self._record, self._chunks = store, record, list(chunks)
        self._callback, self._interval = callback, interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._began = time.monotonic()
        self._rows_at_start: int | None = None

    def start(self) -> None:
        self._began = time.monotonic()
        self._rows_at_start = self.snapshot().rows_done
        if self._callback is None:
            return
        self._thread = threading.Thread(target=self._loop, name="afdb-backfill-progress")
        self._thread.daemon = True
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _loop(self) -> None:
        assert self._callback is not None
        while not self._stop.wait(self._interval):
            try:
                self._callback(self.snapshot())
            except Exception as exc:  # noqa: BLE001 - progress must never stop the backfill
                log_event(logger, logging.WARNING, "backfill_progress_failed", error=repr(exc))

    def snapshot(self, *, final: bool = False) -> BackfillProgress:
        rows = done = 0
        r = self._record
        for chunk in self._chunks:
            stored = self._store.read(chunk_key(r.namespace, r.poller, r.run_id, chunk.index))
            if stored is not None:
                rows += stored.checkpoint.stats.rows
                done += chunk.finished(stored.checkpoint)
        elapsed = time.monotonic() - self._began
        fresh = rows - (self._rows_at_start if self._rows_at_start is not None else rows)
        rate = fresh / elapsed if elapsed > 0 else 0.0
        left = max(0, r.estimate - rows)
        eta = 0.0 if final or left == 0 else (left / rate if rate > 0 else None)
        return BackfillProgress(
            run_id=r.run_id,
            rows_done=rows,
            rows_estimated=max(r.estimate, rows),
            chunks_done=done,
            chunks_total=len(self._chunks),
            elapsed=elapsed,
            rate=rate,
            eta=eta,
            final=final,
        )
