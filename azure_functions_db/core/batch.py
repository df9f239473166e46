"""What a handler receives: a :class:`Batch` of :class:`Change` objects."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, overload

from azure_functions_db.core.position import KeyValue, Position, encode_value


def event_id(poller: str, position: Position) -> str:
    """A deterministic id for one row version of one poller: the idempotency key.

    The same row version (same pk, same cursor) gets the same id on every replay, in every
    namespace and every backfill run and chunk (a backfill and the live poller agree), so
    handlers can deduplicate on it. It depends on the poller's name and the position only.
    """
    doc = [
        poller,
        [encode_value(_instant(v)) for v in position.cursor],
        [encode_value(_instant(v)) for v in position.pk],
    ]
    digest = hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode())
    return digest.hexdigest()[:32]


def _instant(value: KeyValue) -> KeyValue:
    """A zone-aware date-time as its UTC instant: `12:00+00:00` and `13:00+01:00` are one row
    version, whatever session zone the driver read it in."""
    if isinstance(value, dt.datetime) and value.utcoffset() is not None:
        return value.astimezone(dt.UTC)
    return value


def _unwrap(values: tuple[KeyValue, ...]) -> Any:
    return values[0] if len(values) == 1 else values


class _EventIdSlot:
    """The slot ``Change.event_id`` caches in: not a field, so not compared, shown or pickled
    (an unpickled ``Change`` computes it again on first use)."""

    __slots__ = ("_event_id",)
    _event_id: str


@dataclass(frozen=True, slots=True)
class Change(_EventIdSlot):
    """One changed row as delivered to the handler.

    Attributes:
        data: The row's columns: a mapping of column name to value, as the driver returned them.
        position: The row's full keyset position.
        poller: The poller that delivered it.
        op: ``"upsert"``, or ``"delete"`` for soft-delete sources.
    """

    data: Mapping[str, Any]
    position: Position
    poller: str
    op: Literal["upsert", "delete"] = "upsert"

    @property
    def event_id(self) -> str:
        """Deterministic idempotency key of this row version (see :func:`event_id`).

        Computed on first use, then kept: a hash per row is most of the engine's own per-row
        cost, and handlers that do not deduplicate should not pay it.
        """
        try:
            return self._event_id
        except AttributeError:
            value = event_id(self.poller, self.position)
            object.__setattr__(self, "_event_id", value)
            return value

    @property
    def cursor(self) -> Any:
        """The cursor value; a tuple when the cursor has several columns."""
        return _unwrap(self.position.cursor)

    @property
    def pk(self) -> Any:
        """The primary-key value; a tuple when the key has several columns."""
        return _unwrap(self.position.pk)


@dataclass(frozen=True)
class Batch(Sequence[Change]):
    """One batch of changes, in ``(cursor, pk)`` order, for one handler call.

    Acknowledged only when the checkpoint commit after the handler succeeds; until then it may
    be delivered again (at-least-once), so handlers must be idempotent (use ``Change.event_id``).

    Attributes:
        poller: Stable poller name.
        namespace: ``"live"`` for the timer poller, ``"backfill"`` (or a custom name) otherwise.
        fence: Fencing token of the lease this batch is processed under.
        attempt: 1 for the first delivery of this batch position, 2 after one failure, ...
        position_before: Checkpoint before the batch (``None`` = from the beginning).
        position_after: Position the checkpoint moves to when the batch is acknowledged.
        changes: The rows.
        chunk: The backfill chunk that delivers this batch (``"<run id>/<index>"``), or
            ``None`` for the live poller and a seek replay.
    """

    poller: str
    namespace: str
    fence: int
    attempt: int
    position_before: Position | None
    position_after: Position
    changes: tuple[Change, ...]
    chunk: str | None = None

    @overload
    def __getitem__(self, index: int) -> Change: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Change]: ...

    def __getitem__(self, index: int | slice) -> Change | Sequence[Change]:
        return self.changes[index]

    def __len__(self) -> int:
        return len(self.changes)

    def __iter__(self) -> Iterator[Change]:
        return iter(self.changes)

    @property
    def rows(self) -> list[Mapping[str, Any]]:
        """The row mappings alone, in order."""
        return [c.data for c in self.changes]
