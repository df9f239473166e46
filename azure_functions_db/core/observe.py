"""What a run reports, and the observer that hears about it while it runs.

The engine calls a :class:`RunObserver` at a few points of a run: when it takes the lease, once per
committed batch, when the handler fails or a commit is rejected, and once when the run ends (every
run, including ``lease_held`` and failed ones). Nothing is measured per row. The default observer
does nothing; :mod:`azure_functions_db.observers.telemetry` turns the calls into OpenTelemetry
metrics. An observer that raises never changes the outcome of a run: :func:`guarded` logs the first
such error and carries on.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass, field
from typing import Literal, Protocol

from azure_functions_db.core.batch import Batch
from azure_functions_db.core.logs import log_event
from azure_functions_db.core.position import Position
from azure_functions_db.errors import (
    CheckpointConflictError,
    HandlerError,
    LeaseLostError,
    PoisonBatchError,
)

logger = logging.getLogger(__name__)

#: The most rows a run counts when it measures the backlog it leaves (``RunReport.lag_rows``).
LAG_CAP = 10_000


def cursor_age(position: Position | None, now: dt.datetime, zone: dt.tzinfo) -> float | None:
    """Seconds from the leading cursor value of ``position`` to ``now``, for date-time cursors
    (a naive one read in ``zone``); ``None`` for other cursors. Never negative (the clocks of
    the database and this machine differ a little)."""
    value = position.cursor[0] if position is not None else None
    if not isinstance(value, dt.datetime):
        return None
    if value.utcoffset() is None:
        value = value.replace(tzinfo=zone)
    return max(0.0, (now - value).total_seconds())


def run_error_status(error: BaseException) -> str:
    """How a run that raised ``error`` ended, as ``afdb.status`` and the health record name it:
    ``poison``, ``handler_failed``, ``lease_lost`` or ``failed``."""
    if isinstance(error, PoisonBatchError):
        return "poison"
    if isinstance(error, HandlerError):
        return "handler_failed"
    if isinstance(error, LeaseLostError | CheckpointConflictError):
        return "lease_lost"
    return "failed"


@dataclass
class RunReport:
    """What one run did.

    ``status`` is ``caught_up``, ``budget_spent``, ``lease_held`` or ``held_by_horizon``: the
    run read everything below the horizon, but rows above it wait for an open transaction
    (``held_by`` says which, ``held_seconds`` for how long) — never shown as caught up.
    ``quarantined`` rows were parked in the quarantine ``records`` (ids) under
    ``poison="quarantine"``. ``lag_rows`` (capped) and ``lag_seconds`` (age of the oldest
    undelivered row, date-time cursors) are the backlog as the run ended (``None``: not known).
    ``health`` is the poller's liveness state after the run (``healthy``, ``stalled``,
    ``falling_behind``; ``None``: not recorded) and ``last_success`` its last successful run.
    """

    poller: str
    namespace: str
    status: Literal["caught_up", "budget_spent", "lease_held", "held_by_horizon"] = "caught_up"
    batches: int = 0
    rows: int = 0
    fence: int | None = None
    holder: str | None = None
    position: Position | None = None
    null_cursor_rows: int | None = None
    warnings: list[str] = field(default_factory=list)
    held_by: str | None = None
    held_seconds: float | None = None
    quarantined: int = 0
    records: list[str] = field(default_factory=list)
    lag_rows: int | None = None
    lag_seconds: float | None = None
    health: str | None = None
    last_success: dt.datetime | None = None
    looped: bool = False  # the run held the poller and read its checkpoint (position is known)


@dataclass(frozen=True)
class BatchTiming:
    """When the steps of one acknowledged batch happened, in the engine clock's ``monotonic``
    seconds: its start (horizon, fetch), the handler call, its hand-off to the commit and the
    commit's landing (on the commit thread, so it may fall after the next batch started)."""

    started: float
    handler_started: float
    handler_ended: float
    committing: float
    landed: float


class RunObserver(Protocol):
    """Hears about one engine's runs. Every method is called on the run's thread and must be
    quick: it runs between batches (or after the run), never per row."""

    def lease_acquired(self, poller: str, namespace: str, fence: int) -> None:
        """A run took the lease; ``fence`` is the fencing token it was granted."""
        ...

    def batch_committed(self, batch: Batch, duration: float) -> None:
        """``batch`` was acknowledged (its checkpoint commit succeeded).

        ``duration`` is seconds from the start of the batch (horizon, fetch) to the commit.
        """
        ...

    def batch_timed(self, batch: Batch, timing: BatchTiming) -> None:
        """When ``batch``'s steps happened (after :meth:`batch_committed`; tracing uses it).
        Added later than the others: an observer without it is simply not told."""
        ...

    def handler_failed(self, batch: Batch, attempt: int) -> None:
        """The handler raised on ``batch``; ``attempt`` counts the failures at this position.

        When it reaches ``max_attempts`` the run then ends with ``PoisonBatchError``.
        """
        ...

    def batch_quarantined(self, batch: Batch, record: str) -> None:
        """``batch`` was parked in quarantine record ``record`` and the checkpoint moved past
        it (``poison="quarantine"``)."""
        ...

    def commit_rejected(self, batch: Batch) -> None:
        """The commit of ``batch`` lost its compare-and-set: another writer holds the poller."""
        ...

    def run_finished(self, report: RunReport, duration: float, error: BaseException | None) -> None:
        """The run ended after ``duration`` seconds.

        ``report`` is what the run returned, or as far as it got when ``error`` (the exception
        that ended it) is set. ``LeaseLostError`` (``FenceBehindCheckpointError`` is one) and
        ``CheckpointConflictError`` mean the lease went to another owner.
        """
        ...


class NullObserver:
    """The default :class:`RunObserver`: hears everything, does nothing."""

    def batch_timed(self, batch: Batch, timing: BatchTiming) -> None:
        """Do nothing."""

    def lease_acquired(self, poller: str, namespace: str, fence: int) -> None:
        """Do nothing."""

    def batch_committed(self, batch: Batch, duration: float) -> None:
        """Do nothing."""

    def handler_failed(self, batch: Batch, attempt: int) -> None:
        """Do nothing."""

    def batch_quarantined(self, batch: Batch, record: str) -> None:
        """Do nothing."""

    def commit_rejected(self, batch: Batch) -> None:
        """Do nothing."""

    def run_finished(self, report: RunReport, duration: float, error: BaseException | None) -> None:
        """Do nothing."""


class _Guarded:
    """Passes every call on to ``inner``; an error there is logged once, never raised.

    Metrics must not decide whether a batch is acknowledged, nor hide the error of a run.
    """

    def __init__(self, inner: RunObserver) -> None:
        self.inner = inner
        self._warned = False

    def lease_acquired(self, poller: str, namespace: str, fence: int) -> None:
        try:
            self.inner.lease_acquired(poller, namespace, fence)
        except Exception as exc:  # noqa: BLE001 - an observer never breaks a run
            self._failed("lease_acquired", exc)

    def batch_committed(self, batch: Batch, duration: float) -> None:
        try:
            self.inner.batch_committed(batch, duration)
        except Exception as exc:  # noqa: BLE001
            self._failed("batch_committed", exc)

    def batch_timed(self, batch: Batch, timing: BatchTiming) -> None:
        """Optional: observers written before it need not have it."""
        timed = getattr(self.inner, "batch_timed", None)
        if timed is None:
            return
        try:
            timed(batch, timing)
        except Exception as exc:  # noqa: BLE001
            self._failed("batch_timed", exc)

    def handler_failed(self, batch: Batch, attempt: int) -> None:
        try:
            self.inner.handler_failed(batch, attempt)
        except Exception as exc:  # noqa: BLE001
            self._failed("handler_failed", exc)

    def batch_quarantined(self, batch: Batch, record: str) -> None:
        try:
            self.inner.batch_quarantined(batch, record)
        except Exception as exc:  # noqa: BLE001
            self._failed("batch_quarantined", exc)

    def commit_rejected(self, batch: Batch) -> None:
        try:
            self.inner.commit_rejected(batch)
        except Exception as exc:  # noqa: BLE001
            self._failed("commit_rejected", exc)

    def run_finished(self, report: RunReport, duration: float, error: BaseException | None) -> None:
        try:
            self.inner.run_finished(report, duration, error)
        except Exception as exc:  # noqa: BLE001
            self._failed("run_finished", exc)

    def _failed(self, event: str, exc: Exception) -> None:
        level = logging.DEBUG if self._warned else logging.WARNING
        self._warned = True
        log_event(
            logger,
            level,
            "observer_failed",
            observer=type(self.inner).__name__,
            event=event,
            error=f"{type(exc).__name__}: {exc}",
        )


def guarded(observer: RunObserver | None) -> _Guarded | NullObserver:
    """``observer`` wrapped so that its errors are logged, not raised; a no-op for ``None``."""
    return NullObserver() if observer is None else _Guarded(observer)
