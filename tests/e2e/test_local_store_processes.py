"""LocalStateStore across real processes (``spawn``): leases, CAS and a holder killed by SIGKILL.

Each worker is a top-level function so the spawned interpreter can import it. Workers write
what they saw to their own file; the test reads the files after every worker has exited.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from multiprocessing.synchronize import Event
from pathlib import Path

import pytest

from azure_functions_db.core.checkpoint import Checkpoint, PollerKey
from azure_functions_db.core.clock import SystemClock
from azure_functions_db.state import LocalStateStore
from azure_functions_db.testing._harness import try_increment

pytestmark = pytest.mark.slow

KEY = PollerKey(namespace="live", poller="orders")
SPAWN = multiprocessing.get_context("spawn")
START_TIMEOUT = 60.0


def _lease_racer(root: str, out: str, seed: int, seconds: float, go: Event) -> None:
    """Grab the lease as often as possible for ``seconds``; log ``fence start end`` per grant.

    Every tenth grant is abandoned instead of released, so some hand-overs go through expiry.
    """
    store = LocalStateStore(root)
    rng = random.Random(seed)
    grants = 0
    go.wait(START_TIMEOUT)
    deadline = time.monotonic() + seconds
    with open(out, "w", encoding="utf-8") as log:
        while time.monotonic() < deadline:
            grant = store.acquire(KEY, f"racer-{seed}", 0.3)
            if grant is None:
                time.sleep(rng.uniform(0, 0.003))
                continue
            start = time.monotonic()
            time.sleep(rng.uniform(0, 0.005))  # the "work" done under the lease
            end = time.monotonic()
            log.write(f"{grant.fence} {start!r} {end!r}\n")
            grants += 1
            if grants % 10 != 5:
                store.release(grant)


def _incrementer(root: str, increments: int, go: Event) -> None:
    """Add one to ``stats.batches`` ``increments`` times by read + CAS, retrying conflicts."""
    store = LocalStateStore(root)
    done = 0
    go.wait(START_TIMEOUT)
    while done < increments:
        done += try_increment(store, KEY)


def _doomed_holder(root: str, duration: float, ready: Event) -> None:
    """Take the lease, say so, and wait to be killed."""
    grant = LocalStateStore(root).acquire(KEY, "doomed", duration)
    assert grant is not None
    ready.set()
    time.sleep(600)


def _doomed_locker(root: str, ready: Event) -> None:
    """Hold the poller's flock (as in the middle of a write), say so, and wait to be killed."""
    with LocalStateStore(root)._locked(KEY):
        ready.set()
        time.sleep(600)


def _taker(root: str, out: str) -> None:
    """Poll until the lease is ours; log the fence, when we got it, and the last refusal."""
    store = LocalStateStore(root)
    clock = SystemClock()
    refused_at: dt.datetime | None = None
    while True:
        asked_at = clock.now()
        grant = store.acquire(KEY, "taker", 30)
        if grant is not None:
            break
        refused_at = asked_at
        time.sleep(0.01)
    got_at = clock.now()
    last = refused_at.isoformat() if refused_at else "-"
    Path(out).write_text(f"{grant.fence} {got_at.isoformat()} {last}\n", encoding="utf-8")


def _run_all(processes: list[multiprocessing.process.BaseProcess], timeout: float) -> None:
    for process in processes:
        process.join(timeout)
    for process in processes:
        if process.is_alive():
            process.kill()
            process.join()
    assert [p.exitcode for p in processes] == [0] * len(processes)


def test_processes_racing_for_the_lease_never_overlap_and_fences_never_repeat(
    tmp_path: Path,
) -> None:
    root = str(tmp_path / "state")
    go = SPAWN.Event()
    logs = [tmp_path / f"racer-{i}.log" for i in range(4)]
    racers = [
        SPAWN.Process(target=_lease_racer, args=(root, str(log), i, 2.5, go))
        for i, log in enumerate(logs)
    ]
    for racer in racers:
        racer.start()
    go.set()
    _run_all(racers, timeout=120)

    intervals: list[tuple[float, float, int, int]] = []
    for racer_id, log in enumerate(logs):
        for line in log.read_text(encoding="utf-8").splitlines():
            fence, start, end = line.split()
            intervals.append((float(start), float(end), int(fence), racer_id))
    intervals.sort()
    assert len({racer_id for *_, racer_id in intervals}) >= 2, "no race happened"
    for before, after in itertools.pairwise(intervals):
        assert before[1] <= after[0], f"two holders at once: {before} and {after}"
        assert before[2] < after[2], f"fence did not go up with the next holder: {before} {after}"
    # Every acquire raised the fence by exactly one, and every grant was logged.
    assert sorted(fence for _, _, fence, _ in intervals) == list(range(1, len(intervals) + 1))
    assert LocalStateStore(root).inspect(KEY).fence == len(intervals)


def test_processes_doing_cas_increments_lose_no_update(tmp_path: Path) -> None:
    root = str(tmp_path / "state")
    LocalStateStore(root).create(Checkpoint(key=KEY))
    go = SPAWN.Event()
    increments = 40
    workers = [SPAWN.Process(target=_incrementer, args=(root, increments, go)) for _ in range(4)]
    for worker in workers:
        worker.start()
    go.set()
    _run_all(workers, timeout=120)

    stored = LocalStateStore(root).read(KEY)
    assert stored is not None
    assert stored.checkpoint.stats.batches == increments * len(workers)


def test_lease_of_a_killed_holder_is_free_at_once_and_the_fence_goes_up(tmp_path: Path) -> None:
    """The holder's process is gone (SIGKILL): its lease, still live by the clock, is free at
    once on this machine, the fence still rises, and status names the dead process."""
    root = str(tmp_path / "state")
    ready = SPAWN.Event()
    holder = SPAWN.Process(target=_doomed_holder, args=(root, 3.0, ready))
    holder.start()
    assert ready.wait(START_TIMEOUT), "the holder never got the lease"
    holder.kill()
    holder.join()
    assert holder.exitcode == -signal.SIGKILL

    store = LocalStateStore(root)
    info = store.inspect(KEY)
    assert (info.state, info.holder, info.fence) == ("free", None, 1)
    assert info.process == f"pid {holder.pid}, dead"
    grant = store.acquire(KEY, "parent", 30)
    assert grant is not None
    assert grant.fence == 2
    assert store.inspect(KEY).process == f"pid {os.getpid()}, alive"


def test_flock_of_a_process_killed_mid_write_is_dropped_by_the_kernel(tmp_path: Path) -> None:
    root = str(tmp_path / "state")
    ready = SPAWN.Event()
    locker = SPAWN.Process(target=_doomed_locker, args=(root, ready))
    locker.start()
    assert ready.wait(START_TIMEOUT), "the locker never took the lock"

    store = LocalStateStore(root)
    blocked = threading.Thread(target=store.acquire, args=(KEY, "parent", 30), daemon=True)
    blocked.start()
    blocked.join(0.5)
    assert blocked.is_alive(), "acquire should wait for the lock held by the other process"
    locker.kill()
    locker.join()
    blocked.join(30)
    assert not blocked.is_alive()
    assert store.inspect(KEY).holder == "parent"


# -- a dead owner's lease is free at once (issue 11, item 3) ----------------------------------

DEAD_OWNER_APP = textwrap.dedent(
    """
    import os
    import time
    from pathlib import Path
    import azure_functions_db as afdb

    db = afdb.PollerBlueprint()

    @db.poller(name="orders", schedule="0 0 * * * *", batch_size=100, lease_duration=60,
               source=afdb.SqlSource(url=os.environ["DO_DB"], table="orders",
                                     cursor="updated_at", pk="id"))
    def on_orders(batch):
        with open(os.environ["DO_OUT"], "a") as f:
            f.write("".join(f"{c.pk}\\n" for c in batch))
        if os.environ.get("DO_HANG"):
            Path(os.environ["DO_HANG"]).touch()
            time.sleep(600)
    """
)


@pytest.mark.slow
def test_sigkill_inside_the_handler_then_an_immediate_rerun_delivers_the_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from azure_functions_db.cli import EXIT_OK, main
    from tests.support.sqlite_orders import Orders

    orders = Orders(tmp_path / "orders.db")
    orders.insert(range(1, 11))
    orders.close()
    app = tmp_path / "function_app.py"
    app.write_text(DEAD_OWNER_APP)
    out, hang = tmp_path / "delivered.txt", tmp_path / "in-handler"
    env = {
        **os.environ,
        "DO_DB": orders.url,
        "DO_OUT": str(out),
        "DO_HANG": str(hang),
        "AFDB_STATE_DIR": str(tmp_path / "state"),
    }
    command = [sys.executable, "-m", "azure_functions_db", "run", str(app), "--once"]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not hang.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert hang.exists()
    os.kill(proc.pid, signal.SIGKILL)  # killed inside the handler, its 60 s lease still live
    proc.wait(30)
    for name in ("DO_DB", "DO_OUT", "AFDB_STATE_DIR"):
        monkeypatch.setenv(name, env[name])
    monkeypatch.delenv("DO_HANG", raising=False)
    capsys.readouterr()
    assert main(["status", str(app), "--json"]) == EXIT_OK
    (doc,) = json.loads(capsys.readouterr().out)
    assert doc["lease"]["process"] == f"pid {proc.pid}, dead"
    assert doc["lease"]["state"] == "free"
    assert main(["run", str(app), "--once"]) == EXIT_OK
    printed = capsys.readouterr().out
    assert "orders: caught_up, 1 batch(es), 10 row(s)" in printed, printed
    # The batch the killed process was handling was delivered twice: never lost.
    assert sorted(int(x) for x in out.read_text().split()) == sorted([*range(1, 11)] * 2)


def test_a_lease_from_another_pid_namespace_is_never_freed_early(tmp_path: Path) -> None:
    """A container on the same kernel shares the boot id but not the process ids: its owner's
    pid means nothing here, so its lease waits for expiry, as on Azure."""
    store = LocalStateStore(tmp_path)
    assert store.acquire(KEY, "container-a", 30) is not None
    path = store.lease_path(KEY)
    doc = json.loads(path.read_text())
    doc.update(pid=2**22 - 7, pid_ns="pid:[1]")  # a pid that does not run here, another namespace
    path.write_text(json.dumps(doc))
    assert LocalStateStore(tmp_path).acquire(KEY, "container-b", 30) is None
    doc["pid_ns"] = os.readlink("/proc/self/ns/pid")  # the same pid, seen from its namespace:
    path.write_text(json.dumps(doc))  # it does not run, so the lease is free
    assert LocalStateStore(tmp_path).acquire(KEY, "container-b", 30) is not None


def test_a_live_owner_still_holds_its_lease(tmp_path: Path) -> None:
    """Only a dead process frees its lease early: a live one (this process) holds it."""
    store = LocalStateStore(tmp_path)
    key = PollerKey("live", "orders")
    assert store.acquire(key, "me", 30) is not None
    assert LocalStateStore(tmp_path).acquire(key, "other", 30) is None
    info = LocalStateStore(tmp_path).inspect(key)
    assert info.state == "held"
    assert info.holder == "me"
    assert info.process == f"pid {os.getpid()}, alive"
