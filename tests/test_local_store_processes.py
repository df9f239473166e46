"""LocalStateStore across real processes (``spawn``): leases, CAS and a holder killed by SIGKILL.

Each worker is a top-level function so the spawned interpreter can import it. Workers write
what they saw to their own file; the test reads the files after every worker has exited.
"""

from __future__ import annotations

import datetime as dt
import itertools
import multiprocessing
import random
import signal
import threading
import time
from multiprocessing.synchronize import Event
from pathlib import Path

import pytest

from azure_functions_db.clock import SystemClock
from azure_functions_db.core.checkpoint import Checkpoint, PollerKey
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


def test_lease_of_a_killed_holder_is_free_after_expiry_not_before_and_fence_goes_up(
    tmp_path: Path,
) -> None:
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
    assert (info.state, info.holder, info.fence) == ("held", "doomed", 1)
    assert info.expires_at is not None
    assert store.acquire(KEY, "parent", 30) is None

    out = tmp_path / "taker.out"
    taker = SPAWN.Process(target=_taker, args=(root, str(out)))
    taker.start()
    _run_all([taker], timeout=60)
    fence, got_at, refused_at = out.read_text(encoding="utf-8").split()
    assert int(fence) == 2
    assert dt.datetime.fromisoformat(got_at) >= info.expires_at
    assert refused_at != "-", "the taker should have been refused while the lease was live"
    assert dt.datetime.fromisoformat(refused_at) < info.expires_at
    assert store.inspect(KEY).holder == "taker"


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
