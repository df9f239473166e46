"""One chunk of a backfill: the normal engine over a bounded view of the poller's source.

A chunk is run by :class:`~azure_functions_db.core.engine.Engine` exactly as a live poller is:
lease (a new fence per attempt) -> fence the chunk's checkpoint -> (fetch -> the poller's own
handler -> compare-and-set commit)* -> release. So a retried or speculative Spark attempt of the
chunk cannot commit over a newer attempt: the newer one fenced the checkpoint, the older one's
commit fails on the etag. The only differences from live polling are the source view
(:class:`BoundedSource`: rows after the chunk's start up to its end, read through the same
ports), the record and namespace of the checkpoint, and its commits, coalesced to one at least
every :data:`CHUNK_CHECKPOINT_SECONDS` when no transactional sink needs one per batch. This
module imports no pyspark: it is what a Spark task calls.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import cast

from azure_functions_db.core.batch import Change
from azure_functions_db.core.checkpoint import PollerKey, SourceDescription
from azure_functions_db.core.claim import Claimer
from azure_functions_db.core.engine import Engine
from azure_functions_db.core.logs import log_event
from azure_functions_db.core.ports import (
    BacklogSource,
    ChangeSource,
    Horizon,
    Source,
    SourceHealth,
    SourceRow,
    StateStore,
    ZonedSource,
)
from azure_functions_db.core.position import KeyValue, Position
from azure_functions_db.core.reader import ReadAheadSource, SelectedRows
from azure_functions_db.errors import SourceError
from azure_functions_db.runtime.poller import PollerDefinition, default_owner
from azure_functions_db.spark.records import ChunkRange, chunk_key, chunk_range

logger = logging.getLogger(__name__)

#: The horizon of a chunk: none. Every row at or below the handoff bound H0 was below the live
#: poller's horizon when H0 was committed (or computed, when seeding), so it is committed.
BACKFILL_HORIZON = Horizon(bound=None, method="backfill", detail="rows up to H0 are committed")

#: A chunk commits its checkpoint at least this often (and at its end, and before it counts a
#: failure), not after every batch: a crash delivers up to about this many seconds of the
#: chunk's work again, as ``checkpoint_seconds`` says. Not with a transactional sink (which
#: commits each batch with its position) nor when the poller sets its own coalescing.
CHUNK_CHECKPOINT_SECONDS = 1.0


class BoundedSource:
    """The rows of ``inner`` up to and including ``end`` (a :class:`~ports.Source`).

    The end is a predicate of the query (``Horizon.until``), so the database decides which rows
    are at or below it in its own collation and type order (a case-insensitive collation or a
    UUID type orders differently from Python). The batch that reaches ``end`` is short, which
    ends the engine's run as caught up. ``check`` is done once by the backfill driver, not per
    chunk.

    A chunk reads exactly as a live poller of ``inner`` does: ``BoundedSource(inner, end)`` is
    an instance of a subclass that also implements each optional read port ``inner`` implements
    (:class:`~ports.ChangeSource`, :class:`~azure_functions_db.core.reader.ReadAheadSource`,
    :class:`~ports.BacklogSource`, :class:`~ports.ZonedSource`) and no other, so ``isinstance``
    tells the engine the truth, and every read it forwards carries the chunk's end. It is never
    an :class:`~ports.AcknowledgingSource`: a backfill delivers history again and leaves the
    rows where they are (an outbox's rows are the live poller's to delete).
    """

    inner: Source
    end: Position

    def __new__(cls, inner: Source, end: Position) -> BoundedSource:
        # A runtime-checkable Protocol is decided by the attributes an object has: the view's
        # class is the one with exactly the ports `inner` has (made once per combination).
        ports = tuple(port for port in _FORWARDED if isinstance(inner, port))
        view = _view_class(ports) if cls is BoundedSource else cls
        return super().__new__(view)

    def __init__(self, inner: Source, end: Position) -> None:
        self.inner = inner
        self.end = end

    def bounded(self, horizon: Horizon) -> Horizon:
        """``horizon`` with the chunk's end as its ``until`` (the engine's own horizon, which
        :meth:`horizon` made, is passed through as it is)."""
        return (
            horizon if horizon.until is self.end else dataclasses.replace(horizon, until=self.end)
        )

    @property
    def description(self) -> SourceDescription:
        return self.inner.description

    def open(self, settings: Mapping[str, str]) -> None:
        self.inner.open(settings)

    def horizon(self) -> Horizon:
        return dataclasses.replace(BACKFILL_HORIZON, until=self.end)

    def fetch(self, after: Position | None, limit: int, horizon: Horizon) -> Sequence[SourceRow]:
        return self.inner.fetch(after, limit, self.bounded(horizon))

    def latest(self, horizon: Horizon) -> Position | None:
        return self.inner.latest(self.bounded(horizon))

    def parse_cursor(self, text: str) -> tuple[KeyValue, ...]:
        return self.inner.parse_cursor(text)

    def check(self) -> SourceHealth:
        return SourceHealth()

    def close(self) -> None:
        self.inner.close()

    def __repr__(self) -> str:
        return f"BoundedSource({self.inner!r}, end={self.end})"


class _Changes(BoundedSource):
    """The chunk's view of a :class:`~ports.ChangeSource`."""

    def fetch_changes(
        self, after: Position | None, limit: int, horizon: Horizon, poller: str
    ) -> Sequence[Change]:
        inner = cast(ChangeSource, self.inner)
        return inner.fetch_changes(after, limit, self.bounded(horizon), poller)


class _ReadAhead(BoundedSource):
    """The chunk's view of a :class:`~azure_functions_db.core.reader.ReadAheadSource`."""

    @property
    def reads_from_any_thread(self) -> bool:
        return cast(ReadAheadSource, self.inner).reads_from_any_thread

    def select(self, after: Position | None, limit: int, horizon: Horizon) -> SelectedRows:
        return cast(ReadAheadSource, self.inner).select(after, limit, self.bounded(horizon))

    def changes_of(self, selected: SelectedRows, poller: str) -> Sequence[Change]:
        return cast(ReadAheadSource, self.inner).changes_of(selected, poller)


class _Backlog(BoundedSource):
    """The chunk's view of a :class:`~ports.BacklogSource`."""

    def rows_after(self, after: Position | None, horizon: Horizon, cap: int) -> int:
        return cast(BacklogSource, self.inner).rows_after(after, self.bounded(horizon), cap)


class _Zoned(BoundedSource):
    """The chunk's view of a :class:`~ports.ZonedSource`."""

    @property
    def cursor_timezone(self) -> dt.tzinfo:
        return cast(ZonedSource, self.inner).cursor_timezone


#: The optional read ports a chunk's view forwards, each with the view class that adds it.
_PORTS: dict[type, type[BoundedSource]] = {
    ChangeSource: _Changes,
    ReadAheadSource: _ReadAhead,
    BacklogSource: _Backlog,
    ZonedSource: _Zoned,
}
_FORWARDED = tuple(_PORTS)


@functools.cache
def _view_class(ports: tuple[type, ...]) -> type[BoundedSource]:
    """The view class with exactly ``ports`` (one class per combination, made once)."""
    if not ports:
        return BoundedSource
    views = tuple(_PORTS[port] for port in ports)
    name = "Bounded" + "".join(view.__name__.lstrip("_") for view in views) + "Source"
    return cast(type[BoundedSource], type(name, views, {"__module__": __name__}))


@dataclass(frozen=True)
class ChunkResult:
    """What one chunk task did (returned to the driver)."""

    index: int
    status: str  # "done": ran to its end now; "skipped": it was finished already
    rows: int = 0
    batches: int = 0
    runs: int = 0
    attempt: int = 0
    seconds: float = 0.0


def run_chunk(
    definition: PollerDefinition,
    store: StateStore,
    settings: Mapping[str, str],
    *,
    namespace: str,
    run_id: str,
    index: int,
    attempt: int = 0,
    owner: str | None = None,
    heartbeat_interval: float | None = None,
) -> ChunkResult:
    """Run chunk ``index`` of a planned run to its end; return what it delivered.

    Engine runs repeat until the chunk is caught up (a run ends when the poller's time budget is
    spent); while another attempt holds the chunk's lease this waits for it. Raises what the
    engine raises (handler failure, lost lease, infrastructure), leaving the chunk resumable.
    """
    began = time.monotonic()
    key = chunk_key(namespace, definition.name, run_id, index)
    stored = store.read(key)  # one read: the planned range and whether the chunk is done
    chunk = chunk_range(stored.checkpoint) if stored is not None else None
    if stored is None or chunk is None:
        raise _unplanned(store, key)
    result = ChunkResult(index=index, status="skipped", attempt=attempt)
    if chunk.finished(stored.checkpoint):
        return result
    # The chunk keeps its own record, but its batches are the poller's: `batch.poller` and every
    # `event_id` are the same as live polling's for the same row version. A poison batch fails
    # the chunk's task (`halt`): quarantine records are the live poller's, and a rerun resumes.
    config = dataclasses.replace(
        definition.config_for(settings),
        namespace=namespace,
        record=key.poller,
        chunk=f"{run_id}/{index}",
        poison="halt",
    )
    if definition.sink is None and config.checkpoint_every is None:
        # Written per batch, the chunk record cost the local store two fsyncs and a third of
        # the chunk's CPU; the progress display reads it about every second anyway.
        config = dataclasses.replace(
            config, checkpoint_seconds=config.checkpoint_seconds or CHUNK_CHECKPOINT_SECONDS
        )
    engine = Engine(
        config,
        BoundedSource(definition.source, chunk.end),
        store,
        definition.handler,
        definition.clock,
        owner=owner or f"backfill:{default_owner()}:attempt{attempt}",
        heartbeat_interval=heartbeat_interval,
        sink=definition.sink,  # each chunk keeps its own position record in the sink
    )
    rows = batches = runs = 0
    while True:
        report = engine.run(settings)
        rows, batches, runs = rows + report.rows, batches + report.batches, runs + 1
        if report.status == "lease_held":
            stored = store.read(key)
            if stored is not None and chunk.finished(stored.checkpoint):
                break
            definition.clock.sleep(min(1.0, config.lease_duration / 3))
        elif report.status == "caught_up" and _mark_finished(store, engine, chunk):
            break
    log_event(
        logger,
        logging.INFO,
        "backfill_chunk_done",
        poller=key.poller,
        namespace=namespace,
        rows=rows,
        batches=batches,
        attempt=attempt,
    )
    return dataclasses.replace(
        result,
        status="done",
        rows=rows,
        batches=batches,
        runs=runs,
        seconds=time.monotonic() - began,
    )


def _unplanned(store: StateStore, key: PollerKey) -> SourceError:
    return SourceError(
        f"Backfill chunk `{key.namespace}/{key.poller}` has no planned range in the state "
        f"store ({store.describe()}): the run was not planned there. Start the backfill from "
        "its driver (`afdb backfill`), which plans the chunks first."
    )


def _mark_finished(store: StateStore, engine: Engine, chunk: ChunkRange) -> bool:
    """Move the chunk's checkpoint to the end of its range, under its lease: the done marker.

    The last row of the range may have moved above H0 (updated) or been deleted, so the last
    committed position can be short of ``end``; the marker makes "finished" a plain position
    comparison. Returns ``False`` if another attempt holds the lease (the caller retries).
    """
    cfg = engine.config
    stored = store.read(cfg.key)
    if stored is not None and chunk.finished(stored.checkpoint):
        return True  # the last batch ended on `end` itself (the usual case): nothing to move
    claimer = Claimer(
        store, cfg.key, owner=engine.owner, duration=cfg.lease_duration, clock=engine.clock
    )
    with claimer.hold(None) as claim:
        if claim is None:
            return False
        current = claim.checkpoint
        if chunk.finished(current):
            return True
        # The engine's last run read the rows after `current` up to `end` in the database's
        # order and found none left: the range is done, whatever Python would say of the two.
        moved = current.advanced(
            chunk.end,
            fence=claim.fence,
            at=engine.clock.now(),
            rows=0,
            source=None,
            read_after=current.position,
        )
        claim.write(dataclasses.replace(moved, stats=current.stats))
        return True
