"""``FunctionsRetry``: an optional retry policy of the Functions host for a poller's timer.

The poller already retries transient database and storage errors inside a run (bounded, with
backoff and jitter), and a failed batch is delivered again on the next timer tick. A host retry
policy adds re-invocations of a failed run before that tick: each one is a new run that reloads
the checkpoint and delivers the same batch again, raising its attempt counter, so a poison batch
reaches ``max_attempts`` sooner. Most pollers need none; use it when the schedule is long (say,
hourly) and a quick second try is worth it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from azure_functions_db.errors import ConfigurationError

# The Python worker reads these with strptime("%H:%M:%S"): hours 00-23 only.
_INTERVAL = re.compile(r"^([01]\d|2[0-3]):([0-5]\d):([0-5]\d)$")
_STRATEGIES = ("fixed_delay", "exponential_backoff")


@dataclass(frozen=True)
class FunctionsRetry:
    """A host retry policy (``fixed_delay`` or ``exponential_backoff``) for the timer function.

    Attributes:
        strategy: ``"fixed_delay"`` (needs ``delay_interval``) or ``"exponential_backoff"``
            (needs ``minimum_interval`` and ``maximum_interval``).
        max_retry_count: Re-invocations after a failed run, 1 to 10.
        delay_interval: ``"HH:MM:SS"`` between tries, for ``fixed_delay``.
        minimum_interval: ``"HH:MM:SS"``, the first delay of ``exponential_backoff``.
        maximum_interval: ``"HH:MM:SS"``, the longest delay of ``exponential_backoff``.
    """

    strategy: Literal["fixed_delay", "exponential_backoff"]
    max_retry_count: int
    delay_interval: str | None = None
    minimum_interval: str | None = None
    maximum_interval: str | None = None

    def __post_init__(self) -> None:
        if self.strategy not in _STRATEGIES:
            raise ConfigurationError(
                f"`FunctionsRetry(strategy={self.strategy!r})` is not a host retry strategy: use "
                '`"fixed_delay"` or `"exponential_backoff"`.'
            )
        count = self.max_retry_count
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= 10:
            raise ConfigurationError(
                f"`FunctionsRetry(max_retry_count={count!r})` must be a whole number from 1 to "
                "10; leave `retry=` unset for no host retries (the next tick retries anyway)."
            )
        if self.strategy == "fixed_delay":
            self._require("delay_interval", self.delay_interval)
        else:
            self._require("minimum_interval", self.minimum_interval)
            self._require("maximum_interval", self.maximum_interval)
            assert self.minimum_interval is not None
            assert self.maximum_interval is not None
            if _seconds(self.minimum_interval) > _seconds(self.maximum_interval):
                raise ConfigurationError(
                    f"`FunctionsRetry(minimum_interval={self.minimum_interval!r})` is longer than "
                    f"`maximum_interval={self.maximum_interval!r}`: swap them."
                )

    def _require(self, field: str, value: str | None) -> None:
        if value is None or not _INTERVAL.match(value):
            raise ConfigurationError(
                f"`FunctionsRetry({field}={value!r})` must be a duration `HH:MM:SS` under 24 "
                f'hours, e.g. `{field}="00:00:30"`, with strategy `{self.strategy}`.'
            )


def _seconds(interval: str) -> int:
    match = _INTERVAL.match(interval)
    assert match is not None
    hours, minutes, seconds = (int(part) for part in match.groups())
    return hours * 3600 + minutes * 60 + seconds
