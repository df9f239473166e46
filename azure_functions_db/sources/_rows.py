"""Driver rows to ``SourceRow`` objects: the per-row hot path of ``SqlSource.fetch``.

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
from typing import Any

from azure_functions_db.core.position import Position
from azure_functions_db.ports import SourceRow

Picker = Callable[[Sequence[Any]], tuple[Any, ...]]


def to_rows(
    rows: Sequence[Sequence[Any]],
    names: Sequence[str],
    cursor_of: Picker,
    pk_of: Picker,
    deleted: Callable[[Sequence[Any]], bool] | None,
) -> list[SourceRow]:
    """``rows`` (values in the order of ``names``) as ``SourceRow`` objects.

    Raises ``CodecError`` when the first or last row has a key value no checkpoint can hold.
    """
    if not rows:
        return []
    for row in (rows[0], rows[-1]):
        Position(cursor=cursor_of(row), pk=pk_of(row))
    position = Position.trusted
    # names and row have equal lengths by construction (names are the selected columns).
    if deleted is None:
        return [
            SourceRow(position(cursor_of(row), pk_of(row)), dict(zip(names, row, strict=False)))
            for row in rows
        ]
    return [
        SourceRow(
            position(cursor_of(row), pk_of(row)),
            dict(zip(names, row, strict=False)),
            "delete" if deleted(row) else "upsert",
        )
        for row in rows
    ]
