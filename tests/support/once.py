"""Start ``python -m azure_functions_db run APP --once`` in a child process (the e2e tests)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
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
