"""``QueueSink``: the batch's changes as Azure Storage Queue messages, at-least-once.

A queue has no transaction to carry the poller's position, so this sink is **at-least-once**:
the handler sends, then the checkpoint commits; a batch whose commit does not land is sent
again. Every message carries the change's ``event_id``, the same for every delivery of a row
version, which is the consumer's dedup key. A batch's messages are sent ``concurrency`` at a
time (a queue keeps no order anyway; each message carries its position). See
``docs/sinks.md``.

Message body (JSON; base64-encoded on the queue unless ``message_encoding="none"``, matching
the Functions host's queue trigger default)::

    {"event_id": "...", "poller": "orders", "op": "upsert",
     "position": {"cursor": [...], "pk": [...]}, "data": {...}}

``data`` holds the row as plain JSON: date-times and dates in ISO 8601, ``Decimal`` and
``UUID`` as strings, bytes in base64.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import json
import os
import threading
import uuid
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from decimal import Decimal
from typing import Any, Literal

from azure_functions_db.core.batch import Change
from azure_functions_db.errors import ConfigurationError, SinkError, TransientSinkError

_QUEUE_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyz0123456789-")
#: Messages in flight at once, by default and at most (the storage client's connection pool
#: keeps 10 connections; more threads would open and drop one per request).
DEFAULT_CONCURRENCY, MAX_CONCURRENCY = 8, 10


def message_body(change: Change) -> str:
    """The JSON text of one change's message."""
    return json.dumps(
        {
            "event_id": change.event_id,
            "poller": change.poller,
            "op": change.op,
            "position": change.position.to_json(),
            "data": dict(change.data),
        },
        default=_plain,
        sort_keys=True,
        separators=(",", ":"),
    )


class QueueSink:
    """At-least-once delivery of changes to one Azure Storage queue (created on first use).

    Use it inside any handler::

        orders_out = QueueSink("orders-out")

        @db.poller(name="orders", schedule=..., source=...)
        def forward(batch):
            orders_out.send(batch)

    Args:
        queue: The queue's name (3-63 lowercase letters, digits and single hyphens).
        connection: The app setting prefix of the storage account, read the way the Functions
            host reads it: a connection string, or ``<connection>__queueServiceUri`` /
            ``__accountName`` with a managed identity (role *Storage Queue Data Message
            Sender*).
        message_encoding: ``"base64"`` (the Functions queue trigger's default) or ``"none"``.
        concurrency: Messages in flight at once (1-10, default 8): one request per message,
            so at Azure's 10-30 ms a request, 8 at a time send some 300-800 messages a second
            where one at a time sends 30-100. ``1`` sends them one by one, in the batch's order.
    """

    def __init__(
        self,
        queue: str,
        *,
        connection: str = "AzureWebJobsStorage",
        message_encoding: Literal["base64", "none"] = "base64",
        concurrency: int = DEFAULT_CONCURRENCY,
    ) -> None:
        if (
            not isinstance(queue, str)
            or not 3 <= len(queue) <= 63
            or not set(queue) <= _QUEUE_NAME_CHARS
            or queue[0] == "-"
            or queue[-1] == "-"
            or "--" in queue
        ):
            raise ConfigurationError(
                f"`queue={queue!r}` is not a valid queue name: use 3-63 lowercase letters, "
                "digits and single hyphens, starting and ending with a letter or digit (e.g. "
                '`"orders-out"`).'
            )
        if message_encoding not in ("base64", "none"):
            raise ConfigurationError(
                f'`message_encoding={message_encoding!r}` must be `"base64"` (what a '
                'Functions queue trigger reads by default) or `"none"`.'
            )
        if (
            not isinstance(concurrency, int)
            or isinstance(concurrency, bool)
            or not 1 <= concurrency <= MAX_CONCURRENCY
        ):
            raise ConfigurationError(
                f"`concurrency={concurrency!r}` must be a whole number from 1 to "
                f"{MAX_CONCURRENCY}: the messages a batch keeps in flight at once (default "
                f"{DEFAULT_CONCURRENCY}; 1 sends them one by one, in order)."
            )
        self.queue = queue
        self.connection = connection
        self.message_encoding = message_encoding
        self.concurrency = concurrency
        self._client: Any = None
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def __repr__(self) -> str:
        return f"QueueSink(queue={self.queue!r}, connection={self.connection!r})"

    def send(self, changes: Iterable[Change], settings: Mapping[str, str] | None = None) -> int:
        """Send one message per change, ``concurrency`` at a time; the number sent. Every
        message is built before the first is sent (a value JSON cannot hold fails the batch
        with nothing sent). Raises ``SinkError`` (``TransientSinkError`` for what a retry may
        fix) once the messages in flight have finished, sending no more after a failure: the
        batch then fails and is delivered again, with the same ``event_id`` in every message."""
        if self._pid != os.getpid():
            self._forked()
        client = self._queue(os.environ if settings is None else settings)
        bodies = [message_body(change) for change in changes]
        if self.concurrency == 1 or len(bodies) <= 1:
            for body in bodies:
                self._send_one(client, body)
            return len(bodies)
        failed = threading.Event()

        def one(body: str) -> bool:
            if failed.is_set():
                return False
            try:
                self._send_one(client, body)
            except BaseException:
                failed.set()
                raise
            return True

        futures: list[Future[bool]] = [self._executor().submit(one, body) for body in bodies]
        sent, error = 0, None
        try:
            for future in futures:
                try:
                    sent += future.result()
                except Exception as exc:  # noqa: BLE001 - the first one is raised below
                    error = error or exc
        except BaseException:  # Ctrl-C (or an exit) while waiting: send no more, go at once
            failed.set()
            for future in futures:
                future.cancel()
            raise
        if error is not None:
            raise error
        return sent

    def _forked(self) -> None:
        """In a process forked from one that used this sink: its threads and connections are
        the parent's; start afresh (a pool whose threads did not survive the fork would wait
        for ever)."""
        self._lock = threading.Lock()
        self._client = None
        self._pool = None
        self._pid = os.getpid()

    def _send_one(self, client: Any, body: str) -> None:
        with self._errors("send a message to"):
            try:
                client.send_message(body)
            except Exception as exc:
                if _code(exc) != "QueueNotFound":
                    raise
                self._create_queue(client)
                client.send_message(body)

    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    max_workers=self.concurrency, thread_name_prefix=f"afdb-queue-{self.queue}"
                )
            return self._pool

    @staticmethod
    def _create_queue(client: Any) -> None:
        """Create the queue; another sender creating it at the same moment is fine."""
        from azure.core.exceptions import ResourceExistsError

        with contextlib.suppress(ResourceExistsError):
            client.create_queue()

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
        if client is not None:
            client.close()

    def _queue(self, settings: Mapping[str, str]) -> Any:
        with self._lock:
            if self._client is not None:
                return self._client
            try:
                from azure.storage.queue import (
                    BinaryBase64DecodePolicy,
                    QueueClient,
                    TextBase64EncodePolicy,
                )
            except ImportError as exc:
                raise ConfigurationError(
                    "QueueSink needs the `azure` extra: add `afdb[azure]` to requirements.txt."
                ) from exc

            from azure_functions_db.state.storage import CLIENT_OPTIONS, resolve_storage

            target = resolve_storage(settings, self.connection)
            encoding: dict[str, Any] = {}
            if self.message_encoding == "base64":
                encoding = {
                    "message_encode_policy": TextBase64EncodePolicy(),
                    "message_decode_policy": BinaryBase64DecodePolicy(),
                }
            if target.connection_string is not None:
                client = QueueClient.from_connection_string(
                    target.connection_string, self.queue, **encoding, **CLIENT_OPTIONS
                )
            else:
                client = QueueClient(
                    target.queue_url or "",
                    self.queue,
                    credential=target.credential,
                    **encoding,
                    **CLIENT_OPTIONS,
                )
            self._client = client
            return client

    @contextmanager
    def _errors(self, action: str) -> Iterator[None]:
        from azure.core.exceptions import (
            AzureError,
            ClientAuthenticationError,
            DecodeError,
            IncompleteReadError,
            ServiceRequestError,
            ServiceResponseError,
        )

        try:
            yield
        except AzureError as exc:
            status = getattr(exc, "status_code", None)
            where = f"queue `{self.queue}` ({self.connection})"
            if isinstance(exc, ClientAuthenticationError) or status == 403:
                raise SinkError(
                    f"QueueSink could not {action} {where}: not authorised. With managed "
                    "identity, grant the app the `Storage Queue Data Message Sender` role (and "
                    "Contributor on the queue, or create it beforehand)."
                ) from exc
            # A connection cut mid-answer (no status, a short or garbled body) is the network's.
            cut = isinstance(exc, IncompleteReadError | DecodeError) or status is None
            transient = (
                isinstance(exc, ServiceRequestError | ServiceResponseError)
                or cut
                or (isinstance(status, int) and (status >= 500 or status in (408, 429)))
            )
            kind = TransientSinkError if transient else SinkError
            detail = f"HTTP {status} {_code(exc)}" if status else type(exc).__name__
            raise kind(f"QueueSink could not {action} {where}: {detail}.") from exc


def _code(exc: Exception) -> str | None:
    code = getattr(exc, "error_code", None)
    return None if code is None else str(getattr(code, "value", code))


def _plain(value: Any) -> Any:
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, Decimal | uuid.UUID):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    raise TypeError(f"a `{type(value).__name__}` value cannot go into a queue message")
