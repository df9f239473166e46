"""The checkpoint record: versioned codec, only-forward rule, fence rule, corrupt input."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal

import pytest

from azure_functions_db.core.checkpoint import (
    Checkpoint,
    PollerKey,
    SourceDescription,
    decode_checkpoint,
    encode_checkpoint,
)
from azure_functions_db.core.position import Position
from azure_functions_db.errors import CodecError, PositionNotForwardError, StaleFenceError

KEY = PollerKey("live", "orders")
AT = dt.datetime(2026, 11, 21, 10, 0, tzinfo=dt.UTC)
SOURCE = SourceDescription(table="orders", cursor=("updated_at",), pk=("id",))


def pos(c: int, p: int) -> Position:
    return Position(cursor=(c,), pk=(p,))


def test_full_record_round_trips():
    cp = (
        Checkpoint(key=KEY, fence=3, source=SOURCE)
        .advanced(
            Position(cursor=(dt.datetime(2026, 1, 1, 0, 0, 0, 7, tzinfo=dt.UTC),), pk=(2**60,)),
            fence=3,
            at=AT,
            rows=10,
            source=SOURCE,
            read_after=None,
        )
        .failed(fence=3, error="boom")
        .sought(pos(1, Decimal(1)), fence=4, by="ops@host", at=AT, reason="why")  # type: ignore[arg-type]
    )
    assert decode_checkpoint(encode_checkpoint(cp)) == cp


def test_schema_number_is_inside_the_record():
    doc = json.loads(encode_checkpoint(Checkpoint(key=KEY)))
    assert doc["schema"] == 1


def test_only_forward_means_read_after_the_stored_position():
    """No Python order decides: a batch moves the checkpoint only if it was read after the
    stored position (the database returned its rows for `key > stored`), onto a new one."""
    cp = Checkpoint(key=KEY, fence=1).advanced(
        pos(5, 5), fence=1, at=AT, rows=1, source=None, read_after=None
    )
    for proposed, read_after in ((pos(5, 5), pos(5, 5)), (pos(5, 6), pos(4, 9)), (pos(9, 9), None)):
        with pytest.raises(PositionNotForwardError):
            cp.advanced(proposed, fence=1, at=AT, rows=1, source=None, read_after=read_after)
    moved = cp.advanced(pos(5, 6), fence=1, at=AT, rows=1, source=None, read_after=pos(5, 5))
    assert moved.position == pos(5, 6)
    # Even a position Python would call "behind" is accepted when the database returned it
    # after the stored one (a case-insensitive collation orders "B" before "a").
    text = Checkpoint(key=KEY, fence=1).advanced(
        Position(cursor=(1,), pk=("a",)), fence=1, at=AT, rows=1, source=None, read_after=None
    )
    after = Position(cursor=(1,), pk=("B",))
    assert (
        text.advanced(after, fence=1, at=AT, rows=1, source=None, read_after=text.position).position
        == after
    )


def test_stale_fence_is_rejected_everywhere():
    cp = Checkpoint(key=KEY, fence=7)
    with pytest.raises(StaleFenceError):
        cp.fenced(6)
    with pytest.raises(StaleFenceError):
        cp.advanced(pos(1, 1), fence=6, at=AT, rows=1, source=None, read_after=None)
    with pytest.raises(StaleFenceError):
        cp.failed(fence=6, error="x")
    with pytest.raises(StaleFenceError):
        cp.sought(None, fence=6, by="x", at=AT, reason="")
    assert cp.fenced(8).fence == 8
    # The claim (the fencing write) by a new grant needs a strictly newer fence; the writes
    # under that claim (commits, a seek) keep it.
    with pytest.raises(StaleFenceError):
        cp.fenced(7)
    assert cp.sought(None, fence=7, by="x", at=AT, reason="").fence == 7
    assert cp.advanced(pos(1, 1), fence=7, at=AT, rows=1, source=None, read_after=None).fence == 7


def test_advance_resets_attempts_and_counts_stats():
    cp = Checkpoint(key=KEY, fence=1).failed(fence=1, error="e").failed(fence=1, error="e")
    assert cp.attempts == 2
    moved = cp.advanced(pos(1, 1), fence=1, at=AT, rows=4, source=SOURCE, read_after=None)
    assert (moved.attempts, moved.last_error, moved.stats.rows, moved.stats.batches) == (
        0,
        None,
        4,
        1,
    )


def test_seek_may_go_backwards_and_is_audited():
    cp = Checkpoint(key=KEY, fence=1).advanced(
        pos(9, 9), fence=1, at=AT, rows=1, source=None, read_after=None
    )
    back = cp.sought(pos(1, 1), fence=2, by="ops", at=AT, reason="replay")
    assert back.position == pos(1, 1)
    assert back.seek is not None
    assert back.seek.from_position == pos(9, 9)
    assert back.seek.to_position == pos(1, 1)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\xff\xfe", "UTF-8"),
        (b"{not json", "JSON"),
        (b"[]", "not a JSON object"),
        (b'{"schema": 2}', "unknown schema `2`"),
        (b'{"schema": 1, "namespace": "live", "poller": "o", "fence": -1}', "fence"),
    ],
)
def test_corrupt_or_future_records_are_refused_with_a_reason(data, reason):
    with pytest.raises(CodecError, match=reason):
        decode_checkpoint(data)


def test_truncated_record_is_refused():
    data = encode_checkpoint(
        Checkpoint(key=KEY, fence=1).advanced(
            pos(1, 1), fence=1, at=AT, rows=1, source=None, read_after=None
        )
    )
    with pytest.raises(CodecError):
        decode_checkpoint(data[: len(data) // 2])
