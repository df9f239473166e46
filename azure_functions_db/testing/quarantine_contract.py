"""The contract suite of :class:`~azure_functions_db.core.ports.QuarantineStore`: quarantine
records in every state store, fakes included.

It is part of :class:`~azure_functions_db.testing.StateStoreContract` (every state store keeps
quarantine records); a subclass adds one hook, :meth:`QuarantineStoreContract.corrupt_quarantined`,
and may override :meth:`QuarantineStoreContract.reopen` to prove records outlive the store object.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import uuid
from decimal import Decimal
from typing import Any

import pytest

from azure_functions_db.core.batch import Batch, Change
from azure_functions_db.core.checkpoint import PollerKey
from azure_functions_db.core.ports import QuarantineStore, StateStore
from azure_functions_db.core.position import Position
from azure_functions_db.core.quarantine import (
    QuarantineEvent,
    QuarantineRecord,
    new_record,
)
from azure_functions_db.errors import (
    CheckpointConflictError,
    CheckpointCorruptError,
    QuarantineConflictError,
    QuarantineCorruptError,
    RecordExistsError,
)
from azure_functions_db.testing._harness import GARBAGE, StoreHarness, checkpoint_for, race

__all__ = ["QuarantineStoreContract", "quarantine_sample"]

_AT = dt.datetime(2026, 11, 25, 12, 0, 0, 250001, tzinfo=dt.UTC)


def quarantine_sample(
    key: PollerKey, rows: int = 3, *, first: int = 1, text: str = "x", fence: int = 3
) -> QuarantineRecord:
    """A record of ``rows`` rows of ``key`` (ids ``first``...), with one value of each kind a
    row may hold."""
    changes = []
    for i in range(first, first + rows):
        position = Position(cursor=(_AT + dt.timedelta(seconds=i),), pk=(i,))
        data: dict[str, Any] = {
            "id": i,
            "updated_at": position.cursor[0],
            "note": f"{text}{i}",
            "amount": Decimal("12.340"),
            "ratio": float("nan") if i == first else 0.5,
            "naive": dt.datetime(2026, 1, 2, 3, 4, 5, 6),
            "day": dt.date(2026, 2, 3),
            "ref": uuid.UUID(int=i),
            "blob": bytes([0, 255, i % 256]),
            "flag": i % 2 == 0,
            "missing": None,
            "doc": {"tags": ["a", "b"], "n": i, "nested": {"ok": True}},
        }
        changes.append(Change(data, position, key.poller, "delete" if i == first else "upsert"))
    before = Position(cursor=(_AT,), pk=(first - 1,))
    batch = Batch(key.poller, key.namespace, fence, 5, before, changes[-1].position, tuple(changes))
    return new_record(key, batch, error="ValueError: bad row", attempts=5, by="host:1", at=_AT)


class QuarantineStoreContract(StoreHarness):
    """The quarantine-record contract, run over one state store."""

    # -- hooks ----------------------------------------------------------------------------------

    def corrupt_quarantined(
        self, store: StateStore, key: PollerKey, record_id: str, data: bytes = GARBAGE
    ) -> None:
        """Store ``data`` as record ``record_id`` of ``key`` unconditionally (out of band)."""
        raise NotImplementedError

    def reopen(self, store: StateStore) -> StateStore:
        """A new store object on the same storage (the same object for a memory store)."""
        return store

    # -- tests ----------------------------------------------------------------------------------

    def test_store_keeps_quarantine_records(self, store: StateStore) -> None:
        assert isinstance(store, QuarantineStore)

    def test_a_record_reads_back_equal_with_every_kind_of_value(
        self, store: StateStore, key: PollerKey
    ) -> None:
        record = quarantine_sample(key, 4)
        etag = store.put_quarantined(record)
        assert etag
        stored = self.reopen(store).read_quarantined(key, record.id)
        assert stored is not None
        assert stored.etag == etag
        got = stored.record
        assert _nan(got.changes[0].data["ratio"])
        assert _comparable(got) == _comparable(record)
        assert [c.event_id for c in got.changes] == [c.event_id for c in record.changes]
        assert [c.op for c in got.changes] == ["delete", "upsert", "upsert", "upsert"]
        assert got.changes[1].data["naive"].tzinfo is None
        assert got.changes[1].data["amount"].as_tuple() == Decimal("12.340").as_tuple()

    def test_a_missing_record_reads_as_none(self, store: StateStore, key: PollerKey) -> None:
        assert store.read_quarantined(key, "q-000000000000000000000000") is None
        assert list(store.list_quarantined(key)) == []

    def test_put_never_overwrites(self, store: StateStore, key: PollerKey) -> None:
        record = quarantine_sample(key)
        store.put_quarantined(record)
        changed = dataclasses.replace(record, error="other")
        with pytest.raises(RecordExistsError):
            store.put_quarantined(changed)
        stored = store.read_quarantined(key, record.id)
        assert stored is not None
        assert stored.record.error == record.error

    def test_replace_is_compare_and_set_and_rotates_the_etag(
        self, store: StateStore, key: PollerKey
    ) -> None:
        record = quarantine_sample(key)
        first = store.put_quarantined(record)
        event = QuarantineEvent("dropped", _AT, "ops@host", 9, "not needed")
        dropped = record.with_event(event, "dropped")
        second = store.replace_quarantined(dropped, first)
        assert second != first
        with pytest.raises(QuarantineConflictError) as caught:
            store.replace_quarantined(record, first)  # a writer that read before the drop
        assert isinstance(caught.value, CheckpointConflictError)
        stored = self.reopen(store).read_quarantined(key, record.id)
        assert stored is not None
        assert stored.etag == second
        assert stored.record.state == "dropped"
        assert stored.record.history[-1] == event

    def test_replace_of_a_missing_record_is_a_conflict_not_a_create(
        self, store: StateStore, key: PollerKey
    ) -> None:
        record = quarantine_sample(key)
        etag = store.put_quarantined(quarantine_sample(key, first=50))
        with pytest.raises(QuarantineConflictError):
            store.replace_quarantined(record, etag)
        assert store.read_quarantined(key, record.id) is None

    def test_list_names_this_pollers_records_only_and_not_as_checkpoints(
        self, store: StateStore, key: PollerKey
    ) -> None:
        other = PollerKey(key.namespace, key.poller + "-b")
        elsewhere = PollerKey("backfill", key.poller)
        mine = [quarantine_sample(key, 1, first=i) for i in (1, 2, 3)]
        for record in [*mine, quarantine_sample(other), quarantine_sample(elsewhere)]:
            store.put_quarantined(record)
        store.create(checkpoint_for(key, 1))
        assert list(self.reopen(store).list_quarantined(key)) == sorted(r.id for r in mine)
        assert key in store.list_keys(key.namespace)
        assert other not in store.list_keys()
        assert elsewhere not in store.list_keys()

    def test_a_large_record_of_a_thousand_rows_reads_back_whole(
        self, store: StateStore, key: PollerKey
    ) -> None:
        # ~1.6 MB of JSON, one value alone over 64 KB: beyond a table entity or property.
        record = quarantine_sample(key, 1000, text="y" * 900)
        big = dict(record.changes[0].data, note="z" * 200_000)
        record = dataclasses.replace(
            record, changes=(dataclasses.replace(record.changes[0], data=big), *record.changes[1:])
        )
        etag = store.put_quarantined(record)
        stored = self.reopen(store).read_quarantined(key, record.id)
        assert stored is not None
        assert stored.etag == etag
        assert _comparable(stored.record) == _comparable(record)
        replayed = record.with_event(QuarantineEvent("replayed", _AT, "ops", 4), "replayed")
        store.replace_quarantined(replayed, etag)
        again = self.reopen(store).read_quarantined(key, record.id)
        assert again is not None
        assert again.record.state == "replayed"
        assert _comparable(again.record) == _comparable(replayed)

    def test_a_corrupt_record_raises_and_is_never_overwritten_by_put(
        self, store: StateStore, key: PollerKey
    ) -> None:
        record = quarantine_sample(key)
        self.corrupt_quarantined(store, key, record.id)
        with pytest.raises(QuarantineCorruptError) as caught:
            store.read_quarantined(key, record.id)
        assert isinstance(caught.value, CheckpointCorruptError)
        assert record.id in str(caught.value)
        with pytest.raises(RecordExistsError):
            store.put_quarantined(record)
        assert record.id in store.list_quarantined(key)

    def test_a_record_of_another_id_is_corrupt(self, store: StateStore, key: PollerKey) -> None:
        from azure_functions_db.core.quarantine import encode_record

        record = quarantine_sample(key)
        self.corrupt_quarantined(store, key, "q-elsewhere", encode_record(record))
        with pytest.raises(QuarantineCorruptError):
            store.read_quarantined(key, "q-elsewhere")

    def test_racing_creates_and_replaces_have_exactly_one_winner(
        self, store: StateStore, key: PollerKey
    ) -> None:
        record = quarantine_sample(key)

        def create(i: int) -> bool:
            try:
                store.put_quarantined(dataclasses.replace(record, error=f"racer {i}"))
            except RecordExistsError:
                return False
            return True

        assert sum(race(self.racers, create)) == 1
        stored = store.read_quarantined(key, record.id)
        assert stored is not None

        def update(i: int) -> bool:
            event = QuarantineEvent("dropped", _AT, f"racer {i}", i)
            try:
                store.replace_quarantined(stored.record.with_event(event, "dropped"), stored.etag)
            except QuarantineConflictError:
                return False
            return True

        assert sum(race(self.racers, update)) == 1
        final = store.read_quarantined(key, record.id)
        assert final is not None
        assert len(final.record.history) == 2


def _comparable(record: QuarantineRecord) -> Any:
    """A record with NaN made comparable (NaN != NaN)."""
    changes = [
        (c.position, c.op, {k: ("nan" if _nan(v) else v) for k, v in c.data.items()})
        for c in record.changes
    ]
    return (dataclasses.replace(record, changes=()), changes)


def _nan(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)
