"""Imported at start-up (first on ``PYTHONPATH``) by the soak's ``skew_poller`` processes only,
which run under libfaketime with ``FAKETIME_DONT_FAKE_MONOTONIC=1``.

libfaketime 0.9.10 (Debian 12) fails ``clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME)`` with
``EINVAL`` when it does not fake the monotonic clock, and CPython's ``time.sleep`` is that call,
so every sleep raised ``OSError: [Errno 22]`` and the poller died at start-up. Timed waits on a
lock work there (``pthread_cond_timedwait``): ``time.sleep`` becomes one. The monotonic clock
must stay real: the soak's evidence orders every process's events by it.
"""

from __future__ import annotations

import threading
import time
from typing import SupportsIndex

_never = threading.Event()


def _sleep(seconds: float | SupportsIndex) -> None:
    length = float(seconds)
    if length < 0:
        raise ValueError("sleep length must be non-negative")
    _never.wait(length)


time.sleep = _sleep
