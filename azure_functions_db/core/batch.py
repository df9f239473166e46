"""What a handler receives: a :class:`Batch` of :class:`Change` objects."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, overload

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


@dataclass(frozen=True, slots=True, eq=False)
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

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Change):
            return NotImplemented
        return (self.data, self.position, self.poller, self.op) == (
            other.data,
            other.position,
            other.poller,
            other.op,
        )

    __hash__ = None  # type: ignore[assignment]  # data is a dict: as the dataclass had it

    @property
    def cursor(self) -> Any:
        """The cursor value; a tuple when the cursor has several columns."""
        return _unwrap(self.position.cursor)

    @property
    def pk(self) -> Any:
        """The primary-key value; a tuple when the key has several columns."""
        return _unwrap(self.position.pk)


class RowLayout(Protocol):
    """Where the values of a driver row go (``SqlSource``'s ``RowShape``)."""

    @property
    def names(self) -> tuple[str, ...]: ...
    @property
    def to_dict(self) -> Callable[[Sequence[Any]], dict[str, Any]]: ...
    @property
    def cursor_of(self) -> Callable[[Sequence[Any]], tuple[Any, ...]]: ...
    @property
    def pk_of(self) -> Callable[[Sequence[Any]], tuple[Any, ...]]: ...
    @property
    def deleted(self) -> Callable[[Sequence[Any]], bool] | None: ...


# The base class's slots, read and written past the properties of ``_RowChange`` below.
_position_slot = Change.__dict__["position"]
_get_position, _set_position = _position_slot.__get__, _position_slot.__set__
_set_data = Change.__dict__["data"].__set__
_set_poller = Change.__dict__["poller"].__set__


class _RowChange(Change):
    """A ``Change`` over a driver row, built in four slot writes: ``data`` at once (one dict
    display per row, see ``RowLayout.to_dict``; nearly every handler reads it), ``position``
    from the row on first access (then kept), ``op`` read from the row.

    It is a ``Change`` in every way a caller can see: equal to the plain ``Change`` with the same
    fields, shown and pickled as one, frozen; ``dataclasses.replace`` returns a plain ``Change``.
    """

    __slots__ = ("_layout", "_row")
    _row: Sequence[Any]
    _layout: RowLayout

    def __new__(cls, *args: Any, **kwargs: Any) -> Change:  # type: ignore[misc]
        return Change(*args, **kwargs)  # dataclasses.replace(): a plain Change

    @property
    def position(self) -> Position:
        try:
            return _get_position(self)  # type: ignore[no-any-return]
        except AttributeError:
            row, layout = self._row, self._layout
            value = Position.trusted(layout.cursor_of(row), layout.pk_of(row))
            _set_position(self, value)
            return value

    @property
    def op(self) -> Literal["upsert", "delete"]:
        deleted = self._layout.deleted
        return "delete" if deleted is not None and deleted(self._row) else "upsert"

    def __repr__(self) -> str:
        return (
            f"Change(data={self.data!r}, position={self.position!r}, poller={self.poller!r}, "
            f"op={self.op!r})"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (Change, (self.data, self.position, self.poller, self.op))


_new = object.__new__
_set_row = _RowChange.__dict__["_row"].__set__
_set_layout = _RowChange.__dict__["_layout"].__set__


class RowChanges(Sequence[Change]):
    """A batch's changes over the driver's rows, each ``Change`` built when it is read.

    A handler that reads every row once (``for change in batch``) gets one short-lived object
    per row, freed as it moves on, instead of a batch of them kept alive (and walked by the
    garbage collector) until the batch is done; a handler that reads none builds none. Each
    read builds a new object, equal to the last (``batch[0] == batch[0]``, not ``is``). It
    equals, shows, hashes and pickles as the tuple of its changes; slices are ``RowChanges``.

    ``last``, when given, is the last row's position, the very object (the engine matches a
    read ahead to it by identity); the caller has checked it, and the positions between are
    built unchecked, as ``Position.trusted`` documents.
    """

    __slots__ = ("_last", "_layout", "_poller", "_rows")

    def __init__(
        self,
        rows: Sequence[Sequence[Any]],
        layout: RowLayout,
        poller: str,
        last: Position | None = None,
    ) -> None:
        self._rows, self._layout, self._poller, self._last = rows, layout, poller, last

    def __len__(self) -> int:
        return len(self._rows)

    @overload
    def __getitem__(self, index: int) -> Change: ...

    @overload
    def __getitem__(self, index: slice) -> RowChanges: ...

    def __getitem__(self, index: int | slice) -> Change | RowChanges:
        rows = self._rows
        if isinstance(index, slice):
            part = rows[index]
            last = self._last_of(part[-1]) if part else None
            return RowChanges(part, self._layout, self._poller, last)
        row = rows[index]
        return _row_change(row, self._layout, self._poller, self._last_of(row))

    def __iter__(self) -> Iterator[Change]:
        layout, poller, last = self._layout, self._poller, self._last
        final = self._rows[-1] if self._rows else None
        for row in self._rows:
            yield _row_change(row, layout, poller, last if row is final else None)

    def _last_of(self, row: Sequence[Any]) -> Position | None:
        """``last`` for the last row, else ``None`` (the position is built on access)."""
        return self._last if self._rows and row is self._rows[-1] else None

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RowChanges | tuple):
            return tuple(self) == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return repr(tuple(self))

    def __reduce__(self) -> tuple[Any, ...]:
        return (tuple, (tuple(self),))


def _row_change(
    row: Sequence[Any], layout: RowLayout, poller: str, position: Position | None
) -> Change:
    """One ``_RowChange`` over ``row``; ``position``, when given, is its position already."""
    change = _new(_RowChange)
    _set_data(change, layout.to_dict(row))
    _set_row(change, row)
    _set_layout(change, layout)
    _set_poller(change, poller)
    if position is not None:
        _set_position(change, position)
    return change


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
        changes: The rows: a tuple, or from a SQL source :class:`RowChanges`, which builds
            each ``Change`` when it is read (iterate the batch once rather than index it).
        chunk: The backfill chunk that delivers this batch (``"<run id>/<index>"``), or
            ``None`` for the live poller and a seek replay.
    """

    poller: str
    namespace: str
    fence: int
    attempt: int
    position_before: Position | None
    position_after: Position
    changes: Sequence[Change]
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
