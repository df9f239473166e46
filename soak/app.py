"""The function app the soak's pollers run: ``afdb run soak/app.py`` (no ``--once``).

One poller, ``soak``, on the writers' table (cursor ``updated_at``, stamped ``now()`` at the
start of each writer transaction, so late commits land below rows already delivered), with its
lease and checkpoint on Azurite, a 1-second schedule and a 15-second lease (Azure's shortest).
It writes every batch through a ``SqlSink`` into ``<table>_applied`` in the server's
``postgres`` database (one row per delivered version), which the checker judges for
exactly-once. With ``SOAK_SINK=0`` (``python -m soak --no-sink``) it has no sink, so the next
batch's handler runs while the previous batch's commit is in flight (the pipelined engine), and
``SOAK_CHECKPOINT_EVERY`` coalesces its commits.
The handler is :class:`soak.handling.SoakHandler`.

Environment (set by ``soak.run``): ``AzureWebJobsStorage``, ``SOAK_DB_URL``, ``SOAK_SINK_URL``,
``SOAK_TABLE``,
``SOAK_CONTAINER``, ``SOAK_EVENTS`` (folder), ``SOAK_DRAIN`` (flag file), ``SOAK_SEED``,
``SOAK_CONTROL`` (``1``: no late-commit horizon; the soak must then report lost rows),
``SOAK_POLL_INTERVAL`` (``--low-latency``: the low-latency mode, ``poll_interval`` seconds),
``SOAK_CALM`` (``1``: the handler never fails, freezes or dawdles, but for the planted poison
versions, which it always refuses: ``poison="quarantine"`` parks them).
"""

from __future__ import annotations

import os
from typing import Any

import azure_functions_db as afdb
from soak.handling import LEASE_SECONDS, SoakProcess

ENV = os.environ
PROCESS = SoakProcess.start(ENV)
APPLIED = f"{ENV['SOAK_TABLE']}_applied"

db = afdb.PollerBlueprint()

SINK = ENV.get("SOAK_SINK", "1") == "1"
CHECKPOINT_EVERY = int(ENV["SOAK_CHECKPOINT_EVERY"]) if ENV.get("SOAK_CHECKPOINT_EVERY") else None
SOURCE = afdb.SqlSource(
    url="%SOAK_DB_URL%",
    table=ENV["SOAK_TABLE"],
    cursor="updated_at",
    pk="id",
    horizon="none" if PROCESS.control else "auto",
)
OPTIONS: dict[str, Any] = {
    "name": "soak",
    "schedule": "* * * * * *",
    "source": SOURCE,
    "state": afdb.BlobStateStore(container=ENV["SOAK_CONTAINER"]),
    "batch_size": 100,
    "time_budget": 30,
    "lease_duration": LEASE_SECONDS,
    "max_attempts": 3,
    "poison": "quarantine",
}
if ENV.get("SOAK_POLL_INTERVAL"):  # python -m soak --low-latency
    OPTIONS["poll_interval"] = float(ENV["SOAK_POLL_INTERVAL"])
_handle = PROCESS.handler(APPLIED)


if SINK:

    @db.poller(
        **OPTIONS,
        sink=afdb.SqlSink(url="%SOAK_SINK_URL%", position_table=f"{ENV['SOAK_TABLE']}_positions"),
    )
    def on_changes(batch: afdb.Batch, sink: afdb.SqlWriter) -> None:
        _handle(batch, sink)

else:  # the pipelined engine: the next handler runs while the commit is in flight

    @db.poller(**OPTIONS, checkpoint_every=CHECKPOINT_EVERY)
    def on_changes_pipelined(batch: afdb.Batch) -> None:
        _handle(batch, None)
