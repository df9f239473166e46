"""``SqlSink``: a handler's writes and the poller's position commit in one database transaction.

The position record lives in a small table in the target database (``afdb_positions`` unless
configured), one row per poller and namespace, created on first use::

    namespace, poller       the poller's key (a backfill chunk has its own record)
    fence                   the newest owner's fence: a transaction of a lower one commits nothing
    sequence                the checkpoint's batch count once the stored batch is committed
    position_before/_after  where the stored batch was read after, and where it ends (typed JSON)
    rows, updated_at        its size, and when it was written (UTC, ISO 8601)

A claim locks that row (``SELECT ... FOR UPDATE``; SQLite: ``BEGIN IMMEDIATE``) and raises its
fence; a batch's transaction writes its mark with one compare-and-set ``UPDATE`` (the fence and
sequence it expects, checked by the statement itself), so a stale owner's batch commits nothing.
Per batch that is the writer's statements, the mark and the commit: no read of the record while
this sink's own last commit tells what it holds. See :class:`~azure_functions_db.core.ports.
TransactionalSink` for the contract and ``docs/sinks.md`` for use.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import threading
import weakref
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

from azure_functions_db.core.arguments import known_arguments
from azure_functions_db.core.batch import Batch
from azure_functions_db.core.checkpoint import PollerKey
from azure_functions_db.core.logs import log_event
from azure_functions_db.core.ports import SinkMark, refuse_older_fence
from azure_functions_db.core.position import Position
from azure_functions_db.errors import (
    ConfigurationError,
    SinkError,
    SinkFencedError,
)
from azure_functions_db.sinks import options
from azure_functions_db.sinks._sql_engine import (
    ENDED,
    reset_unless_ended,
    resets_on_return,
    transactional_options,
)
from azure_functions_db.sinks.writes import SqlWriter, check_transactional, sink_error
from azure_functions_db.sources import engines, entra, urls

logger = logging.getLogger(__name__)


class SqlSink:
    """Effectively-once writes into a SQL database: the batch and its position, one commit.

    Hand it to ``@db.poller(..., sink=afdb.SqlSink(url="%TARGET_DB_URL%"))``; the handler then
    takes a second argument, a :class:`~azure_functions_db.sinks.writes.SqlWriter`, whose
    ``insert``/``upsert``/``delete``/``apply``/``execute`` run in the batch's transaction.

    Args:
        url: SQLAlchemy URL of the target database (text or ``sqlalchemy.URL``); ``%SETTING%``
            reads (part of) it from an app setting when the sink opens, at the first run (never
            at import), each value going into its own part of the URL as it is.
        connection: Instead of ``url``: the name of the app setting holding the whole URL.
        credential: Sign in with Microsoft Entra ID tokens instead of a password, as
            ``SqlSource(credential=...)``.
        position_table: Name of the position table (created on first use).
        schema: Schema of the position table, and of the tables the writer names without one
            (default: the connection's).
        engine_options: Extra ``sqlalchemy.create_engine`` arguments.
        connect_timeout: Seconds to wait for a connection.
    """

    @known_arguments("SqlSink")
    def __init__(
        self,
        url: str | sa.URL | None = None,
        *,
        connection: str | None = None,
        credential: Any = None,
        position_table: str = "afdb_positions",
        schema: str | None = None,
        engine_options: Mapping[str, Any] | None = None,
        connect_timeout: float = 10.0,
    ) -> None:
        template = urls.url_template(url, connection, "SqlSink")
        self._credential = None if credential is None else entra.check_credential(credential)
        self._url: str | sa.URL = template
        self.options = options.build(
            options.SqlSinkOptions,
            url=template if isinstance(template, str) else urls.render_masked(template),
            position_table=position_table,
            schema=schema,
            engine_options=engine_options,
            connect_timeout=connect_timeout,
        )
        self._masked = urls.masked_url(template)
        self._secrets: tuple[str, ...] = ()
        self._engine: sa.Engine | None = None
        self._positions: sa.Table | None = None
        self._tables: dict[str, sa.Table] = {}
        # What this sink's own last commit left in each record (see `transaction`).
        self._known: dict[PollerKey, SinkMark] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"SqlSink(url={self._masked!r}, position_table={self.options.position_table!r})"

    def describe(self) -> str:
        return f"SqlSink {self._masked} (positions in `{self._positions_name()}`)"

    # -- the TransactionalSink port ----------------------------------------------------------

    def open(self, settings: Mapping[str, str]) -> None:
        """Resolve the URL, create the engine and the position table. Idempotent."""
        with self._lock:
            if self._engine is not None:
                return
            owner = "the SqlSink"
            url = urls.resolve_url(self._url, settings, owner)
            self._masked, self._secrets = urls.render_masked(url), urls.url_secrets(url)
            engine = engines.create(
                url,
                {**transactional_options(url), **self.options.engine_options},
                self._masked,
                self._scrub,
                connect_timeout=self.options.connect_timeout,
            )
            if resets_on_return(url, self.options.engine_options):
                reset_unless_ended(engine)
            if self._credential is not None:
                entra.sign_in_with_tokens(engine, self._credential, self._masked)
            positions = _position_table(self.options.position_table, self.options.db_schema)
            with self._errors("create the position table"):
                self._create(engine, positions)
            self._engine, self._positions = engine, positions
            log_event(logger, logging.INFO, "sink_opened", sink=self.describe())

    def claim(self, key: PollerKey, fence: int) -> SinkMark | None:
        """Store ``fence`` in ``key``'s record and return what the record held before."""
        positions = self._ready()
        self._known.pop(key, None)
        for attempt in range(2):
            try:
                with self._errors("claim the position record"), self._transaction() as conn:
                    mark = self._read(conn, key, lock=True)
                    if mark is None:
                        conn.execute(sa.insert(positions).values(**_fresh(key, fence)))
                    else:
                        refuse_older_fence(key, fence, mark)
                    if mark is not None and mark.fence < fence:
                        # Conditional, so it is atomic even where the read above took no lock:
                        # a newer claim that got in between leaves no row to update.
                        claimed = conn.execute(
                            sa.update(positions)
                            .where(_is(positions, key), positions.c.fence < fence)
                            .values(fence=fence)
                        )
                        if claimed.rowcount != 1:
                            newer = self._read(conn, key, lock=False)
                            stored = newer.fence if newer is not None else 0
                            raise SinkFencedError(key.poller, key.namespace, fence, stored)
            except SinkError as exc:
                # Two owners created the record at once: the loser reads the winner's row.
                if attempt or not isinstance(exc.__cause__, sa_exc.IntegrityError):
                    raise
                continue
            now = mark or SinkMark(fence=fence, sequence=0, before=None, after=None)
            self._known[key] = dataclasses.replace(now, fence=fence)
            return mark
        raise AssertionError("unreachable")  # pragma: no cover

    @contextmanager
    def transaction(
        self, key: PollerKey, batch: Batch, sequence: int
    ) -> Iterator[SqlWriter | None]:
        """The batch's transaction: yields the writer, or ``None`` if the batch is stored.

        The record is expected to hold what this sink's own last commit for ``key`` left in it
        (a claim or a batch, remembered in memory); without that memory (a failure since, a
        first use), or when that is this batch's own mark, it is read first (unlocked: a stored
        batch skips the handler, a newer fence refuses it early). The record is not locked
        while the handler runs, so a new owner's claim goes through meanwhile. The mark is then
        one compare-and-set statement: ``UPDATE ... WHERE fence = :expected AND sequence =
        :expected``. No row updated means the record changed (a newer claim, or another
        process with the same fence): the record is read once more under lock to say which,
        and the transaction rolls back.
        """
        self._ready()
        # Forgotten until this transaction commits: after any failure the record is read again.
        known = self._known.pop(key, None)
        with self._errors("write the batch"), self._transaction() as conn:
            if known is None or known.holds(batch, sequence):
                seen = self._read(conn, key, lock=False)
            else:
                seen = known
            refuse_older_fence(key, batch.fence, seen)
            if seen is not None and seen.holds(batch, sequence):
                stored: SinkMark | None = seen
                yield None
            else:
                yield SqlWriter(conn, self._table)
                stored = self._mark_batch(conn, key, batch, sequence, seen)
        if stored is not None:
            self._known[key] = stored

    def _mark_batch(
        self,
        conn: sa.Connection,
        key: PollerKey,
        batch: Batch,
        sequence: int,
        seen: SinkMark | None,
    ) -> SinkMark:
        """Write ``batch``'s mark over the record ``seen`` in one statement; refuse a record
        that is no longer ``seen`` (``SinkFencedError`` for a newer fence)."""
        positions = self._ready()
        values = {
            "fence": batch.fence,
            "sequence": sequence,
            "position_before": _encode(batch.position_before),
            "position_after": _encode(batch.position_after),
            "rows": len(batch),
            "updated_at": _now(),
        }
        mark = SinkMark(
            batch.fence, sequence, batch.position_before, batch.position_after, len(batch)
        )
        if seen is None:
            # No record (claim creates one; it was deleted since): a concurrent creation fails
            # on the primary key, and the batch rolls back.
            conn.execute(sa.insert(positions).values(**_fresh(key, batch.fence), **values))
            return mark
        # Compare-and-set: atomic in every database, whatever its locking reads do (SQL Server's
        # dialect renders no FOR UPDATE); `seen.fence <= batch.fence` was checked above. One
        # statement object for every batch, so SQLAlchemy builds and keys it once.
        written = conn.execute(
            _compare_and_set(positions),
            {
                **values,
                "w_namespace": key.namespace,
                "w_poller": key.poller,
                "w_fence": seen.fence,
                "w_sequence": seen.sequence,
            },
        )
        if written.rowcount != 1:
            # A locking read sees the newest committed record, also under MySQL's REPEATABLE
            # READ, whose plain reads would show this transaction's snapshot.
            now = self._read(conn, key, lock=True)
            refuse_older_fence(key, batch.fence, now)
            raise SinkError(
                f"The position record of {key} in {self.describe()} changed while the batch "
                "ran, under the same fence: two processes share one lease. The batch was "
                "rolled back.",
                poller=key.poller,
                namespace=key.namespace,
            )
        return mark

    def mark(self, key: PollerKey) -> SinkMark | None:
        """What ``key``'s record holds now (for ``status`` and tests); ``None`` if none."""
        with self._errors("read the position record"), self._ready_engine().connect() as conn:
            row = conn.execute(sa.select(self._ready()).where(_is(self._ready(), key))).first()
        return _mark(row) if row is not None else None

    def close(self) -> None:
        """Dispose of the engine's connections (the sink opens again on next use)."""
        with self._lock:
            engine, self._engine, self._positions = self._engine, None, None
            self._tables.clear()
            self._known.clear()
        if engine is not None:
            engine.dispose()

    # -- helpers -----------------------------------------------------------------------------

    def _positions_name(self) -> str:
        schema = self.options.db_schema
        return f"{schema}.{self.options.position_table}" if schema else self.options.position_table

    def _ready(self) -> sa.Table:
        if self._positions is None:
            raise SinkError(f"{self!r} is not open: the engine opens it before the first run.")
        return self._positions

    def _ready_engine(self) -> sa.Engine:
        if self._engine is None:
            raise SinkError(f"{self!r} is not open: the engine opens it before the first run.")
        return self._engine

    def _create(self, engine: sa.Engine, positions: sa.Table) -> None:
        try:
            with engines.transaction(engine) as conn:
                positions.create(conn, checkfirst=True)
        except sa_exc.DBAPIError:
            # Another process created it between the check and the CREATE. On PostgreSQL the
            # failed CREATE aborted that transaction, so look in a new one.
            with engines.transaction(engine) as conn:
                if not sa.inspect(conn).has_table(positions.name, schema=positions.schema):
                    raise
        with engines.transaction(engine) as conn:
            check_transactional(conn, positions.name, positions.schema)

    @contextmanager
    def _transaction(self) -> Iterator[sa.Connection]:
        engine = self._ready_engine()
        if engine.dialect.name != "sqlite":
            with engines.transaction(engine) as conn:
                yield conn
                try:
                    conn.commit()
                except BaseException:
                    # SQLAlchemy counts a transaction whose commit failed as ended, and the
                    # pool would not roll it back: drop the connection, its transaction (if the
                    # server still had one open) goes with it.
                    conn.invalidate()
                    raise
                # Nothing for the pool to roll back when it takes the connection back.
                conn.info[ENDED] = True
            return
        # pysqlite runs our connections in autocommit (isolation_level None): take the write
        # lock at BEGIN, so a claim and a batch cannot both read the record before writing.
        with engine.connect() as conn:
            conn.exec_driver_sql("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.exec_driver_sql("ROLLBACK")
                raise
            conn.exec_driver_sql("COMMIT")

    def _read(self, conn: sa.Connection, key: PollerKey, *, lock: bool) -> SinkMark | None:
        positions = self._ready()
        query = locked_read(positions, conn.dialect) if lock else sa.select(positions)
        row = conn.execute(query.where(_is(positions, key))).first()
        return _mark(row) if row is not None else None

    def _table(self, conn: sa.Connection, name: str) -> sa.Table:
        with self._lock:
            table = self._tables.get(name)
        if table is not None:
            return table
        schema, _, bare = name.rpartition(".")
        schema = schema or self.options.db_schema or ""
        try:
            table = sa.Table(bare, sa.MetaData(), autoload_with=conn, schema=schema or None)
        except sa_exc.NoSuchTableError:
            raise ConfigurationError(
                f"The sink's database has no table `{name}` ({self._masked}): create it, or fix "
                "the name passed to the writer."
            ) from None
        check_transactional(conn, bare, schema or None)
        with self._lock:
            self._tables[name] = table
        return table

    def _scrub(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    @contextmanager
    def _errors(self, action: str) -> Iterator[None]:
        try:
            yield
        except sa_exc.SQLAlchemyError as exc:
            what = f"SqlSink could not {action} at `{self._masked}`"
            raise sink_error(exc, what, self._scrub) from exc


def locked_read(positions: sa.Table, dialect: sa.Dialect) -> sa.Select[Any]:
    """A read of the position table that locks the rows it returns until the transaction ends:
    ``FOR UPDATE``; SQL Server's dialect renders none, so an ``UPDLOCK`` hint there; SQLite's
    ``BEGIN IMMEDIATE`` has locked the whole database already. (A claim's write and a batch's
    mark are compare-and-sets as well, so the lock makes errors clearer; it is not what keeps a
    stale owner out.)"""
    query = sa.select(positions)
    if dialect.name == "mssql":
        return query.with_hint(positions, "WITH (UPDLOCK, ROWLOCK)", dialect_name="mssql")
    if dialect.name == "sqlite":
        return query
    return query.with_for_update()


def _position_table(name: str, schema: str | None) -> sa.Table:
    return sa.Table(
        name,
        sa.MetaData(),
        sa.Column("namespace", sa.String(63), primary_key=True),
        sa.Column("poller", sa.String(255), primary_key=True),
        sa.Column("fence", sa.BigInteger, nullable=False),
        sa.Column("sequence", sa.BigInteger, nullable=False),
        sa.Column("position_before", sa.Text, nullable=True),
        sa.Column("position_after", sa.Text, nullable=True),
        sa.Column("rows", sa.BigInteger, nullable=False),
        sa.Column("updated_at", sa.String(40), nullable=False),
        schema=schema,
        mysql_engine="InnoDB",
    )


_CAS: weakref.WeakKeyDictionary[sa.Table, sa.Update] = weakref.WeakKeyDictionary()


def _compare_and_set(positions: sa.Table) -> sa.Update:
    """The mark's ``UPDATE``: the columns of its parameters set where the record is the one
    named by ``w_namespace``/``w_poller`` and still holds ``w_fence``/``w_sequence``. Built
    once per position table (a statement built per batch costs SQLAlchemy more than the
    statement costs the database)."""
    statement = _CAS.get(positions)
    if statement is None:
        statement = sa.update(positions).where(
            positions.c.namespace == sa.bindparam("w_namespace"),
            positions.c.poller == sa.bindparam("w_poller"),
            positions.c.fence == sa.bindparam("w_fence"),
            positions.c.sequence == sa.bindparam("w_sequence"),
        )
        _CAS[positions] = statement
    return statement


def _is(positions: sa.Table, key: PollerKey) -> sa.ColumnElement[bool]:
    return sa.and_(positions.c.namespace == key.namespace, positions.c.poller == key.poller)


def _fresh(key: PollerKey, fence: int) -> dict[str, Any]:
    return {
        "namespace": key.namespace,
        "poller": key.poller,
        "fence": fence,
        "sequence": 0,
        "position_before": None,
        "position_after": None,
        "rows": 0,
        "updated_at": _now(),
    }


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat()


def _encode(position: Position | None) -> str | None:
    if position is None:
        return None
    return json.dumps(position.to_json(), sort_keys=True, separators=(",", ":"))


def _decode(text: str | None) -> Position | None:
    return None if text is None else Position.from_json(json.loads(text))


def _mark(row: sa.Row[Any]) -> SinkMark:
    data = row._mapping
    return SinkMark(
        fence=int(data["fence"]),
        sequence=int(data["sequence"]),
        before=_decode(data["position_before"]),
        after=_decode(data["position_after"]),
        rows=int(data["rows"]),
    )
