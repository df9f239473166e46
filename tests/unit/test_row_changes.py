"""``RowChanges``: the lazily built ``Change`` objects a ``SqlSource`` hands the engine are
``Change`` objects in every way a handler, a sink or a pickle can see, and the sequence of them
is the tuple of them in every way but identity."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import pickle
from collections.abc import Mapping

import pytest

from azure_functions_db.core.batch import Batch, Change, RowChanges, event_id
from azure_functions_db.core.position import Position
from azure_functions_db.sources._rows import RowShape, dict_builder
from azure_functions_db.sources.keyset import picker

NAMES = ("id", "note", "updated_at", "deleted")
WHEN = dt.datetime(2026, 1, 1, 12, tzinfo=dt.UTC)
ROWS = [(7, "seven", WHEN, False), (8, "eight", WHEN, True)]
SHAPE = RowShape(NAMES, cursor_of=picker([2]), pk_of=picker([0]))
SOFT = RowShape(NAMES, picker([2]), picker([0]), deleted=lambda row: bool(row[3]))


def _plain(row: tuple[object, ...], op: str = "upsert") -> Change:
    return Change(dict(zip(NAMES, row, strict=True)), Position((row[2],), (row[0],)), "orders", op)  # type: ignore[arg-type]


def test_a_row_change_equals_the_plain_change_of_its_row_and_shows_as_one():
    lazy = SHAPE.changes(ROWS, "orders")
    assert [type(c) is Change for c in lazy] == [False, False]  # really the lazy kind
    assert list(lazy) == [_plain(ROWS[0]), _plain(ROWS[1])]
    assert _plain(ROWS[0]) == lazy[0]
    assert lazy[0] != lazy[1]
    assert repr(lazy[0]) == repr(_plain(ROWS[0]))
    assert lazy[0].cursor == WHEN
    assert lazy[0].pk == 7
    assert lazy[0].event_id == event_id("orders", Position((WHEN,), (7,)))
    with pytest.raises(TypeError):
        hash(lazy[0])  # as unhashable as a plain Change (its data is a dict)


def test_data_and_position_are_built_once_and_read_in_any_order():
    first, second = RowChanges(ROWS, SHAPE, "orders")
    assert first.position == Position((WHEN,), (7,))  # position before data
    assert first.position is first.position
    data = first.data
    assert data == {"id": 7, "note": "seven", "updated_at": WHEN, "deleted": False}
    assert first.position == Position((WHEN,), (7,))
    assert first.op == "upsert"
    assert second.data["note"] == "eight"  # data before position
    assert second.position == Position((WHEN,), (8,))


def test_soft_deleted_rows_read_their_op_from_the_row():
    live, gone = SOFT.changes(ROWS, "orders")
    assert (live.op, gone.op) == ("upsert", "delete")
    assert gone.data["deleted"] is True
    assert gone.op == "delete"
    assert gone == _plain(ROWS[1], "delete")


def test_row_changes_stay_frozen_and_have_no_instance_dict():
    change = SHAPE.changes(ROWS, "orders")[0]
    assert not hasattr(change, "__dict__")
    for name, value in (("data", {}), ("position", None), ("poller", "x"), ("op", "delete")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(change, name, value)


@pytest.mark.parametrize("read_first", [False, True])
def test_a_row_change_pickles_and_is_replaced_as_a_plain_change(read_first):
    change = SOFT.changes(ROWS, "orders")[1]
    if read_first:
        assert change.data["id"] == 8
    copy = pickle.loads(pickle.dumps(change))
    assert type(copy) is Change
    assert copy == change
    assert copy.op == "delete"
    moved = dataclasses.replace(change, poller="other")
    assert type(moved) is Change
    assert (moved.data, moved.position, moved.poller, moved.op) == (
        change.data,
        change.position,
        "other",
        "delete",
    )


@pytest.mark.parametrize(
    "names",
    [
        ("id",),
        ("a'b", 'c"d', "e\\f", "x}, 'y': __import__('os'), 'z': {"),
        ("Ünïcode", "line\nbreak", "with space"),
        ("dup", "other", "dup"),
        tuple(f"c{i}" for i in range(300)),
    ],
    ids=["one", "quotes-and-injection", "unicode", "repeated", "wide"],
)
def test_the_generated_dict_builder_is_dict_of_zip(names):
    row = tuple(range(len(names)))
    assert dict_builder(names)(row) == dict(zip(names, row, strict=True))
    assert RowShape(names, picker([0]), picker([0])).changes([row], "p")[0].data == dict(
        zip(names, row, strict=True)
    )


PLAIN = (_plain(ROWS[0]), _plain(ROWS[1]))


def test_each_read_builds_a_new_change_equal_to_the_last():
    lazy = RowChanges(ROWS, SHAPE, "orders")
    assert lazy[0] == lazy[0]
    assert lazy[0] is not lazy[0]  # nothing kept: a read change is freed when dropped
    assert [a is b for a, b in zip(lazy, lazy, strict=True)] == [False, False]
    assert lazy[-1] == _plain(ROWS[1])
    with pytest.raises(IndexError):
        lazy[2]


def test_row_changes_are_the_tuple_of_their_changes_but_not_a_list():
    lazy = RowChanges(ROWS, SHAPE, "orders")
    assert lazy == PLAIN
    assert lazy == PLAIN
    assert lazy == RowChanges(list(ROWS), SHAPE, "orders")
    assert lazy != list(PLAIN)  # as a tuple is not a list
    assert lazy != PLAIN[:1]
    assert repr(lazy) == repr(PLAIN)
    assert len(lazy) == 2
    assert _plain(ROWS[1]) in lazy
    assert lazy.index(_plain(ROWS[1])) == 1
    assert list(reversed(lazy)) == [PLAIN[1], PLAIN[0]]
    with pytest.raises(TypeError):
        hash(lazy)  # as unhashable as the tuple (a change's data is a dict)
    copy = pickle.loads(pickle.dumps(lazy))
    assert type(copy) is tuple
    assert [type(c) for c in copy] == [Change, Change]
    assert copy == PLAIN


def test_the_last_position_given_is_the_last_changes_own_object_in_every_read():
    last = Position((WHEN,), (8,))
    lazy = RowChanges(ROWS, SHAPE, "orders", last)
    assert lazy[-1].position is last
    assert lazy[1].position is last
    assert [c.position is last for c in lazy] == [False, True]
    assert lazy[1:].__getitem__(0).position is last  # a slice that ends at the end keeps it
    head = lazy[:1]
    assert type(head) is RowChanges
    assert head == PLAIN[:1]
    assert head[-1].position is not last
    assert head[-1].position == Position((WHEN,), (7,))
    assert lazy[5:] == ()


def test_a_batch_over_row_changes_reads_like_one_over_a_tuple():
    lazy = RowChanges(ROWS, SOFT, "orders")
    after = Position((WHEN,), (8,))
    batch = Batch("orders", "live", 1, 1, None, after, lazy)
    plain = Batch("orders", "live", 1, 1, None, after, (_plain(ROWS[0]), _plain(ROWS[1], "delete")))
    assert batch == plain
    assert len(batch) == 2
    assert [c.op for c in batch] == ["upsert", "delete"]
    assert batch.rows == [c.data for c in plain]
    assert batch[1] == plain[1]
    assert pickle.loads(pickle.dumps(batch)) == plain


ROW_DICT = {"id": 7, "note": "seven", "updated_at": WHEN, "deleted": False}


def test_row_data_is_a_read_only_mapping_over_the_row_that_acts_as_its_dict():
    data = SHAPE.changes(ROWS, "orders")[0].data
    assert isinstance(data, Mapping)
    assert not isinstance(data, dict)  # no dict is built per row
    assert data == ROW_DICT
    assert ROW_DICT == data  # noqa: SIM300 - the dict's side of the comparison
    assert data != {**ROW_DICT, "id": 8}
    assert data == SHAPE.changes(ROWS, "orders")[0].data
    assert data != SHAPE.changes(ROWS, "orders")[1].data
    assert list(data) == list(NAMES)
    assert len(data) == 4
    assert list(data.items()) == list(ROW_DICT.items())
    assert ("note" in data, "missing" in data) == (True, False)
    assert (data.get("note"), data.get("missing"), data.get("missing", 0)) == ("seven", None, 0)
    with pytest.raises(KeyError, match="missing"):
        data["missing"]
    copied = dict(data)
    assert type(copied) is dict
    assert copied == ROW_DICT
    assert type(data.copy()) is dict
    assert data.copy() == ROW_DICT
    assert data | {"id": 9} == {**ROW_DICT, "id": 9}
    assert {"extra": 1} | data == {"extra": 1, **ROW_DICT}
    assert repr(data) == repr(ROW_DICT)
    assert json.dumps(dict(data), default=str) == json.dumps(ROW_DICT, default=str)
    copy = pickle.loads(pickle.dumps(data))
    assert type(copy) is dict
    assert copy == ROW_DICT
    with pytest.raises(TypeError):
        hash(data)


@pytest.mark.parametrize("change", ["set", "delete"])
def test_row_data_refuses_changes_and_says_how_to_copy_it(change):
    data = SHAPE.changes(ROWS, "orders")[0].data

    def attempt() -> None:
        if change == "set":
            data["note"] = "changed"  # type: ignore[index]
        else:
            del data["note"]  # type: ignore[attr-defined]

    with pytest.raises(TypeError, match=r"read-only.*dict\(change\.data\)"):
        attempt()
    assert data["note"] == "seven"


def test_row_data_of_a_repeated_column_keeps_the_last_value_as_a_dict_would():
    shape = RowShape(("dup", "other", "dup"), picker([1]), picker([1]))
    data = shape.changes([(1, 2, 3)], "p")[0].data
    names = ("dup", "other", "dup")
    assert data == {"dup": 3, "other": 2} == dict(zip(names, (1, 2, 3), strict=True))
    assert len(data) == 2


def test_changes_of_two_pollers_over_one_layout_keep_their_own_poller():
    one, two = SHAPE.changes(ROWS, "one")[0], SHAPE.changes(ROWS, "two")[0]
    assert (one.poller, two.poller) == ("one", "two")
    assert one.event_id != two.event_id
