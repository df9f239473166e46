"""Run the poller of ``tests/support/azure_proc_app.py`` in a child process, with a tunable engine.

Usage: ``python tests/support/azure_proc_child.py MODE`` with MODE

- ``once``: one run;
- ``until-run``: a run every ``AZP_POLL`` seconds until one is not ``lease_held``;
- ``loop``: runs until the file ``AZP_STOP`` exists; after a run that held the lease wait
  ``AZP_BACKOFF`` seconds (let the other instance have a go), after ``lease_held`` ``AZP_POLL``.

The engine is the package's own, built as ``PollerDefinition`` builds it, except for what the
test injects: ``AZP_CLOCK=frozen`` (wall time moves, ``monotonic()`` never does: the process
believes no time passes), ``AZP_CLOCK=skew:SECONDS`` (wall clock ahead), ``AZP_HEARTBEAT``
(heartbeat interval in seconds). Every run ends with a ``run`` event: status, fence, rows, or the
error's type and message. Exit status 0 if the last run succeeded, 1 if it failed.
"""

from __future__ import annotations

import datetime as dt
import os
import sys
import time
from pathlib import Path

# The app next to this file, and the repository (for `devkit`), as `python -m` would see them.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import azure_proc_app as app

from azure_functions_db.core.clock import Clock, SystemClock
from azure_functions_db.core.engine import Engine
from azure_functions_db.errors import AfdbError
from azure_functions_db.runtime.poller import default_owner


class FrozenMonotonicClock(SystemClock):
    """Real wall time and sleeps; a monotonic clock that never advances."""

    def __init__(self) -> None:
        self._frozen = time.monotonic()

    def monotonic(self) -> float:
        return self._frozen


class SkewedClock(SystemClock):
    """A wall clock ``seconds`` ahead of the machine's."""

    def __init__(self, seconds: float) -> None:
        self._skew = dt.timedelta(seconds=seconds)

    def now(self) -> dt.datetime:
        return super().now() + self._skew


def make_clock(spec: str) -> Clock:
    if spec == "frozen":
        return FrozenMonotonicClock()
    if spec.startswith("skew:"):
        return SkewedClock(float(spec.removeprefix("skew:")))
    return SystemClock()


def run(engine: Engine, env: dict[str, str]) -> tuple[bool, str]:
    """One run; emits its ``run`` event; returns (succeeded, status)."""
    try:
        report = engine.run(env)
    except AfdbError as exc:
        app.emit("run", status="failed", error=type(exc).__name__, message=str(exc))
        return False, "failed"
    app.emit("run", status=report.status, fence=report.fence, rows=report.rows)
    return True, report.status


def main(mode: str) -> int:
    env = dict(os.environ)
    clock = make_clock(env.get("AZP_CLOCK", ""))
    app.emit("child_start", mode=mode, now=clock.now().isoformat(), sys_now=SystemClock().now())
    (definition,) = app.db.pollers.values()
    heartbeat = env.get("AZP_HEARTBEAT")
    engine = Engine(
        definition.config,
        definition.source,
        definition.store(env),
        definition.handler,
        clock,
        owner=default_owner(),
        heartbeat_interval=float(heartbeat) if heartbeat else None,
    )
    poll = float(env.get("AZP_POLL", "0.25"))
    if mode == "once":
        ok, _ = run(engine, env)
        return 0 if ok else 1
    if mode == "until-run":
        while True:
            ok, status = run(engine, env)
            if status != "lease_held":
                return 0 if ok else 1
            time.sleep(poll)
    if mode == "loop":
        stop = Path(env["AZP_STOP"])
        backoff = float(env.get("AZP_BACKOFF", "1.2"))
        failures = 0
        while not stop.exists():
            ok, status = run(engine, env)
            failures += 0 if ok else 1
            time.sleep(poll if status == "lease_held" else backoff)
        return 1 if failures else 0
    raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
