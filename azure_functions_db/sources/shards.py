"""Sharded sources: one table split over N pollers by a stable hash of the primary key.

Shard ``i`` of ``N`` reads the rows whose shard value is ``i``. The value is computed by the
database, from the primary key alone, so every version of a row lands in the same shard and is
delivered there in order. Each value is in ``0 .. N-1`` (a NULL key component hashes as 0), so
every row belongs to exactly one shard.

The shard value is either

- the column ``afdb_shard_<N>`` when the table has one (it must be a generated/computed column:
  MariaDB and SQL Server index an expression only that way), or
- the expression below, matched by an expression (functional) index on PostgreSQL, MySQL 8 and
  SQLite.

Per dialect (``k`` the pk, several columns joined with ``'|'``)::

    postgresql  mod(coalesce(hashtext(CAST(k AS text))::bigint, 0) + 2147483648, N)
    mysql       MOD(COALESCE(CRC32(k), 0), N)          (MariaDB too; a string column is
                                                       hashed as WEIGHT_STRING(RTRIM(col)))
    mssql       (COALESCE(CAST(CHECKSUM(k) AS BIGINT), 0) + 2147483648) % N
    sqlite      ((COALESCE(k, 0) % N) + N) % N          (one integer pk column: no hash)

The expression is SQL text with its constants inline (never bound), so the planner matches it
to the index built from :func:`ddl`, and the keyset stays an index range on
``(shard, cursor..., pk...)``.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import sqlalchemy as sa
from sqlalchemy.sql.elements import ColumnElement

from azure_functions_db.errors import ConfigurationError, SourceDefinitionError

#: The most shards one poller may have (each is its own timer function, lease and checkpoint).
MAX_SHARDS = 64
#: The bound parameter of the shard's own value.
SHARD_PARAM = "afdb_shard"


def check_shards(value: object, poller: object) -> int:
    """``shards=`` of a poller: a whole number from 2 to :data:`MAX_SHARDS`."""
    if isinstance(value, bool) or not isinstance(value, int) or not 2 <= value <= MAX_SHARDS:
        raise ConfigurationError(
            f"`shards={value!r}` (poller `{poller}`) must be a whole number from 2 to "
            f"{MAX_SHARDS}: the pollers the table is split over (leave it out for one)."
        )
    return value


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` (from 0) of ``count``."""

    index: int
    count: int

    def __post_init__(self) -> None:
        check_shards(self.count, "?")
        if isinstance(self.index, bool) or not isinstance(self.index, int):
            raise ConfigurationError(f"shard index {self.index!r} must be a whole number")
        if not 0 <= self.index < self.count:
            raise ConfigurationError(
                f"shard {self.index} does not exist among {self.count} (0 to {self.count - 1})"
            )

    @property
    def suffix(self) -> str:
        """What a shard's poller name ends with: ``shard-1-of-4``."""
        return f"shard-{self.index}-of-{self.count}"

    @property
    def column(self) -> str:
        """The generated column that may hold the shard values of ``count`` shards."""
        return f"afdb_shard_{self.count}"

    def poller_name(self, group: str) -> str:
        """The shard's poller name (its checkpoint, lease and function): ``orders.shard-1-of-4``."""
        return f"{group}.{self.suffix}"

    def describe(self, term: str) -> str:
        """How the checkpoint's source description records the shard."""
        return f"shard {self.index} of {self.count}: {term}"


def _mariadb(dialect: sa.Dialect) -> bool:
    return bool(getattr(dialect, "is_mariadb", False))


def expression_text(dialect: sa.Dialect, pk: Sequence[sa.Column[Any]], count: int) -> str:
    """The shard expression of ``pk`` over ``count`` shards, as this dialect's SQL text."""
    quote = dialect.identifier_preparer.quote
    names = [quote(column.name) for column in pk]
    name = dialect.name
    _check_key_types(name, pk, count)
    if name == "postgresql":
        key = " || '|' || ".join(f"CAST({n} AS text)" for n in names)
        return f"mod(coalesce(hashtext({key})::bigint, 0) + 2147483648, {count})"
    if name in ("mysql", "mariadb"):
        # A string key is hashed by its collation's weights, trailing spaces trimmed: keys the
        # database holds equal ('abc', 'ABC', 'abc ' under a case-insensitive PAD SPACE
        # collation) are one row, which must stay in one shard when its key is so updated.
        parts = [
            f"WEIGHT_STRING(RTRIM({n}))" if _string(column) else n
            for n, column in zip(names, pk, strict=True)
        ]
        key = parts[0] if len(parts) == 1 else f"CONCAT_WS('|', {', '.join(parts)})"
        return f"MOD(COALESCE(CRC32({key}), 0), {count})"
    if name == "mssql":
        return f"(COALESCE(CAST(CHECKSUM({', '.join(names)}) AS BIGINT), 0) + 2147483648) % {count}"
    if name == "sqlite":
        if len(pk) != 1 or not _integer(pk[0]):
            raise SourceDefinitionError(
                f"SQLite has no hash function to shard on the key ({', '.join(c.name for c in pk)})"
                f": shard on one integer pk column, or add a generated column "
                f"`afdb_shard_{count}` holding 0 to {count - 1} (see docs/scale.md)."
            )
        return f"((COALESCE({names[0]}, 0) % {count}) + {count}) % {count}"
    raise SourceDefinitionError(
        f"Sharding has no hash expression for the `{name}` dialect: add a generated column "
        f"`afdb_shard_{count}` holding 0 to {count - 1} from the primary key (see docs/scale.md)."
    )


#: Key types whose text the hash reads the same in every session, per dialect: not date-times
#: (the session's time zone and date style), floats (``extra_float_digits``) or PostgreSQL's
#: ``bytea`` (``bytea_output``). Other key types shard through a generated column.
_STABLE_TEXT = {
    "postgresql": (int, str, uuid.UUID, Decimal, bool),
    "mysql": (int, str, bytes, Decimal),
    "mariadb": (int, str, bytes, Decimal),
}


def _check_key_types(dialect: str, pk: Sequence[sa.Column[Any]], count: int) -> None:
    stable = _STABLE_TEXT.get(dialect)
    if stable is None:
        return
    for column in pk:
        try:
            python_type: type = column.type.python_type
        except NotImplementedError:
            python_type = object
        if not issubclass(python_type, stable) or python_type is float:
            raise SourceDefinitionError(
                f"Key column `{column.name}` ({column.type}) cannot be hashed the same way in "
                "every database session (its text depends on session settings), so it cannot "
                f"pick a row's shard: add a generated column `afdb_shard_{count}` holding 0 to "
                f"{count - 1} from the key (see docs/scale.md)."
            )


def _string(column: sa.Column[Any]) -> bool:
    """Whether the key column holds text (compared under a collation)."""
    try:
        return column.type.python_type is str
    except NotImplementedError:
        return False


def _integer(column: sa.Column[Any]) -> bool:
    try:
        return column.type.python_type is int
    except NotImplementedError:
        return False


@dataclass(frozen=True)
class ShardTerm:
    """What a shard's rows are selected by: the generated column, or the expression."""

    shard: Shard
    sql: ColumnElement[Any]
    text: str
    column: str | None  # the generated column's name, when the term is one

    def predicate(self) -> ColumnElement[bool]:
        """``<term> = :afdb_shard`` (the shard's own value, bound)."""
        return self.sql == sa.bindparam(SHARD_PARAM, self.shard.index, type_=sa.Integer)


def shard_term(
    table: sa.Table, dialect: sa.Dialect, pk: Sequence[sa.Column[Any]], shard: Shard
) -> ShardTerm:
    """The shard's term over the reflected ``table``: its ``afdb_shard_<N>`` column if it has
    one (which must be generated), else the dialect's expression."""
    name = shard.column
    column = next((c for c in table.columns if c.name.lower() == name), None)
    if column is not None:
        if column.computed is None:
            raise SourceDefinitionError(
                f"Column `{table.name}.{column.name}` must be a generated (computed) column, so "
                "every row written gets its shard: recreate it as `afdb validate` prints, or "
                "drop it to shard on the expression."
            )
        return ShardTerm(shard, column, dialect.identifier_preparer.quote(column.name), column.name)
    text = expression_text(dialect, pk, shard.count)
    return ShardTerm(shard, sa.literal_column(text, type_=sa.Integer), text, None)


def described(where: str | None, term: ShardTerm | None, shard: Shard | None = None) -> str | None:
    """The ``where`` of a source's description, with its shard (its term once it is open)."""
    if term is not None:
        text = term.shard.describe(term.text)
    elif shard is not None:
        text = f"shard {shard.index} of {shard.count}"
    else:
        return where
    return text if where is None else f"{where} AND {text}"


def strays(conn: sa.Connection, table: sa.Table, term: ShardTerm) -> int:
    """Rows whose generated shard column holds no shard's value (NULL or outside 0..N-1): no
    shard would ever read them. Always 0 for the expression."""
    if term.column is None:
        return 0
    column = table.c[term.column]
    outside = sa.or_(column.is_(None), column < 0, column >= term.shard.count)
    return int(
        conn.execute(sa.select(sa.func.count()).select_from(table).where(outside)).scalar_one()
    )


#: How many of the newest rows the check of a generated shard column compares.
SAMPLE = 1000


def column_mismatches(
    conn: sa.Connection,
    table: sa.Table,
    term: ShardTerm,
    cursor: Sequence[sa.Column[Any]],
    pk: Sequence[sa.Column[Any]],
) -> int:
    """Of the newest :data:`SAMPLE` rows (the keyset index, read backwards), how many hold
    another value in the generated shard column than the shard expression: such a column
    reads rows in other shards than the expression does, so a switch between the two would
    skip some and repeat others. 0 for the expression, or a dialect or key without one."""
    if term.column is None:
        return 0
    try:
        text = expression_text(conn.dialect, pk, term.shard.count)
    except SourceDefinitionError:
        return 0  # no expression to agree with: the column is the only definition
    newest = (
        sa.select(table.c[term.column].label("v"), sa.literal_column(text).label("e"))
        .order_by(*(column.desc() for column in (*cursor, *pk)))
        .limit(SAMPLE)
        .subquery()
    )
    differ = sa.select(sa.func.count()).where(newest.c.v.is_distinct_from(newest.c.e))
    return int(conn.execute(differ).scalar_one())


def ddl(
    dialect: sa.Dialect,
    *,
    table: str,
    bare: str,
    cursor: Sequence[str],
    pk: Sequence[sa.Column[Any]],
    count: int,
) -> list[str]:
    """The statements that give ``count`` shards an index range each: an expression index
    (PostgreSQL, MySQL 8, SQLite) or a generated column and its index (MariaDB, SQL Server)."""
    quote = dialect.identifier_preparer.quote
    text = expression_text(dialect, pk, count)
    rest = ", ".join(quote(c) for c in (*cursor, *(c.name for c in pk)))
    index = f"ix_{bare}_afdb_shard_{count}"
    column = f"afdb_shard_{count}"
    if dialect.name == "postgresql":
        return [f"CREATE INDEX CONCURRENTLY {index} ON {table} (({text}), {rest})"]
    if dialect.name in ("mysql", "mariadb") and _mariadb(dialect):
        return [
            f"ALTER TABLE {table} ADD COLUMN {column} SMALLINT AS ({text}) VIRTUAL, "
            f"ADD INDEX {index} ({column}, {rest})"
        ]
    if dialect.name == "mssql":
        return [
            f"ALTER TABLE {table} ADD {column} AS ({text}) PERSISTED",
            f"CREATE INDEX {index} ON {table} ({column}, {rest})",
        ]
    return [f"CREATE INDEX {index} ON {table} (({text}), {rest})"]
