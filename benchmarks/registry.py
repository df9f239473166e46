"""Every benchmark the harness knows, in the order ``python -m benchmarks`` runs them.

To add one (PostgreSQL, Azurite, Spark, ...): write ``benchmarks/<tier>_<what>.py`` exporting
``BENCHMARK = Benchmark(...)``, raise :class:`~benchmarks.harness.BenchmarkSkipped` from its
``run`` when its service is not reachable, and list it here.
"""

from __future__ import annotations

from benchmarks import (
    azurite_requests,
    db_latency,
    delta_sink,
    horizon_window,
    mysql_trigger_replay,
    pg_drain,
    pg_remote,
    pg_shards,
    pg_sinks,
    poll_idle,
    queue_sink,
    spark_backfill,
    sqlite_flatness,
    sqlite_idle,
    sqlite_latency,
    sqlite_memory,
    sqlite_throughput,
)
from benchmarks.harness import Benchmark

ALL: tuple[Benchmark, ...] = (
    sqlite_throughput.BENCHMARK,
    sqlite_flatness.BENCHMARK,
    sqlite_idle.BENCHMARK,
    sqlite_latency.BENCHMARK,
    sqlite_memory.BENCHMARK,
    delta_sink.BENCHMARK,
    azurite_requests.BENCHMARK,
    poll_idle.BENCHMARK,
    queue_sink.BENCHMARK,
    pg_drain.BENCHMARK,
    pg_remote.BENCHMARK,
    pg_sinks.BENCHMARK,
    pg_shards.BENCHMARK,
    db_latency.BENCHMARK,
    horizon_window.BENCHMARK,
    spark_backfill.BENCHMARK,
    mysql_trigger_replay.BENCHMARK,
)


def by_name(names: list[str] | None) -> tuple[Benchmark, ...]:
    """The registered benchmarks named in ``names`` (all of them for ``None``), in run order."""
    if not names:
        return ALL
    known = {b.name for b in ALL}
    unknown = sorted(set(names) - known)
    if unknown:
        raise KeyError(f"unknown benchmark(s) {unknown}; choose from {sorted(known)}")
    return tuple(b for b in ALL if b.name in names)
