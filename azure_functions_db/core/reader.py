"""Reading a poller's batches, the next one ahead while this one is handled.

A keyset read needs only the previous batch's last position and the horizon, both known as soon
as the database returned that batch. So when a batch comes back full, the next one is selected
on a worker thread (after the batch's last position, under the same horizon) while this batch
becomes the handler's changes and goes to the handler, and it is handed out when the run asks
for exactly that read. The database's wait overlaps the run's own work instead of adding to it.

The read ahead is the read the run would make a moment later: below a horizon a read returns the
same rows whenever it runs (no transaction can still commit a row under the bound), and without
a bound an earlier read is one a slower run could have made. It never acknowledges anything. It
is dropped when the run asks for another read (a quarantined batch, the time budget spent, a
handler failure); its error is dropped too, and the run reads again itself, with its retries.
At most one read is in flight and it ends before the run touches the source again, so a source
sees one read at a time, as without it. Only a :class:`ReadAheadSource` whose reads on another
thread see the same database is read ahead, and not one handed back its rows (an outbox).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from azure_functions_db.core.batch import Change
from azure_functions_db.core.config import PollerConfig
from azure_functions_db.core.ports import (
    AcknowledgingSource,
    ChangeSource,
    Horizon,
    Source,
    SourceRow,
)
from azure_functions_db.core.position import Position
from azure_functions_db.core.retry import Retrying

#: A batch as the handler's changes and the source's own rows (none when the source built the
#: changes itself).
Read = tuple[Sequence[Change], Sequence[SourceRow]]
#: Seconds the run waits at most for the worker thread to start a read ahead.
_START_WAIT = 1.0
#: Logs one structured event: ``log(level, action, **fields)``.
LogEvent = Callable[..., None]


@dataclass(frozen=True, slots=True)
class SelectedRows:
    """A batch as the database returned it: the driver's rows, and the position of the last
    one (``None`` when there are none), checked as a checkpoint will store it."""

    rows: Sequence[Any]
    last: Position | None


@runtime_checkable
class ReadAheadSource(Protocol):
    """A :class:`~azure_functions_db.core.ports.ChangeSource` whose read splits in two: the
    database's part, which may run on a worker thread, and the building of the changes, on the
    run's thread. ``changes_of(select(after, limit, horizon), poller)`` is exactly
    ``fetch_changes(after, limit, horizon, poller)``, errors included, and the last change's
    ``position`` is ``selected.last`` itself."""

    @property
    def reads_from_any_thread(self) -> bool:
        """Whether a read on another thread sees the same database (not a connection per
        thread, as SQLAlchemy's ``SingletonThreadPool`` gives an in-memory SQLite)."""
        ...

    def select(self, after: Position | None, limit: int, horizon: Horizon) -> SelectedRows:
        """The database's part of ``fetch_changes``; may run on any thread."""
        ...

    def changes_of(self, selected: SelectedRows, poller: str) -> Sequence[Change]:
        """The rows of ``selected`` as ``poller``'s changes."""
        ...


class BatchReader:
    """Reads the batches of one poller's runs from its source.

    Args:
        config: The poller's configuration (batch size, name; ``pipeline``: read ahead or not).
        source: The source to read.
        retrying: The engine's bounded retries of transient errors.
        log: The run's structured log.
    """

    def __init__(
        self, config: PollerConfig, source: Source, retrying: Retrying, log: LogEvent
    ) -> None:
        self._limit, self._name = config.batch_size, config.changes_poller
        self._source = source
        self._retrying = retrying
        self._log = log
        # A runtime-checkable Protocol costs two attribute scans per isinstance: decide once.
        # A source that builds the Change objects saves one object per row; an acknowledging
        # source is handed back the rows it returned, so it is read with fetch.
        acknowledging = isinstance(source, AcknowledgingSource)
        self._changes = source if isinstance(source, ChangeSource) and not acknowledging else None
        self._split = source if isinstance(source, ReadAheadSource) and not acknowledging else None
        self._ahead_allowed = config.pipeline
        self._executor: ThreadPoolExecutor | None = None
        self._ahead: tuple[Position, Horizon, Future[SelectedRows]] | None = None

    def read(self, after: Position | None, horizon: Horizon) -> Read:
        """The batch after ``after`` under ``horizon``; when it is full, the next one is
        selected on the worker thread while this one is made into changes."""
        split = self._split
        if split is None or not self._ahead_allowed or not split.reads_from_any_thread:
            return self._retrying(self._fetch, after, horizon)
        selected = self._take(after, horizon)
        if selected is None:
            selected = self._retrying(split.select, after, self._limit, horizon)
        if selected.last is not None and len(selected.rows) >= self._limit:
            self._read_ahead(split, selected.last, horizon)
        return split.changes_of(selected, self._name), ()

    def close(self) -> None:
        """Wait for a read in flight (dropping it) and stop the worker thread."""
        self._drop()
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    # -- internals -----------------------------------------------------------------------------

    def _fetch(self, after: Position | None, horizon: Horizon) -> Read:
        if self._changes is not None:
            return self._changes.fetch_changes(after, self._limit, horizon, self._name), ()
        rows = self._source.fetch(after, self._limit, horizon)
        return [Change(r.data, r.position, self._name, r.op) for r in rows], rows

    def _read_ahead(self, split: ReadAheadSource, after: Position, horizon: Horizon) -> None:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="afdb-read")
        started = threading.Event()

        def select() -> SelectedRows:
            started.set()
            return split.select(after, self._limit, horizon)

        self._ahead = (after, horizon, self._executor.submit(select))
        # Let the worker have the interpreter until its query is on the wire: the run's next
        # work (the handler, the commit hand-off) often holds the GIL for less than a switch
        # interval (5 ms), so without this wait the read ahead would start only when the run
        # waits for it.
        started.wait(_START_WAIT)

    def _take(self, after: Position | None, horizon: Horizon) -> SelectedRows | None:
        ahead, self._ahead = self._ahead, None
        if ahead is None:
            return None
        position, bound, future = ahead
        try:
            selected = future.result()  # ended before the source is read again, used or not
        except Exception as exc:  # noqa: BLE001 - the run reads again, with its retries
            self._log(logging.DEBUG, "read_ahead_failed", error=f"{type(exc).__name__}: {exc}")
            return None
        # Identity, not equality: only the very position and horizon the run asks for (whether
        # two positions are equal is for the database to say, not Python).
        return selected if position is after and bound is horizon else None

    def _drop(self) -> None:
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            ahead[2].exception()  # wait for it; whatever it read or raised is not used
