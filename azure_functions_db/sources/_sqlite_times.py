"""SQLite date-time cursors: bind positions back in the text format the rows are stored in.

SQLite has no date-time type: a ``DATETIME`` column holds text, compared as text. SQLAlchemy
binds a Python datetime as ``YYYY-MM-DD HH:MM:SS.ffffff``, but rows are often written otherwise:
``CURRENT_TIMESTAMP`` writes ``YYYY-MM-DD HH:MM:SS``, Python's ``isoformat()`` a ``T`` and no
fraction when the microseconds are 0, ``strftime('%f')`` milliseconds. A position bound in
another format than its own row's text does not select that row with ``=`` (rows tied with the
checkpoint are skipped) or does not exclude it with ``>`` (the same batch comes back for ever).

So the source reads which format the column holds and binds in exactly that format
(:class:`TextDateTime`); a column holding several formats that no single one can reproduce is
refused with an error naming the formats and the fix.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, Literal

import sqlalchemy as sa

from azure_functions_db.errors import SourceDefinitionError

#: Digits of the fraction: always 0, 3 or 6, or Python's ``isoformat()`` (6, none when zero).
Fraction = Literal[0, 3, 6, "isoformat"]

_BY_LENGTHS: dict[frozenset[int], Fraction] = {
    frozenset({19}): 0,
    frozenset({23}): 3,
    frozenset({26}): 6,
    frozenset({19, 26}): "isoformat",
}


@dataclass(frozen=True)
class TextFormat:
    """How a column's date-times are written: the date/time separator and the fraction."""

    sep: Literal[" ", "T"] = " "
    fraction: Fraction = 6

    def render(self, value: dt.datetime) -> str:
        """``value`` as this format writes it (a finer value is truncated: never above it)."""
        base = value.strftime(f"%Y-%m-%d{self.sep}%H:%M:%S")
        if self.fraction == "isoformat":
            return base + (f".{value.microsecond:06d}" if value.microsecond else "")
        if self.fraction == 0:
            return base
        if self.fraction == 3:
            return f"{base}.{value.microsecond // 1000:03d}"
        return f"{base}.{value.microsecond:06d}"

    def __str__(self) -> str:
        sep = "T" if self.sep == "T" else " "
        fraction = {0: "", 3: ".fff", 6: ".ffffff", "isoformat": "[.ffffff]"}[self.fraction]
        return f"YYYY-MM-DD{sep}HH:MM:SS{fraction}"


class TextDateTime(sa.types.TypeDecorator[dt.datetime]):
    """A SQLite date-time column read as ``datetime`` and bound in its own text format."""

    impl = sa.String
    cache_ok = True

    def __init__(self, text_format: TextFormat | None) -> None:
        super().__init__()
        #: ``None`` until the column holds a row; then fixed (see ``SqlSource``).
        self.text_format = text_format

    def process_bind_param(self, value: Any, dialect: sa.Dialect) -> str | None:
        if value is None or isinstance(value, str):
            return value
        if not isinstance(value, dt.datetime):  # a date bound against a date-time column
            value = dt.datetime.combine(value, dt.time())
        return (self.text_format or TextFormat()).render(value)

    def process_result_value(self, value: Any, dialect: sa.Dialect) -> dt.datetime | None:
        if value is None or isinstance(value, dt.datetime):
            return value
        return dt.datetime.fromisoformat(str(value))

    @property
    def python_type(self) -> type[dt.datetime]:
        return dt.datetime


def is_text_datetime(column: sa.Column[Any]) -> bool:
    """A SQLite column SQLAlchemy reads as a naive ``datetime`` (stored as text)."""
    return isinstance(column.type, sa.DateTime) and not column.type.timezone


def detect(conn: sa.Connection, column: sa.Column[Any], qualified: str) -> TextFormat | None:
    """The one text format of ``column``'s values; ``None`` while it holds no value.

    Raises :class:`SourceDefinitionError` when the values are not all text in one format that a
    bound position can reproduce.
    """
    value = sa.type_coerce(column, sa.String)
    statement = (
        sa.select(
            sa.func.typeof(value),
            sa.func.substr(value, 11, 1),
            sa.func.length(value),
            sa.func.min(value),
        )
        .where(column.is_not(None))
        .group_by(sa.func.typeof(value), sa.func.substr(value, 11, 1), sa.func.length(value))
    )
    found = conn.execute(statement).all()
    if not found:
        return None
    kinds = {row[0] for row in found}
    seps = {row[1] for row in found}
    lengths = frozenset(int(row[2]) for row in found)
    fraction = _BY_LENGTHS.get(lengths)
    if fraction == "isoformat" and _zero_fractions(conn, value):
        fraction = None  # `12:00:00.000000` beside `12:00:01`: two ways of writing a zero
    if kinds == {"text"} and len(seps) == 1 and seps <= {" ", "T"} and fraction is not None:
        return TextFormat(sep=" " if seps == {" "} else "T", fraction=fraction)
    examples = ", ".join(f"`{row[3]}`" for row in found[:4])
    raise SourceDefinitionError(
        f"Cursor column `{column.name}` of `{qualified}` holds date-times in several text "
        f"formats ({examples}; SQLite types {sorted(kinds)}). SQLite compares them as text, so "
        "no bound position can select its own row in every format and rows would be skipped "
        f"or re-read. Rewrite them in one format, e.g. `UPDATE {qualified} SET {column.name} = "
        f"strftime('%Y-%m-%d %H:%M:%f', {column.name})`, and have writers keep it (or use an "
        "INTEGER cursor)."
    )


def _zero_fractions(conn: sa.Connection, value: sa.ColumnElement[Any]) -> bool:
    """Whether a 26-character value ends in ``.000000`` (isoformat() would omit it)."""
    statement = sa.select(sa.func.count()).where(
        sa.func.length(value) == 26, sa.func.substr(value, 20) == ".000000"
    )
    return bool(conn.execute(statement).scalar_one())


def adopt(
    conn: sa.Connection, table: sa.Table, names: tuple[str, ...], qualified: str
) -> list[TextDateTime]:
    """Give the text date-time columns ``names`` of a SQLite ``table`` their stored format."""
    if conn.dialect.name != "sqlite":
        return []
    adopted: list[TextDateTime] = []
    for name in dict.fromkeys(names):
        column = table.c.get(name)  # a missing column is reported when the query is built
        if column is not None and is_text_datetime(column):
            column.type = TextDateTime(detect(conn, column, qualified))
            adopted.append(column.type)
    return adopted


def recheck(
    conn: sa.Connection, table: sa.Table, types: list[TextDateTime], qualified: str
) -> None:
    """Fix a still unknown format once rows exist; refuse a format that changed since."""
    for column in table.c:
        text_type = column.type
        if not isinstance(text_type, TextDateTime) or text_type not in types:
            continue
        found = detect(conn, column, qualified)
        if text_type.text_format is None:
            text_type.text_format = found
        elif found is not None and found != text_type.text_format:
            raise SourceDefinitionError(
                f"Cursor column `{column.name}` of `{qualified}` now holds date-times as "
                f"`{found}`, not `{text_type.text_format}` as when the poller started: new rows "
                "are written in another format, and SQLite compares them as text. Rewrite the "
                "column in one format and have every writer keep it."
            )
