"""OpenTelemetry metrics of pollers (the ``otel`` extra): rows, batches, failures, leases, lag.

Only the OpenTelemetry *API* is used, with the global ``MeterProvider`` unless one is passed in:
whoever configures an SDK (``configure_azure_monitor()`` in ``function_app.py``, or any other
OpenTelemetry setup) decides where the metrics go. This module configures no exporter. Without
an SDK the API's meter records nothing; without the API installed, pollers run with no observer
and nothing from OpenTelemetry is imported.

Pollers get an :class:`OtelMetrics` observer automatically when ``opentelemetry-api`` is
importable, unless the app setting ``AFDB_OTEL_METRICS`` is ``false`` (see
:func:`metrics_observer`). Attributes are the poller name and namespace, plus the run status and
error type on the run instruments: never a URL, a table, a row value or a setting.
The instruments are listed in ``docs/observability.md``.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Mapping
from importlib import metadata
from typing import TYPE_CHECKING

from azure_functions_db.core.batch import Batch
from azure_functions_db.core.clock import Clock, SystemClock
from azure_functions_db.core.logs import log_event
from azure_functions_db.core.observe import (
    LAG_CAP,
    BatchTiming,
    RunObserver,
    RunReport,
    cursor_age,
    run_error_status,
)
from azure_functions_db.core.ports import BacklogSource, Source, ZonedSource
from azure_functions_db.core.position import Position
from azure_functions_db.runtime.settings import AppSettings

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider

logger = logging.getLogger(__name__)

#: Name of the OpenTelemetry meter (the instrumentation scope) of every instrument.
METER_NAME = "azure_functions_db"
#: Most rows the ``afdb.lag.rows_behind`` count reads; a backlog this large reports the cap.
ROWS_BEHIND_CAP = LAG_CAP

POLLER = "afdb.poller"
NAMESPACE = "afdb.namespace"
STATUS = "afdb.status"
ERROR_TYPE = "error.type"  # the OpenTelemetry semantic-convention attribute for failures

# Seconds: a batch or run takes milliseconds to minutes (the default buckets suit milliseconds).
_DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


def metrics_enabled(settings: Mapping[str, str]) -> bool:
    """Whether ``AFDB_OTEL_METRICS`` in ``settings`` leaves the metrics on (the default)."""
    return AppSettings.read(settings).otel_metrics


def metrics_observer(
    source: Source | None, settings: Mapping[str, str], *, clock: Clock | None = None
) -> RunObserver | None:
    """The observer a poller's engine gets: :class:`OtelMetrics`, or ``None``.

    ``None`` when ``AFDB_OTEL_METRICS`` is ``false`` or ``opentelemetry-api`` is not installed
    (then nothing from OpenTelemetry is imported).
    """
    if not metrics_enabled(settings):
        return None
    try:
        return OtelMetrics(source, clock=clock)
    except ImportError:
        log_event(logger, logging.DEBUG, "metrics_unavailable", reason="no opentelemetry-api")
        return None


def run_status(report: RunReport, error: BaseException | None) -> str:
    """The ``afdb.status`` of a run: how it ended.

    ``caught_up``, ``held_by_horizon``, ``budget_spent`` or ``lease_held`` for a run that
    returned; ``poison``, ``handler_failed``, ``lease_lost`` (another owner took the poller:
    lease lost, fence behind, commit rejected) or ``failed`` (anything else, e.g. the database
    or storage) for one that raised.
    """
    return report.status if error is None else run_error_status(error)


class OtelMetrics:
    """A :class:`~azure_functions_db.core.observe.RunObserver` recording OpenTelemetry metrics.

    One per poller engine (``PollerDefinition`` makes it). Per batch it adds to two counters,
    records one duration and sets one gauge; the bounded backlog count runs at most once per
    run, after the run.

    Args:
        source: The poller's source. Its ``cursor_timezone`` (if any) places naive date-time
            cursors for ``afdb.lag.cursor_age``; a
            :class:`~azure_functions_db.core.ports.BacklogSource` also gives
            ``afdb.lag.rows_behind`` after a run that did not catch up.
        meter_provider: Where the instruments live; default the global provider (what
            ``configure_azure_monitor()`` sets). Tests pass a private one.
        clock: Wall-clock time for the cursor age; default the system clock.
        rows_behind_cap: Most rows the backlog count reads.

    Raises:
        ImportError: ``opentelemetry-api`` is not installed (``pip install
            afdb[otel]``).
    """

    def __init__(
        self,
        source: Source | None = None,
        *,
        meter_provider: MeterProvider | None = None,
        clock: Clock | None = None,
        rows_behind_cap: int = ROWS_BEHIND_CAP,
    ) -> None:
        from opentelemetry import metrics

        meter = metrics.get_meter(METER_NAME, _version(), meter_provider=meter_provider)
        self._source = source
        self._clock = clock or SystemClock()
        self._cap = rows_behind_cap
        self._zone = source.cursor_timezone if isinstance(source, ZonedSource) else dt.UTC
        self._attributes: dict[tuple[str, str], dict[str, str]] = {}

        def count(name: str, unit: str, description: str) -> metrics.Counter:
            return meter.create_counter(name, unit=unit, description=description)

        def seconds(name: str, description: str) -> metrics.Histogram:
            return meter.create_histogram(
                name,
                unit="s",
                description=description,
                explicit_bucket_boundaries_advisory=_DURATION_BUCKETS,
            )

        self._rows = count("afdb.rows.delivered", "{row}", "Rows in acknowledged batches.")
        self._batches = count("afdb.batches.committed", "{batch}", "Acknowledged batches.")
        self._failures = count(
            "afdb.handler.failures", "{failure}", "Handler calls that raised (batch not acked)."
        )
        self._quarantined = count(
            "afdb.rows.quarantined",
            "{row}",
            'Rows parked in quarantine records (poison="quarantine"); replay them by command.',
        )
        self._acquired = count("afdb.lease.acquired", "{lease}", "Runs that took the lease.")
        self._lost = count(
            "afdb.lease.lost", "{lease}", "Runs that ended because another owner took over."
        )
        self._rejected = count(
            "afdb.commits.rejected", "{commit}", "Checkpoint commits that lost compare-and-set."
        )
        self._runs = count("afdb.runs", "{run}", "Runs, by afdb.status.")
        self._batch_duration = seconds(
            "afdb.batch.duration", "From the horizon query to the checkpoint commit of a batch."
        )
        self._run_duration = seconds("afdb.run.duration", "One timer run, by afdb.status.")
        self._cursor_age = meter.create_gauge(
            "afdb.lag.cursor_age",
            unit="s",
            description="Now minus the cursor of the last delivered row (date-time cursors).",
        )
        self._rows_behind = meter.create_gauge(
            "afdb.lag.rows_behind",
            unit="{row}",
            description=f"Rows still to read after a run (at most {rows_behind_cap}).",
        )
        self._stalled = meter.create_gauge(
            "afdb.health.stalled",
            unit="1",
            description="1 while no run of the poller has succeeded for stall_intervals "
            "schedule intervals, else 0; set by every run that records its health.",
        )
        self._behind = meter.create_gauge(
            "afdb.health.falling_behind",
            unit="1",
            description="1 while the poller's backlog has grown over stall_intervals runs in "
            "a row, else 0; set by every run that records its health.",
        )
        self._success_age = meter.create_gauge(
            "afdb.health.success_age",
            unit="s",
            description="Seconds since the poller's last successful run, as a run ends.",
        )
        self._held = meter.create_gauge(
            "afdb.horizon.held",
            unit="s",
            description="How long an open transaction has held rows back behind the horizon "
            "(0 when nothing waits).",
        )

    # -- RunObserver ---------------------------------------------------------------------------

    def lease_acquired(self, poller: str, namespace: str, fence: int) -> None:
        """Count a lease taken."""
        self._acquired.add(1, self._attrs(poller, namespace))

    def batch_committed(self, batch: Batch, duration: float) -> None:
        """Count the batch and its rows, record its duration and the cursor age."""
        attrs = self._attrs(batch.poller, batch.namespace)
        self._rows.add(len(batch), attrs)
        self._batches.add(1, attrs)
        self._batch_duration.record(duration, attrs)
        age = self._age(batch.position_after)
        if age is not None:
            self._cursor_age.set(age, attrs)

    def batch_timed(self, batch: Batch, timing: BatchTiming) -> None:
        """Metrics need no step times (the traces do)."""

    def handler_failed(self, batch: Batch, attempt: int) -> None:
        """Count a handler failure."""
        self._failures.add(1, self._attrs(batch.poller, batch.namespace))

    def batch_quarantined(self, batch: Batch, record: str) -> None:
        """Count the rows parked in quarantine."""
        self._quarantined.add(len(batch), self._attrs(batch.poller, batch.namespace))

    def commit_rejected(self, batch: Batch) -> None:
        """Count a rejected commit."""
        self._rejected.add(1, self._attrs(batch.poller, batch.namespace))

    def run_finished(self, report: RunReport, duration: float, error: BaseException | None) -> None:
        """Count the run by status, record its duration, a lost lease and the lag."""
        attrs = self._attrs(report.poller, report.namespace)
        status = run_status(report, error)
        run_attrs = {**attrs, STATUS: status}
        if error is not None:
            run_attrs[ERROR_TYPE] = type(error).__name__
        self._runs.add(1, run_attrs)
        self._run_duration.record(duration, run_attrs)
        if status == "lease_lost":
            self._lost.add(1, attrs)
        if status in ("caught_up", "held_by_horizon"):
            self._held.set(report.held_seconds or 0.0, attrs)
        if report.health is not None:
            self._stalled.set(int(report.health == "stalled"), attrs)
            self._behind.set(int(report.health == "falling_behind"), attrs)
            if report.last_success is not None:
                quiet = (self._clock.now() - report.last_success).total_seconds()
                self._success_age.set(max(0.0, quiet), attrs)
        if status == "caught_up":
            self._rows_behind.set(0, attrs)
        elif status in ("budget_spent", "handler_failed", "poison"):
            # The run stopped short of the end, at the checkpoint's position.
            behind = (
                min(report.lag_rows, self._cap)
                if report.lag_rows is not None
                else self._count_behind(report)
            )
            if behind is not None:
                self._rows_behind.set(behind, attrs)
            if status != "budget_spent":
                # A stuck batch: the checkpoint's age grows on every run until it passes.
                age = self._age(report.position)
                if age is not None:
                    self._cursor_age.set(age, attrs)

    # -- helpers -------------------------------------------------------------------------------

    def _attrs(self, poller: str, namespace: str) -> dict[str, str]:
        attrs = self._attributes.get((poller, namespace))
        if attrs is None:
            attrs = self._attributes[poller, namespace] = {POLLER: poller, NAMESPACE: namespace}
        return attrs

    def _age(self, position: Position | None) -> float | None:
        """Seconds from the leading cursor value of ``position`` to now, for date-time cursors."""
        return cursor_age(position, self._clock.now(), self._zone)

    def _count_behind(self, report: RunReport) -> int | None:
        source = self._source
        if source is None or not isinstance(source, BacklogSource):
            return None
        try:
            return source.rows_after(report.position, source.horizon(), self._cap)
        except Exception as exc:  # noqa: BLE001 - a metric is not worth failing a run over
            log_event(
                logger,
                logging.DEBUG,
                "rows_behind_failed",
                poller=report.poller,
                namespace=report.namespace,
                error=type(exc).__name__,
            )
            return None


def _version() -> str:
    try:
        return metadata.version("afdb")
    except metadata.PackageNotFoundError:  # pragma: no cover - running from a source tree
        return ""
