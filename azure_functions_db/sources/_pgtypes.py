"""PostgreSQL column types SQLAlchemy does not know, registered per engine (not globally)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import sqlalchemy as sa


class Xid8(sa.types.UserDefinedType[int]):
    """PostgreSQL ``xid8`` (a 64-bit transaction id): read as ``int``, bound as text.

    Without it reflection warns and the column is untyped, so values arrive as text and
    positions would compare as strings (``"10" < "9"``), refusing a legitimate commit.
    Bound values go as text, which the server casts to ``xid8`` by context.
    """

    cache_ok = True

    def get_col_spec(self, **kw: Any) -> str:
        return "xid8"

    @property
    def python_type(self) -> type[int]:
        return int

    def bind_processor(self, dialect: sa.Dialect) -> Callable[[Any], Any]:
        return lambda value: None if value is None else str(value)

    def result_processor(self, dialect: sa.Dialect, coltype: object) -> Callable[[Any], Any]:
        return lambda value: None if value is None else int(value)


def register(engine: sa.Engine) -> None:
    """Teach this engine's PostgreSQL dialect the types above (other engines are untouched)."""
    if engine.dialect.name == "postgresql":
        names = dict(getattr(engine.dialect, "ischema_names", {}))
        names["xid8"] = Xid8
        engine.dialect.ischema_names = names  # type: ignore[attr-defined]
