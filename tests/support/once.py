"""Start ``python -m azure_functions_db run APP --once`` in a child process (the e2e tests)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path


def start_once(
    app: Path, env: Mapping[str, str], log: Path | None = None
) -> subprocess.Popen[bytes]:
    """One run of ``app`` with ``env`` added to this process's environment; its output goes to
    a pipe (read it with :func:`finish`), or is appended to ``log``."""
    command = [sys.executable, "-m", "azure_functions_db", "run", str(app), "--once"]
    environment = {**os.environ, **env}
    if log is None:
        return subprocess.Popen(
            command, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
    with log.open("ab") as output:  # the child keeps its own descriptor
        return subprocess.Popen(command, env=environment, stdout=output, stderr=subprocess.STDOUT)


def finish(proc: subprocess.Popen[bytes], timeout: float = 120) -> tuple[int, str]:
    """Wait for a piped child; its exit code and output."""
    out = proc.communicate(timeout=timeout)[0].decode()
    return proc.returncode, out


def frozen_past_its_lease(
    stale: subprocess.Popen[bytes],
    folder: Path,
    take_over: Callable[[], subprocess.Popen[bytes]],
    *,
    lease: float = 2.0,
) -> tuple[tuple[int, str], tuple[int, str]]:
    """The stale-owner scenario: wait until ``stale``'s handler has written (it creates
    ``folder/ready``), SIGSTOP it past its ``lease``, run ``take_over()`` to the end, then let
    the handler return (``folder/go``) and SIGCONT it. The new owner's and the stale one's exit
    codes and outputs. The stale process is never left running (its open transaction would
    block the test's cleanup)."""
    deadline = time.monotonic() + 60
    try:
        while not (folder / "ready").exists():
            if stale.poll() is not None:
                raise AssertionError(f"the first owner exited early: {finish(stale)[1]}")
            if time.monotonic() > deadline:
                raise AssertionError("the first owner never reached its handler")
            time.sleep(0.02)
        stale.send_signal(signal.SIGSTOP)
        time.sleep(lease + 0.5)  # no heartbeat from a stopped process: its lease runs out
        new = finish(take_over())
        (folder / "go").write_text("go")
        stale.send_signal(signal.SIGCONT)
        return new, finish(stale)
    finally:
        if stale.poll() is None:
            stale.send_signal(signal.SIGCONT)
            stale.kill()
            stale.communicate()
