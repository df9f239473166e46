"""The keyset position and its type-tagged codec: exact round trips and total order."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import pickle
import uuid
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from azure_functions_db.core import batch as batch_module
from azure_functions_db.core.batch import Change
from azure_functions_db.core.ports import SourceRow
from azure_functions_db.core.position import Position, decode_value, encode_value
from azure_functions_db.errors import CodecError

aware = st.datetimes(
    min_value=dt.datetime(1, 1, 2),
    max_value=dt.datetime(9999, 12, 30),
    timezones=st.one_of(
        st.just(dt.UTC),
        st.builds(
            dt.timezone,
            st.timedeltas(min_value=dt.timedelta(hours=-23), max_value=dt.timedelta(hours=23)),
        ),
    ),
)
key_values = st.one_of(
    st.integers(min_value=-(2**80), max_value=2**80),
    st.text(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.decimals(allow_nan=False, allow_infinity=False),
    st.datetimes(),
    aware,
    st.dates(),
    st.times(),
    st.uuids(),
    st.binary(),
    st.booleans(),
)


def roundtrip(value: object) -> object:
    encoded = json.loads(json.dumps(encode_value(value)))  # type: ignore[arg-type]
    return decode_value(encoded)


@given(key_values)
def test_every_value_round_trips_exactly_through_json(value):
    back = roundtrip(value)
    assert type(back) is type(value)
    assert back == value
    if isinstance(value, dt.datetime):
        assert back.utcoffset() == value.utcoffset()  # type: ignore[union-attr]
        assert back.microsecond == value.microsecond  # type: ignore[union-attr]
    if isinstance(value, Decimal):
        assert str(back) == str(value)  # the exponent survives: Decimal("1.50") stays "1.50"


@pytest.mark.parametrize(
    "value",
    [
        2**53 + 1,
        -(2**63),
        dt.datetime(2026, 3, 29, 1, 30, 0, 123456, tzinfo=dt.timezone(dt.timedelta(hours=2))),
        dt.datetime(2026, 3, 29, 1, 30, 0, 1),
        dt.date(1999, 12, 31),
        Decimal("12345678901234567890.000000001"),
        Decimal("1E+3"),
        uuid.UUID("12345678-1234-5678-1234-567812345678"),
        b"\x00\x00\x00\x00\x00\x00\x07\xd1",  # a SQL Server rowversion
        "",
    ],
)
def test_edge_values_round_trip(value):
    back = roundtrip(value)
    assert back == value
    assert type(back) is type(value)


def test_naive_and_aware_datetimes_stay_distinct():
    naive = dt.datetime(2026, 1, 1, 12)
    aware_value = naive.replace(tzinfo=dt.UTC)
    assert encode_value(naive)["t"] == "datetime"
    assert encode_value(aware_value)["t"] == "datetime_tz"
    assert roundtrip(naive).tzinfo is None  # type: ignore[union-attr]
    assert roundtrip(aware_value).tzinfo is not None  # type: ignore[union-attr]


@pytest.mark.parametrize("value", [float("nan"), float("inf"), Decimal("NaN"), None, object()])
def test_values_that_cannot_be_keys_are_rejected(value):
    with pytest.raises(CodecError):
        encode_value(value)


@pytest.mark.parametrize(
    "encoded",
    [
        {"t": "int", "v": "1.5"},
        {"t": "nope", "v": "1"},
        {"t": "datetime_tz", "v": "2026-01-01T00:00:00"},
        {"t": "datetime", "v": "2026-01-01T00:00:00+00:00"},
        {"t": "bytes", "v": "not base64!"},
        {"t": "int"},
        {"t": "int", "v": 5},
        "5",
    ],
)
def test_malformed_encodings_are_rejected(encoded):
    with pytest.raises(CodecError):
        decode_value(encoded)


def test_positions_have_no_python_order():
    """The database orders rows (collations, UUID types): Python must not compare positions."""
    a, b = Position(cursor=(1,), pk=("a",)), Position(cursor=(1,), pk=("B",))
    for compare in (
        lambda: a < b,
        lambda: a <= b,
        lambda: a > b,
        lambda: a >= b,
        lambda: sorted([a, b]),
    ):
        with pytest.raises(TypeError):
            compare()
    assert a == Position(cursor=(1,), pk=("a",))
    assert a != b


@given(st.lists(key_values, min_size=1, max_size=3), st.lists(key_values, max_size=3))
def test_position_json_round_trip(cursor, pk):
    position = Position(cursor=tuple(cursor), pk=tuple(pk))
    assert Position.from_json(json.loads(json.dumps(position.to_json()))) == position


def test_position_needs_a_cursor():
    with pytest.raises(CodecError):
        Position(cursor=(), pk=(1,))


# -- the per-row objects: slotted, frozen, picklable (a backfill ships them to Spark workers) ---


def _change() -> Change:
    position = Position(cursor=(dt.datetime(2026, 1, 1, 12, 0, 0, 5),), pk=(7,))
    return Change({"id": 7, "note": "n"}, position, "orders")


def test_per_row_objects_have_no_instance_dict_and_stay_frozen():
    change = _change()
    row = SourceRow(change.position, change.data)
    for value in (change.position, row, change):
        assert not hasattr(value, "__dict__")
    with pytest.raises(dataclasses.FrozenInstanceError):
        change.position.pk = (8,)  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        change.op = "delete"  # type: ignore[misc]
    assert [f.name for f in dataclasses.fields(Change)] == ["data", "position", "poller", "op"]
    assert repr(change).startswith("Change(data={'id': 7, 'note': 'n'}, position=Position(")


def test_event_id_is_computed_once_and_is_not_part_of_equality(monkeypatch):
    calls: list[str] = []
    real = batch_module.event_id

    def counting(poller: str, position: Position) -> str:
        calls.append(poller)
        return real(poller, position)

    monkeypatch.setattr(batch_module, "event_id", counting)
    change = _change()
    first = change.event_id
    assert change.event_id == first
    assert calls == ["orders"]
    assert first == real("orders", change.position)
    assert change == _change()  # one with its id cached equals one without


@pytest.mark.parametrize("cached", [False, True])
def test_position_row_and_change_pickle_round_trip(cached):
    change = _change()
    if cached:
        expected = change.event_id
    row = SourceRow(change.position, change.data, "delete")
    for value in (change.position, row, change):
        copy = pickle.loads(pickle.dumps(value))
        assert copy == value
        assert type(copy) is type(value)
    copy = pickle.loads(pickle.dumps(change))
    assert copy.event_id == change.event_id
    if cached:
        assert copy.event_id == expected
    assert pickle.loads(pickle.dumps(change.position)).key == change.position.key


def test_trusted_position_equals_a_checked_one():
    cursor, pk = (dt.datetime(2026, 1, 1),), (1, "a")
    trusted = Position.trusted(cursor, pk)
    assert trusted == Position(cursor=cursor, pk=pk)
    assert hash(trusted) == hash(Position(cursor=cursor, pk=pk))
    assert type(trusted) is Position
    assert trusted.to_json() == Position(cursor=cursor, pk=pk).to_json()
