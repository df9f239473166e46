"""What a soak poller's handler does with a batch (shared by the PostgreSQL and MariaDB apps).

It logs the fence and time it started under, refuses every batch holding a planted poison
version (only ``poison="quarantine"`` gets the poller past it), writes the batch through the
sink (one row per delivered version), then sometimes works slowly, freezes past its lease or fails;
once the driver creates the drain flag it does none of that, so the drain is quick. Last it logs
every (id, version) of the batch, with fsync, before it returns.

The driver's ``overrun_handler`` fault leaves a file named after a poller in ``SOAK_OVERRUN``
holding a number of seconds: the next call of that poller, in whichever process, takes the file
(a rename, so only one call does) and sleeps that long (past the poller's ``time_budget`` and
its lease) before it writes anything.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import azure_functions_db as afdb
from devkit.evidence import EvidenceLog, capture_engine_events
from soak.check import poisoned

# Chances per handler call (none while draining); otherwise it works 20-100 ms, like a handler
# that writes somewhere, so a fault often lands while a batch is in flight.
P_FAIL, P_FREEZE, P_SLOW = 0.02, 0.01, 0.08
WORK = (0.02, 0.1)
#: The pollers' lease (Azure's shortest); a frozen handler sleeps past it.
LEASE_SECONDS = 15.0


def position(value: afdb.Position | None) -> list[Any] | None:
    return None if value is None else [*value.cursor, *value.pk]


@dataclass
class SoakHandler:
    """One poller's handler: its evidence log, its drain flag, its sink table."""

    events: EvidenceLog
    drain: Path
    overrun: Path | None
    lease_seconds: float
    calm: bool
    rng: random.Random

    def __call__(
        self, batch: afdb.Batch, write: Callable[[list[dict[str, Any]]], object] | None
    ) -> None:
        # First thing: the checker's (c) judges when the call began. Logged after the sink's
        # insert, a call frozen (SIGSTOP) inside that insert looked as if it began after the
        # freeze, under a fence already superseded (the 30-minute run of 2026-11-26, seed 3939).
        started = self.events.write(
            "start", fence=batch.fence, attempt=batch.attempt, rows=len(batch)
        )
        bad = [[c.pk, c.data["version"]] for c in batch if poisoned(c.pk, c.data["version"])]
        if bad:  # always, draining or not: only quarantine gets the poller past these
            self.events.write("poison", fence=batch.fence, attempt=batch.attempt, rows=bad)
            raise ValueError(f"soak: planted poison version(s) {bad}")
        self._overrun(batch)
        if write is not None:
            write(
                [
                    {
                        "id": c.pk,
                        "version": c.data["version"],
                        "fence": batch.fence,
                        "pid": os.getpid(),
                    }
                    for c in batch
                ],
            )
        if not self.calm and not self.drain.exists():
            draw = self.rng.random()
            if draw < P_FAIL:
                self.events.write("fail", fence=batch.fence)
                raise RuntimeError("soak: injected handler failure")
            if draw < P_FAIL + P_FREEZE:
                self.events.write("freeze", fence=batch.fence, seconds=self.lease_seconds + 3)
                time.sleep(self.lease_seconds + 3)
            elif draw < P_FAIL + P_FREEZE + P_SLOW:
                time.sleep(self.rng.uniform(0.2, 2.5))
            else:
                time.sleep(self.rng.uniform(*WORK))
        self.events.write(
            "deliver",
            fence=batch.fence,
            started=started,
            attempt=batch.attempt,
            before=position(batch.position_before),
            after=position(batch.position_after),
            rows=[[change.pk, change.data["version"]] for change in batch],
        )

    def _overrun(self, batch: afdb.Batch) -> None:
        """Sleep as long as the driver's order for this poller says, if there is one."""
        order = None if self.overrun is None else self.overrun / batch.poller
        if order is None or not order.exists():  # taken while draining too: the fault acts
            return
        taken = order.with_name(f"{batch.poller}.{os.getpid()}")
        try:
            order.rename(taken)  # only one call takes it
            seconds = float(taken.read_text() or 0)
        except (OSError, ValueError):
            return
        self.events.write("overrun", fence=batch.fence, seconds=seconds)
        time.sleep(seconds)


@dataclass(frozen=True)
class SoakProcess:
    """What one poller process of a soak reads from the environment the driver set:
    ``SOAK_EVENTS`` (its evidence folder), ``SOAK_DRAIN`` (flag file), ``SOAK_CONTROL`` (``1``:
    no late-commit horizon), ``SOAK_CALM`` (``1``: a handler that never fails, freezes or
    dawdles), ``SOAK_SEED``."""

    events: EvidenceLog
    drain: Path
    overrun: Path | None
    control: bool
    calm: bool
    rng: random.Random

    @classmethod
    def start(cls, env: Mapping[str, str]) -> SoakProcess:
        """This process's evidence log (the engine's events go there too) and switches."""
        events = EvidenceLog(Path(env["SOAK_EVENTS"]) / f"poller-{os.getpid()}.jsonl")
        capture_engine_events(events.write)
        return cls(
            events=events,
            drain=Path(env["SOAK_DRAIN"]),
            overrun=Path(env["SOAK_OVERRUN"]) if env.get("SOAK_OVERRUN") else None,
            control=env.get("SOAK_CONTROL") == "1",
            calm=env.get("SOAK_CALM") == "1",
            # Per process: each replacement poller draws its own behaviour.
            rng=random.Random(f"{env.get('SOAK_SEED', '0')}:{os.getpid()}"),  # noqa: S311
        )

    def handler(self) -> SoakHandler:
        """The handler of this process's poller."""
        return SoakHandler(
            self.events, self.drain, self.overrun, LEASE_SECONDS, self.calm, self.rng
        )
