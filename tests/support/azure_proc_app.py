"""The function app that ``tests/e2e/test_azure_processes.py`` runs in child processes.

One poller on a SQLite ``orders`` table with its state on Azurite (Blob, or Table + blob leases),
configured entirely by ``AZP_*`` environment variables, so the real CLI (``python -m
azure_functions_db run tests/support/azure_proc_app.py``) and ``tests/support/azure_proc_child.py``
run the same poller. Everything the child does that the test must judge goes to one event file
(``AZP_EVENTS``) as JSON lines, appended with one ``write`` each and fsynced: handler starts and
ends (pid, fence, ids, positions, times on the machine-wide monotonic clock), the engine's log
events, and every fault the injected transport caused.

Environment:
    AZP_CONN, AZP_CONTAINER       Azurite connection string; blob container for state/leases
    AZP_STORE, AZP_TABLE          ``blob`` (default) or ``table``; the table name for ``table``
    AZP_DB, AZP_POLLER            SQLAlchemy URL of the SQLite file; the poller name
    AZP_BATCH, AZP_BUDGET         batch size; time budget in seconds
    AZP_SLEEP                     seconds each handler call sleeps (a slow handler)
    AZP_HOLD_AT, AZP_HOLD, AZP_READY
                                  when a batch holds row ``AZP_HOLD_AT``: write the rows before
                                  it as side effects, create ``AZP_READY``, sleep ``AZP_HOLD`` s
    AZP_FAULT                     ``lose_response:N`` (the Nth conditional checkpoint write
                                  reaches Azurite, its response is lost), ``lose_request:N``
                                  (it never leaves), ``busy:N`` (every Nth request of each kind
                                  is answered 503 by a fake server without being sent)
    AZP_SDK_RETRY                 ``off``: no SDK retries on the checkpoint client
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import requests
from azure.core.exceptions import ServiceRequestError, ServiceResponseError
from azure.core.pipeline.transport import (
    HttpRequest,
    HttpResponse,
    HttpTransport,
    RequestsTransport,
    RequestsTransportResponse,
)
from azure.storage.blob import ExponentialRetry
from requests.structures import CaseInsensitiveDict

import azure_functions_db as afdb
from azure_functions_db.core.batch import Batch
from devkit.evidence import EvidenceLog, capture_engine_events

ENV = os.environ
EVENTS = Path(ENV["AZP_EVENTS"])
# One event per line (one ``write`` on an ``O_APPEND`` file, then fsync), shared with the soak.
emit = EvidenceLog(EVENTS).write


capture_engine_events(emit)


# -- fault injection ------------------------------------------------------------------------------


def _kind(request: HttpRequest) -> str:
    """``commit`` (a conditional checkpoint write), ``lease``, ``checkpoint`` or ``other``."""
    url = request.url
    conditional = "If-Match" in request.headers
    blob_checkpoint = ".checkpoint.json" in url
    table_entity = "PartitionKey=" in url
    if (
        request.method in ("PUT", "PATCH", "MERGE")
        and conditional
        and (blob_checkpoint or table_entity)
    ):
        return "commit"
    if ".lease" in url:
        return "lease"
    if blob_checkpoint or table_entity:
        return "checkpoint"
    return "other"


def _busy(request: HttpRequest) -> RequestsTransportResponse:
    """A 503 ServerBusy, as the storage service answers when it sheds load."""
    raw = requests.Response()
    raw.status_code = 503
    raw.reason = "Service Unavailable"
    raw.url = request.url
    table = "PartitionKey=" in request.url or "/Tables" in request.url
    if table:
        body = b'{"odata.error":{"code":"ServerBusy","message":{"value":"injected"}}}'
        content_type = "application/json"
    else:
        body = (
            b'<?xml version="1.0" encoding="utf-8"?><Error><Code>ServerBusy</Code>'
            b"<Message>injected</Message></Error>"
        )
        content_type = "application/xml"
    raw._content = body  # a canned response, never sent over the wire
    raw.headers = CaseInsensitiveDict(
        {
            "Content-Type": content_type,
            "Content-Length": str(len(body)),
            "x-ms-error-code": "ServerBusy",
            "x-ms-request-id": "injected",
        }
    )
    return RequestsTransportResponse(request, raw)


class FaultyTransport(HttpTransport):  # type: ignore[type-arg]
    """The real transport, with deterministic faults. It sits below the SDK's retry policy (every
    attempt passes through it), like a network or a server that misbehaves."""

    def __init__(self, fault: str) -> None:
        mode, _, n = fault.partition(":")
        if mode not in ("lose_response", "lose_request", "busy") or not n.isdigit():
            raise ValueError(f"bad AZP_FAULT {fault!r}")
        self.mode, self.n = mode, int(n)
        # The timeouts the stores give their own transports (fail fast, retry on top).
        self.inner = RequestsTransport(connection_timeout=5, read_timeout=15)
        self.counts: Counter[str] = Counter()
        self.faulted: HttpRequest | None = None
        self._lock = threading.Lock()

    def send(self, request: HttpRequest, **kwargs: Any) -> HttpResponse:
        kind = _kind(request)
        with self._lock:
            self.counts[kind] += 1
            nth = self.counts[kind]
        if self.mode == "busy" and nth % self.n == 0:
            emit("fault", fault="busy", kind=kind, method=request.method, url=request.url)
            return _busy(request)
        if kind == "commit" and self.mode in ("lose_response", "lose_request"):
            if nth == self.n:
                emit("fault", fault=self.mode, kind=kind, method=request.method, url=request.url)
                if self.mode == "lose_request":
                    raise ServiceRequestError("injected: the request never left")
                response = self.inner.send(request, **kwargs)
                emit("fault_reached_server", status=response.status_code)
                raise ServiceResponseError("injected: the response was lost")
            if nth > self.n:
                response = self.inner.send(request, **kwargs)
                emit("commit_after_fault", nth=nth, status=response.status_code)
                return response
        return self.inner.send(request, **kwargs)

    def open(self) -> None:
        self.inner.open()

    def close(self) -> None:
        self.inner.close()

    def __enter__(self) -> FaultyTransport:
        self.inner.__enter__()
        return self

    def __exit__(self, *args: Any) -> None:
        self.inner.__exit__(*args)


def client_options(store: str) -> dict[str, Any]:
    """Options for the checkpoint client: the faulty transport, and maybe no SDK retries.

    azure-storage-blob ignores azure-core's ``per_retry_policies``/``per_call_policies``
    keywords (it builds its own pipeline), so faults go in through ``transport=``, the one
    public per-attempt hook that both storage SDKs honour.
    """
    options: dict[str, Any] = {}
    fault = ENV.get("AZP_FAULT")
    if fault:
        options["transport"] = FaultyTransport(fault)
    if ENV.get("AZP_SDK_RETRY") == "off":
        if store == "table":
            options["retry_total"] = 0
        else:
            options["retry_policy"] = ExponentialRetry(retry_total=0)
    return options


def make_store() -> Any:
    settings = {"AzureWebJobsStorage": ENV["AZP_CONN"]}
    kind = ENV.get("AZP_STORE", "blob")
    if kind == "table":
        return afdb.TableStateStore(
            settings=settings,
            table=ENV["AZP_TABLE"],
            lease_container=ENV["AZP_CONTAINER"],
            client_options=client_options(kind),
        )
    return afdb.BlobStateStore(
        settings=settings, container=ENV["AZP_CONTAINER"], client_options=client_options(kind)
    )


# -- the poller ---------------------------------------------------------------------------------

db = afdb.PollerBlueprint()
_calls = itertools.count()


def _pk(position: afdb.Position | None) -> list[Any] | None:
    return None if position is None else list(position.pk)


@db.poller(
    name=ENV.get("AZP_POLLER", "orders"),
    schedule=ENV.get("AZP_SCHEDULE", "* * * * * *"),
    source=afdb.SqlSource(url="%AZP_DB%", table="orders", cursor="updated_at", pk="id"),
    state=make_store(),
    batch_size=int(ENV.get("AZP_BATCH", "10")),
    time_budget=float(ENV.get("AZP_BUDGET", "120")),
    lease_duration=15,
    pipeline=ENV.get("AZP_PIPELINE", "1") == "1",
)
def on_orders(batch: Batch) -> None:
    ids = [c.pk for c in batch]
    info = {
        "fence": batch.fence,
        "attempt": batch.attempt,
        "ids": ids,
        "before": _pk(batch.position_before),
        "after": _pk(batch.position_after),
        "call": next(_calls),
    }
    emit("start", **info)
    hold_at = int(ENV.get("AZP_HOLD_AT", "0"))
    if hold_at in ids:
        for i in ids[: ids.index(hold_at)]:
            emit("row", id=i, fence=batch.fence)  # partial side effects of this batch
        Path(ENV["AZP_READY"]).write_text(str(os.getpid()))
        time.sleep(float(ENV["AZP_HOLD"]))
    else:
        time.sleep(float(ENV.get("AZP_SLEEP", "0")))
    emit("end", **info)
