"""Azurite behind an Azure-like link: how many messages a second ``QueueSink`` sends, several
in flight (the default) against one at a time, in the same run.

Azure Storage answers a Function's request in 10-30 ms; Azurite on loopback in a few, which
would hide what keeping messages in flight buys. So Azurite sits behind
:class:`devkit.latency_proxy.LatencyProxy` (in a child process, 10 ms each way: a 20 ms round
trip). Each mode sends the same batches of 100 changes (one message each) to its own queue,
``rounds`` times; the figure is messages over the wall time of the ``send`` calls. The ratio is
the default's rate over ``concurrency=1``'s (issue 33: a soak's queue poller, one message at a
time, could not drain a 200,000-row burst).
"""

from __future__ import annotations

import time
import uuid

from azure_functions_db.core.batch import Change
from azure_functions_db.core.position import Position
from azure_functions_db.sinks.queue import DEFAULT_CONCURRENCY, QueueSink
from benchmarks.azurite_requests import azurite
from benchmarks.harness import Benchmark, BenchmarkResult, Context

BATCH = 100
ROUNDS, QUICK_ROUNDS = 8, 3
ONE_WAY = 0.010  # seconds each way: a 20 ms round trip


def _batch(first: int) -> list[Change]:
    return [
        Change({"id": i, "amount": "1.10"}, Position((i,), (i,)), "orders")
        for i in range(first, first + BATCH)
    ]


def run(ctx: Context) -> BenchmarkResult:
    from devkit.latency_proxy import proxied_connection_string

    result = BenchmarkResult(name=BENCHMARK.name, title=BENCHMARK.title, tier=BENCHMARK.tier)
    rounds = QUICK_ROUNDS if ctx.quick else ROUNDS
    with (
        azurite(ctx) as connection_string,
        proxied_connection_string(connection_string, ONE_WAY, in_process=False) as slow,
    ):
        settings = {"AzureWebJobsStorage": slow}
        for key, concurrency in (("one", 1), ("default", DEFAULT_CONCURRENCY)):
            sink = QueueSink(f"bench-{uuid.uuid4().hex[:12]}", concurrency=concurrency)
            sink.send(_batch(0), settings)  # creates the queue; not timed
            ctx.progress(f"concurrency={concurrency}: {rounds} batches of {BATCH}")
            started = time.perf_counter()
            sent = sum(sink.send(_batch(r * BATCH), settings) for r in range(1, rounds + 1))
            seconds = time.perf_counter() - started
            sink.close()
            result.metric(
                f"{key}.rate",
                f"concurrency={concurrency}: messages a second",
                round(sent / seconds, 1),
                "msg/s",
                f"{sent} messages in {seconds:.2f} s, 20 ms round trips",
            )
    result.ratio(
        "default_vs_one",
        f"concurrency={DEFAULT_CONCURRENCY} (default) / concurrency=1",
        "default.rate",
        "one.rate",
        ">= 4",
    )
    result.note(
        f"Azurite behind a latency proxy in a child process ({ONE_WAY * 1000:g} ms each way), "
        f"batches of {BATCH} changes, one message each; both modes in the same run."
    )
    return result


BENCHMARK = Benchmark(
    name="queue_sink",
    title="Azurite behind 20 ms round trips: QueueSink messages a second, in flight vs one by one",
    tier="azurite",
    run=run,
)
