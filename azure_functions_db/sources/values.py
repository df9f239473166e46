"""Python values of cursor columns: what a reflected column holds, and parsing operator text.

Positions carry exactly the values the driver returned, so they bind back into the keyset query
unchanged and compare in the database the way the rows do. Only two things here make values:
:func:`parse_value` (operator input for ``seek --cursor``) and :func:`time_bound` (the lag
horizon). Both follow one rule for naive time columns: a naive column holds wall-clock time in the
source's ``cursor_timezone``, UTC unless configured.
"""

from __future__ import annotations

import datetime as dt
import math
import uuid
from collections.abc import Callable, Sequence
from decimal import Decimal, InvalidOperation
from typing import Any, Literal, TypeAlias

import sqlalchemy as sa
from sqlalchemy.dialects.mssql import DATETIMEOFFSET

from azure_functions_db.core.position import KeyValue
from azure_functions_db.errors import ConfigurationError

Kind: TypeAlias = Literal[
    "int",
    "decimal",
    "float",
    "datetime",
    "datetime_tz",
    "date",
    "time",
    "str",
    "uuid",
    "bytes",
    "bool",
]

_EXPECTED: dict[Kind, str] = {
    "int": "an integer such as `42`",
    "decimal": "a decimal number such as `12.50`",
    "float": "a number such as `1.5`",
    "datetime": "an ISO 8601 date-time such as `2026-01-31T12:00:00`",
    "datetime_tz": "an ISO 8601 date-time such as `2026-01-31T12:00:00+00:00`",
    "date": "an ISO 8601 date such as `2026-01-31`",
    "time": "an ISO 8601 time such as `12:30:00`",
    "str": "text",
    "uuid": "a UUID such as `12345678-1234-5678-1234-567812345678`",
    "bytes": "hexadecimal bytes such as `0x00000000000007d1`",
    "bool": "`true` or `false`",
}


def column_kind(column: sa.Column[Any]) -> Kind | None:
    """The kind of Python value the driver returns for ``column``, or ``None`` if unsupported."""
    type_ = column.type
    if isinstance(type_, DATETIMEOFFSET) or (isinstance(type_, sa.DateTime) and type_.timezone):
        return "datetime_tz"
    if isinstance(type_, sa.Uuid):
        return "uuid" if type_.as_uuid else "str"
    try:
        python_type = type_.python_type
    except NotImplementedError:
        return None
    return python_kind(python_type)


def python_kind(python_type: type) -> Kind | None:
    """The kind of a Python type (``bool`` before ``int``, ``datetime`` before ``date``)."""
    for candidate, kind in _KINDS:
        if issubclass(python_type, candidate):
            return kind
    return None


# Subclasses first: bool is an int, datetime is a date.
_KINDS: tuple[tuple[type, Kind], ...] = (
    (bool, "bool"),
    (int, "int"),
    (Decimal, "decimal"),
    (float, "float"),
    (dt.datetime, "datetime"),
    (dt.date, "date"),
    (dt.time, "time"),
    (str, "str"),
    (uuid.UUID, "uuid"),
    (bytes, "bytes"),
)


def parse_value(text: str, column: sa.Column[Any], zone: dt.tzinfo) -> KeyValue:
    """``text`` as a value of ``column``'s type; raises :class:`ConfigurationError`.

    A naive date-time for a tz-aware column is read in ``zone``; an aware one for a naive column
    is converted to ``zone`` and made naive (naive columns hold wall-clock time in ``zone``).
    """
    kind = column_kind(column)
    if kind is None:
        raise ConfigurationError(
            f"Cursor column `{column.name}` has type `{column.type}`, which `seek --cursor` "
            "cannot parse. Use `seek --beginning` or `seek --now` instead."
        )
    value = text if kind == "str" else text.strip()
    try:
        return _PARSERS[kind](value, zone)
    except (ValueError, ArithmeticError, InvalidOperation) as exc:
        raise ConfigurationError(
            f"Cannot read `{text}` as a value of cursor column `{column.name}` "
            f"({column.type}): expected {_EXPECTED[kind]}."
        ) from exc


def parse_cursor(
    text: str, columns: Sequence[sa.Column[Any]], zone: dt.tzinfo, qualified: str
) -> tuple[KeyValue, ...]:
    """Operator text as values of the cursor ``columns``: comma-separated for several."""
    if len(columns) == 1:
        return (parse_value(text, columns[0], zone),)
    parts = [part.strip() for part in text.split(",", len(columns) - 1)]
    if len(parts) != len(columns):
        names = ", ".join(f"`{column.name}`" for column in columns)
        raise ConfigurationError(
            f"`{text}` has {len(parts)} value(s) but the cursor of `{qualified}` has "
            f"{len(columns)} columns ({names}): give one value per column, separated by commas."
        )
    return tuple(parse_value(p, c, zone) for p, c in zip(parts, columns, strict=True))


def time_bound(moment: dt.datetime, column: sa.Column[Any], zone: dt.tzinfo) -> KeyValue | None:
    """``moment`` (aware) as a bound comparable with ``column``, or ``None`` if not a time type.

    Aware columns get the aware UTC value; naive date-time columns the wall-clock time in
    ``zone``; date columns the date in ``zone``. A column with fewer than 6 fractional digits
    (MySQL ``DATETIME``, PostgreSQL ``timestamptz(0)``) gets the bound cut down to its unit: the
    database truncates (MariaDB) or rounds (MySQL, PostgreSQL) a stamp to it, so a row stamped after
    ``moment`` can be stored below it, but never below the unit that holds ``moment``.
    """
    kind = column_kind(column)
    if kind == "datetime_tz":
        return _whole_units(moment.astimezone(dt.UTC), column)
    if kind == "datetime":
        return _whole_units(moment.astimezone(zone).replace(tzinfo=None), column)
    if kind == "date":
        return moment.astimezone(zone).date()
    return None


def fraction_digits(column: sa.Column[Any]) -> int:
    """How many fractional digits of a second a date-time column stores (at most 6)."""
    type_ = column.type
    if hasattr(type_, "fsp"):  # MySQL/MariaDB DATETIME(fsp), TIMESTAMP(fsp): None is 0
        return 0 if type_.fsp is None else min(int(type_.fsp), 6)
    precision = getattr(type_, "precision", None)  # PostgreSQL TIMESTAMP(p): None is 6
    return 6 if not isinstance(precision, int) else min(precision, 6)


def _whole_units(value: dt.datetime, column: sa.Column[Any]) -> dt.datetime:
    unit = 10 ** (6 - fraction_digits(column))
    return value.replace(microsecond=value.microsecond - value.microsecond % unit)


def _datetime(text: str, zone: dt.tzinfo) -> dt.datetime:
    value = dt.datetime.fromisoformat(text)
    if value.tzinfo is None:
        return value
    return value.astimezone(zone).replace(tzinfo=None)


def _datetime_tz(text: str, zone: dt.tzinfo) -> dt.datetime:
    value = dt.datetime.fromisoformat(text)
    return value.replace(tzinfo=zone) if value.tzinfo is None else value


def _int(text: str, zone: dt.tzinfo) -> int:
    return int(text)


def _decimal(text: str, zone: dt.tzinfo) -> Decimal:
    value = Decimal(text)
    if not value.is_finite():
        raise ValueError("not a finite number")
    return value


def _float(text: str, zone: dt.tzinfo) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError("not a finite number")
    return value


def _bytes(text: str, zone: dt.tzinfo) -> bytes:
    return bytes.fromhex(text[2:] if text[:2].lower() == "0x" else text)


def _bool(text: str, zone: dt.tzinfo) -> bool:
    lowered = text.lower()
    if lowered not in ("true", "false", "1", "0"):
        raise ValueError("not a boolean")
    return lowered in ("true", "1")


_PARSERS: dict[Kind, Callable[[str, dt.tzinfo], KeyValue]] = {
    "int": _int,
    "decimal": _decimal,
    "float": _float,
    "datetime": _datetime,
    "datetime_tz": _datetime_tz,
    "date": lambda text, zone: dt.date.fromisoformat(text),
    "time": lambda text, zone: dt.time.fromisoformat(text),
    "str": lambda text, zone: text,
    "uuid": lambda text, zone: uuid.UUID(text),
    "bytes": _bytes,
    "bool": _bool,
}
