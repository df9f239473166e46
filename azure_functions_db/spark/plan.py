"""Planning a backfill on the driver: the handoff bound H0, the chunk boundaries, the records.

**Handoff.** H0 is the live poller's checkpoint position when the run is planned. The backfill
covers rows at or below H0 and the live poller those above it, so together they miss nothing.
A live poller with no position yet is *seeded* with H0 = the last row below the source's horizon
(create-only, so a live poller that created its checkpoint meanwhile is never overwritten; an
existing record without a position is moved under the live lease, audited like ``afdb seek``).

**Chunks.** Contiguous, non-overlapping ranges of the ``(cursor..., pk...)`` key, each ending
at a boundary key and the last one at the run's upper bound, so every row of the range belongs
to exactly one chunk. Boundaries are *quantiles of the key*: the planner walks the key index
with one ``ORDER BY key OFFSET step-1 LIMIT 1`` query per boundary (key columns only, no row
data; an index-only range scan of ``step`` entries each, one pass over the range in total).
Quantiles are balanced by row count whatever the key's type or gaps. Ranges of the primary key
alone (``id BETWEEN a AND b``) were not chosen: they do not follow the keyset order, so a chunk
could not resume from an ordinary checkpoint, and sparse or skewed ids unbalance them.
The walk ignores the source's ``where`` filter (boundaries are only keys: any key is a valid
boundary), so a very selective filter can unbalance chunks; the estimate applies the filter.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

from azure_functions_db.core.checkpoint import Checkpoint, SeekAudit
from azure_functions_db.core.logs import log_event
from azure_functions_db.core.ports import BacklogSource, Horizon, Source, StateStore
from azure_functions_db.core.position import KeyValue, Position
from azure_functions_db.core.reshard import first_position_refusal
from azure_functions_db.errors import (
    ConfigurationError,
    RecordExistsError,
    SourceError,
)
from azure_functions_db.ops.seek import move_checkpoint
from azure_functions_db.runtime.poller import PollerDefinition
from azure_functions_db.sources import SqlSource
from azure_functions_db.sources.keyset import after_predicate, bound_value, upto_predicate
from azure_functions_db.spark.records import (
    ChunkRange,
    RunRecord,
    chunk_checkpoint,
    chunk_key,
    chunk_range,
    run_key,
)

logger = logging.getLogger(__name__)

_NO_HORIZON = Horizon(bound=None, method="none")
_NO_CAP = 2**62


def handoff_bound(
    definition: PollerDefinition, store: StateStore, *, run_id: str, by: str, now: dt.datetime
) -> Position | None:
    """H0: the live poller's position, seeding the live checkpoint with it when it has none.

    Returns ``None`` when the source has no row yet (nothing to backfill; the live poller will
    read everything). The source must be open.
    """
    source, key = definition.source, definition.config.key
    stored = store.read(key)
    if stored is not None and stored.checkpoint.position is not None:
        return stored.checkpoint.position
    # A first position: not for a poller waiting for `afdb reshard`, nor beside pollers of
    # another shard count of its table (the live poller would skip what they did not read).
    first = stored is None or stored.checkpoint.seek is None
    if first and (refused := first_position_refusal(definition.config, store)) is not None:
        raise refused
    h0 = source.latest(source.horizon())
    if h0 is None:
        return None
    reason = (
        f"seeded by backfill run `{run_id}`: the backfill covers rows up to here, live the rest"
    )
    if stored is None:
        audit = SeekAudit(by=by, at=now, from_position=None, to_position=h0, reason=reason)
        seeded = Checkpoint(key=key, position=h0, source=source.description, seek=audit)
        try:
            store.create(seeded)
        except RecordExistsError:
            stored = store.read(key)  # a live run created it meanwhile: use what it holds
        else:
            _log_seed(definition, h0, run_id)
            return h0
        assert stored is not None
        if stored.checkpoint.position is not None:
            return stored.checkpoint.position
    # A record with no position: move it under the live lease, like `afdb seek`.
    _, before, _ = move_checkpoint(
        definition,
        store,
        h0,
        owner=f"afdb-backfill:{by}",
        by=by,
        reason=reason,
        now=now,
        unless_positioned=True,
    )
    if before is not None:
        return before
    _log_seed(definition, h0, run_id)
    return h0


def _log_seed(definition: PollerDefinition, h0: Position, run_id: str) -> None:
    log_event(
        logger,
        logging.WARNING,
        "backfill_seeded_live",
        poller=definition.name,
        namespace=definition.config.namespace,
        position=h0,
        run=run_id,
    )


def plan_chunks(
    source: Source, start: Position | None, end: Position | None, partitions: int, min_rows: int
) -> tuple[list[ChunkRange], int]:
    """Chunks covering the rows after ``start`` up to ``end``, and the estimated row count.

    At most ``partitions`` chunks, and none much smaller than ``min_rows`` (the batch size).
    A source that is not a :class:`SqlSource` gets one chunk and no estimate.
    """
    if end is None:
        return [], 0
    if not isinstance(source, SqlSource):
        return [ChunkRange(0, start, end)], 0
    try:
        total = _count(source, start, end)
    except sa_exc.SQLAlchemyError as exc:
        raise _planning_error(source, exc) from exc
    if start is not None and total == 0:  # `--from` at or past the end: nothing to replay
        return [], 0
    estimate = total
    if source.description.where is not None and isinstance(source, BacklogSource):
        estimate = source.rows_after(start, _NO_HORIZON, _NO_CAP) - source.rows_after(
            end, _NO_HORIZON, _NO_CAP
        )
    parts = max(1, min(partitions, math.ceil(estimate / max(1, min_rows))))
    bounds: list[Position] = []
    if parts > 1:
        try:
            bounds = _walk(source, start, end, math.ceil(total / parts), parts - 1)
        except sa_exc.SQLAlchemyError as exc:
            raise _planning_error(source, exc) from exc
    edges: list[Position | None] = [start, *bounds, end]
    chunks = [ChunkRange(i, edges[i], edge) for i, edge in enumerate(edges[1:]) if edge is not None]
    return chunks, max(0, estimate)


def _key(source: SqlSource) -> tuple[list[sa.Column[Any]], int]:
    return [*source.cursor_columns, *source.pk_columns], len(source.cursor_columns)


def _after(
    source: SqlSource, position: Position, prefix: str
) -> tuple[sa.ColumnElement[bool], dict[str, KeyValue]]:
    """``key > position`` (``cursor >= position.cursor`` for a position without pk values)."""
    key, ncursor = _key(source)
    columns = key if position.pk else key[:ncursor]
    params = {f"{prefix}{i}": value for i, value in enumerate(position.key)}
    values = [bound_value(name, column) for name, column in zip(params, columns, strict=True)]
    row_values = source.engine.dialect.name == "postgresql"
    predicate = after_predicate(columns, values, inclusive=not position.pk, row_values=row_values)
    return predicate, params


def _ranged(
    source: SqlSource, statement: sa.Select[Any], start: Position | None, end: Position | None
) -> tuple[sa.Select[Any], dict[str, KeyValue]]:
    key, ncursor = _key(source)
    statement = statement.where(*(column.is_not(None) for column in key[:ncursor]))
    params: dict[str, KeyValue] = {}
    if start is not None:
        predicate, start_params = _after(source, start, "afdb_s")
        statement, params = statement.where(predicate), {**params, **start_params}
    if end is not None:
        statement, params = statement.where(_upto(source, end)), {**params, **_upto_params(end)}
    return statement, params


def _upto(source: SqlSource, end: Position) -> sa.ColumnElement[bool]:
    """``key <= end``, evaluated by the database in its own collation and type order."""
    key, _ = _key(source)
    values = [
        bound_value(name, column) for name, column in zip(_upto_params(end), key, strict=True)
    ]
    return upto_predicate(key, values, row_values=source.engine.dialect.name == "postgresql")


def _upto_params(end: Position) -> dict[str, KeyValue]:
    return {f"afdb_e{i}": value for i, value in enumerate(end.key)}


def _count(source: SqlSource, start: Position | None, end: Position) -> int:
    key, _ = _key(source)
    keys, params = _ranged(source, sa.select(*key), start, end)
    statement = sa.select(sa.func.count()).select_from(keys.subquery("afdb_range"))
    with source.engine.connect() as conn:
        count: int = conn.execute(statement, params).scalar_one()
    return count


def _walk(
    source: SqlSource, start: Position | None, end: Position, step: int, boundaries: int
) -> list[Position]:
    """Up to ``boundaries`` keys, ``step`` rows apart, after ``start`` and before ``end``.

    ``end`` bounds the walk inside the query (the database's order decides, not Python's).
    """
    key, ncursor = _key(source)
    found: list[Position] = []
    after = start
    with source.engine.connect() as conn:
        for _ in range(boundaries):
            statement, params = _ranged(source, sa.select(*key), after, end)
            statement = statement.order_by(*key).offset(step - 1).limit(1)
            row = conn.execute(statement, params).first()
            if row is None:
                break
            position = Position(cursor=tuple(row[:ncursor]), pk=tuple(row[ncursor:]))
            if position == end:  # the end itself is the last chunk's end, not a boundary
                break
            found.append(position)
            after = position
    return found


def _planning_error(source: SqlSource, exc: sa_exc.SQLAlchemyError) -> SourceError:
    cause = getattr(exc, "orig", None) or exc
    first = str(cause).strip().splitlines()[0] if str(cause).strip() else ""
    return SourceError(
        f"Planning the backfill of `{source.description.table}` failed "
        f"({type(cause).__name__}): {first[:300]}"
    )


def prepare_run(
    definition: PollerDefinition,
    store: StateStore,
    *,
    namespace: str,
    run_id: str,
    start: tuple[KeyValue, ...] | None,
    end: tuple[KeyValue, ...] | None,
    partitions: int,
    by: str,
    now: dt.datetime,
) -> tuple[RunRecord, list[ChunkRange]]:
    """The run's record and chunks: read back for a known run id, else planned and stored.

    ``start`` (inclusive) and ``end`` (exclusive) are cursor values narrowing the range; a
    resumed run keeps the range it was planned with. The source must be open.
    """
    stored = store.read(run_key(namespace, definition.name, run_id))
    if stored is not None:
        record = RunRecord.from_checkpoint(stored.checkpoint)
        if record is None:
            raise ConfigurationError(
                f"`{stored.checkpoint.key}` exists but is not a backfill run record: choose "
                "another run id or namespace."
            )
        return record, load_chunks(store, record)
    source = definition.source
    h0 = handoff_bound(definition, store, run_id=run_id, by=by, now=now)
    lower = Position(cursor=start, pk=()) if start else None
    upper = h0
    if end is not None and h0 is not None:
        # The last row before `--to` and at or below H0: both bounds applied by the database.
        upper = source.latest(Horizon(bound=end[0], method="to", until=h0))
    chunks, estimate = plan_chunks(source, lower, upper, partitions, definition.config.batch_size)
    for chunk in chunks:
        _store_chunk(definition, store, namespace, run_id, chunk, by=by, now=now)
    record = RunRecord(
        poller=definition.name,
        run_id=run_id,
        namespace=namespace,
        h0=h0,
        start=lower,
        end=upper,
        chunks=len(chunks),
        estimate=estimate,
        phase="planned",
        by=by,
        planned_at=now,
    )
    try:
        store.create(record.to_checkpoint(source.description))
    except RecordExistsError:  # another driver planned the same run id meanwhile
        again = store.read(record.key)
        theirs = RunRecord.from_checkpoint(again.checkpoint) if again else None
        if theirs is None:
            raise
        return theirs, load_chunks(store, theirs)
    log_event(
        logger,
        logging.INFO,
        "backfill_planned",
        poller=definition.name,
        namespace=namespace,
        run=run_id,
        h0=h0,
        chunks=len(chunks),
        estimate=estimate,
    )
    return record, chunks


def _store_chunk(
    definition: PollerDefinition,
    store: StateStore,
    namespace: str,
    run_id: str,
    chunk: ChunkRange,
    *,
    by: str,
    now: dt.datetime,
) -> None:
    key = chunk_key(namespace, definition.name, run_id, chunk.index)
    fresh = chunk_checkpoint(key, run_id, chunk, definition.source.description, by=by, at=now)
    try:
        store.create(fresh)
    except RecordExistsError:
        # Left by a driver that died while planning (no run record yet, so no task ran it):
        # replace it only if nothing ever ran on it.
        stored = store.read(key)
        assert stored is not None
        if stored.checkpoint.fence != 0 or stored.checkpoint.stats.batches:
            raise ConfigurationError(
                f"Backfill chunk `{key}` already ran under another plan of run `{run_id}`: "
                "start a new run id."
            ) from None
        store.replace(fresh, stored.etag)


def load_chunks(store: StateStore, record: RunRecord) -> list[ChunkRange]:
    """The chunks of a planned run, read from their records."""
    chunks: list[ChunkRange] = []
    for index in range(record.chunks):
        key = chunk_key(record.namespace, record.poller, record.run_id, index)
        stored = store.read(key)
        chunk = chunk_range(stored.checkpoint) if stored is not None else None
        if chunk is None:
            raise ConfigurationError(
                f"Backfill run `{record.run_id}` lists {record.chunks} chunks but `{key}` is "
                f"missing or not a chunk record in {store.describe()}."
            )
        chunks.append(chunk)
    return chunks


def parse_bounds(
    source: Source, start: str | Sequence[KeyValue] | None, end: str | Sequence[KeyValue] | None
) -> tuple[tuple[KeyValue, ...] | None, tuple[KeyValue, ...] | None]:
    """``--from``/``--to`` as cursor values (text is parsed by the source's column types)."""

    def one(value: str | Sequence[KeyValue] | None) -> tuple[KeyValue, ...] | None:
        if value is None:
            return None
        if isinstance(value, str):
            return source.parse_cursor(value)
        return tuple(value)

    return one(start), one(end)
