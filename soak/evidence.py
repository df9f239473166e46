"""Evidence files: one JSON object per line, each appended with one ``write`` and fsynced.

Every process of the soak writes its own file, so a SIGKILL can cost at most the line being
written (the checker skips a torn last line). Times are ``time.monotonic()``, which on Linux is
one clock for every process of the machine, so events of different processes compare.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any


class EvidenceLog:
    """An append-only, fsynced JSON-lines file."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._lock = threading.Lock()

    def write(self, ev: str, **fields: Any) -> float:
        """Append one event stamped with pid and times; return its monotonic time."""
        now = time.monotonic()
        record = {"ev": ev, "pid": os.getpid(), "t": now, "wall": time.time(), **fields}
        line = (json.dumps(record, default=str) + "\n").encode()
        with self._lock:
            os.write(self._fd, line)
            os.fsync(self._fd)
        return now

    def close(self) -> None:
        with self._lock:
            os.close(self._fd)


def read_events(path: Path) -> Iterator[dict[str, Any]]:
    """The events of one file; a torn last line (the writer was killed mid-write) is skipped."""
    with path.open("rb") as handle:
        for raw in handle:
            if not raw.endswith(b"\n"):
                return
            yield json.loads(raw)


def read_all(folder: Path, pattern: str = "*.jsonl") -> list[dict[str, Any]]:
    """The events of every matching file in ``folder``, in time order."""
    events: list[dict[str, Any]] = []
    for path in sorted(folder.glob(pattern)):
        events.extend(read_events(path))
    events.sort(key=lambda e: float(e["t"]))
    return events
