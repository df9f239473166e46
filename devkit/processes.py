"""Child processes of a test or benchmark: stopping them as a deployment would."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Sequence


def stop(procs: Sequence[subprocess.Popen[bytes]], timeout: float = 30) -> None:
    """SIGTERM every process, then wait for each (killing one that hangs)."""
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
