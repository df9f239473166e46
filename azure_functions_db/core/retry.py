"""Bounded retries of transient infrastructure errors, with exponential backoff and jitter."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from typing import TypeVar

from azure_functions_db.core.clock import Clock
from azure_functions_db.errors import (
    TransientSinkError,
    TransientSourceError,
    TransientStoreError,
)

T = TypeVar("T")


class Retrying:
    """Calls an operation, retrying the transient errors of sources, stores and sinks
    (:class:`TransientSourceError`, :class:`TransientStoreError`, :class:`TransientSinkError`)
    up to ``retries`` times, ``delay * 2**n`` seconds apart plus up to ``delay`` of jitter.

    Each retry is logged through ``log(level, action, **fields)`` as ``transient_error_retry``;
    the last failure is raised. Any other error is raised at once.
    """

    def __init__(
        self,
        *,
        retries: int,
        delay: float,
        clock: Clock,
        log: Callable[..., None],
        rng: random.Random | None = None,
    ) -> None:
        self.retries = retries
        self.delay = delay
        self.clock = clock
        self.log = log
        self.rng = rng or random.Random()  # noqa: S311 - retry jitter, not crypto

    def __call__(self, call: Callable[..., T], *args: object) -> T:
        for attempt in range(self.retries + 1):
            try:
                return call(*args)
            except (TransientSourceError, TransientStoreError, TransientSinkError) as exc:
                if attempt >= self.retries:
                    raise
                delay = self.delay * 2**attempt + self.rng.uniform(0, self.delay)
                self.log(
                    logging.WARNING,
                    "transient_error_retry",
                    attempt=attempt + 1,
                    delay=f"{delay:.2f}s",
                    error=type(exc).__name__,
                )
                self.clock.sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover
