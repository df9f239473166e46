"""The function app the soak's pollers run: ``afdb run soak.app --poller NAME`` (no ``--once``).

Its pollers come from ``SOAK_POLLERS`` (``name:table:mode:sink:every:shards,...``; ``every`` > 1:
the poller reads only the rows whose id is a multiple of it, by ``where=``; ``shards`` > 1: it is
split over that many shards, each a poller), and each process runs one of them (``--poller``),
with its lease and checkpoint on Azurite, a 15-second lease (Azure's shortest),
``poison="quarantine"``, and a mode: ``timer`` (one run a second) or ``low`` (the
low-latency mode, ``poll_interval=0.2``, one run polling for most of its budget). The sink:

``sql``    a ``SqlSink`` into ``<table>_applied`` (exactly-once; on PostgreSQL in the server's
           ``postgres`` database, so an open sink transaction never holds the source's horizon)
``delta``  a ``DeltaSink`` into the Delta table ``SOAK_DELTA/<table>`` (exactly-once)
``queue``  a ``QueueSink`` onto the Azurite queue ``SOAK_QUEUE`` (at-least-once; 10 messages in
           flight, the most it allows)
``none``   no sink: the next batch's handler runs while the previous batch's commit is in
           flight (the pipelined engine); ``SOAK_CHECKPOINT_EVERY`` coalesces its commits

The handler is :class:`soak.handling.SoakHandler`. The cursor is ``updated_at``, stamped at the
start of each writer transaction (late commits land below rows already delivered); on MariaDB a
naive ``DATETIME(6)`` in the zone ``SOAK_ZONE``.

Environment (set by ``soak.run``): ``AzureWebJobsStorage`` and ``SOAK_DB_URL`` /
``SOAK_SINK_URL`` (through the soak's fault proxies), ``SOAK_POLLERS``, ``SOAK_CONTAINER``,
``SOAK_DELTA``, ``SOAK_QUEUE``, ``SOAK_ZONE``, ``SOAK_EVENTS`` (this process's folder),
``SOAK_DRAIN`` (flag file), ``SOAK_OVERRUN`` (folder of the driver's overrun orders),
``SOAK_SEED``, ``SOAK_CONTROL`` (``1``: no late-commit horizon; the soak must then report lost
rows), ``SOAK_CALM`` (``1``: the handler never fails, freezes or dawdles, but for the planted
poison versions), ``SOAK_POLL_INTERVAL``, ``SOAK_CHECKPOINT_EVERY``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import azure_functions_db as afdb
from soak.handling import LEASE_SECONDS, SoakProcess

ENV = os.environ
PROCESS = SoakProcess.start(ENV)

db = afdb.PollerBlueprint()


def _delta_schema() -> Any:
    import pyarrow as pa

    return pa.schema(
        [("id", pa.int64()), ("version", pa.int64()), ("fence", pa.int64()), ("pid", pa.int64())]
    )


def _define(name: str, table: str, mode: str, sink: str, every: str, shards: str) -> None:  # noqa: PLR0917 - one spec's fields
    options: dict[str, Any] = {
        "name": name,
        "schedule": "* * * * * *",
        "source": afdb.SqlSource(
            url="%SOAK_DB_URL%",
            table=table,
            cursor="updated_at",
            pk="id",
            horizon="none" if PROCESS.control else "auto",
            cursor_timezone=ENV.get("SOAK_ZONE") or None,
            where=None if every == "1" else f"id % {int(every)} = 0",
        ),
        "state": afdb.BlobStateStore(container=ENV["SOAK_CONTAINER"]),
        "batch_size": 100,
        "time_budget": 20 if mode == "low" else 30,
        "lease_duration": LEASE_SECONDS,
        "max_attempts": 3,
        "poison": "quarantine",
    }
    if int(shards) > 1:
        options["shards"] = int(shards)
    if mode == "low":
        options["poll_interval"] = float(ENV.get("SOAK_POLL_INTERVAL") or 0.2)
    handle = PROCESS.handler()
    on_changes: Callable[..., None]
    if sink == "sql":
        options["sink"] = afdb.SqlSink(url="%SOAK_SINK_URL%", position_table=f"{table}_positions")
        applied = f"{table}_applied"

        def on_sql(batch: afdb.Batch, sink: afdb.SqlWriter) -> None:
            handle(batch, lambda rows: sink.insert(applied, rows))

        on_changes = on_sql
    elif sink == "delta":
        options["sink"] = afdb.DeltaSink(f"%SOAK_DELTA%/{table}", schema=_delta_schema())

        def on_delta(batch: afdb.Batch, sink: afdb.DeltaWriter) -> None:
            handle(batch, sink.insert)

        on_changes = on_delta
    elif sink == "queue":
        out = afdb.QueueSink(ENV["SOAK_QUEUE"], concurrency=10)

        def on_queue(batch: afdb.Batch) -> None:
            handle(batch, lambda _rows: out.send(batch))

        on_changes = on_queue
    else:  # the pipelined engine: the next handler runs while the commit is in flight
        if ENV.get("SOAK_CHECKPOINT_EVERY"):
            options["checkpoint_every"] = int(ENV["SOAK_CHECKPOINT_EVERY"])

        def on_pipelined(batch: afdb.Batch) -> None:
            handle(batch, None)

        on_changes = on_pipelined
    on_changes.__name__ = f"on_{name}"
    db.poller(**options)(on_changes)


for _spec in ENV["SOAK_POLLERS"].split(","):
    _define(*_spec.split(":"))
