"""The engine side of every benchmark, written once for every tier.

A tier (SQLite, PostgreSQL) builds its ``orders`` table and says how a user would write the
source for it (:meth:`Orders.source`); from there on a benchmark builds the engine, drains the
table and checks that it did with the same code whatever the tier.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from azure_functions_db.core.batch import Batch
from azure_functions_db.core.clock import SystemClock
from azure_functions_db.core.config import PollerConfig
from azure_functions_db.core.engine import Engine, Handler, RunReport
from azure_functions_db.core.ports import StateStore
from azure_functions_db.sources import SqlSource
from azure_functions_db.state.local import LocalStateStore

POLLER = "bench"
OWNER = "bench"


class Orders(Protocol):
    """A tier's built ``orders`` table."""

    @property
    def rows(self) -> int: ...

    @property
    def name(self) -> str: ...

    def source(self, horizon: str | None = None) -> SqlSource:
        """The source a user would write for this table (``horizon``: the source's option)."""
        ...


def noop_handler(batch: Batch) -> None:
    """The handler of every benchmark: receive the batch, do nothing (no event id is computed)."""


def column_handler(batch: Batch) -> None:
    """Read one column of every row (``note``), as the least a real handler does."""
    for change in batch:
        change.data["note"]


def event_id_handler(batch: Batch) -> None:
    """Read every change's ``event_id``, as a deduplicating handler would (profile variant)."""
    for change in batch:
        change.event_id  # noqa: B018  # computed lazily, on first access


def poller_config(
    batch_size: int, *, pipeline: bool = True, checkpoint_every: int | None = None
) -> PollerConfig:
    return PollerConfig(
        name=POLLER,
        batch_size=batch_size,
        time_budget=3600,
        lease_duration=60,
        pipeline=pipeline,
        checkpoint_every=checkpoint_every,
    )


def make_engine(
    db: Orders,
    store: StateStore,
    batch_size: int,
    handler: Handler = noop_handler,
    horizon: str | None = None,
    *,
    pipeline: bool = True,
    checkpoint_every: int | None = None,
) -> tuple[Engine, SqlSource]:
    """A fresh source and engine, as a new Functions worker process would build them."""
    source = db.source(horizon)
    config = poller_config(batch_size, pipeline=pipeline, checkpoint_every=checkpoint_every)
    engine = Engine(config, source, store, handler, SystemClock(), owner=OWNER)
    return engine, source


def drained(report: RunReport, db: Orders) -> int:
    """The rows a draining run delivered; refuses a run that did not drain the table."""
    if report.status != "caught_up" or report.rows != db.rows:
        raise RuntimeError(
            f"the engine run did not drain `{db.name}`: status={report.status} "
            f"rows={report.rows} of {db.rows}"
        )
    return report.rows


def engine_drain(
    db: Orders,
    store: StateStore,
    batch_size: int,
    handler: Handler = noop_handler,
    horizon: str | None = None,
    *,
    pipeline: bool = True,
    checkpoint_every: int | None = None,
) -> int:
    """One ``Engine.run`` from an empty state store to the end of the table; the row count
    (``pipeline=True``, the default: each commit in flight while the next batch is read and
    handled; ``False``: each commit before the next batch is read; ``checkpoint_every``:
    coalesced commits)."""
    engine, source = make_engine(
        db,
        store,
        batch_size,
        handler,
        horizon,
        pipeline=pipeline,
        checkpoint_every=checkpoint_every,
    )
    try:
        return drained(engine.run({}), db)
    finally:
        source.close()


def fresh_local_store(directory: Path) -> LocalStateStore:
    """An empty local state store in ``directory`` (removed first)."""
    shutil.rmtree(directory, ignore_errors=True)
    return LocalStateStore(directory)


def local_drain(
    db: Orders,
    state_dir: Path,
    batch_size: int,
    handler: Handler = noop_handler,
    horizon: str | None = None,
    *,
    pipeline: bool = True,
) -> Callable[[], int]:
    """A drain with a fresh local state store, ready for :func:`benchmarks.harness.timed`."""
    return lambda: engine_drain(
        db, fresh_local_store(state_dir), batch_size, handler, horizon, pipeline=pipeline
    )
