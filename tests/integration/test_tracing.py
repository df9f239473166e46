"""OpenTelemetry traces (``observers/tracing.py``) read back with the SDK's in-memory exporter:
one ``afdb.run`` span per run, an ``afdb.batch`` span per acknowledged batch under it, and under
each batch its ``afdb.handler`` call and its ``afdb.commit``; the pipelined commit of a batch
stays under its own batch; a failed run's span says why; no URL, table or value in any span."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from azure_functions_db.core.batch import Batch
from azure_functions_db.core.clock import SystemClock
from azure_functions_db.core.engine import Engine, PollerConfig
from azure_functions_db.errors import HandlerError
from azure_functions_db.observers.tracing import FanOut, OtelTraces, traces_observer
from azure_functions_db.sources.sqlalchemy import SqlSource
from azure_functions_db.state.memory import MemoryStateStore
from tests.support.sqlite_orders import Orders


@pytest.fixture
def spans() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def engine(tmp_path: Path, handler, provider: TracerProvider, **config) -> Engine:
    orders = Orders(tmp_path / "orders.db")
    orders.insert(range(1, 11))
    orders.close()
    clock = SystemClock()
    source = SqlSource(url=orders.url, table="orders", cursor="updated_at", pk="id")
    return Engine(
        PollerConfig(name="orders", batch_size=4, **config),
        source,
        MemoryStateStore(),
        handler,
        clock,
        owner="t",
        observer=OtelTraces(tracer_provider=provider, clock=clock),
    )


def test_a_run_is_one_trace_of_batches_each_with_its_handler_and_commit(tmp_path, spans):
    provider, exporter = spans

    def handler(batch: Batch) -> None:
        time.sleep(0.01)

    engine(tmp_path, handler, provider).run({})
    found = exporter.get_finished_spans()
    (run,) = [s for s in found if s.name == "afdb.run"]
    batches = [s for s in found if s.name == "afdb.batch"]
    assert [b.attributes["afdb.rows"] for b in batches] == [4, 4, 2]
    assert run.attributes["afdb.status"] == "caught_up"
    assert run.attributes["afdb.rows"] == 10
    assert {s.context.trace_id for s in found} == {run.context.trace_id}  # one trace
    for batch in batches:
        assert batch.parent.span_id == run.context.span_id
        steps = {s.name: s for s in found if s.parent and s.parent.span_id == batch.context.span_id}
        assert set(steps) == {"afdb.handler", "afdb.commit"}
        handler_span, commit = steps["afdb.handler"], steps["afdb.commit"]
        assert batch.start_time <= handler_span.start_time <= handler_span.end_time
        assert handler_span.end_time - handler_span.start_time >= 9_000_000  # the 10 ms sleep
        assert handler_span.end_time <= commit.start_time <= commit.end_time == batch.end_time
        assert run.start_time <= batch.start_time <= batch.end_time <= run.end_time
    for span in found:  # attributes name the poller, never where or what it reads
        assert not any(
            "orders.db" in str(v) or "sqlite" in str(v) for v in span.attributes.values()
        )


def test_a_failed_run_says_why(tmp_path, spans):
    provider, exporter = spans

    def handler(batch: Batch) -> None:
        raise RuntimeError("no")

    with pytest.raises(HandlerError):
        engine(tmp_path, handler, provider).run({})
    (run,) = exporter.get_finished_spans()
    assert run.status.status_code is StatusCode.ERROR
    assert run.attributes["error.type"] == "HandlerError"
    assert run.attributes["afdb.status"] == "handler_failed"


def test_traces_follow_their_setting_and_fan_out_keeps_metrics(tmp_path, spans):
    assert traces_observer({"AFDB_OTEL_TRACES": "false"}) is None
    assert isinstance(traces_observer({}), OtelTraces)
    provider, exporter = spans
    seen: list[int] = []

    class Counting:
        def lease_acquired(self, *a) -> None: ...
        def batch_committed(self, batch, duration) -> None:
            seen.append(len(batch))

        def handler_failed(self, *a) -> None: ...
        def batch_quarantined(self, *a) -> None: ...
        def commit_rejected(self, *a) -> None: ...
        def run_finished(self, *a) -> None: ...

    e = engine(tmp_path, lambda b: None, provider)
    e.observer = FanOut(Counting(), OtelTraces(tracer_provider=provider))  # type: ignore[assignment]
    e.run({})
    assert seen == [4, 4, 2]  # an observer without batch_timed is still told everything else
    assert len([s for s in exporter.get_finished_spans() if s.name == "afdb.batch"]) == 3


def test_a_run_that_finds_the_lease_held_writes_no_trace(tmp_path, spans):
    provider, exporter = spans
    e = engine(tmp_path, lambda b: None, provider)
    assert e.store.acquire(e.config.key, "someone-else", 30) is not None
    assert e.run({}).status == "lease_held"
    assert exporter.get_finished_spans() == ()
