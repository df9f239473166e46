"""The function app the soak's pollers run: ``afdb run soak/app.py`` (no ``--once``).

One poller, ``soak``, on the writers' table (cursor ``updated_at``, stamped ``now()`` at the
start of each writer transaction, so late commits land below rows already delivered), with its
lease and checkpoint on Azurite, a 1-second schedule and a 15-second lease (Azure's shortest).
It writes every batch through a ``SqlSink`` into ``<table>_applied`` in the server's
``postgres`` database (one row per delivered version), which the checker judges for
exactly-once. With ``SOAK_SINK=0`` (``python -m soak --no-sink``) it has no sink, so the next
batch's handler runs while the previous batch's commit is in flight (the pipelined engine), and
``SOAK_CHECKPOINT_EVERY`` coalesces its commits.
The handler logs the fence and time it started under, then every (id, version) of the batch, with
fsync, before it returns; sometimes it works slowly, freezes past its lease or fails. Once the
driver creates the drain flag it does none of that, so the drain is quick.

Environment (set by ``soak.run``): ``AzureWebJobsStorage``, ``SOAK_DB_URL``, ``SOAK_SINK_URL``,
``SOAK_TABLE``,
``SOAK_CONTAINER``, ``SOAK_EVENTS`` (folder), ``SOAK_DRAIN`` (flag file), ``SOAK_SEED``,
``SOAK_CONTROL`` (``1``: no late-commit horizon; the soak must then report lost rows),
``SOAK_CALM`` (``1``: the handler never fails, freezes or dawdles, but for the planted poison
versions, which it always refuses: ``poison="quarantine"`` parks them).
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path
from typing import Any

import azure_functions_db as afdb
from devkit.evidence import EvidenceLog, capture_engine_events
from soak.check import poisoned

ENV = os.environ
LEASE_SECONDS = 15.0
EVENTS = EvidenceLog(Path(ENV["SOAK_EVENTS"]) / f"poller-{os.getpid()}.jsonl")
DRAIN = Path(ENV["SOAK_DRAIN"])
CONTROL = ENV.get("SOAK_CONTROL") == "1"
CALM = ENV.get("SOAK_CALM") == "1"
# Per process: each replacement poller draws its own behaviour.
_rng = random.Random(f"{ENV.get('SOAK_SEED', '0')}:{os.getpid()}")  # noqa: S311 - not crypto

# Chances per handler call (none while draining); otherwise it works 20-100 ms, like a handler
# that writes somewhere, so a fault often lands while a batch is in flight.
P_FAIL, P_FREEZE, P_SLOW = 0.02, 0.01, 0.08
WORK = (0.02, 0.1)


capture_engine_events(EVENTS.write)
APPLIED = f"{ENV['SOAK_TABLE']}_applied"

db = afdb.PollerBlueprint()


def _position(position: afdb.Position | None) -> list[Any] | None:
    return None if position is None else [*position.cursor, *position.pk]


SINK = ENV.get("SOAK_SINK", "1") == "1"
CHECKPOINT_EVERY = int(ENV["SOAK_CHECKPOINT_EVERY"]) if ENV.get("SOAK_CHECKPOINT_EVERY") else None
SOURCE = afdb.SqlSource(
    url="%SOAK_DB_URL%",
    table=ENV["SOAK_TABLE"],
    cursor="updated_at",
    pk="id",
    horizon="none" if CONTROL else "auto",
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


def _handle(batch: afdb.Batch, sink: afdb.SqlWriter | None) -> None:
    bad = [[c.pk, c.data["version"]] for c in batch if poisoned(c.pk, c.data["version"])]
    if bad:  # always, draining or not: only quarantine gets the poller past these
        EVENTS.write("poison", fence=batch.fence, attempt=batch.attempt, rows=bad)
        raise ValueError(f"soak: planted poison version(s) {bad}")
    if sink is not None:
        sink.insert(
            APPLIED,
            [
                {"id": c.pk, "version": c.data["version"], "fence": batch.fence, "pid": os.getpid()}
                for c in batch
            ],
        )
    started = EVENTS.write("start", fence=batch.fence, attempt=batch.attempt, rows=len(batch))
    if not CALM and not DRAIN.exists():
        draw = _rng.random()
        if draw < P_FAIL:
            EVENTS.write("fail", fence=batch.fence)
            raise RuntimeError("soak: injected handler failure")
        if draw < P_FAIL + P_FREEZE:
            EVENTS.write("freeze", fence=batch.fence, seconds=LEASE_SECONDS + 3)
            time.sleep(LEASE_SECONDS + 3)
        elif draw < P_FAIL + P_FREEZE + P_SLOW:
            time.sleep(_rng.uniform(0.2, 2.5))
        else:
            time.sleep(_rng.uniform(*WORK))
    EVENTS.write(
        "deliver",
        fence=batch.fence,
        started=started,
        attempt=batch.attempt,
        before=_position(batch.position_before),
        after=_position(batch.position_after),
        rows=[[change.pk, change.data["version"]] for change in batch],
    )


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
