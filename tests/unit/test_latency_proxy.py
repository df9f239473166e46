"""``devkit/latency_proxy.py``: a loopback TCP proxy that adds latency, not a narrow pipe.

Against a small echo server of the test's own. Times are only checked from below (a round trip
costs at least twice the delay), except where the point is that the delay is *not* multiplied
(concurrent connections, several chunks in flight), with bounds well below what a delay
multiplied would cost; a fast path is judged by the fastest of three trips.
"""

from __future__ import annotations

import random
import socket
import socketserver
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from devkit.latency_proxy import LatencyProxy, proxied_connection_string, proxy_process

DELAY = 0.05


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        sock: socket.socket = self.request
        while data := sock.recv(65536):
            sock.sendall(data)


class _Server(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True
    block_on_close = True


@pytest.fixture
def echo() -> Iterator[tuple[str, int]]:
    """An echo server on a free loopback port: every byte it reads comes back."""
    server = _Server(("127.0.0.1", 0), _Echo)
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    try:
        host, port = server.server_address[:2]
        yield str(host), int(port)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    chunks, got = [], 0
    while got < size:
        chunk = sock.recv(min(65536, size - got))
        if not chunk:
            raise AssertionError(f"connection closed after {got} of {size} bytes")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _round_trip(port: int, message: bytes = b"ping\n") -> float:
    """Seconds from sending ``message`` on a new connection to having all of it back."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        started = time.monotonic()
        sock.sendall(message)
        assert _recv_exactly(sock, len(message)) == message
        return time.monotonic() - started


def _recv_or_reset(sock: socket.socket) -> bytes:
    """What a closed connection gives: ``b""`` (FIN), or nothing either way on a reset."""
    try:
        return sock.recv(100)
    except ConnectionResetError:
        return b""


def _send_and_recv_or_reset(sock: socket.socket) -> bytes:
    """Send a byte and read: a connection reset already (before the send) gives ``b""``."""
    try:
        sock.sendall(b"x")
    except (ConnectionResetError, BrokenPipeError):
        return b""
    return _recv_or_reset(sock)


def _refused(address: tuple[str, int]) -> bool:
    """Whether a new connection to ``address`` is reset: during the handshake (a loaded
    machine may see the reset as early as ``connect``), before the send, or at the read."""
    try:
        with socket.create_connection(address, timeout=5) as sock:
            return _send_and_recv_or_reset(sock) == b""
    except ConnectionResetError:
        return True


def _fastest(port: int, payload: bytes = b"ping\n") -> float:
    """The fastest of three round trips: a fast path stays fast in one of them however loaded
    the machine (a scheduling stall slows one trip, not all three)."""
    return min(_round_trip(port, payload) for _ in range(3))


def _proxy_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("latency-proxy-")]


def test_a_round_trip_costs_at_least_twice_the_delay(echo: tuple[str, int]) -> None:
    with LatencyProxy(*echo, delay=DELAY) as proxy:
        assert proxy.port != 0
        assert proxy.address == ("127.0.0.1", proxy.port)
        for _ in range(3):
            assert _round_trip(proxy.port) >= 2 * DELAY
    assert _fastest(echo[1]) < 2 * DELAY  # the server alone is fast: the delay is the proxy's


def test_a_zero_delay_proxy_forwards_too(echo: tuple[str, int]) -> None:
    with LatencyProxy(*echo, delay=0) as proxy:
        assert _fastest(proxy.port, b"x" * 1000) < 6 * DELAY


def test_a_negative_delay_is_refused() -> None:
    with pytest.raises(ValueError, match="delay"):
        LatencyProxy("127.0.0.1", 1, delay=-0.001)


def test_concurrent_connections_are_each_delayed_once_not_one_after_another(
    echo: tuple[str, int],
) -> None:
    results: list[float] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def client(port: int) -> None:
        try:
            barrier.wait(10)
            results.append(_round_trip(port))
        except BaseException as exc:
            errors.append(exc)

    with LatencyProxy(*echo, delay=DELAY) as proxy:
        threads = [threading.Thread(target=client, args=(proxy.port,)) for _ in range(8)]
        started = time.monotonic()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        elapsed = time.monotonic() - started
        assert proxy.accepted == 8
    assert errors == []
    assert len(results) == 8
    assert min(results) >= 2 * DELAY
    # In parallel: one after another they would take 8 x 2 x delay; half that is the bound.
    assert max(results) < 8 * DELAY, results
    assert elapsed < 8 * DELAY


def test_chunks_in_flight_on_one_connection_are_each_delayed_once(echo: tuple[str, int]) -> None:
    """Twenty small writes 2 ms apart come back about 2 x delay after the last one was sent, not
    20 x 2 x delay: latency, not a narrow pipe."""
    pieces = [f"piece {i:02d};".encode() for i in range(20)]
    with (
        LatencyProxy(*echo, delay=DELAY) as proxy,
        socket.create_connection(proxy.address, timeout=10) as sock,
    ):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        started = time.monotonic()
        for piece in pieces:
            sock.sendall(piece)
            time.sleep(0.002)
        sent = time.monotonic()
        back = _recv_exactly(sock, sum(map(len, pieces)))
        done = time.monotonic()
    assert back == b"".join(pieces)
    assert done - started >= 2 * DELAY
    # About 2 x delay after the last send; each piece delayed in turn would be ~19 x delay.
    assert done - sent < 8 * DELAY


def test_a_large_payload_arrives_whole_and_in_order(echo: tuple[str, int]) -> None:
    payload = random.Random(15).randbytes(1024 * 1024 + 17)
    received: list[bytes] = []
    with (
        LatencyProxy(*echo, delay=0.01) as proxy,
        socket.create_connection(proxy.address, timeout=30) as sock,
    ):
        # Read while writing: the echo sends back as it reads, and buffers are finite.
        reader = threading.Thread(
            target=lambda: received.append(_recv_exactly(sock, len(payload))), daemon=True
        )
        reader.start()
        for offset in range(0, len(payload), 10_000):
            sock.sendall(payload[offset : offset + 10_000])
        reader.join(30)
    assert received == [payload]


def test_the_end_of_a_stream_is_forwarded_after_the_data(echo: tuple[str, int]) -> None:
    """A half-close reaches the server after the delay; its own close comes back to the client."""
    with (
        LatencyProxy(*echo, delay=DELAY) as proxy,
        socket.create_connection(proxy.address, timeout=10) as sock,
    ):
        sock.sendall(b"last words")
        sock.shutdown(socket.SHUT_WR)
        assert _recv_exactly(sock, 10) == b"last words"
        assert sock.recv(10) == b""  # the echo server closed after our FIN
        deadline = time.monotonic() + 10
        while proxy.open_connections and time.monotonic() < deadline:
            time.sleep(0.01)
        assert proxy.open_connections == 0


def test_close_aborts_open_connections_joins_threads_and_frees_the_port(
    echo: tuple[str, int],
) -> None:
    proxy = LatencyProxy(*echo, delay=DELAY).start()
    port = proxy.port
    with socket.create_connection(proxy.address, timeout=10) as sock:
        sock.sendall(b"hello")
        assert _recv_exactly(sock, 5) == b"hello"
        sock.sendall(b"in flight")  # still delayed when the proxy closes
        assert proxy.open_connections == 1
        started = time.monotonic()
        proxy.close()
        assert time.monotonic() - started < 5
        assert proxy.open_connections == 0
        assert _proxy_threads() == []
        assert _recv_or_reset(sock) == b""
    proxy.close()  # idempotent
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()


def test_a_target_that_refuses_closes_the_client_connection(echo: tuple[str, int]) -> None:
    with socket.socket() as spare:
        spare.bind(("127.0.0.1", 0))
        dead_port = spare.getsockname()[1]  # bound, never listening: connections are refused
        with (
            LatencyProxy("127.0.0.1", dead_port, delay=DELAY) as proxy,
            socket.create_connection(proxy.address, timeout=10) as sock,
        ):
            assert _recv_or_reset(sock) == b""
            # The proxy itself still serves: another target through another proxy works.
            with LatencyProxy(*echo, delay=DELAY) as other:
                assert _round_trip(other.port) >= 2 * DELAY
    assert _proxy_threads() == []


KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def test_the_connection_string_helper_puts_each_endpoint_behind_its_own_proxy(
    echo: tuple[str, int],
) -> None:
    host, port = echo
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        other_port = other.getsockname()[1]
        original = (
            f"DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={KEY};"
            f"BlobEndpoint=http://{host}:{port}/devstoreaccount1;"
            f"QueueEndpoint=http://{host}:{other_port}/devstoreaccount1;"
            f"TableEndpoint=http://{host}:{port}/devstoreaccount1;"
        )
        with proxied_connection_string(original, DELAY) as proxied:
            fields = dict(part.split("=", 1) for part in proxied.split(";") if part)
            assert fields["AccountKey"] == KEY
            assert fields["AccountName"] == "devstoreaccount1"
            blob, queue, table = (fields[f"{name}Endpoint"] for name in ("Blob", "Queue", "Table"))
            assert blob == table  # one proxy per distinct host and port
            assert blob != queue
            proxy_port = int(blob.removeprefix("http://127.0.0.1:").split("/")[0])
            assert proxy_port not in (port, other_port)
            assert blob.endswith(f":{proxy_port}/devstoreaccount1")
            assert _round_trip(proxy_port) >= 2 * DELAY
        assert _proxy_threads() == []
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", proxy_port), timeout=5).close()


@pytest.mark.parametrize(
    "connection_string",
    [
        "UseDevelopmentStorage=true",
        f"DefaultEndpointsProtocol=https;AccountName=a;AccountKey={KEY};EndpointSuffix=x.net",
        f"AccountName=a;AccountKey={KEY};BlobEndpoint=https://a.blob.core.windows.net/",
        "BlobEndpoint",
    ],
)
def test_the_connection_string_helper_refuses_what_it_cannot_proxy(connection_string: str) -> None:
    with (
        pytest.raises(ValueError, match=r"Endpoint|Key=Value"),
        proxied_connection_string(connection_string),
    ):
        pass
    assert _proxy_threads() == []


def test_a_proxy_in_a_child_process_delays_too_and_stops_with_the_block(
    echo: tuple[str, int],
) -> None:
    with proxy_process(*echo, delay=DELAY) as port:
        assert port != echo[1]
        assert _proxy_threads() == []  # not in this process
        for _ in range(2):
            assert _round_trip(port, b"x" * 1000) >= 2 * DELAY
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()


def test_the_connection_string_helper_can_put_its_proxies_in_child_processes(
    echo: tuple[str, int],
) -> None:
    host, port = echo
    original = (
        f"DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={KEY};"
        f"BlobEndpoint=http://{host}:{port}/devstoreaccount1;"
    )
    with proxied_connection_string(original, DELAY, in_process=False) as proxied:
        blob = dict(part.split("=", 1) for part in proxied.split(";") if part)["BlobEndpoint"]
        proxy_port = int(blob.removeprefix("http://127.0.0.1:").split("/")[0])
        assert proxy_port != port
        assert _proxy_threads() == []
        assert _round_trip(proxy_port) >= 2 * DELAY
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", proxy_port), timeout=5).close()


def test_a_running_proxys_delay_changes_for_what_it_reads_next(echo: tuple[str, int]) -> None:
    with LatencyProxy(*echo, delay=0) as proxy, socket.create_connection(proxy.address) as sock:
        sock.sendall(b"a")
        assert _recv_exactly(sock, 1) == b"a"
        proxy.delay = DELAY
        started = time.monotonic()
        sock.sendall(b"b")
        assert _recv_exactly(sock, 1) == b"b"
        assert time.monotonic() - started >= 2 * DELAY  # the open connection is slow now too


def test_a_dropping_proxy_lets_the_request_land_and_loses_the_answer(
    echo: tuple[str, int],
) -> None:
    """What a client meets when a connection breaks mid-request: the server got the bytes
    (the echo answered), the client never hears the answer."""
    with LatencyProxy(*echo, delay=0) as proxy:
        proxy.dropping = True
        with socket.create_connection(proxy.address, timeout=5) as sock:
            sock.sendall(b"lost\n")
            assert _recv_or_reset(sock) == b""
        proxy.dropping = False
        assert _fastest(proxy.port) < 6 * DELAY  # and it forwards again


def test_a_refusing_proxy_resets_new_connections_and_keeps_open_ones(
    echo: tuple[str, int],
) -> None:
    with LatencyProxy(*echo, delay=0) as proxy, socket.create_connection(proxy.address) as kept:
        kept.sendall(b"1")
        assert _recv_exactly(kept, 1) == b"1"
        proxy.refusing = True
        assert _refused(proxy.address)
        kept.sendall(b"2")
        assert _recv_exactly(kept, 1) == b"2"  # an open connection goes on
        assert proxy.abort_all() == 1
        assert _recv_or_reset(kept) == b""
        proxy.refusing = False
        assert _fastest(proxy.port) < 6 * DELAY


def test_the_soaks_fault_proxies_obey_the_driver(echo: tuple[str, int], tmp_path: Any) -> None:
    """``soak.proxy``: one child process, several named proxies, switched by commands."""
    from soak.proxy import FaultProxies

    proxies = FaultProxies({"a": echo, "b": echo}, tmp_path / "proxy.log")
    try:
        assert set(proxies.ports) == {"a", "b"}
        assert _fastest(proxies.ports["a"]) < 6 * DELAY
        proxies.send("a", "delay", str(DELAY))
        deadline = time.monotonic() + 5
        while _round_trip(proxies.ports["a"]) < 2 * DELAY:  # the command is asynchronous
            assert time.monotonic() < deadline, "the delay never took effect"
        assert _fastest(proxies.ports["b"]) < 2 * DELAY  # only the named proxy
        proxies.send("b", "refuse", "1")
        deadline = time.monotonic() + 5
        while not _refused(("127.0.0.1", proxies.ports["b"])):
            assert time.monotonic() < deadline, "the refusal never took effect"
    finally:
        proxies.close()
    assert "b: refuse 1" in (tmp_path / "proxy.log").read_text()
