"""QueueSink on Azurite: one message per change, `event_id` as the dedup key, at-least-once
(a failed batch is sent again with the same ids), messages a Functions queue trigger decodes."""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
import signal
import threading
import time
import uuid
from decimal import Decimal
from typing import Any

import pytest
from azure.storage.queue import QueueClient

from azure_functions_db.core.batch import Batch, Change
from azure_functions_db.core.engine import Engine, PollerConfig
from azure_functions_db.core.position import Position
from azure_functions_db.errors import ConfigurationError, HandlerError
from azure_functions_db.sinks.queue import QueueSink
from azure_functions_db.sources.memory import MemorySource
from azure_functions_db.state.memory import MemoryStateStore
from azure_functions_db.testing.clock import FakeClock
from devkit.azurite import Azurite


@pytest.fixture
def queue_name() -> str:
    return f"q-{uuid.uuid4().hex[:12]}"


def received(azurite: Azurite, name: str) -> list[dict[str, Any]]:
    client = QueueClient.from_connection_string(azurite.connection_string, name)
    bodies = []
    with client:
        while batch := list(client.receive_messages(messages_per_page=32, max_messages=32)):
            for message in batch:
                bodies.append(json.loads(base64.b64decode(message.content)))
                client.delete_message(message)
    return bodies


def test_a_poller_sends_one_message_per_change_and_a_failed_batch_again(
    azurite: Azurite, queue_name: str
) -> None:
    settings = {"AzureWebJobsStorage": azurite.connection_string}
    rows = [
        {
            "id": i,
            "v": i,
            "at": dt.datetime(2026, 1, 1, 12, i, tzinfo=dt.UTC),
            "amount": Decimal("1.10"),
            "blob": b"\x00\xff",
        }
        for i in range(1, 6)
    ]
    source = MemorySource("orders", "v", "id", rows)
    sink = QueueSink(queue_name)
    failures = [True]

    def forward(batch: Batch) -> None:
        sink.send(batch, settings)
        if failures:
            failures.pop()
            raise RuntimeError("after sending: the checkpoint commit will not happen")

    store = MemoryStateStore(FakeClock())
    engine = Engine(
        PollerConfig(name="orders", batch_size=3), source, store, forward, FakeClock(), owner="a"
    )
    with pytest.raises(HandlerError):
        engine.run(settings)
    engine.run(settings)
    bodies = received(azurite, queue_name)
    ids = sorted(b["data"]["id"] for b in bodies)
    assert ids == [1, 1, 2, 2, 3, 3, 4, 5]  # the failed batch again: at-least-once
    by_row: dict[int, set[str]] = {}
    for body in bodies:
        by_row.setdefault(body["data"]["id"], set()).add(body["event_id"])
    assert all(len(events) == 1 for events in by_row.values())  # the dedup key is stable
    first = next(b for b in bodies if b["data"]["id"] == 1)
    assert first["poller"] == "orders"
    assert first["op"] == "upsert"
    assert first["data"]["at"] == "2026-01-01T12:01:00+00:00"
    assert first["data"]["amount"] == "1.10"
    assert base64.b64decode(first["data"]["blob"]) == b"\x00\xff"
    assert Position.from_json(first["position"]) == Position((1,), (1,))
    sink.close()


def test_unencoded_messages_are_plain_json(azurite: Azurite, queue_name: str) -> None:
    settings = {"AzureWebJobsStorage": azurite.connection_string}
    source = MemorySource("orders", "v", "id", [{"id": 1, "v": 1}])
    sink = QueueSink(queue_name, message_encoding="none")

    def forward(batch: Batch) -> None:
        sink.send(batch, settings)

    store = MemoryStateStore(FakeClock())
    Engine(PollerConfig(name="orders"), source, store, forward, FakeClock(), owner="a").run({})
    client = QueueClient.from_connection_string(azurite.connection_string, queue_name)
    with client:
        message = next(iter(client.receive_messages()))
    assert json.loads(message.content)["data"] == {"id": 1, "v": 1}
    sink.close()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"queue": "Orders"}, "`queue='Orders'` is not a valid queue name"),
        ({"queue": "a--b"}, "single hyphens"),
        ({"queue": "orders", "message_encoding": "utf8"}, "`message_encoding='utf8'`"),
        ({"queue": "orders", "concurrency": 0}, "`concurrency=0` must be a whole number from 1"),
        ({"queue": "orders", "concurrency": 11}, "from 1 to 10"),
        ({"queue": "orders", "concurrency": 2.5}, "`concurrency=2.5`"),
    ],
)
def test_bad_options_name_the_value_and_the_fix(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        QueueSink(**options)
    assert message in str(caught.value)


def test_a_missing_connection_setting_names_it() -> None:
    with pytest.raises(ConfigurationError, match="`AzureWebJobsStorage` is not defined"):
        QueueSink("orders-out").send([], {})


def test_senders_racing_to_create_the_queue_all_send(azurite: Azurite, queue_name: str) -> None:
    import threading

    settings = {"AzureWebJobsStorage": azurite.connection_string}
    changes = [Change({"id": i}, Position((i,), (i,)), "orders") for i in range(8)]
    errors: list[BaseException] = []
    start = threading.Barrier(6)

    def send(part: int) -> None:
        sink = QueueSink(queue_name)
        try:
            start.wait(10)
            sink.send(changes[part::6], settings)
        except BaseException as exc:
            errors.append(exc)
        finally:
            sink.close()

    threads = [threading.Thread(target=send, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert sorted(b["data"]["id"] for b in received(azurite, queue_name)) == list(range(8))


def _changes(count: int) -> list[Change]:
    return [Change({"id": i}, Position((i,), (i,)), "orders") for i in range(count)]


def test_a_batch_is_sent_several_messages_at_a_time_and_one_by_one_in_order(
    azurite: Azurite, queue_name: str
) -> None:
    """Against Azurite behind a proxy that adds 20 ms a round trip: the default keeps several
    messages in flight at once (every one arrives, once); ``concurrency=1`` sends the batch's
    messages one by one, in order."""
    import threading

    from devkit.latency_proxy import proxied_connection_string

    with proxied_connection_string(azurite.connection_string, 0.01) as slow:
        settings = {"AzureWebJobsStorage": slow}
        sink = QueueSink(queue_name)
        in_flight, most = 0, 0
        lock = threading.Lock()
        send_one = sink._send_one

        def counting(client: Any, body: str) -> None:
            nonlocal in_flight, most
            with lock:
                in_flight += 1
                most = max(most, in_flight)
            try:
                send_one(client, body)
            finally:
                with lock:
                    in_flight -= 1

        sink._send_one = counting  # type: ignore[method-assign]
        assert sink.send(_changes(40), settings) == 40
        sink.close()
        assert most > 1
        assert sorted(b["data"]["id"] for b in received(azurite, queue_name)) == list(range(40))
        ordered = QueueSink(queue_name, concurrency=1)
        assert ordered.send(_changes(10), settings) == 10
        ordered.close()
    assert [b["data"]["id"] for b in received(azurite, queue_name)] == list(range(10))


class _FailingClient:
    """A queue client whose third message fails (a storage error with HTTP 503)."""

    def __init__(self) -> None:
        import threading

        self.sent: list[str] = []
        self.calls = 0
        self._lock = threading.Lock()

    def send_message(self, body: str) -> None:
        from azure.core.exceptions import HttpResponseError

        with self._lock:
            self.calls += 1
            call = self.calls
        if call == 3:
            error = HttpResponseError(message="server busy")
            error.status_code = 503
            raise error
        with self._lock:
            self.sent.append(body)

    def close(self) -> None:
        pass


@pytest.mark.parametrize("concurrency", [1, 2])
def test_a_failed_message_fails_the_batch_and_stops_the_rest(concurrency: int) -> None:
    from azure_functions_db.errors import TransientSinkError

    sink = QueueSink("orders-out", concurrency=concurrency)
    client = _FailingClient()
    sink._client = client
    with pytest.raises(TransientSinkError, match="HTTP 503"):
        sink.send(_changes(50), {})
    # The messages already in flight finish; none is started after the failure.
    assert 2 <= len(client.sent) <= 2 + concurrency
    sink.close()


def test_a_value_json_cannot_hold_fails_the_batch_before_anything_is_sent() -> None:
    sink = QueueSink("orders-out")
    client = _FailingClient()
    sink._client = client
    bad = [*_changes(3), Change({"id": object()}, Position((9,), (9,)), "orders")]
    with pytest.raises(TypeError, match="cannot go into a queue message"):
        sink.send(bad, {})
    assert client.calls == 0


@pytest.mark.skipif(not hasattr(os, "fork"), reason="POSIX fork")
def test_a_process_forked_after_sending_sends_too(azurite: Azurite, queue_name: str) -> None:
    """The parent's pool threads and connections do not survive a fork: the child's first
    send starts afresh instead of waiting for ever on a pool with no threads."""
    settings = {"AzureWebJobsStorage": azurite.connection_string}
    sink = QueueSink(queue_name)
    assert sink.send(_changes(10), settings) == 10
    child = os.fork()
    if child == 0:  # pragma: no cover - the child's exit code is the result
        try:
            os._exit(0 if sink.send(_changes(10), settings) == 10 else 1)
        except BaseException:
            os._exit(2)
    deadline = time.monotonic() + 60
    while (done := os.waitpid(child, os.WNOHANG))[0] == 0:
        if time.monotonic() > deadline:
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)
            pytest.fail("the forked child's send never returned")
        time.sleep(0.05)
    assert os.waitstatus_to_exitcode(done[1]) == 0
    sink.close()
    assert len(received(azurite, queue_name)) == 20


class _SlowClient(_FailingClient):
    def send_message(self, body: str) -> None:
        time.sleep(0.05)
        with self._lock:
            self.calls += 1
            self.sent.append(body)


def test_ctrl_c_while_a_batch_is_sent_starts_no_more_messages() -> None:
    sink = QueueSink("orders-out")
    client = _SlowClient()
    sink._client = client
    main = threading.get_ident()
    fired: list[float] = []

    def interrupt() -> None:
        fired.append(time.monotonic())
        signal.pthread_kill(main, signal.SIGINT)

    threading.Timer(0.1, interrupt).start()
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        sink.send(_changes(400), {})
    raised = time.monotonic()
    time.sleep(0.3)  # what was in flight ends; nothing new starts
    stopped = len(client.sent)
    time.sleep(0.3)
    assert len(client.sent) == stopped
    # 8 in flight every 50 ms until Ctrl-C reached the send (however late a loaded machine
    # fired it), those in flight then, and a margin: far from the 400 a send going on reaches.
    assert fired
    assert stopped <= 8 * ((raised - started) / 0.05 + 3)
    assert stopped < 400
    sink.close()


def test_an_answer_cut_mid_way_is_a_transient_error() -> None:
    from azure.core.exceptions import IncompleteReadError

    from azure_functions_db.errors import TransientSinkError

    class Cut(_FailingClient):
        def send_message(self, body: str) -> None:
            raise IncompleteReadError(message="connection closed mid-body")

    sink = QueueSink("orders-out", concurrency=1)
    sink._client = Cut()
    with pytest.raises(TransientSinkError, match="IncompleteReadError"):
        sink.send(_changes(1), {})
