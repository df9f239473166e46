"""Liveness inside a run: the backlog a run leaves and the poller's health record
(:mod:`azure_functions_db.core.liveness`), a mixin of
:class:`~azure_functions_db.core.engine.Engine`."""

from __future__ import annotations

import datetime as dt
import logging
from typing import TYPE_CHECKING, Any

from azure_functions_db.core.claim import Claim
from azure_functions_db.core.clock import Clock
from azure_functions_db.core.config import PollerConfig
from azure_functions_db.core.engine_poison import describe_error
from azure_functions_db.core.liveness import RunOutcome, next_health, write_health
from azure_functions_db.core.observe import LAG_CAP, RunReport, cursor_age, run_error_status
from azure_functions_db.core.ports import (
    BacklogSource,
    Horizon,
    Source,
    StateStore,
    StoredCheckpoint,
)
from azure_functions_db.core.position import Position
from azure_functions_db.errors import CheckpointConflictError, LeaseLostError

#: No upper bound: every row after a position (backlog counts, not batches).
UNBOUNDED = Horizon(bound=None, method="none")


class HealthRuns:
    """Reports how a run ended: a horizon that holds rows back, the backlog, and the poller's
    health record (with one log line per change of state)."""

    config: PollerConfig
    source: Source
    store: StateStore
    clock: Clock
    _backlog: BacklogSource | None
    #: The health record as this engine last wrote it (its next write goes over it unread).
    _health_known: StoredCheckpoint | None = None
    _zone: dt.tzinfo
    _retrying: Any

    if TYPE_CHECKING:

        def _log(self, level: int, action: str, **fields: object) -> None: ...

        def _settle(self) -> None: ...

    def _caught_up(self, report: RunReport, horizon: Horizon, position: Position | None) -> None:
        """Everything below the horizon is read: ``caught_up``, or ``held_by_horizon`` when
        an open transaction holds the bound and rows above it are waiting (a stall that is
        correct, and reported, never shown as caught up)."""
        report.status = "caught_up"
        hold = horizon.hold
        if hold is None or self._backlog is None:
            return
        if self._retrying(self._backlog.rows_after, position, UNBOUNDED, 1) == 0:
            return
        age = max(0.0, (self.clock.now() - hold.since).total_seconds())
        report.status, report.held_by, report.held_seconds = "held_by_horizon", hold.holder, age
        self._log(
            logging.WARNING if age >= self.config.hold_warning else logging.INFO,
            "horizon_held",
            held_by=hold.holder,
            held_seconds=f"{age:.0f}",
            method=horizon.method,
            note="rows_wait_for_this_open_transaction",
        )

    def _at_the_end(
        self, claim: Claim, report: RunReport, horizon: Horizon, started: float
    ) -> bool:
        """Everything below the horizon is read: settle the commits and end the run (``True``:
        caught up, or held by the horizon), or in low-latency mode wait and read again."""
        self._settle()
        if self._poll_again(started):
            return False
        self._caught_up(report, horizon, claim.checkpoint.position)
        return True

    def _poll_again(self, started: float) -> bool:
        """Low-latency mode (``poll_interval``): caught up with budget left, wait and read
        again under the same lease (no storage request but the heartbeat's), instead of ending
        the run."""
        interval = self.config.poll_interval
        if interval is None:
            return False
        if self.clock.monotonic() + interval - started >= self.config.time_budget:
            return False
        self.clock.sleep(interval)
        return True

    def _record_health(
        self, report: RunReport, error: BaseException | None, *, manual: bool = False
    ) -> None:
        """Measure the backlog the run left and update the poller's health record; log a change
        of state once (``poller_stalled``, ``poller_falling_behind``, ``poller_recovered``).

        Best effort and never the run's outcome: a failure here is logged at DEBUG. Runs that
        found the lease held, or lost it, leave the record to the owner's run."""
        cfg = self.config
        if cfg.chunk is not None or (error is None and report.status == "lease_held"):
            return
        if isinstance(error, LeaseLostError | CheckpointConflictError | KeyboardInterrupt):
            return
        try:
            self._measure_lag(report, error)
            outcome = RunOutcome(
                at=self.clock.now(),
                status=report.status if error is None else run_error_status(error),
                ok=error is None,
                lag_rows=report.lag_rows,
                lag_seconds=report.lag_seconds,
                error=None if error is None else describe_error(error),
                manual=manual,
            )
            written = write_health(
                self.store,
                cfg.key,
                lambda before: next_health(
                    before, outcome, stall_after=cfg.stall_after, stall_runs=cfg.stall_runs
                ),
                known=self._health_known,
            )
        except Exception as exc:  # noqa: BLE001 - liveness must not change the run's outcome
            self._health_known = None
            self._log(logging.DEBUG, "health_not_recorded", error=describe_error(exc))
            return
        self._health_known = None if written is None else written.stored
        if written is None:
            return
        before, after = written.before, written.after
        report.health = after.state
        report.last_success = after.last_success_at
        if (before.state if before else "healthy") == after.state:
            return
        fields: dict[str, object] = {
            "state": after.state,
            "last_success": after.last_success_at,
            "last_status": after.last_status,
            "lag_rows": after.lag_rows,
        }
        if after.state == "stalled":
            self._log(logging.ERROR, "poller_stalled", stall_after=cfg.stall_after, **fields)
        elif after.state == "falling_behind":
            self._log(logging.WARNING, "poller_falling_behind", runs=after.lag_grew, **fields)
        else:
            self._log(
                logging.WARNING, "poller_recovered", was=before.state if before else "-", **fields
            )

    def _measure_lag(self, report: RunReport, error: BaseException | None) -> None:
        """The backlog after the run: none when it caught up; else the rows still after the
        checkpoint (capped) and the age of the oldest of them (date-time cursors)."""
        if error is None and report.status == "caught_up":
            report.lag_rows, report.lag_seconds = 0, 0.0
            return
        if self._backlog is None or not report.looped:
            return  # no position known: the run ended before it read the checkpoint
        try:
            report.lag_rows = self._backlog.rows_after(report.position, UNBOUNDED, LAG_CAP)
            if report.lag_rows:
                first = self.source.fetch(report.position, 1, UNBOUNDED)
                if first:
                    report.lag_seconds = cursor_age(first[0].position, self.clock.now(), self._zone)
        except Exception as exc:  # noqa: BLE001 - a measurement, not worth failing a run over
            self._log(logging.DEBUG, "lag_not_measured", error=describe_error(exc))
