"""What ``DeltaSink`` keeps and reads of a Delta table's log: the application ids of a
poller's marks, the marks as the log records them, and the sink's open table with the marks it
knows at one version (:class:`TableState`)."""

from __future__ import annotations

import json
import logging
import operator
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from azure_functions_db.core.batch import Batch, Change, RowData, driver_row
from azure_functions_db.core.checkpoint import PollerKey
from azure_functions_db.core.logs import log_event
from azure_functions_db.core.ports import SinkMark
from azure_functions_db.core.position import Position

logger = logging.getLogger("azure_functions_db.sinks.delta")

#: How far back the table's history is searched for a poller's last batch commit (``None``:
#: all of it that the log still holds).
HISTORY_WINDOW = (50, 1000, None)


def batch_app(key: PollerKey) -> str:
    """The application id whose version is the poller's last committed batch sequence."""
    return f"afdb:{key.namespace}/{key.poller}"


def fence_app(key: PollerKey) -> str:
    """The application id whose version is the newest owner's fence."""
    return f"afdb-fence:{key.namespace}/{key.poller}"


class TableState:
    """The sink's open table and what it knows of the pollers' marks at one version of it.

    ``known`` holds marks as of ``version``: each read from the table, or committed by this sink
    on top of that version (a successful commit of ``max_commit_retries=0`` lands exactly one
    version later, so nothing else came in between). Another writer's commit moves the table
    past ``version`` when it is read, and every mark is read again.
    """

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.table: Any = None
        self.pid = 0
        self.version = -1
        self.known: dict[PollerKey, SinkMark | None] = {}
        #: A commit lost a race: read the log's new entries before each batch's commit, until
        #: such a reading finds none.
        self.contended = False

    def opened(self, table: Any) -> None:
        self.table, self.pid = table, os.getpid()
        self.version, self.known = -1, {}

    def forget(self) -> None:
        """After an error whose effect on the open table is not known: open it again."""
        self.table, self.version, self.known = None, -1, {}

    def landed(self, base: int, now: int, key: PollerKey, mark: SinkMark) -> None:
        """This sink's commit of ``mark`` on top of version ``base`` landed; the table is at
        ``now``."""
        if self.version == base and now == base + 1:
            self.version = now
            self.known[key] = mark
        else:
            self.known.clear()


def arrow_schema(table: Any) -> Any:
    import pyarrow as pa

    return pa.schema(table.schema().to_arrow())


def read_mark(table: Any, key: PollerKey) -> SinkMark | None:
    """The poller's mark as the table's application transactions and history record it."""
    fence = table.transaction_version(fence_app(key))
    sequence = table.transaction_version(batch_app(key))
    if fence is None and sequence is None:
        return None
    if sequence is None:
        return SinkMark(fence=int(fence), sequence=0, before=None, after=None)
    commit = _batch_commit(table, key, int(sequence))
    return SinkMark(
        fence=int(fence if fence is not None else commit.get("afdb.fence", 0)),
        sequence=int(sequence),
        before=decode_position(commit.get("afdb.before")),
        after=decode_position(commit.get("afdb.after")),
        rows=int(commit.get("afdb.rows", 0)),
    )


def _batch_commit(table: Any, key: PollerKey, sequence: int) -> dict[str, Any]:
    """The commit info of ``key``'s batch ``sequence``; empty when the log no longer has it.

    Delta removes old log entries (``delta.logRetentionDuration``, 30 days by default) while
    the application transaction versions stay in its checkpoints: a poller quiet for longer
    still knows its sequence and fence, only not the positions, which matter only to catch the
    checkpoint up after a crash between the two commits (then the engine says so).
    """
    app = batch_app(key)
    for limit in HISTORY_WINDOW:
        for commit in table.history(limit):
            if commit.get("afdb.app") == app and commit.get("afdb.sequence") == str(sequence):
                return dict(commit)
    log_event(
        logger,
        logging.WARNING,
        "sink_history_missing",
        poller=key.poller,
        namespace=key.namespace,
        sequence=sequence,
        note="the Delta log no longer holds this batch's commit; its positions are unknown",
    )
    return {}


def encode_position(position: Position | None) -> str:
    return json.dumps(position.to_json() if position else None, sort_keys=True)


def decode_position(text: str | None) -> Position | None:
    if text is None:
        return None
    data = json.loads(text)
    return None if data is None else Position.from_json(data)


def row_mappings(rows: Iterable[Mapping[str, Any] | Change]) -> list[Mapping[str, Any]]:
    if isinstance(rows, Batch):
        return list(map(_DATA, rows))
    return [row.data if isinstance(row, Change) else row for row in rows]


_DATA = operator.attrgetter("data")


def view_columns(
    rows: Sequence[Mapping[str, Any]], shape: type[RowData], names: Iterable[str]
) -> list[list[Any]]:
    """The values of each of ``names`` in ``rows`` (views of ``shape``), column by column,
    read straight from the driver rows under the views: what ``[row[name] for row in rows]``
    gives, without a Python call per value."""
    tuples = list(map(driver_row, rows))  # type: ignore[arg-type]  # views of `shape`
    return [list(map(operator.itemgetter(shape.column_index(name)), tuples)) for name in names]
