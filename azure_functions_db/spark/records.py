"""The state a backfill keeps in the poller's state store: one run record and one record per chunk.

Both are ordinary checkpoint records (same store, same compare-and-set, same fences), in the
backfill namespace (``backfill`` unless the user names another):

- the **run record** ``<poller>~<run_id>``: ``position`` is the handoff bound H0 (the live
  poller's position when the run was planned); its audit (``seek``) says who planned the run and
  when, the range it covers (``from_position`` exclusive or, without pk values, inclusive of that
  cursor; ``to_position`` inclusive) and, in ``reason``, the phase (``planned`` / ``finished``),
  the number of chunks and the row estimate. ``committed_at`` and ``stats`` are set when the run
  finishes (rows and batches over every chunk).
- a **chunk record** ``<poller>~<run_id>~<index>`` per chunk: a normal poller checkpoint the
  engine advances batch by batch under the chunk's own lease and fence. Its audit holds the
  chunk's range, fixed when the run was planned: rows after ``from_position`` up to and including
  ``to_position``. The chunk is finished when its position reaches ``to_position``.

Keeping the plan inside the records themselves is what makes a backfill resumable from the
store alone: a rerun with the same run id reads the run record and the chunk records, and runs
only the chunks that are not finished. This module imports no pyspark.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from typing import Literal

from azure_functions_db.core.checkpoint import (
    Checkpoint,
    CheckpointStats,
    PollerKey,
    SeekAudit,
    SourceDescription,
)
from azure_functions_db.core.ports import StateStore
from azure_functions_db.core.position import Position
from azure_functions_db.errors import ConfigurationError

RUN_TAG = "afdb-backfill"
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,39}")
_REASON = re.compile(
    rf"{RUN_TAG} kind=(?P<kind>run|chunk) run=(?P<run>\S+)"
    r"(?: phase=(?P<phase>planned|finished) chunks=(?P<chunks>\d+) estimate=(?P<estimate>\d+))?"
    r"(?: chunk=(?P<chunk>\d+))?"
)

Phase = Literal["planned", "finished"]


#: Separates the poller, run id and chunk index in record names. Neither a poller name nor a
#: run id may contain it, so ``orders.r1`` run ``0`` and ``orders`` run ``r1`` chunk 0 stay two
#: records (joined with ``.`` they were one, and planning one overwrote the other).
SEP = "~"


def check_run_id(run_id: str) -> str:
    """A run id is 1-40 letters, digits, ``-`` or ``_`` (no ``~``: it separates key parts)."""
    if not isinstance(run_id, str) or not _RUN_ID.fullmatch(run_id):
        raise ConfigurationError(
            f"Invalid backfill run id `{run_id!r}`: use 1-40 letters, digits, `-` or `_`, "
            'starting with a letter or digit (e.g. "2026-05-01" or "replay1").'
        )
    return run_id


def run_key(namespace: str, poller: str, run_id: str) -> PollerKey:
    """The key of a run record: ``<namespace>/<poller>~<run_id>``."""
    return PollerKey(namespace=namespace, poller=_name(f"{poller}{SEP}{run_id}"))


def chunk_key(namespace: str, poller: str, run_id: str, index: int) -> PollerKey:
    """The key of a chunk's checkpoint: ``<namespace>/<poller>~<run_id>~<index>``."""
    return PollerKey(namespace=namespace, poller=_name(f"{poller}{SEP}{run_id}{SEP}{index}"))


def _name(name: str) -> str:
    if len(name) > 63:
        raise ConfigurationError(
            f"Backfill record name `{name}` is longer than 63 characters: use a shorter run id "
            "(`--run-id`)."
        )
    return name


@dataclass(frozen=True)
class ChunkRange:
    """One chunk of a run: the rows after ``start`` up to and including ``end``, in key order.

    ``start is None`` means from the first row; a ``start`` without pk values means "from the
    first row with this cursor" (inclusive), like ``afdb seek --cursor``.
    """

    index: int
    start: Position | None
    end: Position

    def finished(self, checkpoint: Checkpoint) -> bool:
        """Whether the chunk's checkpoint has reached the end of its range.

        Equality, not order: a chunk is marked finished by moving its checkpoint to ``end``
        exactly, once a run has read the rows up to ``end`` (a bound the database applies) and
        found none left. A last batch that ends on ``end`` itself finishes it too.
        """
        return checkpoint.position == self.end


@dataclass(frozen=True)
class RunRecord:
    """What a backfill run recorded about itself (see the module docstring)."""

    poller: str
    run_id: str
    namespace: str
    h0: Position | None
    start: Position | None
    end: Position | None
    chunks: int
    estimate: int
    phase: Phase
    by: str
    planned_at: dt.datetime
    finished_at: dt.datetime | None = None
    rows: int = 0
    batches: int = 0

    @property
    def key(self) -> PollerKey:
        return run_key(self.namespace, self.poller, self.run_id)

    def to_checkpoint(self, source: SourceDescription | None) -> Checkpoint:
        reason = (
            f"{RUN_TAG} kind=run run={self.run_id} phase={self.phase} chunks={self.chunks} "
            f"estimate={self.estimate}"
        )
        return Checkpoint(
            key=self.key,
            position=self.h0,
            source=source,
            committed_at=self.finished_at,
            stats=CheckpointStats(batches=self.batches, rows=self.rows),
            seek=SeekAudit(
                by=self.by,
                at=self.planned_at,
                from_position=self.start,
                to_position=self.end,
                reason=reason,
            ),
        )

    @classmethod
    def from_checkpoint(cls, checkpoint: Checkpoint) -> RunRecord | None:
        """The run record held by ``checkpoint``, or ``None`` if it is not one."""
        audit = checkpoint.seek
        match = _REASON.fullmatch(audit.reason) if audit is not None else None
        if audit is None or match is None or match["kind"] != "run" or match["phase"] is None:
            return None
        poller = checkpoint.key.poller.removesuffix(f"{SEP}{match['run']}")
        phase: Phase = "finished" if match["phase"] == "finished" else "planned"
        return cls(
            poller=poller,
            run_id=match["run"],
            namespace=checkpoint.key.namespace,
            h0=checkpoint.position,
            start=audit.from_position,
            end=audit.to_position,
            chunks=int(match["chunks"]),
            estimate=int(match["estimate"]),
            phase=phase,
            by=audit.by,
            planned_at=audit.at,
            finished_at=checkpoint.committed_at,
            rows=checkpoint.stats.rows,
            batches=checkpoint.stats.batches,
        )

    def describe(self) -> str:
        """One line for ``afdb status``."""
        text = f"backfill run {self.run_id}: {self.phase}, {self.chunks} chunk(s)"
        if self.phase == "finished":
            text += f", {self.rows} row(s)"
        else:
            text += f", ~{self.estimate} row(s) estimated"
        return text + f"; covers up to H0 {self.h0 or '(nothing)'}"


def chunk_checkpoint(
    key: PollerKey,
    run_id: str,
    chunk: ChunkRange,
    source: SourceDescription | None,
    *,
    by: str,
    at: dt.datetime,
) -> Checkpoint:
    """A fresh chunk record: positioned at the chunk's start, its range in the audit, fence 0."""
    return Checkpoint(
        key=key,
        position=chunk.start,
        source=source,
        seek=SeekAudit(
            by=by,
            at=at,
            from_position=chunk.start,
            to_position=chunk.end,
            reason=f"{RUN_TAG} kind=chunk run={run_id} chunk={chunk.index}",
        ),
    )


def chunk_range(checkpoint: Checkpoint) -> ChunkRange | None:
    """The range recorded in a chunk record, or ``None`` if ``checkpoint`` is not one."""
    audit = checkpoint.seek
    match = _REASON.fullmatch(audit.reason) if audit is not None else None
    if audit is None or match is None or match["kind"] != "chunk" or audit.to_position is None:
        return None
    return ChunkRange(int(match["chunk"]), audit.from_position, audit.to_position)


def run_records(
    store: StateStore, poller: str, namespace: str | None = None
) -> list[tuple[Checkpoint, RunRecord]]:
    """The backfill run records of ``poller`` in ``namespace`` (every namespace for ``None``):
    each record's checkpoint and the run it describes."""
    prefix = poller + SEP
    found = []
    for key in store.list_keys(namespace):
        rest = key.poller.removeprefix(prefix)
        if rest == key.poller or SEP in rest:
            continue  # another poller's, or a chunk's record
        stored = store.read(key)
        record = RunRecord.from_checkpoint(stored.checkpoint) if stored is not None else None
        if stored is not None and record is not None:
            found.append((stored.checkpoint, record))
    return found


def unfinished_runs(store: StateStore, namespace: str, poller: str) -> list[RunRecord]:
    """The runs of ``poller`` in ``namespace`` that never finished, oldest planned first."""
    runs = [r for _, r in run_records(store, _name(poller), namespace) if r.phase != "finished"]
    return sorted(runs, key=lambda r: r.planned_at)
