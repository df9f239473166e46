"""Shared harness of the state-store contract suites: hooks, fixtures and small helpers.

Subclasses (through :class:`~azure_functions_db.testing.StateStoreContract`) provide
:meth:`StoreHarness.make_store` and :meth:`StoreHarness.corrupt`; every movement of time goes
through :meth:`StoreHarness.advance`, so a store on a real clock plugs in by sleeping there.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import ClassVar, TypeVar

import pytest

from azure_functions_db.core.checkpoint import (
    Checkpoint,
    CheckpointStats,
    PollerKey,
    SourceDescription,
)
from azure_functions_db.core.ports import LeaseGrant, StateStore, StoredCheckpoint
from azure_functions_db.core.position import Position
from azure_functions_db.errors import CheckpointConflictError
from azure_functions_db.testing.clock import FakeClock

GARBAGE = b'\x00\xff{"schema": 1, "poller": '
"""Bytes that are not a checkpoint record: the default payload of ``corrupt``."""

T = TypeVar("T")
SOURCE = SourceDescription(table="orders", cursor=("updated_at",), pk=("id",))


def checkpoint_for(key: PollerKey, n: int = 0, *, fence: int = 0) -> Checkpoint:
    """A small record of ``key`` at position ``(n, n)`` (no position when ``n`` is 0)."""
    position = Position(cursor=(n,), pk=(n,)) if n else None
    return Checkpoint(key=key, position=position, fence=fence, source=SOURCE)


def try_increment(store: StateStore, key: PollerKey) -> bool:
    """One read + compare-and-set adding 1 to ``stats.batches``; False if another writer won.

    The unit of work of the lost-update tests (threads in the contract suite, processes in the
    local store's tests): the final count must equal the number of ``True`` results.
    """
    stored = store.read(key)
    if stored is None:
        raise AssertionError(f"no record for {key}")
    batches = stored.checkpoint.stats.batches + 1
    bumped = dataclasses.replace(
        stored.checkpoint, stats=CheckpointStats(batches=batches, rows=batches)
    )
    try:
        store.replace(bumped, stored.etag)
    except CheckpointConflictError:
        return False
    return True


def race(count: int, work: Callable[[int], T]) -> list[T]:
    """Run ``work(i)`` in ``count`` threads released at the same instant; re-raise any error."""
    barrier = threading.Barrier(count)

    def start(i: int) -> T:
        barrier.wait()
        return work(i)

    with ThreadPoolExecutor(max_workers=count) as pool:
        return list(pool.map(start, range(count)))


class StoreHarness:
    """Hooks and fixtures every state-store suite shares; it holds no tests itself."""

    controllable_clock: ClassVar[bool] = True
    """Whether :meth:`advance` moves the store's time exactly (False: it sleeps for real)."""
    lease_duration: ClassVar[float] = 30.0
    """Seconds for the leases the tests take (Azure accepts 15 to 60)."""
    clock_slack: ClassVar[float] = 0.0
    """Extra seconds to wait past an expiry when the clock is not controllable."""
    racers: ClassVar[int] = 8
    """Threads in the race tests."""

    # -- hooks for subclasses -----------------------------------------------------------------

    def make_store(self, clock: FakeClock, tmp_path: Path) -> StateStore:
        """A fresh store whose lease expiry follows ``clock`` (when controllable)."""
        raise NotImplementedError

    def corrupt(self, store: StateStore, key: PollerKey, data: bytes = GARBAGE) -> None:
        """Store ``data`` as the record of ``key`` unconditionally, as an out-of-band writer."""
        raise NotImplementedError

    def advance(self, clock: FakeClock, seconds: float) -> None:
        """Let ``seconds`` pass for the store (and ``clock``)."""
        clock.advance(seconds)

    # -- fixtures ------------------------------------------------------------------------------

    @pytest.fixture
    def clock(self) -> FakeClock:
        # A start with microseconds catches stores that round expiry times.
        return FakeClock(dt.datetime(2026, 1, 1, 12, 0, 0, 123457, tzinfo=dt.UTC))

    @pytest.fixture
    def store(self, clock: FakeClock, tmp_path: Path) -> StateStore:
        return self.make_store(clock, tmp_path)

    @pytest.fixture
    def key(self) -> PollerKey:
        # Unique per test, so stores that share one container across tests stay isolated.
        return PollerKey(namespace="live", poller=f"orders-{uuid.uuid4().hex[:12]}")

    def _exact_clock(self) -> None:
        if not self.controllable_clock:
            # The prefix tells the project's CI guard this is no missing service tier.
            pytest.skip(
                "not applicable: needs a store whose time can be moved to an exact instant "
                "(Azure decides lease expiry on its own clock)"
            )

    def _past_expiry(self, clock: FakeClock) -> None:
        self.advance(clock, self.lease_duration + self.clock_slack)

    @staticmethod
    def _read(store: StateStore, key: PollerKey) -> StoredCheckpoint:
        stored = store.read(key)
        assert stored is not None, f"record {key} should exist"
        return stored

    def _acquire(self, store: StateStore, key: PollerKey, owner: str) -> LeaseGrant:
        grant = store.acquire(key, owner, self.lease_duration)
        assert grant is not None, f"{owner} should have acquired the free lease of {key}"
        return grant
