"""Contract of :class:`~azure_functions_db.core.ports.CheckpointStore`: changed only by CAS."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from decimal import Decimal

import pytest

from azure_functions_db.core.checkpoint import (
    Checkpoint,
    CheckpointStats,
    PollerKey,
    SeekAudit,
    SourceDescription,
    encode_checkpoint,
)
from azure_functions_db.core.ports import StateStore, StoredCheckpoint
from azure_functions_db.core.position import Position
from azure_functions_db.errors import (
    CheckpointConflictError,
    CheckpointCorruptError,
    PositionNotForwardError,
    RecordExistsError,
)
from azure_functions_db.testing._harness import (
    StoreHarness,
    checkpoint_for,
    race,
    try_increment,
)
from azure_functions_db.testing.clock import FakeClock


class CheckpointStoreContract(StoreHarness):
    """Checkpoint records: create-only, etag compare-and-set, corruption, codec round trip."""

    def test_read_of_missing_record_returns_none(self, store: StateStore, key: PollerKey) -> None:
        assert store.read(key) is None

    def test_create_then_read_returns_the_record_and_the_same_etag(
        self, store: StateStore, key: PollerKey
    ) -> None:
        etag = store.create(checkpoint_for(key, 3, fence=1))
        assert self._read(store, key) == StoredCheckpoint(checkpoint_for(key, 3, fence=1), etag)

    def test_second_create_raises_record_exists_and_leaves_the_record_unchanged(
        self, store: StateStore, key: PollerKey
    ) -> None:
        etag = store.create(checkpoint_for(key, 1))
        with pytest.raises(RecordExistsError) as info:
            store.create(checkpoint_for(key, 2))
        assert (info.value.namespace, info.value.poller) == (key.namespace, key.poller)
        assert self._read(store, key) == StoredCheckpoint(checkpoint_for(key, 1), etag)

    def test_racing_creates_let_exactly_one_writer_in(
        self, store: StateStore, key: PollerKey
    ) -> None:
        def create(i: int) -> str | None:
            try:
                return store.create(checkpoint_for(key, i + 1))
            except RecordExistsError:
                return None

        etags = [etag for etag in race(self.racers, create) if etag is not None]
        assert len(etags) == 1
        assert self._read(store, key).etag == etags[0]

    def test_etag_rotates_on_every_write_even_when_the_content_is_identical(
        self, store: StateStore, key: PollerKey
    ) -> None:
        record = checkpoint_for(key, 1)
        etags = [store.create(record)]
        for _ in range(3):
            etags.append(store.replace(record, etags[-1]))
        assert len(set(etags)) == len(etags)
        assert self._read(store, key) == StoredCheckpoint(record, etags[-1])

    def test_replace_with_stale_etag_is_rejected_and_the_record_is_unchanged(
        self, store: StateStore, key: PollerKey
    ) -> None:
        first = store.create(checkpoint_for(key, 1, fence=1))
        second = store.replace(checkpoint_for(key, 2, fence=2), first)
        with pytest.raises(CheckpointConflictError) as info:
            store.replace(checkpoint_for(key, 3, fence=1), first)
        error = info.value
        assert (error.namespace, error.poller) == (key.namespace, key.poller)
        assert (error.expected_etag, error.found_etag) == (first, second)
        assert (error.fence, error.found_fence) == (1, 2)
        assert self._read(store, key) == StoredCheckpoint(checkpoint_for(key, 2, fence=2), second)

    def test_replace_of_a_missing_record_is_rejected_not_turned_into_a_create(
        self, store: StateStore, key: PollerKey
    ) -> None:
        with pytest.raises(CheckpointConflictError) as info:
            store.replace(checkpoint_for(key, 1), uuid.uuid4().hex)
        assert info.value.found_etag is None
        assert store.read(key) is None
        assert key not in store.list_keys(key.namespace)

    def test_round_trip_keeps_every_value_type_exactly(
        self, store: StateStore, key: PollerKey
    ) -> None:
        india = dt.timezone(dt.timedelta(hours=5, minutes=30))
        position = Position(
            cursor=(
                dt.datetime(2026, 3, 4, 5, 6, 7, 891011, tzinfo=india),
                dt.datetime(2026, 3, 4, 5, 6, 7, 1),
                dt.date(2024, 2, 29),
            ),
            pk=(
                Decimal("12.3400"),
                uuid.UUID("12345678-9abc-def0-1234-56789abcdef0"),
                2**63 + 12345,
                b"\x00\x01\xfe\xff",
                "tenant ü",
            ),
        )
        record = Checkpoint(
            key=key,
            position=position,
            fence=7,
            source=SourceDescription("dbo.orders", ("updated_at", "ver"), ("tenant", "id")),
            committed_at=dt.datetime(2026, 3, 4, 5, 6, 8, 999999, tzinfo=dt.UTC),
            attempts=2,
            last_error="boom: handler raised",
            stats=CheckpointStats(batches=2**53 + 1, rows=2**60),
            seek=SeekAudit("ops@host", dt.datetime(2026, 3, 1, tzinfo=dt.UTC), None, position, "x"),
        )
        etag = store.create(record)
        for stored in (self._read(store, key), self._read(store, key)):
            assert stored == StoredCheckpoint(record, etag)
            assert stored.checkpoint.position is not None
            # Equality alone would accept Decimal("12.34") or the same instant in UTC.
            got = [(type(v), repr(v)) for v in stored.checkpoint.position.key]
            assert got == [(type(v), repr(v)) for v in position.key]

    def test_corrupt_record_raises_on_read_and_is_never_overwritten_by_create(
        self, store: StateStore, key: PollerKey
    ) -> None:
        self.corrupt(store, key)
        with pytest.raises(CheckpointCorruptError) as info:
            store.read(key)
        assert (info.value.namespace, info.value.poller) == (key.namespace, key.poller)
        with pytest.raises(RecordExistsError):
            store.create(checkpoint_for(key, 1))
        with pytest.raises(CheckpointCorruptError):
            store.read(key)
        assert key in store.list_keys(key.namespace)

    def test_replace_over_a_corrupted_record_with_the_etag_seen_before_is_rejected(
        self, store: StateStore, key: PollerKey
    ) -> None:
        etag = store.create(checkpoint_for(key, 1))
        self.corrupt(store, key)
        with pytest.raises(CheckpointConflictError) as info:
            store.replace(checkpoint_for(key, 2), etag)
        assert info.value.found_fence is None
        with pytest.raises(CheckpointCorruptError):
            store.read(key)

    @pytest.mark.parametrize("problem", ["unknown_schema", "other_poller", "empty"])
    def test_undecodable_or_misplaced_record_is_corrupt_not_missing(
        self, store: StateStore, key: PollerKey, problem: str
    ) -> None:
        other = PollerKey(namespace=key.namespace, poller=key.poller + "-other")
        data = {
            "unknown_schema": json.dumps({"schema": 99, "poller": key.poller}).encode(),
            "other_poller": encode_checkpoint(checkpoint_for(other, 1)),
            "empty": b"",
        }[problem]
        self.corrupt(store, key, data)
        with pytest.raises(CheckpointCorruptError):
            store.read(key)
        with pytest.raises(RecordExistsError):
            store.create(checkpoint_for(key, 1))

    def test_list_keys_is_sorted_and_filters_by_namespace(self, store: StateStore) -> None:
        ns = f"ns-{uuid.uuid4().hex[:8]}"
        keys = [PollerKey(ns, p) for p in ("b", "a_b", "a", "c.d", "a-1")]
        keys.append(PollerKey(ns + "-x", "a"))
        for k in keys:
            store.create(checkpoint_for(k))
        in_ns = sorted(keys[:-1], key=lambda k: k.poller)
        assert list(store.list_keys(ns)) == in_ns
        everything = list(store.list_keys())
        assert [k for k in everything if k.namespace.startswith(ns)] == [*in_ns, keys[-1]]
        assert everything == sorted(everything, key=lambda k: (k.namespace, k.poller))
        assert all(self._read(store, k).checkpoint.key == k for k in keys)

    def test_same_poller_name_in_two_namespaces_is_two_records(
        self, store: StateStore, key: PollerKey
    ) -> None:
        backfill = PollerKey(namespace="backfill", poller=key.poller)
        store.create(checkpoint_for(key, 1))
        assert store.read(backfill) is None
        store.create(checkpoint_for(backfill, 2))
        assert self._read(store, key).checkpoint == checkpoint_for(key, 1)
        assert self._read(store, backfill).checkpoint == checkpoint_for(backfill, 2)

    def test_position_never_moves_backwards_through_the_core(
        self, store: StateStore, key: PollerKey, clock: FakeClock
    ) -> None:
        etag = store.create(checkpoint_for(key, 5, fence=1))
        stored = self._read(store, key).checkpoint
        here = stored.position
        # Only a batch read after the stored position may move it, and not onto itself; no
        # Python comparison of the positions is involved (the database ordered the batch).
        for proposed, read_after in (
            (Position((5,), (5,)), here),  # stays in place
            (Position((5,), (6,)), Position((4,), (99,))),  # read after another position
            (Position((5,), (6,)), None),  # read from the beginning
        ):
            with pytest.raises(PositionNotForwardError):
                stored.advanced(
                    proposed, fence=1, at=clock.now(), rows=1, source=None, read_after=read_after
                )
        assert self._read(store, key).etag == etag
        ahead = stored.advanced(
            Position((5,), (6,)), fence=1, at=clock.now(), rows=1, source=None, read_after=here
        )
        store.replace(ahead, etag)
        assert self._read(store, key).checkpoint.position == Position((5,), (6,))

    def test_racing_read_replace_loops_lose_no_update(
        self, store: StateStore, key: PollerKey
    ) -> None:
        store.create(checkpoint_for(key))
        attempts = 25

        def increment(_: int) -> int:
            return sum(try_increment(store, key) for _attempt in range(attempts))

        successes = sum(race(self.racers, increment))
        assert successes >= attempts
        assert self._read(store, key).checkpoint.stats.batches == successes
