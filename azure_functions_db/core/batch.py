"""What a handler receives: a :class:`Batch` of :class:`Change` objects."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import operator
import threading
import weakref
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
        data: The row's columns: a read-only mapping of column name to value, as the driver
            returned them (from a SQL source a view of the row, not a dict: `dict(change.data)`
            copies it).
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


# The base class's slot, read and written past the property of ``_RowChange`` below.
_position_slot = Change.__dict__["position"]
_get_position, _set_position = _position_slot.__get__, _position_slot.__set__
_new = object.__new__


class RowData(Mapping[str, Any]):
    """``Change.data`` of a row from a SQL source: a read-only mapping over the driver's row.

    Reading a column is an index into the row the database returned, through one name -> index
    map shared by every row of the source (no dict per row). It equals the dict of the same
    items, shows and pickles as one, and ``dict(change.data)`` (or ``change.data.copy()``) gives
    a dict to change or to pass to ``json.dumps``. A repeated column name keeps its last value,
    as in a dict built from the row.
    """

    __slots__ = ("_row",)
    _row: Sequence[Any]
    #: name -> index into the row, and ``row -> dict`` (the layout's ``to_dict``); set on each
    #: source's subclass (see ``_classes``).
    _index: Mapping[str, int] = {}
    _to_dict: Callable[[Sequence[Any]], dict[str, Any]] = staticmethod(lambda row: {})

    def __getitem__(self, key: str) -> Any:
        return self._row[self._index[key]]

    def get(self, key: str, default: Any = None) -> Any:
        index = self._index.get(key)
        return default if index is None else self._row[index]

    def __contains__(self, key: object) -> bool:
        return key in self._index

    def __iter__(self) -> Iterator[str]:
        return iter(self._index)

    def __len__(self) -> int:
        return len(self._index)

    @classmethod
    def column_index(cls, name: str) -> int:
        """Where column ``name`` sits in the driver rows under this class's views (``KeyError``
        for a column the source does not select)."""
        return cls._index[name]

    def copy(self) -> dict[str, Any]:
        """The row as a new dict."""
        return self._to_dict(self._row)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RowData):
            return self.copy() == other.copy()
        if isinstance(other, Mapping):
            return self.copy() == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # as a dict

    def __or__(self, other: object) -> dict[str, Any]:
        if not isinstance(other, Mapping):
            return NotImplemented
        return {**self.copy(), **other}

    def __ror__(self, other: object) -> dict[str, Any]:
        if not isinstance(other, Mapping):
            return NotImplemented
        return {**other, **self.copy()}

    def __setitem__(self, key: str, value: Any) -> None:
        raise TypeError(
            f"change.data is read-only (a view of the row the database returned): cannot set "
            f"{key!r}. Copy it first: `row = dict(change.data)`, then change `row`."
        )

    def __delitem__(self, key: str) -> None:
        raise TypeError(
            f"change.data is read-only (a view of the row the database returned): cannot "
            f"delete {key!r}. Copy it first: `row = dict(change.data)`, then change `row`."
        )

    def __repr__(self) -> str:
        return repr(self.copy())

    def __reduce__(self) -> tuple[Any, ...]:
        return (dict, (self.copy(),))


#: The driver's row under a :class:`RowData` view (for writers that read many views at once).
driver_row: Callable[[RowData], Sequence[Any]] = operator.attrgetter("_row")


def view_class(rows: Sequence[object]) -> type[RowData] | None:
    """The one :class:`RowData` class every item of ``rows`` is a view of (a batch's changes
    from one SQL source share one name -> index map, so their columns), or ``None``."""
    classes = set(map(type, rows))
    if len(classes) != 1:
        return None
    shape = classes.pop()
    return shape if issubclass(shape, RowData) else None


class _RowChange(Change):
    """A ``Change`` over a driver row, built in one slot write: ``data`` is a :class:`RowData`
    over the row, made on access; ``position`` is read from the row on first access (then
    kept); ``op`` is read from the row; ``poller`` and the row's layout belong to the class (one
    subclass per source layout and poller, see :func:`_classes`).

    It is a ``Change`` in every way a caller can see: equal to the plain ``Change`` with the same
    fields, shown and pickled as one (``data`` as a dict), frozen; ``dataclasses.replace``
    returns a plain ``Change``.
    """

    __slots__ = ("_row",)
    _row: Sequence[Any]
    _layout: RowLayout
    _poller: str
    _data: type[RowData]

    def __new__(cls, *args: Any, **kwargs: Any) -> Change:  # type: ignore[misc]
        return Change(*args, **kwargs)  # dataclasses.replace(): a plain Change

    @property
    def data(self) -> Mapping[str, Any]:
        view = _new(self._data)
        _set_view_row(view, self._row)
        return view

    @property
    def poller(self) -> str:
        return self._poller

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
        return (Change, (dict(self.data), self.position, self.poller, self.op))


_set_row = _RowChange.__dict__["_row"].__set__
_set_view_row = RowData.__dict__["_row"].__set__
#: layout -> poller -> the ``_RowChange`` subclass of that layout and poller.
_CLASSES: weakref.WeakKeyDictionary[Any, dict[str, type[_RowChange]]] = weakref.WeakKeyDictionary()
_CLASSES_LOCK = threading.Lock()


def _classes(layout: RowLayout, poller: str) -> type[_RowChange]:
    """The ``_RowChange`` subclass of ``layout`` and ``poller`` (made once, kept while the
    layout lives): the layout, the poller and the column index are class attributes, so a
    change of a row is one object with one slot."""
    try:
        return _CLASSES[layout][poller]
    except KeyError:
        pass
    with _CLASSES_LOCK:
        by_poller = _CLASSES.setdefault(layout, {})
        if poller not in by_poller:
            index = {name: i for i, name in enumerate(layout.names)}
            data = type(
                "RowData",
                (RowData,),
                {
                    "__slots__": (),
                    "__module__": __name__,
                    "_index": index,
                    "_to_dict": staticmethod(layout.to_dict),
                },
            )
            by_poller[poller] = type(
                "Change",
                (_RowChange,),
                {
                    "__slots__": (),
                    "__module__": __name__,
                    "_layout": layout,
                    "_poller": poller,
                    "_data": data,
                },
            )
        return by_poller[poller]


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

    __slots__ = ("_class", "_last", "_layout", "_poller", "_rows")

    def __init__(
        self,
        rows: Sequence[Sequence[Any]],
        layout: RowLayout,
        poller: str,
        last: Position | None = None,
    ) -> None:
        self._rows, self._layout, self._poller, self._last = rows, layout, poller, last
        self._class = _classes(layout, poller)

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
        change = _new(self._class)
        _set_row(change, row)
        position = self._last_of(row)
        if position is not None:
            _set_position(change, position)
        return change

    def __iter__(self) -> Iterator[Change]:
        cls, rows = self._class, self._rows
        if not rows:
            return
        last = self._last
        for row in rows[:-1] if last is not None else rows:
            change = _new(cls)
            _set_row(change, row)
            yield change
        if last is not None:
            change = _new(cls)
            _set_row(change, rows[-1])
            _set_position(change, last)
            yield change

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
