"""An in-memory :class:`~azure_functions_db.core.ports.TransactionalSink` for tests.

Held to the same contract as :class:`~azure_functions_db.sinks.sql.SqlSink`
(:class:`~azure_functions_db.testing.sink_contract.SinkContract` runs over both): one lock
guards the position records as the position row's lock does in a database (held to commit, not
while the handler runs), and a transaction's writes land in the tables only when it commits
with its mark.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from azure_functions_db.core.batch import Batch, Change
from azure_functions_db.core.checkpoint import PollerKey
from azure_functions_db.core.ports import SinkMark, refuse_older_fence
from azure_functions_db.errors import ConfigurationError, SinkError
from azure_functions_db.sinks.writes import split_by_op

Rows = Iterable[Mapping[str, Any] | Change]


class MemoryWriter:
    """The handler's side of a :class:`MemorySink` transaction: tables keyed by ``key``."""

    def __init__(
        self,
        tables: dict[str, dict[tuple[Any, ...], dict[str, Any]]],
        keys: Mapping[str, Sequence[str]],
    ):
        self._tables = tables
        self._keys = keys
        self.touched: set[str] = set()

    def insert(self, table: str, rows: Rows) -> int:
        """Insert ``rows``; a row whose key exists fails the transaction, as a database would."""
        count = 0
        for key, row in self._rows(table, rows, None):
            if key in self._tables[table]:
                raise ConfigurationError(f"duplicate key {key!r} inserted into `{table}`")
            self._tables[table][key] = row
            count += 1
        return count

    def upsert(self, table: str, rows: Rows, *, key: Sequence[str] | None = None) -> int:
        """Insert or replace ``rows`` by ``key`` (default: the table's key)."""
        count = 0
        for k, row in self._rows(table, rows, key):
            self._tables[table][k] = {**self._tables[table].get(k, {}), **row}
            count += 1
        return count

    def delete(self, table: str, rows: Rows, *, key: Sequence[str] | None = None) -> int:
        """Delete the rows whose key matches one of ``rows``."""
        count = 0
        for k, _ in self._rows(table, rows, key):
            count += self._tables[table].pop(k, None) is not None
        return count

    def apply(
        self, table: str, changes: Iterable[Change], *, key: Sequence[str] | None = None
    ) -> int:
        """Upsert each change's row, delete the soft-deleted ones."""
        upserts, deletes = split_by_op(changes)
        return self.upsert(table, upserts, key=key) + self.delete(table, deletes, key=key)

    def _rows(
        self, table: str, rows: Rows, key: Sequence[str] | None
    ) -> Iterator[tuple[tuple[Any, ...], dict[str, Any]]]:
        if table not in self._tables:
            raise ConfigurationError(f"The sink has no table `{table}`: create it first.")
        columns = list(key) if key is not None else list(self._keys[table])
        self.touched.add(table)
        for row in rows:
            data = dict(row.data if isinstance(row, Change) else row)
            yield tuple(data[c] for c in columns), data


class MemorySink:
    """Tables and position records in memory; :meth:`create_table` makes a target table."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._marks: dict[PollerKey, SinkMark] = {}
        self._tables: dict[str, dict[tuple[Any, ...], dict[str, Any]]] = {}
        self._keys: dict[str, tuple[str, ...]] = {}
        self.opened = 0

    def create_table(self, name: str, key: Sequence[str]) -> None:
        with self._lock:
            self._tables.setdefault(name, {})
            self._keys[name] = tuple(key)

    def rows(self, table: str) -> list[dict[str, Any]]:
        """The committed rows of ``table``, in key order."""
        with self._lock:
            return [dict(self._tables[table][k]) for k in sorted(self._tables[table])]

    # -- the TransactionalSink port ----------------------------------------------------------

    def open(self, settings: Mapping[str, str]) -> None:
        self.opened += 1

    def describe(self) -> str:
        return "MemorySink"

    def claim(self, key: PollerKey, fence: int) -> SinkMark | None:
        with self._lock:
            mark = self._marks.get(key)
            if mark is None:
                self._marks[key] = SinkMark(fence=fence, sequence=0, before=None, after=None)
                return None
            refuse_older_fence(key, fence, mark)
            self._marks[key] = SinkMark(fence, mark.sequence, mark.before, mark.after, mark.rows)
            return mark

    @contextmanager
    def transaction(
        self, key: PollerKey, batch: Batch, sequence: int
    ) -> Iterator[MemoryWriter | None]:
        with self._lock:
            seen = self._marks.get(key)
            staged = {name: dict(rows) for name, rows in self._tables.items()}
        refuse_older_fence(key, batch.fence, seen)
        if seen is not None and seen.holds(batch, sequence):
            yield None
            return
        writer = MemoryWriter(staged, self._keys)
        yield writer
        with self._lock:
            mark = self._marks.get(key)
            refuse_older_fence(key, batch.fence, mark)
            if mark != seen:
                raise SinkError(
                    f"The position record of {key} changed while the batch ran.",
                    poller=key.poller,
                    namespace=key.namespace,
                )
            for name in writer.touched:
                self._tables[name] = staged[name]
            self._marks[key] = SinkMark(
                batch.fence, sequence, batch.position_before, batch.position_after, len(batch)
            )

    def mark(self, key: PollerKey) -> SinkMark | None:
        with self._lock:
            return self._marks.get(key)
