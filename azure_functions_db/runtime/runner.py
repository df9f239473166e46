"""The local runner: a poller's timer schedule without a Functions host (``afdb run``)."""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from croniter import croniter

from azure_functions_db.core.clock import Clock
from azure_functions_db.core.engine import RunReport
from azure_functions_db.core.logs import log_event
from azure_functions_db.errors import AfdbError, UnexpectedRunError
from azure_functions_db.runtime.poller import PollerDefinition, resolve_schedule

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunOutcome:
    """One run of one poller: its report, or the error that ended it."""

    poller: str
    report: RunReport | None
    error: AfdbError | None

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_json(self, store: str) -> dict[str, Any]:
        """One line of ``afdb run --json``: stable keys (never renamed, only added)."""
        r = self.report
        position = r.position if r is not None else None
        return {
            "poller": self.poller,
            "ok": self.ok,
            "status": r.status if r is not None else "failed",
            "batches": r.batches if r is not None else 0,
            "rows": r.rows if r is not None else 0,
            "position": position.to_json() if position is not None else None,
            "position_text": str(position) if position is not None else None,
            "quarantined": r.quarantined if r is not None else 0,
            "records": list(r.records) if r is not None else [],
            "lease_holder": r.holder if r is not None else None,
            "held_by": r.held_by if r is not None else None,
            "held_seconds": r.held_seconds if r is not None else None,
            "error": str(self.error) if self.error is not None else None,
            "store": store,
        }


def run_one(
    definition: PollerDefinition, settings: Mapping[str, str], *, manual: bool = False
) -> RunOutcome:
    """Run a poller once; any error becomes that poller's failed outcome.

    One broken poller must not stop the others of the app: an error that is not the library's
    own (a driver's, a bug) is wrapped in :class:`UnexpectedRunError` and logged with its
    traceback. Only a Ctrl-C or ``sys.exit()`` ends the process.
    """
    try:
        return RunOutcome(definition.name, definition.run_once(settings, manual=manual), None)
    except AfdbError as exc:
        error: AfdbError = exc
        log_event(
            logger,
            logging.ERROR,
            "run_failed",
            poller=definition.name,
            namespace=definition.config.namespace,
            error=str(exc),
        )
    except Exception as exc:
        error = UnexpectedRunError(definition.name, exc, definition.config.namespace)
        error.__cause__ = exc
        logger.exception(
            "action=run_failed poller=%s namespace=%s error=%s",
            definition.name,
            definition.config.namespace,
            type(exc).__name__,
        )
    return RunOutcome(definition.name, None, error)


def run_scheduled(
    pollers: Sequence[PollerDefinition],
    settings: Mapping[str, str],
    clock: Clock,
    *,
    stop: threading.Event,
    on_outcome: Callable[[RunOutcome], None] = lambda _: None,
) -> int:
    """Run pollers on their NCRONTAB schedules until ``stop`` is set; return failed-run count.

    Runs are sequential, so one poller never overlaps itself (as with the Functions timer).
    """
    now = clock.now()
    schedules = {p.name: resolve_schedule(p.schedule, settings, p.name) for p in pollers}
    due: dict[str, dt.datetime] = {}
    for p in pollers:
        due[p.name] = now if p.run_on_startup else _next_fire(schedules[p.name], now)
    failures = 0
    while not stop.is_set():
        name = min(due, key=lambda n: due[n])
        wait = (due[name] - clock.now()).total_seconds()
        if wait > 0:
            if stop.wait(wait):
                break
            continue
        definition = next(p for p in pollers if p.name == name)
        outcome = run_one(definition, settings)
        failures += 0 if outcome.ok else 1
        on_outcome(outcome)
        due[name] = _next_fire(schedules[name], clock.now())
    return failures


def _next_fire(schedule: str, after: dt.datetime) -> dt.datetime:
    it = croniter(schedule, after, second_at_beginning=True)
    fire: dt.datetime = it.get_next(dt.datetime)
    return fire
