"""What a handler writes through a :class:`~azure_functions_db.sinks.sql.SqlSink`: the writer.

Every statement runs on the sink transaction's connection, so it commits with the batch's
position record or not at all. ``upsert`` is one statement per dialect (PostgreSQL and SQLite
``ON CONFLICT``, MySQL/MariaDB ``ON DUPLICATE KEY``, SQL Server ``MERGE ... WITH (HOLDLOCK)``).
"""

from __future__ import annotations

import operator
import re
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import mysql, postgresql, sqlite

from azure_functions_db.core.batch import Batch, Change, RowData, driver_row, view_class
from azure_functions_db.errors import ConfigurationError, SinkError, TransientSinkError
from azure_functions_db.sources.transience import is_transient

Rows = Iterable[Mapping[str, Any] | Change]
#: MySQL/MariaDB storage engines that roll back (any other one ignores transactions).
TRANSACTIONAL_ENGINES = frozenset({"innodb", "rocksdb", "tokudb"})


def split_by_op(changes: Iterable[Change]) -> tuple[list[Change], list[Change]]:
    """The changes to upsert and the soft-deleted ones to delete, each in batch order (a batch
    holds each row once, so the two never touch the same key)."""
    items = list(changes)
    return [c for c in items if c.op != "delete"], [c for c in items if c.op == "delete"]


def sink_error(exc: sa_exc.SQLAlchemyError, what: str, scrub: Callable[[str], str]) -> SinkError:
    """The sink error for a driver error: ``TransientSinkError`` for what a retry may fix (a
    dropped connection, a timeout: by the driver's error code, see
    :func:`~azure_functions_db.sources.transience.is_transient`), ``SinkError`` otherwise (a
    CHECK constraint, an index row too large); ``what`` says who failed doing what where, and
    the driver's first line passes through ``scrub`` (no secret in a message)."""
    cause: BaseException = getattr(exc, "orig", None) or exc
    detail = scrub(str(cause).strip().splitlines()[0] if str(cause).strip() else "")
    kind = TransientSinkError if is_transient(exc) else SinkError
    return kind(f"{what} ({type(cause).__name__}): {detail[:500]}")


def check_transactional(conn: sa.Connection, table: str, schema: str | None) -> None:
    """Refuse a MySQL/MariaDB table whose engine ignores transactions (MyISAM, MEMORY, ...):
    its rows would stay written when the batch's transaction rolls back."""
    if conn.dialect.name not in ("mysql", "mariadb"):
        return
    engine = conn.execute(
        sa.text(
            "SELECT ENGINE FROM information_schema.TABLES "
            "WHERE TABLE_SCHEMA = COALESCE(:schema, DATABASE()) AND TABLE_NAME = :table"
        ),
        {"schema": schema, "table": table},
    ).scalar()
    if engine is not None and str(engine).lower() not in TRANSACTIONAL_ENGINES:
        raise ConfigurationError(
            f"Table `{table}` uses the {engine} storage engine, which ignores transactions: "
            "a batch rolled back would leave its rows written, so SqlSink refuses it. Convert "
            f"it with `ALTER TABLE {table} ENGINE=InnoDB`."
        )


class SqlWriter:
    """The handler's side of one sink transaction (the second argument of the handler).

    Its statements commit together with the batch's position record when the handler returns,
    and roll back with it when the handler raises. Use it only inside that handler call.
    """

    def __init__(self, conn: sa.Connection, table: Callable[[sa.Connection, str], sa.Table]):
        self._conn = conn
        self._table = table

    @property
    def connection(self) -> sa.Connection:
        """The transaction's SQLAlchemy connection, for anything the helpers do not cover.
        Do not commit or roll it back: the sink does, with the position record."""
        return self._conn

    def table(self, name: str) -> sa.Table:
        """The target table ``name`` (``schema.table`` for another schema), reflected once."""
        return self._table(self._conn, name)

    def execute(self, statement: Any, params: Any = None) -> sa.CursorResult[Any]:
        """Run ``statement`` (text or a SQLAlchemy statement) in the transaction."""
        if isinstance(statement, str):
            statement = sa.text(statement)
        return self._conn.execute(statement, params)

    def insert(self, table: str, rows: Rows) -> int:
        """Insert ``rows`` (mappings, or the batch's changes); the number inserted."""
        target, data, shape = self._prepared(table, rows)
        if data:
            self._many(sa.insert(target), data, ("insert",), shape)
        return len(data)

    def upsert(self, table: str, rows: Rows, *, key: Sequence[str] | None = None) -> int:
        """Insert ``rows`` or update the ones whose ``key`` exists (default: the primary key)."""
        target, data, shape = self._prepared(table, rows)
        if not data:
            return 0
        columns = list(data[0])
        keys = self._key(target, key)
        missing = [k for k in keys if k not in columns]
        if missing:
            raise ConfigurationError(
                f"upsert into `{table}`: the rows have no `{missing[0]}`, a column of the key "
                f"{keys}: include it, or pass `key=[...]` with the columns that identify a row."
            )
        statement, bind = upsert_statement(self._conn.dialect, target, columns, keys)
        if bind is _same:
            self._many(statement, data, ("upsert", *keys), shape)
        else:
            self._conn.execute(statement, [bind(row) for row in data])
        return len(data)

    def delete(self, table: str, rows: Rows, *, key: Sequence[str] | None = None) -> int:
        """Delete the rows whose ``key`` (default: the primary key) matches one of ``rows``."""
        target, data, _ = self._prepared(table, rows, whole=False)
        if not data:
            return 0
        keys = self._key(target, key)
        condition = sa.and_(*(target.c[k] == sa.bindparam(f"k_{i}") for i, k in enumerate(keys)))
        params = [{f"k_{i}": row[k] for i, k in enumerate(keys)} for row in data]
        self._conn.execute(sa.delete(target).where(condition), params)
        return len(data)

    def apply(
        self, table: str, changes: Iterable[Change], *, key: Sequence[str] | None = None
    ) -> int:
        """Mirror ``changes`` into ``table``: upsert each row, delete the soft-deleted ones."""
        upserts, deletes = split_by_op(changes)
        return self.upsert(table, upserts, key=key) + self.delete(table, deletes, key=key)

    # -- helpers -----------------------------------------------------------------------------

    def _many(
        self,
        statement: Any,
        data: list[Mapping[str, Any]],
        kind: tuple[str, ...],
        shape: type[RowData] | None,
    ) -> None:
        """Run ``statement`` for every row of ``data`` (one driver ``executemany``); ``shape``:
        the one :class:`RowData` class every row is a view of, if they are."""
        dialect = self._conn.dialect
        plan = driver_statement(dialect, statement, kind, tuple(data[0]))
        if plan is None:
            self._conn.execute(statement, data)
        else:
            self._conn.exec_driver_sql(plan.sql, plan.rows(data, shape))

    def _prepared(
        self, table: str, rows: Rows, *, whole: bool = True
    ) -> tuple[sa.Table, list[Mapping[str, Any]], type[RowData] | None]:
        """The target, the rows as mappings (checked), and the one :class:`RowData` class
        every row is a view of (a batch's changes from a SQL source), or ``None``."""
        target = self.table(table)
        if isinstance(rows, Batch):
            data: list[Mapping[str, Any]] = list(map(_DATA, rows))
        else:
            data = [row.data if isinstance(row, Change) else row for row in rows]
        known = set(target.c.keys())
        shape = view_class(data)
        # Views of one source's rows have the same columns (one name -> index map per RowData
        # class): checking the first checks them all.
        columns: set[str] | None = None
        for row in data[:1] if shape is not None else data:
            if not isinstance(row, Mapping):
                raise ConfigurationError(
                    f"Rows written to `{table}` must be mappings of column to value (or the "
                    f"batch's changes), not `{type(row).__name__}`."
                )
            # A set of the names, compared in C: a mapping's keys view (a batch's `change.data`
            # is a read-only view) would compare name by name in Python.
            names = set(row)
            if columns is None or not whole:
                columns = names
                if not names <= known:
                    raise ConfigurationError(
                        f"Table `{table}` has no column `{sorted(names - known)[0]}`: select the "
                        "target's columns from each row (e.g. `{k: c.data[k] for k in (...)}`)."
                    )
            elif names != columns:  # the first row's columns, known ones
                raise ConfigurationError(
                    f"Rows written to `{table}` must all have the same columns: one has "
                    f"{sorted(names)}, the first {sorted(columns)}."
                )
        return target, data, shape

    @staticmethod
    def _key(target: sa.Table, key: Sequence[str] | None) -> list[str]:
        if key is None:
            keys = [c.name for c in target.primary_key.columns]
            if not keys:
                raise ConfigurationError(
                    f"Table `{target.name}` has no primary key: pass `key=[...]`, the columns "
                    "of a unique index that identify a row."
                )
            return keys
        keys = [key] if isinstance(key, str) else list(key)
        unknown = [k for k in keys if k not in target.c]
        if not keys or unknown:
            raise ConfigurationError(
                f"`key={key!r}` must name columns of `{target.name}`"
                + (f"; it has no `{unknown[0]}`." if unknown else ".")
            )
        return keys


def _same(row: Mapping[str, Any]) -> Mapping[str, Any]:
    return row


_DATA = operator.attrgetter("data")


#: The (dialect, driver) pairs whose statements the writer may hand to the driver itself.
DIRECT_DRIVERS = frozenset(
    {
        ("postgresql", "psycopg"),
        ("mysql", "pymysql"),
        ("mariadb", "pymysql"),
        ("sqlite", "pysqlite"),
    }
)
_PYFORMAT = re.compile(r"%\((\w+)\)s")


@dataclass(frozen=True)
class DriverStatement:
    """A writer's statement as the driver's own SQL, with each row's values as a tuple."""

    sql: str
    values: Callable[[Mapping[str, Any]], tuple[Any, ...]]
    #: The statement's columns in bind order.
    order: tuple[str, ...] = ()
    _by_shape: weakref.WeakKeyDictionary[type[RowData], Callable[[Any], tuple[Any, ...]]] = field(
        default_factory=weakref.WeakKeyDictionary, compare=False, repr=False
    )

    def rows(
        self, data: Sequence[Mapping[str, Any]], shape: type[RowData] | None = None
    ) -> list[tuple[Any, ...]]:
        """Each row's values in bind order. When every row is a view of one :class:`RowData`
        class (``shape``), straight from the driver rows under the views, through one index
        getter per class (what ``view[name]`` reads, without a lookup per value)."""
        if shape is None or not self.order:
            return list(map(self.values, data))
        getter = self._by_shape.get(shape)
        if getter is None:
            getter = _getter(tuple(shape.column_index(name) for name in self.order))
            self._by_shape[shape] = getter
        return list(map(getter, map(driver_row, data)))  # type: ignore[arg-type]  # views


def _getter(keys: tuple[Any, ...]) -> Callable[[Any], tuple[Any, ...]]:
    """``operator.itemgetter(*keys)``, a tuple also for one key."""
    getter = operator.itemgetter(*keys)
    if len(keys) == 1:
        return lambda row: (getter(row),)
    return getter


_PLANS: weakref.WeakKeyDictionary[sa.Table, dict[tuple[Any, ...], DriverStatement | None]] = (
    weakref.WeakKeyDictionary()
)
_PLANS_LOCK = threading.Lock()


def driver_statement(
    dialect: sa.Dialect, statement: Any, kind: tuple[str, ...], columns: tuple[str, ...]
) -> DriverStatement | None:
    """``statement`` (an insert or upsert of ``columns`` into a table, ``kind`` naming which)
    compiled once by SQLAlchemy, as the text the driver's ``executemany`` takes with a tuple
    per row; ``None`` where SQLAlchemy would do more than hand the values on.

    SQLAlchemy's own executemany builds and processes a parameter dict per row, a third of
    the client's time of a batch insert. Where no column's type converts its values (JSON,
    SQLite's dates and the like do: ``None`` then) and the driver is one of
    :data:`DIRECT_DRIVERS` (tested here; SQL Server's pyodbc also sets input sizes), the
    same SQL with the rows' values in bind order does what SQLAlchemy's would do. Kept per
    table, kind, columns and dialect."""
    table = statement.table
    key = (dialect.name, dialect.driver, kind, columns)
    with _PLANS_LOCK:
        plans = _PLANS.setdefault(table, {})
        if key in plans:
            return plans[key]
    plan = _compiled(dialect, statement, columns)
    with _PLANS_LOCK:
        plans[key] = plan
    return plan


def _compiled(
    dialect: sa.Dialect, statement: Any, columns: tuple[str, ...]
) -> DriverStatement | None:
    if (dialect.name, dialect.driver) not in DIRECT_DRIVERS:
        return None
    table = statement.table
    for column in columns:
        if table.c[column].type.dialect_impl(dialect).bind_processor(dialect) is not None:
            return None
    compiled = statement.compile(dialect=dialect, column_keys=list(columns), for_executemany=True)
    sql = compiled.string
    if dialect.paramstyle == "pyformat":
        order = _PYFORMAT.findall(sql)
        sql = _PYFORMAT.sub("%s", sql)
    elif dialect.paramstyle == "qmark":
        order = list(compiled.positiontup or ())
    else:  # pragma: no cover - no driver of DIRECT_DRIVERS
        return None
    if len(order) != len(columns) or set(order) != set(columns):
        return None  # bind names SQLAlchemy escaped, or a bind of its own
    return DriverStatement(sql, _getter(tuple(order)), tuple(order))


def upsert_statement(
    dialect: sa.Dialect, table: sa.Table, columns: list[str], keys: list[str]
) -> tuple[Any, Callable[[Mapping[str, Any]], Mapping[str, Any]]]:
    """One insert-or-update statement for ``dialect``, and how to bind a row to it."""
    updates = [c for c in columns if c not in keys]
    same = _same
    if dialect.name in ("postgresql", "sqlite"):
        module = postgresql if dialect.name == "postgresql" else sqlite
        insert = module.insert(table)
        if not updates:
            return insert.on_conflict_do_nothing(index_elements=keys), same
        return insert.on_conflict_do_update(
            index_elements=keys, set_={c: insert.excluded[c] for c in updates}
        ), same
    if dialect.name in ("mysql", "mariadb"):
        mine = mysql.insert(table)
        chosen = updates or keys[:1]  # no other column: a no-op update keeps the row
        return mine.on_duplicate_key_update({c: mine.inserted[c] for c in chosen}), same
    if dialect.name == "mssql":
        return _merge(dialect, table, columns, keys)
    raise ConfigurationError(
        f"SqlSink cannot upsert on `{dialect.name}`: use PostgreSQL, MySQL/MariaDB, SQLite or "
        "SQL Server, or write with `sink.execute(...)`."
    )


def _merge(
    dialect: sa.Dialect, table: sa.Table, columns: list[str], keys: list[str]
) -> tuple[Any, Callable[[Mapping[str, Any]], Mapping[str, Any]]]:
    """SQL Server's upsert: ``MERGE ... WITH (HOLDLOCK)`` (the lock closes the race between
    the match and the insert), with positional bind names so any column name binds."""
    quote = dialect.identifier_preparer.quote
    names = {c: f"p{i}" for i, c in enumerate(columns)}
    source = ", ".join(f":{names[c]} AS {quote(c)}" for c in columns)
    match = " AND ".join(f"t.{quote(k)} = s.{quote(k)}" for k in keys)
    updates = [c for c in columns if c not in keys]
    matched = (
        "WHEN MATCHED THEN UPDATE SET " + ", ".join(f"t.{quote(c)} = s.{quote(c)}" for c in updates)
        if updates
        else ""
    )
    target = dialect.identifier_preparer.format_table(table)
    sql = (
        f"MERGE INTO {target} WITH (HOLDLOCK) AS t USING (SELECT {source}) AS s ON {match} "
        f"{matched} WHEN NOT MATCHED THEN INSERT ({', '.join(quote(c) for c in columns)}) "
        f"VALUES ({', '.join(f's.{quote(c)}' for c in columns)});"
    )
    bindparams = [sa.bindparam(names[c], type_=table.c[c].type) for c in columns]
    statement = sa.text(sql).bindparams(*bindparams)

    def bind(row: Mapping[str, Any]) -> Mapping[str, Any]:
        return {names[c]: row[c] for c in columns}

    return statement, bind
