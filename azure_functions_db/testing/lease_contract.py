"""Contract of :class:`~azure_functions_db.core.ports.LeaseManager`: one expiring, fenced lease."""

from __future__ import annotations

import datetime as dt

import pytest

from azure_functions_db.core.checkpoint import PollerKey
from azure_functions_db.core.ports import StateStore
from azure_functions_db.errors import LeaseLostError
from azure_functions_db.testing._harness import StoreHarness, race
from azure_functions_db.testing.clock import FakeClock


class LeaseManagerContract(StoreHarness):
    """Leases: exclusivity, the fence counter, expiry edges, renew and release."""

    def test_inspect_of_a_never_leased_poller_is_free_with_fence_zero(
        self, store: StateStore, key: PollerKey
    ) -> None:
        info = store.inspect(key)
        assert (info.key, info.state, info.holder, info.fence) == (key, "free", None, 0)

    def test_acquire_grants_a_positive_fence_and_inspect_shows_the_holder(
        self, store: StateStore, key: PollerKey
    ) -> None:
        grant = self._acquire(store, key, "host-a:1")
        assert (grant.key, grant.owner, grant.duration) == (key, "host-a:1", self.lease_duration)
        assert grant.fence >= 1
        assert grant.lease_id
        info = store.inspect(key)
        assert (info.state, info.holder, info.fence) == ("held", "host-a:1", grant.fence)

    def test_second_owner_gets_none_while_the_lease_is_live(
        self, store: StateStore, key: PollerKey, clock: FakeClock
    ) -> None:
        grant = self._acquire(store, key, "host-a")
        self.advance(clock, self.lease_duration / 2)
        assert store.acquire(key, "host-b", self.lease_duration) is None
        assert store.inspect(key).holder == "host-a"
        assert store.inspect(key).fence == grant.fence

    def test_same_owner_string_cannot_hold_two_grants(
        self, store: StateStore, key: PollerKey
    ) -> None:
        self._acquire(store, key, "host-a")
        assert store.acquire(key, "host-a", self.lease_duration) is None

    def test_fence_strictly_increases_across_release_and_expiry(
        self, store: StateStore, key: PollerKey, clock: FakeClock
    ) -> None:
        first = self._acquire(store, key, "a")
        store.release(first)
        second = self._acquire(store, key, "b")
        self._past_expiry(clock)
        third = self._acquire(store, key, "c")
        assert first.fence < second.fence < third.fence
        assert len({first.lease_id, second.lease_id, third.lease_id}) == 3
        assert store.inspect(key).fence == third.fence

    def test_lease_is_free_exactly_at_expiry(
        self, store: StateStore, key: PollerKey, clock: FakeClock
    ) -> None:
        self._exact_clock()
        grant = self._acquire(store, key, "a")
        self.advance(clock, self.lease_duration)
        assert store.inspect(key).state == "free"
        assert self._acquire(store, key, "b").fence == grant.fence + 1

    def test_lease_is_held_one_microsecond_before_expiry(
        self, store: StateStore, key: PollerKey, clock: FakeClock
    ) -> None:
        self._exact_clock()
        start = clock.now()
        self._acquire(store, key, "a")
        info = store.inspect(key)
        assert info.expires_at == start + dt.timedelta(seconds=self.lease_duration)
        self.advance(clock, self.lease_duration - 1e-6)
        assert store.inspect(key).state == "held"
        assert store.acquire(key, "b", self.lease_duration) is None

    def test_renew_extends_the_lease_by_its_duration_from_now(
        self, store: StateStore, key: PollerKey, clock: FakeClock
    ) -> None:
        grant = self._acquire(store, key, "a")
        self.advance(clock, self.lease_duration * 0.6)
        renewed_at = clock.now()
        store.renew(grant)
        self.advance(clock, self.lease_duration * 0.6)  # past the first expiry
        assert store.acquire(key, "b", self.lease_duration) is None
        info = store.inspect(key)
        assert (info.state, info.holder, info.fence) == ("held", "a", grant.fence)
        if self.controllable_clock:
            assert info.expires_at == renewed_at + dt.timedelta(seconds=self.lease_duration)
        self.advance(clock, self.lease_duration * 0.4 + self.clock_slack)
        assert self._acquire(store, key, "b").fence == grant.fence + 1

    def test_renew_after_another_owner_took_the_lease_raises_lease_lost(
        self, store: StateStore, key: PollerKey, clock: FakeClock
    ) -> None:
        grant = self._acquire(store, key, "a")
        self._past_expiry(clock)
        taker = self._acquire(store, key, "b")
        with pytest.raises(LeaseLostError) as info:
            store.renew(grant)
        assert (info.value.poller, info.value.fence) == (key.poller, grant.fence)
        assert (store.inspect(key).holder, store.inspect(key).fence) == ("b", taker.fence)

    def test_renew_of_an_expired_lease_nobody_took_succeeds_with_the_same_fence(
        self, store: StateStore, key: PollerKey, clock: FakeClock
    ) -> None:
        grant = self._acquire(store, key, "a")
        self._past_expiry(clock)
        assert store.inspect(key).state == "free"
        store.renew(grant)
        info = store.inspect(key)
        assert (info.state, info.holder, info.fence) == ("held", "a", grant.fence)
        assert store.acquire(key, "b", self.lease_duration) is None

    def test_renew_after_release_raises_lease_lost(self, store: StateStore, key: PollerKey) -> None:
        grant = self._acquire(store, key, "a")
        store.release(grant)
        with pytest.raises(LeaseLostError):
            store.renew(grant)
        assert store.inspect(key).state == "free"

    def test_release_frees_the_lease_at_once_and_keeps_the_fence(
        self, store: StateStore, key: PollerKey
    ) -> None:
        grant = self._acquire(store, key, "a")
        store.release(grant)
        info = store.inspect(key)
        assert (info.state, info.holder, info.fence) == ("free", None, grant.fence)
        assert self._acquire(store, key, "b").fence == grant.fence + 1

    def test_release_is_idempotent(self, store: StateStore, key: PollerKey) -> None:
        grant = self._acquire(store, key, "a")
        store.release(grant)
        store.release(grant)
        assert store.inspect(key).state == "free"
        assert store.inspect(key).fence == grant.fence

    def test_release_of_a_lost_lease_does_nothing(
        self, store: StateStore, key: PollerKey, clock: FakeClock
    ) -> None:
        grant = self._acquire(store, key, "a")
        self._past_expiry(clock)
        taker = self._acquire(store, key, "b")
        store.release(grant)
        info = store.inspect(key)
        assert (info.state, info.holder, info.fence) == ("held", "b", taker.fence)
        assert store.acquire(key, "c", self.lease_duration) is None

    def test_leases_of_different_pollers_are_independent(
        self, store: StateStore, key: PollerKey
    ) -> None:
        other = PollerKey(namespace="backfill", poller=key.poller)
        self._acquire(store, key, "a")
        self._acquire(store, other, "b")
        assert (store.inspect(key).holder, store.inspect(other).holder) == ("a", "b")

    def test_racing_threads_acquire_exactly_one_grant(
        self, store: StateStore, key: PollerKey
    ) -> None:
        results = race(self.racers, lambda i: store.acquire(key, f"owner-{i}", self.lease_duration))
        grants = [grant for grant in results if grant is not None]
        assert len(grants) == 1
        assert store.inspect(key).holder == grants[0].owner
