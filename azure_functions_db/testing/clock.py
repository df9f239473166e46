"""FakeClock: a :class:`~azure_functions_db.core.clock.Clock` that moves only when told to."""

from __future__ import annotations

import datetime as dt
import threading


class FakeClock:
    """A clock that moves only when told to. ``sleep`` advances it instead of blocking.

    Thread-safe, so a heartbeat thread and a test can share one.
    """

    def __init__(self, start: dt.datetime | None = None) -> None:
        self._now = start or dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
        if self._now.tzinfo is None:
            raise ValueError("FakeClock needs a timezone-aware start time")
        self._mono = 1000.0
        self._lock = threading.Lock()

    def now(self) -> dt.datetime:
        with self._lock:
            return self._now

    def monotonic(self) -> float:
        with self._lock:
            return self._mono

    def sleep(self, seconds: float) -> None:
        self.advance(seconds)

    def advance(self, seconds: float) -> None:
        """Move both clocks forward by ``seconds``."""
        if seconds < 0:
            raise ValueError("a clock never moves backwards")
        with self._lock:
            self._now += dt.timedelta(seconds=seconds)
            self._mono += seconds
