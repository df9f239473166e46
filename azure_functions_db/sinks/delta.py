"""``DeltaSink``: exactly-once into one Delta Lake table, with Delta's application transactions.

Every batch is one Delta commit that carries, besides its data, two application transactions
(``txn`` actions) and the batch's positions in its commit metadata:

- ``afdb:<namespace>/<poller>`` at version ``sequence`` (the checkpoint's batch count once the
  batch is committed): which batch of this poller (or backfill chunk) the table holds;
- ``afdb-fence:<namespace>/<poller>`` at version ``fence``: the newest owner's fence;
- ``afdb.before``/``afdb.after``/``afdb.rows``/``afdb.fence``: where the batch was read after,
  where it ends, its size (so recovery can move the checkpoint from the table alone).

A claim is a commit of the fence transaction alone. Every commit is made on top of the version
it was checked against, with ``max_commit_retries=0``: if any other commit landed in between (a
new owner's claim, a backfill chunk's batch), it fails, and the sink reads the table again,
checks the fence again and retries the commit (the handler does not run again). So a commit of
an older fence can never land after a newer claim. Written with the ``deltalake`` package
(delta-rs, no JVM), from a Functions process and from the Spark backfill's tasks alike.

The sink keeps the table open and knows the marks as of the version it last read or committed:
a batch reads no log before its commit (the commit itself finds out whether anything came in
between), a claim reads only the log's new entries. The cost of a batch is that of appending
to an open ``DeltaTable`` (``benchmarks/delta_sink.py``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from functools import partial
from typing import Any

from azure_functions_db.core.batch import Batch, Change, view_class
from azure_functions_db.core.checkpoint import PollerKey
from azure_functions_db.core.logs import log_event
from azure_functions_db.core.ports import SinkMark, refuse_older_fence
from azure_functions_db.errors import (
    ConfigurationError,
    SinkError,
    SinkFencedError,
    TransientSinkError,
)
from azure_functions_db.sinks import options
from azure_functions_db.sinks._delta_log import (
    TableState,
    arrow_schema,
    batch_app,
    encode_position,
    fence_app,
    read_mark,
    row_mappings,
    view_columns,
)
from azure_functions_db.sources import urls

logger = logging.getLogger(__name__)

#: Commit attempts on top of other writers' commits before the batch fails (transiently).
COMMIT_ATTEMPTS = 30
_OP = "_afdb_op"


def _converted(writer: DeltaWriter | None, schema: Any) -> Any:
    """The Arrow table of ``writer.appended`` from the tables its inserts converted, if they
    hold every row, in the columns and types of ``schema`` (the table's at the commit; another
    writer may have changed it since); ``None`` otherwise."""
    if writer is None or not writer.tables:
        return None
    tables = writer.tables
    if sum(t.num_rows for t in tables) != len(writer.appended):
        return None
    for field in (f for t in tables for f in t.schema):
        if field.name not in schema.names or schema.field(field.name) != field:
            return None
    if len(tables) == 1:
        return tables[0]
    import pyarrow as pa

    # Inserts of other columns: each one's missing columns are null, in the table's order.
    joined = pa.concat_tables(tables, promote_options="default")
    return joined.select([name for name in schema.names if name in joined.column_names])


class DeltaWriter:
    """The handler's side of a :class:`DeltaSink` batch: the rows of one Delta commit.

    ``insert`` appends; ``upsert``, ``delete`` and ``apply`` need the sink's ``key`` and make
    the commit one ``MERGE`` (the last write of each key in the batch wins, and an ``insert``
    in such a batch is merged like an ``upsert``). Nothing is written until the handler
    returns; then the rows and the batch's position commit together.
    """

    def __init__(
        self,
        key: tuple[str, ...] | None,
        arrow: Callable[[Sequence[Mapping[str, Any]]], Any] | None = None,
    ) -> None:
        self._key = key
        self._arrow = arrow
        self.appended: list[Mapping[str, Any]] = []
        self.merged: dict[tuple[Any, ...], tuple[str, Mapping[str, Any]]] = {}
        #: Without a key, the Arrow tables of ``appended``, one per ``insert`` (see ``insert``).
        self.tables: list[Any] = []

    def insert(self, rows: Iterable[Mapping[str, Any] | Change]) -> int:
        """Append ``rows`` (mappings, or the batch's changes: their ``data``). With a key, a
        later write of the same key in this batch replaces it."""
        data = row_mappings(rows)
        if self._key is None:
            if self._arrow is not None and data:
                # Converted now, inside the handler: the engine then waits for the checkpoint
                # commit of the batch before (the sink commits only once it landed), and the
                # Delta commit after it has only the write left to do.
                self.tables.append(self._arrow(data))
            self.appended.extend(data)
            return len(data)
        return self._merge("insert", data)

    def upsert(self, rows: Iterable[Mapping[str, Any] | Change]) -> int:
        """Insert ``rows``, or update the rows with the same key."""
        return self._merge("upsert", row_mappings(rows))

    def delete(self, rows: Iterable[Mapping[str, Any] | Change]) -> int:
        """Delete the rows whose key matches one of ``rows``."""
        return self._merge("delete", row_mappings(rows))

    def apply(self, changes: Iterable[Change]) -> int:
        """Mirror ``changes``: upsert each row, delete the soft-deleted ones."""
        count = 0
        for change in changes:
            count += self._merge("delete" if change.op == "delete" else "upsert", [change.data])
        return count

    def _merge(self, op: str, data: list[Mapping[str, Any]]) -> int:
        if self._key is None:
            raise ConfigurationError(
                f"DeltaWriter.{op} needs the table's key: pass `key=[...]` to DeltaSink (the "
                "columns that identify a row), or use `insert`."
            )
        for row in data:
            missing = [k for k in self._key if k not in row]
            if missing:
                raise ConfigurationError(
                    f"A row given to DeltaWriter.{op} has no `{missing[0]}`, a column of the "
                    f"key {list(self._key)}."
                )
            self.merged[tuple(row[k] for k in self._key)] = (op, row)
        return len(data)


class DeltaSink:
    """Exactly-once writes into one Delta Lake table (local path, ``abfss://``, ...).

    Args:
        uri: The table's location; ``%SETTING%`` reads it (or part of it) from an app setting
            when the sink opens, at the first run.
        key: Columns that identify a row, for ``upsert``/``delete``/``apply`` (a ``MERGE``);
            without it the writer only appends.
        schema: A ``pyarrow.Schema`` to create the table with when it does not exist yet
            (otherwise the table must exist).
        storage_options: ``deltalake`` storage options (e.g. for ADLS); values may be
            ``%SETTING%`` references, resolved when the sink opens and never logged.
    """

    def __init__(
        self,
        uri: str,
        *,
        key: str | Sequence[str] | None = None,
        schema: Any = None,
        storage_options: Mapping[str, str] | None = None,
    ) -> None:
        self.options = options.build(
            options.DeltaSinkOptions,
            uri=uri,
            key=key,
            storage_options=storage_options,
        )
        self._schema = schema
        self._uri: str | None = None
        self._storage: dict[str, str] | None = None
        self._lock = threading.Lock()
        self._state = TableState()

    def __repr__(self) -> str:
        return f"DeltaSink(uri={self.options.uri!r}, key={self.options.key!r})"

    def describe(self) -> str:
        return f"DeltaSink {self._uri or self.options.uri}"

    # -- the TransactionalSink port ----------------------------------------------------------

    def open(self, settings: Mapping[str, str]) -> None:
        """Resolve settings; create the table from ``schema=`` if it does not exist."""
        with self._lock:
            if self._uri is not None:
                return
            try:
                import deltalake
            except ImportError as exc:
                raise ConfigurationError(
                    "DeltaSink needs the `delta` extra: add `afdb[delta]` to requirements.txt "
                    "(it installs deltalake and pyarrow)."
                ) from exc
            where = "the DeltaSink"
            uri = urls.resolve_settings(self.options.uri, settings, where)
            storage = {
                name: urls.resolve_settings(value, settings, where)
                for name, value in self.options.storage_options.items()
            }
            with self._errors("open the table"):
                if not deltalake.DeltaTable.is_deltatable(uri, storage_options=storage or None):
                    if self._schema is None:
                        raise ConfigurationError(
                            f"There is no Delta table at `{self.options.uri}`: create it, or "
                            "pass `schema=` (a pyarrow.Schema) to let the sink create it."
                        )
                    self._create(uri, storage)
            self._uri, self._storage = uri, storage
            log_event(logger, logging.INFO, "sink_opened", sink=self.describe())

    def _create(self, uri: str, storage: dict[str, str]) -> None:
        """Create the table; several writers opening a new table at once (a backfill's chunk
        tasks) race, and every one but the winner finds it created."""
        import deltalake
        from deltalake.exceptions import CommitFailedError

        try:
            deltalake.DeltaTable.create(
                uri, self._schema, mode="ignore", storage_options=storage or None
            )
        except CommitFailedError:
            if not deltalake.DeltaTable.is_deltatable(uri, storage_options=storage or None):
                raise

    def claim(self, key: PollerKey, fence: int) -> SinkMark | None:
        """Commit ``fence`` as the fence transaction's version; return the poller's mark."""
        for _ in range(COMMIT_ATTEMPTS):
            with self._state.lock:
                table = self._refreshed()
                mark = self._known_mark(table, key)
                refuse_older_fence(key, fence, mark)
                if mark is not None and mark.fence == fence:
                    return mark
                version = table.version()
                if self._commit(table, key, fence, None, {"afdb.claim": str(fence)}):
                    claimed = (
                        replace(mark, fence=fence)
                        if mark is not None
                        else SinkMark(fence=fence, sequence=0, before=None, after=None)
                    )
                    self._state.landed(version, table.version(), key, claimed)
                    return mark
        raise self._busy(key)

    @contextmanager
    def transaction(
        self, key: PollerKey, batch: Batch, sequence: int
    ) -> Iterator[DeltaWriter | None]:
        """Yields the writer (``None`` if the table holds this batch); commits on exit.

        The table stays open between batches, and what it says of ``key`` is kept as of the
        version this sink last read or committed: no log is read before the handler runs. The
        commit is made on top of that version and fails if any other commit landed since (a
        newer owner's claim among them); then the table is read again, the fence checked again
        and the commit retried. Once a race was lost, each batch reads the log's new entries
        right before it commits, until one finds none.
        """
        with self._state.lock:
            seen = self._known_mark(self._loaded(), key)
        refuse_older_fence(key, batch.fence, seen)
        if seen is not None and seen.holds(batch, sequence):
            yield None
            return
        with self._state.lock:
            schema = arrow_schema(self._loaded())
        writer = DeltaWriter(self.options.key, partial(self._arrow, schema))
        yield writer
        metadata = {
            "afdb.app": batch_app(key),
            "afdb.sequence": str(sequence),
            "afdb.fence": str(batch.fence),
            "afdb.before": encode_position(batch.position_before),
            "afdb.after": encode_position(batch.position_after),
            "afdb.rows": str(len(batch)),
        }
        committed = SinkMark(
            fence=batch.fence,
            sequence=sequence,
            before=batch.position_before,
            after=batch.position_after,
            rows=len(batch),
        )
        state = self._state
        for attempt in range(COMMIT_ATTEMPTS):
            with state.lock:
                table = self._loaded()
                if attempt == 0 and state.contended:
                    base = table.version()
                    table = self._refreshed()
                    state.contended = table.version() != base
                mark = self._known_mark(table, key)
                refuse_older_fence(key, batch.fence, mark)
                if mark is not None and mark.holds(batch, sequence):
                    return  # an earlier attempt landed although it reported a failure
                if mark != seen:
                    raise SinkError(
                        f"The Delta table's record of {key} changed while the batch ran, under "
                        "the same fence: two processes share one lease. Nothing was committed.",
                        poller=key.poller,
                        namespace=key.namespace,
                    )
                version = table.version()
                if self._commit(table, key, batch.fence, (sequence, writer), metadata):
                    state.landed(version, table.version(), key, committed)
                    return
        raise self._busy(key)

    def mark(self, key: PollerKey) -> SinkMark | None:
        with self._state.lock:
            return self._known_mark(self._refreshed(), key)

    # -- helpers -----------------------------------------------------------------------------

    def _loaded(self) -> Any:
        """The open table, as of the version last read or committed (opened at first use)."""
        import deltalake

        if self._uri is None:
            raise SinkError(f"{self!r} is not open: the engine opens it before the first run.")
        state = self._state
        if state.table is None or state.pid != os.getpid():
            with self._errors("read the table"):
                table = deltalake.DeltaTable(self._uri, storage_options=self._storage or None)
            state.opened(table)
        return state.table

    def _refreshed(self) -> Any:
        """The open table moved to the newest version: the log's new entries read (one
        listing of the log, and the commits after the version held)."""
        fresh = self._state.table is None or self._state.pid != os.getpid()
        table = self._loaded()
        if not fresh:
            try:
                with self._errors("read the table"):
                    table.update_incremental()
            except SinkError:
                self._state.forget()
                raise
        return table

    def _known_mark(self, table: Any, key: PollerKey) -> SinkMark | None:
        """``key``'s mark at ``table``'s version: kept from the last read or commit of this
        sink when no other commit landed since, else read from the table (and kept)."""
        state = self._state
        if state.version != table.version():
            state.known.clear()
            state.version = table.version()
        if key not in state.known:
            with self._errors("read the table"):
                state.known[key] = read_mark(table, key)
        return state.known[key]

    def _commit(
        self,
        table: Any,
        key: PollerKey,
        fence: int,
        batch: tuple[int, DeltaWriter] | None,
        metadata: dict[str, str],
    ) -> bool:
        """One commit on top of ``table``'s version; ``False`` if another commit came first
        (then ``table`` has been moved to the newest version)."""
        import deltalake
        from deltalake.exceptions import CommitFailedError

        txns = [deltalake.Transaction(fence_app(key), fence)]
        if batch is not None:
            txns.append(deltalake.Transaction(batch_app(key), batch[0]))
        props = deltalake.CommitProperties(
            custom_metadata=metadata, app_transactions=txns, max_commit_retries=0
        )
        version = table.version()
        try:
            with self._errors("commit the batch"):
                writer = batch[1] if batch is not None else None
                appended = list(writer.appended) if writer is not None else []
                if writer is not None and all(op == "insert" for op, _ in writer.merged.values()):
                    appended += [row for _, row in writer.merged.values()]
                elif writer is not None:
                    self._merge(table, writer, props)
                    return True
                if appended:
                    schema = arrow_schema(table)
                    data = _converted(writer, schema) or self._arrow(schema, appended)
                    deltalake.write_deltalake(table, data, mode="append", commit_properties=props)
                else:
                    table.create_write_transaction(
                        [], mode="append", schema=table.schema(), commit_properties=props
                    )
                    table.update_incremental()  # a commit without data leaves it where it was
        except SinkError as exc:
            if not isinstance(exc.__cause__, CommitFailedError):
                self._state.forget()  # what the open table holds after this is not known
                raise
            if self._refreshed().version() == version:
                self._state.forget()
                raise  # nobody else committed: a real failure, not a lost race
            self._state.contended = True
            time.sleep(0.01)
            return False
        return True

    def _merge(self, table: Any, writer: DeltaWriter, props: Any) -> None:
        key = writer._key or ()
        rows = [{**row, _OP: op} for op, row in writer.merged.values()]
        schema = arrow_schema(table)
        columns = list(schema.names)
        source = self._arrow(schema, rows, extra=_OP)
        quoted = {c: f"`{c}`" for c in columns}
        predicate = " AND ".join(f"t.{quoted[k]} = s.{quoted[k]}" for k in key)
        present = [c for c in columns if c in source.column_names]
        values = {quoted[c]: f"s.{quoted[c]}" for c in present}
        merger = table.merge(
            source, predicate, source_alias="s", target_alias="t", commit_properties=props
        )
        merger = merger.when_matched_delete(predicate=f"s.{_OP} = 'delete'")
        merger = merger.when_matched_update(
            updates={quoted[c]: f"s.{quoted[c]}" for c in present if c not in key},
            predicate=f"s.{_OP} <> 'delete'",
        )
        merger = merger.when_not_matched_insert(updates=values, predicate=f"s.{_OP} <> 'delete'")
        merger.execute()

    def _arrow(
        self, schema: Any, rows: Sequence[Mapping[str, Any]], extra: str | None = None
    ) -> Any:
        """The rows as one Arrow table of the columns of ``schema`` (the table's) that any row
        names (a row without one of them holds null there); a column the table does not have
        is refused."""
        import pyarrow as pa

        shape = view_class(rows) if extra is None and rows else None
        present: set[str] = set(rows[0]) if shape is not None else set()
        if shape is None:
            named = present.update
            for row in rows:
                named(row)  # the keys of every row, at C speed for dicts
        unknown = sorted(present - set(schema.names) - {extra})
        if unknown:
            raise ConfigurationError(
                f"The Delta table at `{self.options.uri}` has no column `{unknown[0]}`: "
                "write only its columns (select them from each change's data)."
            )
        fields = [f for f in schema if f.name in present] or list(schema)
        if extra is not None:
            fields.append(pa.field(extra, pa.string()))
        if shape is not None and present:
            # Views of one source's rows (a batch's changes): each column read from the
            # driver rows in C, converted as `from_pylist` converts it.
            columns = view_columns(rows, shape, [f.name for f in fields])
            return pa.Table.from_arrays(columns, schema=pa.schema(fields))
        # Column-wise from the mappings themselves (a read-only view works as a dict does).
        return pa.Table.from_pylist(rows, schema=pa.schema(fields))

    def _busy(self, key: PollerKey) -> TransientSinkError:
        return TransientSinkError(
            f"{self.describe()}: {COMMIT_ATTEMPTS} commits for {key} in a row lost the race to "
            "other writers of the table; the batch was not committed and will be retried.",
            poller=key.poller,
            namespace=key.namespace,
        )

    @contextmanager
    def _errors(self, action: str) -> Iterator[None]:
        try:
            yield
        except (ConfigurationError, SinkError, SinkFencedError):
            raise
        except Exception as exc:
            detail = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            for secret in (self._storage or {}).values():
                if secret:
                    detail = detail.replace(secret, "***")
            kind = TransientSinkError if isinstance(exc, OSError) else SinkError
            raise kind(
                f"DeltaSink could not {action} at `{self.options.uri}` "
                f"({type(exc).__name__}): {detail[:500]}"
            ) from exc
