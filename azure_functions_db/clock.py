"""The real clock. It lives outside :mod:`azure_functions_db.core`, which must not read clocks.

Production code builds one :class:`SystemClock` and hands it to the engine and the local stores;
tests hand them a :class:`~azure_functions_db.core.clock.FakeClock` instead.
"""

from __future__ import annotations

import datetime as dt
import time


class SystemClock:
    """The machine's clocks: UTC wall time, the monotonic clock, and a blocking sleep.

    Implements :class:`~azure_functions_db.core.clock.Clock`.
    """

    def now(self) -> dt.datetime:
        """Current wall-clock time, timezone-aware (UTC)."""
        return dt.datetime.now(dt.UTC)

    def monotonic(self) -> float:
        """Seconds on :func:`time.monotonic`; only differences are meaningful."""
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        """Block the calling thread for ``seconds``."""
        time.sleep(seconds)

    def __repr__(self) -> str:
        return "SystemClock()"
