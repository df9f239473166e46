"""Time: the :class:`Clock` protocol and the machine's clock, :class:`SystemClock`.

The engine, the lease keeper and the local stores read time only through a ``Clock`` they are
given; production code hands them one ``SystemClock``, tests a
:class:`~azure_functions_db.testing.FakeClock`. ``SystemClock`` is the one place in ``core`` that
reads the machine's clocks (``tests/unit/test_architecture.py`` checks that).
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Protocol


class Clock(Protocol):
    """The only source of time for the engine and the local stores."""

    def now(self) -> dt.datetime:
        """Current wall-clock time, timezone-aware (UTC)."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes backwards; only differences are meaningful."""
        ...

    def sleep(self, seconds: float) -> None:
        """Block for ``seconds`` (a fake clock advances instead)."""
        ...


class SystemClock:
    """The machine's clocks: UTC wall time, the monotonic clock, and a blocking sleep.

    Implements :class:`Clock`. The only code of the package that reads the machine's clocks.
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
