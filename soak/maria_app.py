"""The function app of the MariaDB soak: ``afdb run soak.maria_app --poller NAME``.

Several pollers of one app, one table each, on one MariaDB server (``SOAK_POLLERS``:
``name:table:mode,...``; mode ``low`` is the low-latency mode, ``poll_interval=0.2`` under one
lease for most of a minute, ``timer`` one run a second). Each table has a string primary key
under the server's default case-insensitive collation and a naive ``DATETIME(6)`` cursor that
the writers stamp with ``NOW(6)`` in a zone that is not UTC (``cursor_timezone`` says which).
Each poller writes every batch through a ``SqlSink`` into ``<table>_applied`` on the same server
(whose open transactions hold every poller's horizon: ``innodb_trx`` is server-wide). Each
process runs one poller (``--poller``), so the pollers read ``innodb_trx`` at the same time.

Environment (set by ``soak.maria``): ``AzureWebJobsStorage``, ``SOAK_DB_URL``, ``SOAK_POLLERS``,
``SOAK_ZONE``, ``SOAK_CONTAINER``, ``SOAK_EVENTS`` (this process's folder), ``SOAK_DRAIN``,
``SOAK_SEED``, ``SOAK_CONTROL`` (``1``: no horizon; the soak must report lost rows), ``SOAK_CALM``.
"""

from __future__ import annotations

import os
from typing import Any

import azure_functions_db as afdb
from soak.handling import LEASE_SECONDS, SoakProcess

ENV = os.environ
PROCESS = SoakProcess.start(ENV)

db = afdb.PollerBlueprint()


def _define(name: str, table: str, mode: str) -> None:
    options: dict[str, Any] = {
        "name": name,
        "schedule": "* * * * * *",
        "source": afdb.SqlSource(
            url="%SOAK_DB_URL%",
            table=table,
            cursor="updated_at",
            pk="id",
            cursor_timezone=ENV["SOAK_ZONE"],
            horizon="none" if PROCESS.control else "auto",
        ),
        "state": afdb.BlobStateStore(container=ENV["SOAK_CONTAINER"]),
        "sink": afdb.SqlSink(url="%SOAK_DB_URL%", position_table=f"{table}_positions"),
        "batch_size": 100,
        "time_budget": 20 if mode == "low" else 30,
        "lease_duration": LEASE_SECONDS,
        "max_attempts": 3,
        "poison": "quarantine",
    }
    if mode == "low":
        options["poll_interval"] = 0.2
    handle = PROCESS.handler(f"{table}_applied")

    def on_changes(batch: afdb.Batch, sink: afdb.SqlWriter) -> None:
        handle(batch, sink)

    on_changes.__name__ = f"on_{name}"
    db.poller(**options)(on_changes)


for _spec in ENV["SOAK_POLLERS"].split(","):
    _define(*_spec.split(":"))
