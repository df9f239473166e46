"""A loopback TCP proxy that adds network latency, for benchmarks that must look like Azure.

Azure Storage answers a Function's conditional PUT in 10-30 ms; Azurite on loopback answers in
a few milliseconds, so a benchmark on Azurite alone flatters every design that makes one storage
request per batch. :class:`LatencyProxy` sits between a client and a TCP server and delays every
chunk of bytes by ``delay`` seconds in each direction: a chunk read at time *t* is written at
*t + delay*, in order, while later chunks are already being read. That is a link with latency,
not one with little bandwidth: a request/response round trip costs ``2 * delay`` more, however
many chunks or connections are in flight.

:func:`proxied_connection_string` rewrites an Azurite connection string so that its Blob, Queue
and Table endpoints go through one proxy each (Azurite serves each service on its own port).

Per connection, each direction has a reader thread (``recv``, stamp, queue) and a writer thread
(wait for the stamp's deadline, ``sendall``); the end of a stream (FIN) is delayed like data and
forwarded as a half-close. A reset or error on either side aborts the connection (both sockets
shut down, undelivered bytes dropped, as a reset does). Not modelled: connection set-up (the
client's connect completes at once; the upstream one is made on accept, without delay), TLS,
loss and bandwidth limits. Standard library only; the threads are this process's, so a busy
interpreter (the GIL) can add to the delay, never take from it.

The chaos soak switches a running proxy's faults (``soak/proxy.py``): :attr:`LatencyProxy.delay`
applies to every chunk read from then on; with :attr:`LatencyProxy.dropping` set, a connection
is aborted when the server's answer arrives (the request reached the server, its answer is
lost); with :attr:`LatencyProxy.refusing` set, a new connection is reset as soon as it is
accepted; :meth:`LatencyProxy.abort_all` cuts every open connection.
"""

from __future__ import annotations

import collections
import contextlib
import selectors
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from urllib.parse import urlsplit, urlunsplit

HOST = "127.0.0.1"
#: One way, seconds: Azure Storage from a Function is 10-30 ms per request round trip.
DEFAULT_DELAY = 0.010
#: Bytes read per ``recv`` (a chunk, delayed as one).
CHUNK = 65536
#: Bytes a direction may hold before its reader stops reading (back pressure on the sender).
MAX_BUFFERED = 16 * 1024 * 1024
#: Seconds to wait for the upstream server to accept a new connection, and for threads at close.
CONNECT_TIMEOUT = 10.0
JOIN_TIMEOUT = 10.0
#: Connection string keys of the endpoints that :func:`proxied_connection_string` rewrites.
ENDPOINT_KEYS = ("BlobEndpoint", "QueueEndpoint", "TableEndpoint")


def _quietly_shutdown(sock: socket.socket, how: int) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(how)


class _Connection:
    """One proxied connection: client <-> upstream, four threads, delayed both ways."""

    def __init__(self, client: socket.socket, upstream: socket.socket, proxy: LatencyProxy) -> None:
        self.client = client
        self.upstream = upstream
        self._proxy = proxy
        self._cond = threading.Condition()
        self._aborted = threading.Event()
        self._closed = False
        self._running = 4
        # (deadline, data) per direction; b"" is the end of the stream.
        self._queues: dict[str, collections.deque[tuple[float, bytes]]] = {
            "up": collections.deque(),
            "down": collections.deque(),
        }
        self._buffered = {"up": 0, "down": 0}
        ends = {"up": (client, upstream), "down": (upstream, client)}
        self.threads = [
            threading.Thread(
                target=self._run,
                args=(role, direction, *ends[direction]),
                name=f"latency-proxy-{proxy.port}-{direction}-{role}",
                daemon=True,
            )
            for direction in ("up", "down")
            for role in ("reader", "writer")
        ]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def abort(self) -> None:
        """Drop undelivered bytes and wake every thread; the last one closes the sockets."""
        with self._cond:
            self._aborted.set()
            self._cond.notify_all()
            if not self._closed:
                for sock in (self.client, self.upstream):
                    _quietly_shutdown(sock, socket.SHUT_RDWR)

    def join(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _run(self, role: str, direction: str, src: socket.socket, dst: socket.socket) -> None:
        try:
            if role == "reader":
                self._read(direction, src)
            else:
                self._write(direction, dst)
        except OSError:
            self.abort()
        finally:
            self._done()

    def _read(self, direction: str, src: socket.socket) -> None:
        queue = self._queues[direction]
        while True:
            data = src.recv(CHUNK)
            deadline = time.monotonic() + self._proxy.delay
            if data and direction == "down" and self._proxy.dropping:
                self.abort()  # the server answered; the client never hears it
                return
            with self._cond:
                while self._buffered[direction] > MAX_BUFFERED and not self._aborted.is_set():
                    self._cond.wait()
                if self._aborted.is_set():
                    return
                queue.append((deadline, data))
                self._buffered[direction] += len(data)
                self._cond.notify_all()
            if not data:
                return

    def _write(self, direction: str, dst: socket.socket) -> None:
        queue = self._queues[direction]
        while True:
            with self._cond:
                while not queue and not self._aborted.is_set():
                    self._cond.wait()
                if self._aborted.is_set():
                    return
                deadline, data = queue.popleft()
                self._buffered[direction] -= len(data)
                self._cond.notify_all()
            while (remaining := deadline - time.monotonic()) > 0:
                if self._aborted.wait(remaining):
                    return
            if not data:
                dst.shutdown(socket.SHUT_WR)
                return
            dst.sendall(data)

    def _done(self) -> None:
        with self._cond:
            self._running -= 1
            if self._running or self._closed:
                return
            self._closed = True
        self.client.close()
        self.upstream.close()
        self._proxy._forget(self)


class LatencyProxy:
    """A loopback TCP proxy to ``target_host:target_port`` delaying each direction by ``delay`` s.

    Listens on ``127.0.0.1`` on a free port (:attr:`port`, :attr:`address`) once started (as a
    context manager, or :meth:`start`); accepts any number of concurrent connections. Closing
    stops accepting, aborts every open connection and joins every thread.
    """

    def __init__(self, target_host: str, target_port: int, delay: float = DEFAULT_DELAY) -> None:
        if delay < 0:
            raise ValueError(f"delay must be >= 0 seconds, not {delay}")
        self.target = (target_host, target_port)
        self.delay = delay
        self.dropping = False
        self.refusing = False
        self._listener: socket.socket | None = None
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None
        self._acceptor: threading.Thread | None = None
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._connections: set[_Connection] = set()
        self._accepted = 0
        self.port = 0

    @property
    def address(self) -> tuple[str, int]:
        return HOST, self.port

    @property
    def accepted(self) -> int:
        """Connections accepted so far (the SDK should reuse a few keep-alive connections)."""
        return self._accepted

    @property
    def open_connections(self) -> int:
        with self._lock:
            return len(self._connections)

    def start(self) -> LatencyProxy:
        if self._listener is not None:
            return self
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            listener.bind((HOST, 0))
            listener.listen(128)
            listener.setblocking(False)
        except OSError:
            listener.close()
            raise
        self._listener = listener
        self.port = listener.getsockname()[1]
        self._wake_r, self._wake_w = socket.socketpair()
        self._stopping.clear()
        self._acceptor = threading.Thread(
            target=self._accept_loop,
            args=(listener, self._wake_r),
            name=f"latency-proxy-{self.port}-accept",
            daemon=True,
        )
        self._acceptor.start()
        return self

    def close(self) -> None:
        """Stop accepting, abort open connections, join every thread; idempotent."""
        if self._listener is None:
            return
        self._stopping.set()
        if self._wake_w is not None:
            with contextlib.suppress(OSError):
                self._wake_w.send(b"x")
        if self._acceptor is not None:
            self._acceptor.join(JOIN_TIMEOUT)
        for sock in (self._listener, self._wake_r, self._wake_w):
            if sock is not None:
                sock.close()
        self._listener = self._wake_r = self._wake_w = self._acceptor = None
        with self._lock:
            connections = list(self._connections)
        for connection in connections:
            connection.abort()
        deadline = time.monotonic() + JOIN_TIMEOUT
        for connection in connections:
            connection.join(max(0.0, deadline - time.monotonic()))

    def _accept_loop(self, listener: socket.socket, wake: socket.socket) -> None:
        with selectors.DefaultSelector() as selector:
            selector.register(listener, selectors.EVENT_READ)
            selector.register(wake, selectors.EVENT_READ)
            while not self._stopping.is_set():
                for key, _ in selector.select():
                    if key.fileobj is listener and not self._stopping.is_set():
                        self._accept_one(listener)

    def _accept_one(self, listener: socket.socket) -> None:
        try:
            client, _ = listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        if self.refusing:
            # A reset, not a graceful close: what a client meets at a server refusing it.
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            client.close()
            return
        client.setblocking(True)
        try:
            upstream = socket.create_connection(self.target, timeout=CONNECT_TIMEOUT)
        except OSError:
            client.close()  # the client sees the connection closed, as if refused
            return
        upstream.settimeout(None)
        for sock in (client, upstream):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        connection = _Connection(client, upstream, self)
        with self._lock:
            self._connections.add(connection)
            self._accepted += 1
        connection.start()

    def abort_all(self) -> int:
        """Abort every open connection (as a reset does); how many there were."""
        with self._lock:
            connections = list(self._connections)
        for connection in connections:
            connection.abort()
        return len(connections)

    def _forget(self, connection: _Connection) -> None:
        with self._lock:
            self._connections.discard(connection)

    def __enter__(self) -> LatencyProxy:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        host, port = self.target
        return f"LatencyProxy({HOST}:{self.port} -> {host}:{port}, delay={self.delay:g} s)"


def _endpoint_parts(connection_string: str) -> list[tuple[str, str]]:
    parts = []
    for part in connection_string.split(";"):
        if part:
            name, sep, value = part.partition("=")
            if not sep:
                raise ValueError(f"not a `Key=Value` pair in the connection string: {name!r}")
            parts.append((name, value))
    return parts


#: The child of :func:`proxy_process`: prints its proxy's port, forwards until stdin closes.
_CHILD = """
import sys
from devkit.latency_proxy import LatencyProxy
with LatencyProxy(sys.argv[1], int(sys.argv[2]), float(sys.argv[3])) as proxy:
    print(proxy.port, flush=True)
    sys.stdin.read()
"""


@contextlib.contextmanager
def proxy_process(
    target_host: str, target_port: int, delay: float = DEFAULT_DELAY
) -> Iterator[int]:
    """A :class:`LatencyProxy` in a child process; yields its port on ``127.0.0.1``.

    In this process the proxy's threads take turns with the client's on one interpreter lock,
    so a busy client delays its own packets further (by up to the interpreter's switch
    interval, 5 ms, per hop); a remote service's latency does not depend on the client's
    interpreter. The child stops when the ``with`` block ends.
    """
    root = Path(__file__).resolve().parent.parent
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, target_host, str(target_port), str(delay)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=root,
        text=True,
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline().strip()
        if not line.isdigit():
            raise RuntimeError(f"the latency proxy process did not start (it printed {line!r})")
        yield int(line)
    finally:
        if child.stdin is not None:
            child.stdin.close()
        try:
            child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        if child.stdout is not None:
            child.stdout.close()


@contextlib.contextmanager
def proxied_connection_string(
    connection_string: str, delay: float = DEFAULT_DELAY, *, in_process: bool = True
) -> Iterator[str]:
    """``connection_string`` with its Blob/Queue/Table endpoints behind :class:`LatencyProxy`s.

    One proxy per distinct endpoint host and port (Azurite: one per service), all closed on exit.
    The string must name its endpoints explicitly (``devkit.azurite.Azurite.connection_string``
    does; ``UseDevelopmentStorage=true`` does not) with ``http`` URLs: the proxy is plain TCP,
    so the client talks to the loopback address as if it were the server. ``in_process=False``
    runs each proxy in a child process (:func:`proxy_process`).
    """
    parts = _endpoint_parts(connection_string)
    endpoints = [(n, v) for n, v in parts if n in ENDPOINT_KEYS]
    if not endpoints:
        raise ValueError(f"the connection string names none of {', '.join(ENDPOINT_KEYS)}")
    with contextlib.ExitStack() as stack:
        ports: dict[tuple[str, int], int] = {}
        rewritten = []
        for name, value in parts:
            if name not in ENDPOINT_KEYS:
                rewritten.append(f"{name}={value}")
                continue
            url = urlsplit(value)
            if url.scheme != "http" or url.hostname is None or url.port is None:
                raise ValueError(f"{name}={value}: an http://host:port/... URL is needed")
            target = (url.hostname, url.port)
            if target not in ports:
                if in_process:
                    ports[target] = stack.enter_context(LatencyProxy(*target, delay=delay)).port
                else:
                    ports[target] = stack.enter_context(proxy_process(*target, delay))
            proxied = url._replace(netloc=f"{HOST}:{ports[target]}")
            rewritten.append(f"{name}={urlunsplit(proxied)}")
        yield ";".join(rewritten) + ";"
