"""``QueueSink``: the batch's changes as Azure Storage Queue messages, at-least-once.

A queue has no transaction to carry the poller's position, so this sink is **at-least-once**:
the handler sends, then the checkpoint commits; a batch whose commit does not land is sent
again. Every message carries the change's ``event_id``, the same for every delivery of a row
version, which is the consumer's dedup key. See ``docs/sinks.md``.

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
from contextlib import contextmanager
from decimal import Decimal
from typing import Any, Literal

from azure_functions_db.core.batch import Change
from azure_functions_db.errors import ConfigurationError, SinkError, TransientSinkError

_QUEUE_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyz0123456789-")


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
    """

    def __init__(
        self,
        queue: str,
        *,
        connection: str = "AzureWebJobsStorage",
        message_encoding: Literal["base64", "none"] = "base64",
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
        self.queue = queue
        self.connection = connection
        self.message_encoding = message_encoding
        self._client: Any = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"QueueSink(queue={self.queue!r}, connection={self.connection!r})"

    def send(self, changes: Iterable[Change], settings: Mapping[str, str] | None = None) -> int:
        """Send one message per change, in order; the number sent. Raises ``SinkError``
        (``TransientSinkError`` for what a retry may fix): the batch then fails and is
        delivered again, with the same ``event_id`` in every message."""
        client = self._queue(os.environ if settings is None else settings)
        count = 0
        for change in changes:
            with self._errors("send a message to"):
                try:
                    client.send_message(message_body(change))
                except Exception as exc:
                    if _code(exc) != "QueueNotFound":
                        raise
                    self._create_queue(client)
                    client.send_message(message_body(change))
            count += 1
        return count

    @staticmethod
    def _create_queue(client: Any) -> None:
        """Create the queue; another sender creating it at the same moment is fine."""
        from azure.core.exceptions import ResourceExistsError

        with contextlib.suppress(ResourceExistsError):
            client.create_queue()

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
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
            transient = isinstance(exc, ServiceRequestError | ServiceResponseError) or (
                isinstance(status, int) and (status >= 500 or status in (408, 429))
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
