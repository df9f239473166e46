"""What the soak reads back from its non-SQL sinks: the Delta table's rows (``deltalake``), and
the queue's messages, taken off Azurite's queue as a consumer would while the soak runs.

The consumer reads the queue directly (not through the fault proxy) and logs each message once
per message id (``queue.jsonl``: the row's id and version, its ``event_id`` and the message id)
before deleting it, several deletes at once (one at a time, the consumer and not the sink set
the pace of a long soak); a message whose delete failed comes back and is not logged again, so the
duplicates the checker counts are the sink's own (a batch sent again), not the consumer's.
"""

from __future__ import annotations

import base64
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from devkit.evidence import EvidenceLog

#: Seconds a received message stays invisible (a failed delete shows it again after this).
VISIBILITY = 20
#: Messages deleted at once (a receive takes up to 32).
DELETERS = 8


def delta_rows(uri: str) -> list[list[Any]]:
    """Every (id, version, fence) the Delta table at ``uri`` holds, in no particular order."""
    import deltalake

    table = deltalake.DeltaTable(uri).to_pyarrow_table(columns=["id", "version", "fence"])
    return [list(row.values()) for row in table.to_pylist()]


class QueueConsumer:
    """A thread that empties one queue into an evidence log (see the module's docstring)."""

    def __init__(self, connection_string: str, queue: str, log: Path) -> None:
        from azure.storage.blob import ExponentialRetry
        from azure.storage.queue import QueueClient

        self.client = QueueClient.from_connection_string(
            connection_string,
            queue,
            connection_timeout=2,
            read_timeout=5,
            retry_policy=ExponentialRetry(retry_total=0),
        )
        self.log = EvidenceLog(log)
        self.seen: set[str] = set()
        self.errors = 0
        self.idle = threading.Event()  # the last receive found the queue empty
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-queue", daemon=True)
        # Deletes in flight at once: one at a time, the consumer (not the sink) set the pace.
        self._pool = ThreadPoolExecutor(DELETERS, thread_name_prefix="soak-queue-delete")
        self._lock = threading.Lock()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self._pool.shutdown(wait=True)

    def drained(self, quiet: float = 3.0) -> bool:
        """Whether the queue is empty now: a receive within ``quiet`` seconds found nothing, and
        the queue counts no message (invisible ones after a failed delete included)."""
        self.idle.clear()
        if not self.idle.wait(quiet) or self._stop.is_set():
            return False
        try:
            count = self.client.get_queue_properties().approximate_message_count
        except Exception:  # noqa: BLE001 - not drained as far as we know
            return False
        return count == 0

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                messages = list(
                    self.client.receive_messages(
                        messages_per_page=32, max_messages=32, visibility_timeout=VISIBILITY
                    )
                )
            except Exception as exc:  # noqa: BLE001 - Azurite paused, restarting, no queue yet
                self.errors += 1
                if "QueueNotFound" not in str(exc):
                    self.log.write("receive_failed", error=type(exc).__name__)
                self._stop.wait(0.5)
                continue
            if not messages:
                self.idle.set()
                self._stop.wait(0.2)
                continue
            list(self._pool.map(self._take, messages))

    def pending(self) -> int:
        """Messages on the queue now (invisible ones included), 0 when it cannot be read."""
        try:
            return int(self.client.get_queue_properties().approximate_message_count or 0)
        except Exception:  # noqa: BLE001 - unknown: no progress is credited
            return 0

    def _take(self, message: Any) -> None:
        with self._lock:
            first = message.id not in self.seen
            self.seen.add(message.id)
        if first:
            try:
                body = json.loads(base64.b64decode(message.content))
                row, event_id = [body["data"]["id"], body["data"]["version"]], body["event_id"]
            except (ValueError, KeyError, TypeError) as exc:  # evidence, not a dead consumer
                self.log.write("bad_message", message=message.id, error=repr(exc)[:200])
            else:
                self.log.write("message", row=row, event_id=event_id, message=message.id)
        try:
            self.client.delete_message(message)
        except Exception as exc:  # noqa: BLE001 - it comes back after VISIBILITY; logged once
            self.errors += 1
            self.log.write("delete_failed", message=message.id, error=type(exc).__name__)
