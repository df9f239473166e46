"""Evidence files for process tests and the soak: one JSON object per line, each appended with
one ``write`` and fsynced; and the library's structured events captured into them.

Every process of the soak writes its own file, so a SIGKILL can cost at most the line being
written (the checker skips a torn last line). Times are ``time.monotonic()``, which on Linux is
one clock for every process of the machine, so events of different processes compare.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
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


class EngineEvents(logging.Handler):
    """Hands the library's structured events (``action=...``: lease acquired with its fence,
    commits, losses) to ``sink("log", action=..., level=..., **fields)``."""

    def __init__(self, sink: Callable[..., object]) -> None:
        super().__init__()
        self._sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        action = getattr(record, "afdb_action", None)
        if action is None:
            return
        fields = {
            k.removeprefix("afdb_"): v
            for k, v in vars(record).items()
            if k.startswith("afdb_") and k != "afdb_action"
        }
        self._sink("log", action=action, level=record.levelname, **fields)


def capture_engine_events(sink: Callable[..., object]) -> None:
    """Send the library's INFO-and-above structured events of this process to ``sink``."""
    library = logging.getLogger("azure_functions_db")
    library.setLevel(logging.INFO)
    library.addHandler(EngineEvents(sink))
