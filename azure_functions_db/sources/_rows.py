"""Driver rows to ``SourceRow`` or ``Change`` objects: the per-row hot path of ``SqlSource``.

One pass, no per-row method calls beyond the constructors. A column returns values of one Python
type, and of a batch only the last row's position is ever stored (and encoded in full when the
checkpoint is committed), so the first and last rows are checked in full and the rows between
are built with the unchecked :meth:`Position.trusted`. A value between them that no checkpoint
could hold (a NaN or an infinity, which sort last anyway, or on SQLite, whose columns may mix
types, a value of another type) never enters a checkpoint: only ``Change.event_id`` would encode
it, and raise ``CodecError`` naming it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from azure_functions_db.core.batch import Change, RowChanges
from azure_functions_db.core.ports import SourceRow
from azure_functions_db.core.position import Position


def driver_rows(result: sa.CursorResult[Any]) -> Sequence[Sequence[Any]]:
    """All rows of ``result``: the driver's own rows when SQLAlchemy would convert none of their
    values, ``Row`` objects otherwise.

    SQLAlchemy's ``Row`` is a second object per row; when no selected column has a result
    processor (PostgreSQL's ``timestamptz``, ``bigint``, ``text`` through psycopg) its values
    are the driver's, so the driver's tuples are taken as they are, through the result's own
    fetch strategy (its buffering and error handling). Any processor (SQLite's text
    date-times, a ``TypeDecorator``), a tuple filter, or a SQLAlchemy without these internals
    takes the documented ``Result.all()``.
    """
    metadata = result._metadata
    processors = getattr(metadata, "_processors", None)
    fetch_all = getattr(result, "_fetchall_impl", None)
    if (
        processors is None
        or fetch_all is None
        or getattr(metadata, "_tuplefilter", True) is not None
        or any(processor is not None for processor in processors)
    ):
        return result.all()
    return fetch_all()  # type: ignore[no-any-return]


def dict_builder(names: Sequence[str]) -> Callable[[Sequence[Any]], dict[str, Any]]:
    """``row -> {name: value}`` for rows of the columns ``names``, as one dict display: about
    2.5 times as fast per row as ``dict(zip(names, row))`` (no iterator, no pairs).

    Its source is generated from the names' ``repr`` and the indexes alone (as
    ``collections.namedtuple`` generates its methods), so a column name cannot inject code; a
    repeated name keeps its last value, as ``dict(zip(...))`` would.
    """
    body = ", ".join(f"{name!r}: row[{index}]" for index, name in enumerate(names))
    build: Callable[[Sequence[Any]], dict[str, Any]] = eval(  # noqa: S307 - see above
        f"lambda row: {{{body}}}", {"__builtins__": {}}
    )
    return build


Picker = Callable[[Sequence[Any]], tuple[Any, ...]]


@dataclass(frozen=True)
class RowShape:
    """Where the values of a driver row go.

    Attributes:
        names: The selected columns, in the order of the row's values.
        cursor_of: ``row -> cursor values``; ``pk_of``: ``row -> pk values``.
        deleted: ``row -> is it soft-deleted?``, ``None`` without ``soft_delete``.
        to_dict: ``row -> {name: value}`` (made from ``names``).
    """

    names: tuple[str, ...]
    cursor_of: Picker
    pk_of: Picker
    deleted: Callable[[Sequence[Any]], bool] | None = None
    to_dict: Callable[[Sequence[Any]], dict[str, Any]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "to_dict", dict_builder(self.names))

    def rows(self, rows: Sequence[Sequence[Any]]) -> list[SourceRow]:
        """``rows`` as ``SourceRow`` objects; ``CodecError`` if the first or last key cannot be
        stored."""
        if not rows:
            return []
        _, cursor_of, pk_of, deleted = self._checked(rows)
        to_dict, position = self.to_dict, Position.trusted
        if deleted is None:
            return [SourceRow(position(cursor_of(row), pk_of(row)), to_dict(row)) for row in rows]
        return [
            SourceRow(
                position(cursor_of(row), pk_of(row)),
                to_dict(row),
                "delete" if deleted(row) else "upsert",
            )
            for row in rows
        ]

    def changes(
        self, rows: Sequence[Sequence[Any]], poller: str, last: Position | None = None
    ) -> Sequence[Change]:
        """``rows`` as ``poller``'s changes, each ``Change`` built when it is read (see
        ``core.batch.RowChanges``); ``last``: the last row's position as :meth:`last` returned
        it (the rows are checked then)."""
        if not rows:
            return []
        if last is None:
            self._checked(rows)
        return RowChanges(rows, self, poller, last)

    def last(self, rows: Sequence[Sequence[Any]]) -> Position | None:
        """The position of the last of ``rows`` (``None``: no rows); ``CodecError`` if the
        first or last key cannot be stored."""
        if not rows:
            return None
        Position(cursor=self.cursor_of(rows[0]), pk=self.pk_of(rows[0]))
        return Position(cursor=self.cursor_of(rows[-1]), pk=self.pk_of(rows[-1]))

    def _checked(
        self, rows: Sequence[Sequence[Any]]
    ) -> tuple[tuple[str, ...], Picker, Picker, Callable[[Sequence[Any]], bool] | None]:
        for row in (rows[0], rows[-1]):
            Position(cursor=self.cursor_of(row), pk=self.pk_of(row))
        return self.names, self.cursor_of, self.pk_of, self.deleted
