"""An in-memory :class:`~azure_functions_db.core.ports.Source` for tests, fakes included in the
contract: :class:`~azure_functions_db.testing.SourceContract` runs over it unchanged.

Rows are plain mappings held in a list; their order is Python's order of the key values, which
is this "database's" order (a real database decides its own, which is why the contract asks each
adapter for it instead of sorting in Python).
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Iterable, Mapping, Sequence
from decimal import Decimal
from typing import Any

from azure_functions_db.core.checkpoint import SourceDescription
from azure_functions_db.core.ports import Horizon, SourceHealth, SourceRow
from azure_functions_db.core.position import KeyValue, Position
from azure_functions_db.errors import ConfigurationError, NullCursorError, SourceDefinitionError
from azure_functions_db.sources._config import check_names

_NONE = Horizon(bound=None, method="none")


class MemorySource:
    """Rows of one in-memory "table", read in ``(cursor..., pk...)`` order like ``SqlSource``.

    Args:
        table: A name for the table (recorded in checkpoints).
        cursor: Cursor column(s).
        pk: Primary-key column(s).
        rows: The initial rows; :meth:`insert` and :meth:`update` change them later.
        on_null_cursor: ``"skip"`` (count and report rows whose cursor is ``None``) or
            ``"raise"`` (:meth:`check` raises :class:`NullCursorError`).
        horizon: The horizon every batch gets (default: no bound).
    """

    def __init__(
        self,
        table: str,
        cursor: str | Sequence[str],
        pk: str | Sequence[str],
        rows: Iterable[Mapping[str, Any]] = (),
        *,
        on_null_cursor: str = "skip",
        horizon: Horizon = _NONE,
    ) -> None:
        self._table = table
        self._cursor = check_names(cursor, "cursor")
        self._pk = check_names(pk, "pk")
        if on_null_cursor not in ("skip", "raise"):
            raise ConfigurationError(
                f'`on_null_cursor={on_null_cursor!r}` is not an option: use `"skip"` or `"raise"`'
            )
        self._on_null = on_null_cursor
        self._horizon = horizon
        self._rows: dict[tuple[Any, ...], dict[str, Any]] = {}
        self._lock = threading.Lock()
        self.insert(rows)

    # -- the table ---------------------------------------------------------------------------

    def insert(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """Add rows, or replace the rows with the same primary key."""
        with self._lock:
            for row in rows:
                missing = [c for c in (*self._cursor, *self._pk) if c not in row]
                if missing:
                    raise SourceDefinitionError(
                        f"Row {dict(row)!r} of `{self._table}` has no column `{missing[0]}`"
                    )
                self._rows[tuple(row[c] for c in self._pk)] = dict(row)

    def delete(self, *pk: Any) -> None:
        """Remove the row with this primary key (a hard delete: invisible to polling)."""
        with self._lock:
            self._rows.pop(tuple(pk), None)

    # -- Source ------------------------------------------------------------------------------

    @property
    def description(self) -> SourceDescription:
        return SourceDescription(table=self._table, cursor=self._cursor, pk=self._pk)

    def open(self, settings: Mapping[str, str]) -> None:
        del settings

    def close(self) -> None:
        pass

    def horizon(self) -> Horizon:
        return self._horizon

    def fetch(self, after: Position | None, limit: int, horizon: Horizon) -> Sequence[SourceRow]:
        return self._below(after, horizon)[:limit]

    def latest(self, horizon: Horizon) -> Position | None:
        rows = self._below(None, horizon)
        return rows[-1].position if rows else None

    def rows_after(self, after: Position | None, horizon: Horizon, cap: int) -> int:
        return min(cap, len(self._below(after, horizon)))

    def parse_cursor(self, text: str) -> tuple[KeyValue, ...]:
        """One value per cursor column, typed like the values the rows hold."""
        parts = text.split(",") if len(self._cursor) > 1 else [text]
        if len(parts) != len(self._cursor):
            raise ConfigurationError(
                f"`{text}` has {len(parts)} value(s); the cursor has {len(self._cursor)}: "
                f"{', '.join(self._cursor)}"
            )
        return tuple(self._parse(i, part.strip()) for i, part in enumerate(parts))

    def check(self) -> SourceHealth:
        with self._lock:
            nulls = sum(1 for r in self._rows.values() if any(r[c] is None for c in self._cursor))
        if nulls and self._on_null == "raise":
            raise NullCursorError(self._table, self._cursor[0], nulls)
        return SourceHealth(null_cursor_rows=nulls)

    # -- helpers -----------------------------------------------------------------------------

    def _below(self, after: Position | None, horizon: Horizon) -> list[SourceRow]:
        """Rows after ``after`` and under both bounds of ``horizon``, in key order."""
        with self._lock:
            rows = [dict(r) for r in self._rows.values()]
        out = []
        for row in rows:
            cursor = tuple(row[c] for c in self._cursor)
            if any(v is None for v in cursor):
                continue
            key = (*cursor, *(row[c] for c in self._pk))
            if after is not None:
                if after.pk and key <= (*after.cursor, *after.pk):
                    continue
                if not after.pk and cursor < after.cursor:
                    continue
            if horizon.bound is not None and cursor[0] >= horizon.bound:
                continue
            if horizon.until is not None and key > (*horizon.until.cursor, *horizon.until.pk):
                continue
            out.append((key, row))
        out.sort(key=lambda item: item[0])
        n = len(self._cursor)
        return [
            SourceRow(position=Position(cursor=key[:n], pk=key[n:]), data=row) for key, row in out
        ]

    def _parse(self, index: int, text: str) -> KeyValue:
        with self._lock:
            sample = next(
                (
                    r[self._cursor[index]]
                    for r in self._rows.values()
                    if r[self._cursor[index]] is not None
                ),
                None,
            )
        kind = type(sample) if sample is not None else str
        try:
            if kind is dt.datetime:
                return dt.datetime.fromisoformat(text)
            if kind is dt.date:
                return dt.date.fromisoformat(text)
            if kind in (int, float, Decimal):
                return kind(text)  # type: ignore[no-any-return]
        except ValueError as exc:
            raise ConfigurationError(
                f"`{text}` is not a {kind.__name__} for cursor `{self._cursor[index]}`"
            ) from exc
        return text

    def __repr__(self) -> str:
        return f"MemorySource(table={self._table!r}, rows={len(self._rows)})"
