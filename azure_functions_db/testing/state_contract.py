"""The contract suite of :class:`~azure_functions_db.core.ports.StateStore`: one suite, every
adapter.

Every adapter must pass :class:`StateStoreContract` unchanged, fakes included. To run it over an
adapter, subclass it in a test module (pytest collects the subclass, not this base)::

    class TestMyStore(StateStoreContract):
        def make_store(self, clock: FakeClock, tmp_path: Path) -> StateStore:
            return MyStore(..., clock=clock)

        def corrupt(self, store: StateStore, key: PollerKey, data: bytes = GARBAGE) -> None:
            ...  # write `data` as the record of `key`, unconditionally, behind the store's back

        def corrupt_quarantined(self, store, key, record_id, data=GARBAGE) -> None:
            ...  # the same for quarantine record `record_id` of `key`

A store whose time cannot be controlled (Azure's lease service) sets ``controllable_clock =
False``, a realistic ``lease_duration`` and ``clock_slack``, and overrides
:meth:`StateStoreContract.advance` to sleep; the tests that need an exact instant are then
skipped, all the others run unchanged.
"""

from __future__ import annotations

import pytest

from azure_functions_db.core.checkpoint import Checkpoint, PollerKey
from azure_functions_db.core.ports import StateStore, StoredCheckpoint
from azure_functions_db.core.position import Position
from azure_functions_db.errors import CheckpointConflictError, StaleFenceError
from azure_functions_db.testing._harness import SOURCE, checkpoint_for
from azure_functions_db.testing.checkpoint_contract import CheckpointStoreContract
from azure_functions_db.testing.clock import FakeClock
from azure_functions_db.testing.lease_contract import LeaseManagerContract
from azure_functions_db.testing.quarantine_contract import QuarantineStoreContract

__all__ = ["StateStoreContract"]


class StateStoreContract(CheckpointStoreContract, LeaseManagerContract, QuarantineStoreContract):
    """The contract of :class:`~azure_functions_db.core.ports.StateStore`, run over one adapter.

    The port suites (quarantine records included), plus what needs leases and records
    together: the fence rule through the core, and leases that leave the checkpoint's etag
    alone.
    """

    def test_store_satisfies_the_protocol_and_describes_itself_on_one_line(
        self, store: StateStore
    ) -> None:
        assert isinstance(store, StateStore)
        description = store.describe()
        assert description
        assert "\n" not in description
        assert ":" in description

    def test_lease_operations_do_not_change_the_checkpoint_etag(
        self, store: StateStore, key: PollerKey
    ) -> None:
        etag = store.create(checkpoint_for(key, 1))
        grant = self._acquire(store, key, "a")
        store.renew(grant)
        store.inspect(key)
        store.release(grant)
        assert self._read(store, key).etag == etag

    # -- the fence rule and the only-forward rule through the core -----------------------------

    def test_stale_fence_writer_cannot_commit_after_the_new_owner_fenced_the_checkpoint(
        self, store: StateStore, key: PollerKey, clock: FakeClock
    ) -> None:
        old = self._acquire(store, key, "a")
        store.create(Checkpoint(key=key, source=SOURCE).fenced(old.fence))
        old_view = self._read(store, key)
        self._past_expiry(clock)  # "a" stalls (GC pause, network) and its lease expires
        new = self._acquire(store, key, "b")
        new_view = self._read(store, key)
        fenced_etag = store.replace(new_view.checkpoint.fenced(new.fence), new_view.etag)

        stale = old_view.checkpoint.advanced(
            Position((5,), (5,)),
            fence=old.fence,
            at=clock.now(),
            rows=5,
            source=None,
            read_after=old_view.checkpoint.position,
        )
        with pytest.raises(CheckpointConflictError) as info:
            store.replace(stale, old_view.etag)
        error = info.value
        assert (error.expected_etag, error.found_etag) == (old_view.etag, fenced_etag)
        assert (error.fence, error.found_fence) == (old.fence, new.fence)
        current = self._read(store, key)
        assert current == StoredCheckpoint(new_view.checkpoint.fenced(new.fence), fenced_etag)
        # Re-reading does not help the old owner: the core refuses its fence.
        with pytest.raises(StaleFenceError):
            current.checkpoint.advanced(
                Position((5,), (5,)),
                fence=old.fence,
                at=clock.now(),
                rows=5,
                source=None,
                read_after=current.checkpoint.position,
            )
        committed = current.checkpoint.advanced(
            Position((5,), (5,)),
            fence=new.fence,
            at=clock.now(),
            rows=5,
            source=None,
            read_after=current.checkpoint.position,
        )
        store.replace(committed, current.etag)
        assert self._read(store, key).checkpoint.position == Position((5,), (5,))
