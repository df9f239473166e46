"""Failure-matrix cases E and F with real processes killed by SIGKILL mid-batch.

The poller runs in a child process through the real CLI (``python -m azure_functions_db run
APP --once``) on a SQLite table and the local file state store. The handler writes one line per
row it processes to a side-effect log, fsynced, so the test sees exactly what happened before the
kill.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from azure_functions_db.core.checkpoint import PollerKey
from azure_functions_db.state.local import LocalStateStore
from tests.support.sqlite_orders import Orders

pytestmark = pytest.mark.slow

APP = textwrap.dedent(
    """
    import os, time
    from pathlib import Path
    import azure_functions_db as afdb

    db = afdb.PollerBlueprint()
    LOG = Path(os.environ["CRASH_LOG"])
    READY = Path(os.environ["CRASH_READY"])

    @db.poller(
        name="orders",
        schedule="0 0 * * * *",
        source=afdb.SqlSource(url="%CRASH_DB%", table="orders", cursor="updated_at", pk="id"),
        state=afdb.LocalStateStore(os.environ["CRASH_STATE"]),
        batch_size=5,
        lease_duration=3,
    )
    def on_orders(batch):
        mode = os.environ.get("CRASH_MODE", "")
        ids = [c.pk for c in batch]
        if mode == "before_handler" and 11 in ids:
            READY.write_text("ready")   # fetched, no side effect yet
            time.sleep(600)
        for i in ids:
            with LOG.open("a") as f:
                f.write(f"{os.getpid()} {i}\\n")
                f.flush()
                os.fsync(f.fileno())
            if mode == "mid_handler" and i == 13:
                READY.write_text("ready")   # rows 11-13 have side effects, 14-15 do not
                time.sleep(600)
    """
)


def start(tmp_path: Path, mode: str, db_url: str) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "CRASH_LOG": str(tmp_path / "effects.log"),
        "CRASH_READY": str(tmp_path / "ready"),
        "CRASH_STATE": str(tmp_path / "state"),
        "CRASH_DB": db_url,
        "CRASH_MODE": mode,
    }
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "azure_functions_db",
            "run",
            str(tmp_path / "function_app.py"),
            "--once",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def wait_for(path: Path, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            out = proc.communicate()[0].decode()
            pytest.fail(f"child exited early ({proc.returncode}): {out}")
        if time.monotonic() > deadline:
            proc.kill()
            proc.communicate()
            pytest.fail("child never reached the crash point")
        time.sleep(0.02)


def effects(tmp_path: Path) -> list[tuple[int, int]]:
    log = tmp_path / "effects.log"
    if not log.exists():
        return []
    return [(int(a), int(b)) for a, b in (line.split() for line in log.read_text().splitlines())]


@pytest.mark.parametrize("mode", ["before_handler", "mid_handler"])
def test_cases_e_f_process_killed_mid_batch_loses_nothing(tmp_path, mode):
    orders = Orders(tmp_path / "orders.db")
    orders.insert(range(1, 23), tie_every=4)
    orders.close()
    (tmp_path / "function_app.py").write_text(APP)

    victim = start(tmp_path, mode, orders.url)
    wait_for(tmp_path / "ready", victim)
    victim.send_signal(signal.SIGKILL)
    victim.communicate(timeout=60)
    assert victim.returncode == -signal.SIGKILL
    before_crash = effects(tmp_path)
    # Batches 1-2 (ids 1-10) were handled; batch 3 (ids 11-15) was not acknowledged. With the
    # commit in flight (pipeline=True, the default) batch 2's commit may not have landed when
    # the kill came: then batch 2 is not acknowledged either, and comes again.
    store = LocalStateStore(tmp_path / "state")
    record = store.read(PollerKey("live", "orders"))
    assert record is not None
    assert record.checkpoint.position is not None
    (acknowledged,) = record.checkpoint.position.pk
    assert acknowledged in (5, 10)
    done = [i for _, i in before_crash]
    assert done == list(range(1, 11)) + ([11, 12, 13] if mode == "mid_handler" else [])

    # The dead owner's process is gone: its lease is free at once on this machine, and the next
    # run redelivers the whole unacknowledged batch, then the rest; nothing lost.
    survivor = start(tmp_path, "", orders.url)
    out = survivor.communicate(timeout=60)[0].decode()
    assert survivor.returncode == 0, out
    assert "lease_held" not in out
    after = [i for pid, i in effects(tmp_path) if pid == survivor.pid]
    assert after == list(range(acknowledged + 1, 23))
    assert {i for _, i in effects(tmp_path)} == set(range(1, 23))
    record = store.read(PollerKey("live", "orders"))
    assert record is not None
    assert record.checkpoint.position is not None
    assert record.checkpoint.position.pk == (22,)
    assert record.checkpoint.fence == 2  # victim 1, survivor 2
