"""The keyset position ``(cursor..., pk...)`` and a type-tagged JSON codec for its values.

A position is the last delivered row's key; the next batch starts strictly after it. Values are
encoded with explicit type tags so a checkpoint written today decodes to an equal value of the
same type tomorrow: tz-aware and naive datetimes keep microseconds and offset, Decimal keeps its
exponent, ints are never squeezed through a float, bytes survive as base64.
"""

from __future__ import annotations

import base64
import datetime as dt
import math
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, TypeAlias

from azure_functions_db.errors import CodecError

# A value a cursor or primary-key column may hold.
KeyValue: TypeAlias = (
    int | str | float | Decimal | dt.datetime | dt.date | dt.time | uuid.UUID | bytes | bool
)
# The JSON form of one encoded value: {"t": <tag>, "v": <string>}.
EncodedValue: TypeAlias = dict[str, str]


def encode_value(value: KeyValue) -> EncodedValue:  # noqa: PLR0911, PLR0912 - one arm per type
    """Encode one key value as ``{"t": tag, "v": text}``; raises :class:`CodecError`."""
    # bool before int (bool is an int subclass); datetime before date (same reason).
    if isinstance(value, bool):
        return {"t": "bool", "v": "true" if value else "false"}
    if isinstance(value, int):
        return {"t": "int", "v": str(value)}
    if isinstance(value, str):
        return {"t": "str", "v": value}
    if isinstance(value, float):
        if not math.isfinite(value):
            raise CodecError(f"cannot use the non-finite float `{value!r}` as a key value")
        return {"t": "float", "v": value.hex()}
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise CodecError(f"cannot use the non-finite Decimal `{value}` as a key value")
        return {"t": "decimal", "v": str(value)}
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None and value.utcoffset() is not None:
            return {"t": "datetime_tz", "v": value.isoformat(timespec="microseconds")}
        return {"t": "datetime", "v": value.replace(tzinfo=None).isoformat("T", "microseconds")}
    if isinstance(value, dt.date):
        return {"t": "date", "v": value.isoformat()}
    if isinstance(value, dt.time):
        if value.tzinfo is not None:
            raise CodecError(f"cannot use the tz-aware time `{value}` as a key value")
        return {"t": "time", "v": value.isoformat("microseconds")}
    if isinstance(value, uuid.UUID):
        return {"t": "uuid", "v": str(value)}
    if isinstance(value, bytes | bytearray | memoryview):
        return {"t": "bytes", "v": base64.b64encode(bytes(value)).decode("ascii")}
    raise CodecError(
        f"cannot use a value of type `{type(value).__name__}` ({value!r}) as a cursor or key; "
        "supported: int, str, float, Decimal, datetime, date, time, UUID, bytes, bool"
    )


def decode_value(encoded: Any) -> KeyValue:
    """Decode the output of :func:`encode_value`; raises :class:`CodecError` on anything else."""
    if not isinstance(encoded, Mapping) or set(encoded) != {"t", "v"}:
        raise CodecError(f"expected an object with keys `t` and `v`, found `{encoded!r}`")
    tag, text = encoded["t"], encoded["v"]
    if not isinstance(text, str):
        raise CodecError(f"value of tag `{tag}` must be a string, found `{text!r}`")
    try:
        value: KeyValue = _DECODERS[tag](text)
    except KeyError:
        raise CodecError(f"unknown value tag `{tag}`") from None
    except (ValueError, ArithmeticError) as exc:
        raise CodecError(f"cannot decode `{text}` as `{tag}`: {exc}") from exc
    return value


def _decode_bool(text: str) -> bool:
    if text not in ("true", "false"):
        raise ValueError("expected `true` or `false`")
    return text == "true"


def _decode_datetime_tz(text: str) -> dt.datetime:
    value = dt.datetime.fromisoformat(text)
    if value.tzinfo is None:
        raise ValueError("missing UTC offset")
    return value


def _decode_datetime(text: str) -> dt.datetime:
    value = dt.datetime.fromisoformat(text)
    if value.tzinfo is not None:
        raise ValueError("unexpected UTC offset on a naive datetime")
    return value


_DECODERS: dict[str, Any] = {
    "bool": _decode_bool,
    "int": int,
    "str": str,
    "float": float.fromhex,
    "decimal": Decimal,
    "datetime_tz": _decode_datetime_tz,
    "datetime": _decode_datetime,
    "date": dt.date.fromisoformat,
    "time": dt.time.fromisoformat,
    "uuid": uuid.UUID,
    "bytes": lambda text: base64.b64decode(text.encode("ascii"), validate=True),
}


_KEY_TYPES = (int, str, float, Decimal, dt.datetime, dt.date, dt.time, uuid.UUID, bytes)
# Exact types every value of which encodes (no NaN, no tz-aware time): one set lookup per value.
_ALWAYS_VALID = frozenset({int, str, bool, dt.datetime, dt.date, uuid.UUID, bytes})


def _plainly_valid(value: object) -> bool:
    """A cheap check that ``encode_value`` would accept ``value``; False means "ask it"."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, Decimal):
        return value.is_finite()
    if isinstance(value, dt.time):
        return value.tzinfo is None
    return isinstance(value, _KEY_TYPES)


@dataclass(frozen=True, slots=True)
class Position:
    """The key of the last acknowledged row: cursor values then primary-key values.

    Positions have no order in Python, on purpose: the database orders the rows (a
    case-insensitive or ICU collation, a UUID type, a float4 column order differently from
    Python), so every "before/after" decision is a predicate in the source's SQL, never a Python
    comparison. Positions compare only for equality (same values). A position with no pk values
    (made only by an operator's ``seek --cursor``) means "before every row with that cursor", so
    the next batch starts *at* that cursor.
    """

    cursor: tuple[KeyValue, ...]
    pk: tuple[KeyValue, ...]

    def __post_init__(self) -> None:
        if not self.cursor:
            raise CodecError("a position needs at least one cursor value")
        # Built for every row fetched: a type check here, full encoding only at commit time.
        for value in (*self.cursor, *self.pk):
            if type(value) not in _ALWAYS_VALID and not _plainly_valid(value):
                encode_value(value)  # raises the precise CodecError

    @classmethod
    def trusted(cls, cursor: tuple[KeyValue, ...], pk: tuple[KeyValue, ...]) -> Position:
        """A position from values already known to encode, without checking them again.

        For sources, per row of a batch: a column returns values of one Python type, so the
        source checks the first and last row of a batch (the last one is the position that is
        committed, and encoded in full then) and builds the rows between with this.
        """
        return _trusted(cursor, pk)

    @property
    def key(self) -> tuple[KeyValue, ...]:
        """The full keyset tuple, cursor values first."""
        return (*self.cursor, *self.pk)

    def to_json(self) -> dict[str, list[EncodedValue]]:
        """The JSON-ready form: ``{"cursor": [...], "pk": [...]}`` of encoded values."""
        return {
            "cursor": [encode_value(v) for v in self.cursor],
            "pk": [encode_value(v) for v in self.pk],
        }

    @classmethod
    def from_json(cls, data: Any) -> Position:
        """Inverse of :meth:`to_json`; raises :class:`CodecError` on malformed input."""
        if not isinstance(data, Mapping) or set(data) != {"cursor", "pk"}:
            raise CodecError(f"expected an object with keys `cursor` and `pk`, found `{data!r}`")
        parts: list[tuple[KeyValue, ...]] = []
        for name in ("cursor", "pk"):
            values = data[name]
            if not isinstance(values, Sequence) or isinstance(values, str):
                raise CodecError(f"`{name}` must be a list, found `{values!r}`")
            parts.append(tuple(decode_value(v) for v in values))
        return cls(cursor=parts[0], pk=parts[1])

    def __str__(self) -> str:
        def show(values: tuple[KeyValue, ...]) -> str:
            return ", ".join(_show(v) for v in values)

        return f"(cursor=({show(self.cursor)}), pk=({show(self.pk)}))"


_new = object.__new__
# The slots' own descriptors: they set a frozen instance's fields without its __setattr__.
_set_cursor = Position.__dict__["cursor"].__set__
_set_pk = Position.__dict__["pk"].__set__


def _trusted(cursor: tuple[KeyValue, ...], pk: tuple[KeyValue, ...]) -> Position:
    position: Position = _new(Position)
    _set_cursor(position, cursor)
    _set_pk(position, pk)
    return position


def _show(value: KeyValue) -> str:
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, bytes):
        return "0x" + value.hex()
    return repr(value) if isinstance(value, str) else str(value)
