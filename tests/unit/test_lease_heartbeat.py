"""The heartbeat's timing: beats from when each renewal was sent, and a failed renewal is
tried again before the lease would lapse, even when it failed slowly (a store's own retries)."""

from __future__ import annotations

import threading
import time

from azure_functions_db.core.checkpoint import PollerKey
from azure_functions_db.core.clock import SystemClock
from azure_functions_db.core.lease import HEARTBEATS_PER_LEASE, LeaseKeeper
from azure_functions_db.core.ports import LeaseGrant
from azure_functions_db.errors import StateStoreError

DURATION = 3.0  # seconds: a beat every 1.2 s


class SlowThenFailingLeases:
    """Renewals: the first fails after 0.6 s (its retries spent), the rest succeed at once."""

    def __init__(self) -> None:
        self.calls: list[float] = []
        self.lock = threading.Lock()

    def renew(self, grant: LeaseGrant) -> None:
        with self.lock:
            self.calls.append(time.monotonic())
            first = len(self.calls) == 1
        if first:
            time.sleep(0.6)
            raise StateStoreError("renew timed out after its retries")


def test_a_renewal_that_failed_slowly_is_tried_again_before_the_lease_lapses() -> None:
    leases = SlowThenFailingLeases()
    grant = LeaseGrant(PollerKey("live", "orders"), "lease-1", "me", 1, DURATION)
    clock = SystemClock()
    start = clock.monotonic()
    keeper = LeaseKeeper(leases, grant, clock, acquired_at=start)  # type: ignore[arg-type]
    keeper.start()
    try:
        time.sleep(DURATION + 0.5)
        assert keeper.lost_reason() is None
    finally:
        keeper.stop()
    first, second = leases.calls[0] - start, leases.calls[1] - start
    assert abs(first - DURATION / HEARTBEATS_PER_LEASE) < 0.3
    assert second < DURATION - 0.2  # tried again in time, not a whole interval after the failure
