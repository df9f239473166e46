"""The soak's fault proxies: the pollers reach Azurite's Blob and Queue services and the
database through loopback proxies (:class:`devkit.latency_proxy.LatencyProxy`) in one child
process, whose faults the driver switches while it runs.

``python -m soak.proxy NAME=HOST:PORT ...`` prints one line ``NAME=PORT ...`` and then reads
commands, one per line, until standard input closes:

``NAME delay SECONDS``   add SECONDS each way to every chunk (0: none)
``NAME drop 1|0``        abort each connection when the server's answer arrives (the request
                         landed, its answer is lost), or stop doing so
``NAME refuse 1|0``      reset every new connection at once, or accept them again
``NAME abort``           cut every open connection

The driver (:class:`FaultProxies`) talks to it; its own reads (the monitor, the queue's
consumer, the drain) go to the services directly, so a fault never hides the evidence.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from devkit.latency_proxy import LatencyProxy

REPO = Path(__file__).resolve().parent.parent


class FaultProxies:
    """The child process of the soak's proxies, one per named ``(host, port)``."""

    def __init__(self, targets: Mapping[str, tuple[str, int]], log: Path) -> None:
        log.parent.mkdir(parents=True, exist_ok=True)
        self._output = log.open("ab")
        self.child = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "soak.proxy",
                *(f"{name}={host}:{port}" for name, (host, port) in targets.items()),
            ],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._output,
            text=True,
        )
        assert self.child.stdout is not None
        line = self.child.stdout.readline().split()
        self.ports = {name: int(port) for name, _, port in (p.partition("=") for p in line)}
        if set(self.ports) != set(targets):
            self.close()
            raise RuntimeError(f"the soak's fault proxies did not start (they printed {line!r})")

    def send(self, name: str, command: str, value: str = "") -> None:
        assert self.child.stdin is not None
        self.child.stdin.write(f"{name} {command} {value}".strip() + "\n")
        self.child.stdin.flush()

    def close(self) -> None:
        if self.child.stdin is not None:
            with contextlib.suppress(OSError):
                self.child.stdin.close()
        try:
            self.child.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.child.kill()
            self.child.wait()
        if self.child.stdout is not None:
            self.child.stdout.close()
        self._output.close()


def serve(specs: Sequence[str]) -> int:
    """The child: start the proxies, print their ports, obey commands until stdin closes."""
    proxies: dict[str, LatencyProxy] = {}
    with contextlib.ExitStack() as stack:
        for spec in specs:
            name, _, target = spec.partition("=")
            host, _, port = target.rpartition(":")
            proxies[name] = stack.enter_context(LatencyProxy(host, int(port), delay=0.0))
        print(" ".join(f"{name}={p.port}" for name, p in proxies.items()), flush=True)
        for line in sys.stdin:
            parts = line.split()
            proxy = proxies.get(parts[0]) if len(parts) >= 2 else None
            if proxy is None:
                continue
            command, value = parts[1], parts[2] if len(parts) > 2 else ""
            if command == "delay":
                proxy.delay = max(0.0, float(value or 0))
            elif command == "drop":
                proxy.dropping = value == "1"
            elif command == "refuse":
                proxy.refusing = value == "1"
            elif command == "abort":
                value = str(proxy.abort_all())
            print(f"proxy {parts[0]}: {command} {value}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(serve(sys.argv[1:]))
