"""OpenTelemetry traces of pollers (the ``otel`` extra): one trace per run, a span per batch,
and under each batch its handler call and its checkpoint commit.

Only the OpenTelemetry *API* is used, with the global ``TracerProvider`` unless one is passed in
(``configure_azure_monitor()`` in ``function_app.py`` sends them to Application Insights, where a
run shows as one end-to-end transaction). The spans are written when the run ends, with the
times the engine measured (:class:`~azure_functions_db.core.observe.BatchTiming`): the commit
of a batch lands on the commit thread while the next batch runs, and writing the tree at the end
keeps every span under its own batch without carrying a context across threads. Attributes are
the poller, namespace, fence, attempt and row count: never a URL, a table, a row value or a
setting. ``AFDB_OTEL_TRACES=false`` turns them off.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from importlib import metadata
from typing import TYPE_CHECKING, Any

from azure_functions_db.core.batch import Batch
from azure_functions_db.core.clock import Clock, SystemClock
from azure_functions_db.core.logs import log_event
from azure_functions_db.core.observe import BatchTiming, RunObserver, RunReport, guarded
from azure_functions_db.observers.telemetry import NAMESPACE, POLLER, run_status
from azure_functions_db.runtime.settings import AppSettings

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

logger = logging.getLogger(__name__)

#: Name of the OpenTelemetry tracer (the instrumentation scope) of every span.
TRACER_NAME = "azure_functions_db"


class OtelTraces:
    """A :class:`~azure_functions_db.core.observe.RunObserver` writing one trace per run."""

    def __init__(
        self, *, tracer_provider: TracerProvider | None = None, clock: Clock | None = None
    ) -> None:
        from opentelemetry import trace  # the `otel` extra; ImportError without it

        try:
            version = metadata.version("afdb")
        except metadata.PackageNotFoundError:  # a source tree, not installed
            version = None
        self._trace = trace
        self._tracer = trace.get_tracer(TRACER_NAME, version, tracer_provider=tracer_provider)
        self._clock = clock or SystemClock()
        self._fence: int | None = None
        self._batches: list[tuple[dict[str, Any], BatchTiming]] = []

    def lease_acquired(self, poller: str, namespace: str, fence: int) -> None:
        self._fence, self._batches = fence, []

    def batch_committed(self, batch: Batch, duration: float) -> None:
        """The step times come with :meth:`batch_timed`."""

    def batch_timed(self, batch: Batch, timing: BatchTiming) -> None:
        # Only what the spans need: the batch's rows are not kept past their commit.
        attributes = {
            POLLER: batch.poller,
            NAMESPACE: batch.namespace,
            "afdb.fence": batch.fence,
            "afdb.attempt": batch.attempt,
            "afdb.rows": len(batch),
        }
        self._batches.append((attributes, timing))

    def handler_failed(self, batch: Batch, attempt: int) -> None:
        """The run's span says how the run ended."""

    def batch_quarantined(self, batch: Batch, record: str) -> None:
        """Metrics count it; the run's span carries the status."""

    def commit_rejected(self, batch: Batch) -> None:
        """The run's span carries the error."""

    def run_finished(self, report: RunReport, duration: float, error: BaseException | None) -> None:
        batches, self._batches = self._batches, []
        now_ns, now = time.time_ns(), self._clock.monotonic()

        def at(monotonic: float) -> int:
            return now_ns - int((now - monotonic) * 1e9)

        status = run_status(report, error)
        if status == "lease_held":  # another instance runs the poller: nothing to trace
            return
        attributes: dict[str, Any] = {
            POLLER: report.poller,
            NAMESPACE: report.namespace,
            "afdb.status": status,
            "afdb.batches": report.batches,
            "afdb.rows": report.rows,
        }
        if report.fence is not None:
            attributes["afdb.fence"] = report.fence
        if error is not None:
            attributes["error.type"] = type(error).__name__
        run = self._tracer.start_span(
            "afdb.run", start_time=now_ns - int(duration * 1e9), attributes=attributes
        )
        if error is not None:
            from opentelemetry.trace import Status, StatusCode

            run.set_status(Status(StatusCode.ERROR, type(error).__name__))
        in_run = self._trace.set_span_in_context(run)
        for batch_attributes, t in batches:
            span = self._tracer.start_span(
                "afdb.batch", context=in_run, start_time=at(t.started), attributes=batch_attributes
            )
            in_batch = self._trace.set_span_in_context(span)
            for name, start, end in (
                ("afdb.handler", t.handler_started, t.handler_ended),
                ("afdb.commit", t.committing, t.landed),
            ):
                step = self._tracer.start_span(name, context=in_batch, start_time=at(start))
                step.end(end_time=at(end))
            span.end(end_time=at(t.landed))
        run.end(end_time=now_ns)


class FanOut:
    """Several observers heard as one (metrics and traces), each guarded on its own."""

    def __init__(self, *observers: RunObserver) -> None:
        self._all = [guarded(o) for o in observers]

    def lease_acquired(self, poller: str, namespace: str, fence: int) -> None:
        for o in self._all:
            o.lease_acquired(poller, namespace, fence)

    def batch_committed(self, batch: Batch, duration: float) -> None:
        for o in self._all:
            o.batch_committed(batch, duration)

    def batch_timed(self, batch: Batch, timing: BatchTiming) -> None:
        for o in self._all:
            o.batch_timed(batch, timing)

    def handler_failed(self, batch: Batch, attempt: int) -> None:
        for o in self._all:
            o.handler_failed(batch, attempt)

    def batch_quarantined(self, batch: Batch, record: str) -> None:
        for o in self._all:
            o.batch_quarantined(batch, record)

    def commit_rejected(self, batch: Batch) -> None:
        for o in self._all:
            o.commit_rejected(batch)

    def run_finished(self, report: RunReport, duration: float, error: BaseException | None) -> None:
        for o in self._all:
            o.run_finished(report, duration, error)


def traces_observer(
    settings: Mapping[str, str], *, clock: Clock | None = None
) -> RunObserver | None:
    """:class:`OtelTraces`, or ``None`` when ``AFDB_OTEL_TRACES`` is ``false`` or
    ``opentelemetry-api`` is not installed (then nothing from OpenTelemetry is imported)."""
    if not AppSettings.read(settings).otel_traces:
        return None
    try:
        return OtelTraces(clock=clock)
    except ImportError:
        log_event(logger, logging.DEBUG, "traces_unavailable", reason="no opentelemetry-api")
        return None


def observers(*found: RunObserver | None) -> RunObserver | None:
    """The observers that exist, as one (``None`` when there is none)."""
    present = [o for o in found if o is not None]
    if not present:
        return None
    return present[0] if len(present) == 1 else FanOut(*present)
