"""The keyset statements of one source: the batch query, the latest row, the NULL-cursor count.

The "after" predicate ``K > V`` for the key tuple ``K = (k1, ..., kn)`` is written in the nested
form with a redundant lower bound::

    k1 >= :v1 AND (k1 > :v1 OR (k2 >= :v2 AND (k2 > :v2 OR ... (kn > :vn))))

Measured on 1M rows with an index on ``(k1, k2)`` (SPEC §5.2), this is the only form that gets an
index range condition on PostgreSQL *and* MariaDB: the plain ``k1 > :v1 OR (k1 = :v1 AND ...)``
form is not turned into an index condition by PostgreSQL, the row-value ``(k1, k2) > (...)`` form
makes MariaDB scan the whole index, and SQL Server has no row values at all.

PostgreSQL alone gets the row-value form ``(k1, k2) > (:v1, :v2)`` (``row_values=True``): it is an
index condition on the whole key there, so a batch starting inside a long run of equal cursor
values seeks straight to the next key, where the nested form's condition covers only ``k1`` and
re-reads the tied rows before the position (measured: 200k rows in runs of 50k ties, 2.6x faster).

Every value is a bound parameter typed with its column's type; nothing is spliced into SQL text.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

import sqlalchemy as sa
from sqlalchemy.dialects import mssql
from sqlalchemy.sql.elements import ColumnElement, Grouping

from azure_functions_db.core.position import KeyValue, Position

if TYPE_CHECKING:
    from azure_functions_db.sources.shards import ShardTerm

#: Where a batch starts: from the beginning, strictly after a full key, or at a cursor value
#: (a position without pk values sorts before every row with that cursor).
Start: TypeAlias = Literal["beginning", "after", "at"]

#: A SELECT of any columns.
AnySelect: TypeAlias = "sa.Select[*tuple[Any, ...]]"

#: Bound-parameter names this module owns; user ``params`` may not use the prefix.
RESERVED_PREFIX = "afdb_"
HORIZON_PARAM = "afdb_horizon"

_MAX_CACHED_LIMITS = 8


def bound_value(name: str, column: ColumnElement[Any]) -> ColumnElement[Any]:
    """The bound parameter ``name`` for a value of ``column``, in the column's own type.

    Drivers send a Python float as a double: against a single-precision column (PostgreSQL
    ``real``, MySQL ``FLOAT``, SQL Server ``real``) the column is widened for the comparison,
    so the value the driver returned for a row (``0.1``) no longer equals that row
    (``0.100000001...``) and a position would not select its own row with ``=`` nor exclude it
    with ``>``. A cast to the column's type compares them in the column's precision.
    """
    # (Column types whose values Python cannot hold exactly, SQL Server's 100 ns DATETIME2(7),
    # are refused when the source opens: see ``_config.check_round_trip``.)
    param = sa.bindparam(name, type_=column.type)
    if isinstance(column.type, sa.Float | mssql.DATETIME | mssql.SMALLDATETIME):
        # SQL Server's DATETIME keeps 1/300 s ticks: a value the driver returned (.003) is
        # compared as DATETIME2 (.0033333) unless the bound is rounded the column's way.
        return sa.cast(param, column.type)
    return param


def key_param(index: int) -> str:
    """The bound-parameter name of the ``index``-th value of the key tuple."""
    return f"afdb_k{index}"


def after_predicate(
    columns: Sequence[ColumnElement[Any]],
    values: Sequence[ColumnElement[Any]],
    *,
    inclusive: bool = False,
    row_values: bool = False,
) -> ColumnElement[bool]:
    """``columns > values`` as tuples (``>=`` when ``inclusive``), in the nested form.

    The comparison on the last column is ``>`` (or ``>=``); every earlier column gets the
    redundant ``>=`` lower bound that lets the planner use an index range on the leading column.
    With ``row_values`` (PostgreSQL only) several columns compare as one row value instead.
    """
    if not columns or len(columns) != len(values):
        raise ValueError("after_predicate needs as many values as columns (at least one)")
    if row_values and len(columns) > 1:
        left, right = sa.tuple_(*columns), sa.tuple_(*values)
        return left >= right if inclusive else left > right
    last_column, last_value = columns[-1], values[-1]
    predicate: ColumnElement[bool] = (
        last_column >= last_value if inclusive else last_column > last_value
    )
    for column, value in zip(reversed(columns[:-1]), reversed(values[:-1]), strict=True):
        predicate = sa.and_(column >= value, sa.or_(column > value, predicate))
    return predicate


def upto_predicate(
    columns: Sequence[ColumnElement[Any]],
    values: Sequence[ColumnElement[Any]],
    *,
    row_values: bool = False,
) -> ColumnElement[bool]:
    """``columns <= values`` as tuples, in the nested form (the mirror of :func:`after_predicate`).

    An inclusive upper bound the database evaluates in its own order: a backfill chunk's end.
    """
    if not columns or len(columns) != len(values):
        raise ValueError("upto_predicate needs as many values as columns (at least one)")
    if row_values and len(columns) > 1:
        return sa.tuple_(*columns) <= sa.tuple_(*values)
    predicate: ColumnElement[bool] = columns[-1] <= values[-1]
    for column, value in zip(reversed(columns[:-1]), reversed(values[:-1]), strict=True):
        predicate = sa.and_(column <= value, sa.or_(column < value, predicate))
    return predicate


def until_param(index: int) -> str:
    """The bound-parameter name of the ``index``-th value of the inclusive upper key bound."""
    return f"afdb_u{index}"


class KeysetQuery:
    """The statements of one source, built once at ``open()`` and reused for every batch.

    ``where`` is the user's filter, already resolved against ``table`` (a text filter arrives
    wrapped in parentheses so its ``OR`` cannot escape into the keyset predicate).
    """

    def __init__(
        self,
        table: sa.Table,
        *,
        selected: Sequence[sa.Column[Any]],
        cursor: Sequence[sa.Column[Any]],
        pk: Sequence[sa.Column[Any]],
        where: ColumnElement[bool] | None,
        row_values: bool = False,
        shard: ShardTerm | None = None,
    ) -> None:
        self.table = table
        self.shard = shard  # already in ``where``; kept for the index check and description
        self.row_values = row_values
        self.selected = tuple(selected)
        self.cursor = tuple(cursor)
        self.pk = tuple(pk)
        self.where = where
        key = (*self.cursor, *self.pk)
        self._key_params = tuple(bound_value(key_param(i), column) for i, column in enumerate(key))
        self._until_params = tuple(
            bound_value(until_param(i), column) for i, column in enumerate(key)
        )
        self._horizon_param = sa.bindparam(HORIZON_PARAM, type_=self.cursor[0].type)
        self._base: dict[tuple[Start, bool, bool], AnySelect] = {
            (start, bounded, until): self._build(start, bounded, until)
            for start in ("beginning", "after", "at")
            for bounded in (False, True)
            for until in (False, True)
        }
        self._limited: dict[tuple[Start, bool, bool, int], AnySelect] = {}
        self._latest = {
            (bounded, until): self._build_latest(bounded, until)
            for bounded in (False, True)
            for until in (False, True)
        }

    # -- statements -------------------------------------------------------------------------

    def batch(self, start: Start, bounded: bool, limit: int, *, until: bool = False) -> AnySelect:
        """``SELECT ... WHERE <after> [AND lead < :horizon] [AND key <= :until] ORDER BY key
        LIMIT limit``.

        ``.limit()`` lets each dialect render its own form (``LIMIT``, ``TOP``, ``FETCH``).
        """
        cache_key = (start, bounded, until, limit)
        statement = self._limited.get(cache_key)
        if statement is None:
            if len(self._limited) >= _MAX_CACHED_LIMITS:
                self._limited.clear()
            statement = self._base[start, bounded, until].limit(limit)
            self._limited[cache_key] = statement
        return statement

    def latest(self, bounded: bool, *, until: bool = False) -> AnySelect:
        """The key of the last row (below ``:afdb_horizon`` when ``bounded``, at or below the
        ``until`` key when ``until``)."""
        return self._latest[bounded, until]

    def null_counts(self) -> AnySelect:
        """One row: rows with any NULL cursor column, then the NULL count of each column."""
        any_null = sa.or_(*(column.is_(None) for column in self.cursor))
        per_column = [
            sa.func.count(sa.case((column.is_(None), 1))).label(f"null_{i}")
            for i, column in enumerate(self.cursor)
        ]
        statement = sa.select(sa.func.count().label("rows"), *per_column).select_from(self.table)
        return self._filtered(statement.where(any_null))

    # -- parameters -------------------------------------------------------------------------

    def start_of(self, after: Position | None) -> Start:
        """Which statement continues from ``after``."""
        if after is None:
            return "beginning"
        return "after" if after.pk else "at"

    def parameters(
        self,
        after: Position | None,
        horizon: KeyValue | None,
        user: Mapping[str, Any],
        until: Position | None = None,
    ) -> dict[str, Any]:
        """Execution parameters: the user's filter values, the key values, the bounds."""
        values: dict[str, Any] = dict(user)
        if after is not None:
            for i, value in enumerate(after.key):
                values[key_param(i)] = value
        if horizon is not None:
            values[HORIZON_PARAM] = horizon
        if until is not None:
            if len(until.key) != len(self._until_params):
                raise ValueError(f"an upper key bound needs every key column, not {until}")
            for i, value in enumerate(until.key):
                values[until_param(i)] = value
        return values

    # -- building ---------------------------------------------------------------------------

    def _filtered(self, statement: AnySelect) -> AnySelect:
        return statement if self.where is None else statement.where(self.where)

    def _guards(self, start: Start, bounded: bool, until: bool) -> list[ColumnElement[bool]]:
        conditions: list[ColumnElement[bool]] = []
        if start == "after":
            key = (*self.cursor, *self.pk)
            conditions.append(after_predicate(key, self._key_params, row_values=self.row_values))
        elif start == "at":
            values = self._key_params[: len(self.cursor)]
            conditions.append(
                after_predicate(self.cursor, values, inclusive=True, row_values=self.row_values)
            )
        if bounded:
            conditions.append(self.cursor[0] < self._horizon_param)
        if until:
            key = (*self.cursor, *self.pk)
            conditions.append(upto_predicate(key, self._until_params, row_values=self.row_values))
        # The comparisons above already exclude a NULL leading cursor; later cursor columns
        # (and the leading one when nothing compares it) need an explicit guard.
        guarded_lead = start != "beginning" or bounded or until
        conditions.extend(
            column.is_not(None) for i, column in enumerate(self.cursor) if i > 0 or not guarded_lead
        )
        return conditions

    def _build(self, start: Start, bounded: bool, until: bool) -> AnySelect:
        statement = sa.select(*self.selected).where(*self._guards(start, bounded, until))
        return self._filtered(statement).order_by(*self.cursor, *self.pk)

    def _build_latest(self, bounded: bool, until: bool) -> AnySelect:
        guards = self._guards("beginning", bounded, until)
        statement = sa.select(*self.cursor, *self.pk).where(*guards)
        order = [column.desc() for column in (*self.cursor, *self.pk)]
        return self._filtered(statement).order_by(*order).limit(1)


def text_filter(clause: sa.TextClause) -> ColumnElement[bool]:
    """A text filter in parentheses, so ``a OR b`` stays one term of the ``AND``."""
    return Grouping(clause)


def picker(indexes: Sequence[int]) -> Callable[[Sequence[Any]], tuple[Any, ...]]:
    """A fast ``row -> tuple(row[i] for i in indexes)`` for the per-row hot path."""
    if len(indexes) == 1:
        (index,) = indexes
        return lambda row: (row[index],)
    if not indexes:
        return lambda row: ()
    return operator.itemgetter(*indexes)


def deletion_test(column: sa.Column[Any], names: Sequence[str]) -> Callable[[Sequence[Any]], bool]:
    """``row -> is it soft-deleted?`` for the ``soft_delete`` ``column`` of rows of ``names``.

    A boolean or integer flag marks a deleted row when true; any other type (``deleted_at``)
    when not NULL.
    """
    index = list(names).index(column.name)
    try:
        python_type = column.type.python_type
    except NotImplementedError:
        python_type = object
    if python_type is bool or python_type is int:
        return lambda row: bool(row[index])
    return lambda row: row[index] is not None
