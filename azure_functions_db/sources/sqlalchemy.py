"""``SqlSource``: changed rows of one table, read in keyset batches with SQLAlchemy 2 Core.

Works with every database SQLAlchemy has a dialect for (PostgreSQL, MySQL/MariaDB, SQL Server,
SQLite, ...). Tables and columns are reflected and quoted by SQLAlchemy; values are always bound
parameters; a user filter is a SQLAlchemy clause or SQL text whose values go in ``params=``.

Time zones. Positions carry exactly the values the driver returned and are bound back unchanged,
so they compare in the database exactly as the rows do. A *naive* date-time cursor column (SQLite
``DATETIME``, PostgreSQL ``timestamp``, MySQL ``DATETIME``/``TIMESTAMP``, SQL Server
``datetime2``) is taken to hold wall-clock time in ``cursor_timezone`` (UTC unless set): that rule
is used only where this module makes a time value itself, namely the lag horizon and operator
input to ``seek --cursor``. Aware columns (``timestamptz``, ``datetimeoffset``) need no zone.
"""

from __future__ import annotations

import copy
import datetime as dt
import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.sql.elements import ColumnElement, TextClause

from azure_functions_db.core.arguments import known_arguments
from azure_functions_db.core.batch import Change
from azure_functions_db.core.checkpoint import SourceDescription
from azure_functions_db.core.clock import Clock, SystemClock
from azure_functions_db.core.ports import Horizon, SourceHealth, SourceRow
from azure_functions_db.core.position import KeyValue, Position
from azure_functions_db.core.reader import SelectedRows
from azure_functions_db.errors import (
    AfdbError,
    CodecError,
    ConfigurationError,
    SourceError,
)
from azure_functions_db.sources import _collations as collations
from azure_functions_db.sources import _config as config
from azure_functions_db.sources import _lag as backlog
from azure_functions_db.sources import _sqlite_times as sqlite_times
from azure_functions_db.sources import _zones as zones
from azure_functions_db.sources import engines, entra, health, shards, urls
from azure_functions_db.sources._errors import translate
from azure_functions_db.sources._horizon import (
    AutoHorizon,
    HorizonStrategy,
    LagHorizon,
    NoHorizon,
    horizon_strategy,
)
from azure_functions_db.sources._rows import RowShape, driver_rows
from azure_functions_db.sources._target import HorizonTarget
from azure_functions_db.sources.keyset import KeysetQuery, deletion_test, picker
from azure_functions_db.sources.values import parse_cursor

__all__ = ["AutoHorizon", "HorizonStrategy", "LagHorizon", "NoHorizon", "SqlSource"]

logger = logging.getLogger(__name__)


class SqlSource:
    """Changed rows of ``table``, in ``ORDER BY cursor..., pk...`` keyset batches.

    Args:
        url: SQLAlchemy URL (text or ``sqlalchemy.URL``); ``%NAME%`` placeholders (the whole
            URL or parts of it) are read from app settings in :meth:`open`, each value into
            its own part of the URL as it is (a password may hold ``@ / # % : ?``).
        connection: Instead of ``url``: the name of the app setting that holds the whole URL
            (``connection="ORDERS_DB"`` is ``url="%ORDERS_DB%"``).
        credential: Entra ID sign-in instead of a password: an ``azure.identity`` credential
            or ``"default"`` (see :mod:`azure_functions_db.sources.entra`).
        table: Table (or view) name. ``schema=`` names its schema.
        cursor: Column(s) that never decrease when a row changes, e.g. ``updated_at``.
        pk: Unique, stable column(s) breaking ties; ``None`` uses the table's primary key.
        where: Extra filter: a SQLAlchemy clause (``sa.column("status") == "paid"``) or SQL
            text with ``:name`` parameters whose values go in ``params=``. Never splice values
            into the text. Its SQL and parameter names (not values) are fingerprinted into the
            checkpoint's source description.
        params: Values of the ``:name`` parameters of ``where``.
        columns: Columns to read into ``SourceRow.data`` (cursor and pk columns always are);
            ``None`` reads all.
        lag: Seconds (or a timedelta) a row must age before it is read; needs a date-time cursor.
        cursor_timezone: IANA zone of a naive date-time cursor (default UTC).
        on_null_cursor: ``"skip"`` counts and reports rows with a NULL cursor in :meth:`check`;
            ``"raise"`` makes :meth:`check` raise ``NullCursorError``.
        engine_options: Extra ``sqlalchemy.create_engine`` arguments.
        connect_timeout: Seconds a new connection may take (connect, TLS, login) before it
            fails as a transient error (default 10), through the driver's own option unless the
            URL or ``engine_options["connect_args"]`` sets it (see ``sources.engines``).
        soft_delete: Column that marks a row deleted: the row is delivered with
            ``Change.op == "delete"`` when the column is true (boolean or number) or, for any
            other type (e.g. a ``deleted_at`` time), not NULL. The update that sets it must also
            move the cursor, or the deletion is never seen.
        horizon: Horizon strategy. ``"auto"`` (the default) picks the commit-safe method of the
            dialect and cursor type (PostgreSQL snapshot xmin or oldest open transaction,
            MySQL/MariaDB ``innodb_trx``, SQL Server ``MIN_ACTIVE_ROWVERSION()``) and falls back
            to ``lag`` saying so once, loudly; ``"lag"``, ``"none"``, or a strategy object.
        clock: Time source for the horizon; default the system clock.
    """

    @known_arguments("SqlSource")
    def __init__(
        self,
        url: str | sa.URL | None = None,
        table: str = "",
        cursor: str | Sequence[str] = (),
        pk: str | Sequence[str] | None = None,
        *,
        connection: str | None = None,
        schema: str | None = None,
        where: ColumnElement[bool] | TextClause | str | None = None,
        params: Mapping[str, Any] | None = None,
        columns: Sequence[str] | None = None,
        lag: float | dt.timedelta = 0,
        cursor_timezone: str | None = None,
        on_null_cursor: Literal["skip", "raise"] = "skip",
        engine_options: Mapping[str, Any] | None = None,
        connect_timeout: float = engines.DEFAULT_CONNECT_TIMEOUT,
        soft_delete: str | None = None,
        horizon: HorizonStrategy | Literal["auto", "lag", "none"] | None = None,
        clock: Clock | None = None,
        credential: Any = None,
    ) -> None:
        self.url_template = urls.url_template(url, connection, "SqlSource")
        self._credential = None if credential is None else entra.check_credential(credential)
        self._table_name = config.check_name(table, "table")
        self._schema = None if schema is None else config.check_name(schema, "schema")
        self._qualified = f"{self._schema}.{self._table_name}" if schema else self._table_name
        self._cursor_names = config.check_names(cursor, "cursor")
        self._pk_names = None if pk is None else config.check_names(pk, "pk")
        self._column_names = None if columns is None else config.check_names(columns, "columns")
        self._soft_delete = (
            None if soft_delete is None else config.check_name(soft_delete, "soft_delete")
        )
        self._lag = config.check_lag(lag)
        self._zone = config.check_zone(cursor_timezone)
        self._zone_given = cursor_timezone is not None
        if on_null_cursor not in ("skip", "raise"):
            raise ConfigurationError(
                f'`on_null_cursor={on_null_cursor!r}` is not an option: use `"skip"` (count and '
                'report NULL-cursor rows) or `"raise"` (fail the check).'
            )
        self._on_null_cursor = on_null_cursor
        self._where, self._params, self._where_print = config.where_filter(where, params)
        if engine_options is not None and not isinstance(engine_options, Mapping):
            raise ConfigurationError(
                f"`engine_options` must be a mapping of create_engine arguments, got "
                f"`{engine_options!r}`."
            )
        self._engine_options = dict(engine_options or {})
        self._connect_timeout = engines.check_connect_timeout(connect_timeout)
        self._horizon, self._horizon_given = horizon_strategy(horizon), horizon
        self._shard: shards.Shard | None = None
        self._clock: Clock = clock or SystemClock()
        self._text_times: list[sqlite_times.TextDateTime] = []
        self._engine: sa.Engine | None = None
        self._query: KeysetQuery | None = None
        self._masked_url = urls.masked_url(self.url_template)
        self._secrets: tuple[str, ...] = ()
        self._shape = RowShape((), cursor_of=picker([]), pk_of=picker([]))
        self._description: SourceDescription | None = None

    # -- configuration seen by the engine and horizon strategies ----------------------------

    @property
    def description(self) -> SourceDescription:
        """Table (schema-qualified), cursor and pk columns, ``where`` fingerprint, columns read.

        With ``pk=None`` the primary key, and the columns read, are known only after
        :meth:`open`; before, ``pk`` is empty and ``columns`` is ``None``.
        """
        if self._description is not None:
            return self._description
        return SourceDescription(
            table=self._qualified,
            cursor=self._cursor_names,
            pk=self._pk_names or (),
            where=shards.described(self._where_print, None, self._shard),
        )

    @property
    def cursor_timezone(self) -> dt.tzinfo:
        """The zone a naive date-time cursor holds wall-clock time in (UTC unless configured)."""
        return self._zone

    @property
    def reads_from_any_thread(self) -> bool:
        """Read ahead on another thread? Not for a subclass that overrides a fetch method."""
        engine, cls = self._engine, type(self)
        own = cls.fetch is SqlSource.fetch and cls.fetch_changes is SqlSource.fetch_changes
        return own and engine is not None and engines.shared_across_threads(engine)

    @property
    def engine(self) -> sa.Engine:
        """The SQLAlchemy engine; raises if the source is not open."""
        self._require_open()
        assert self._engine is not None
        return self._engine

    @property
    def cursor_columns(self) -> tuple[sa.Column[Any], ...]:
        """The reflected cursor columns; raises if the source is not open."""
        return self._require_open().cursor

    @property
    def pk_columns(self) -> tuple[sa.Column[Any], ...]:
        """The reflected pk columns; raises if the source is not open."""
        return self._require_open().pk

    @property
    def shard_term(self) -> shards.ShardTerm | None:
        """A shard's column or expression (``None`` unsharded); raises if not open."""
        return self._require_open().shard

    def shard(self, index: int, count: int) -> SqlSource:
        """Shard ``index`` of ``count`` (:mod:`~.shards`): an unopened copy reading only its
        rows, with its own horizon strategy (shared if ``horizon=`` passed an object)."""
        if self._shard is not None:
            raise ConfigurationError("shard an unsharded source")
        part = copy.copy(self)
        part._engine = part._query = part._description = None  # its own, when it opens
        part._shard, part._horizon = (
            shards.Shard(index, count),
            horizon_strategy(self._horizon_given),
        )
        return part

    # -- the Source port ---------------------------------------------------------------------

    def open(self, settings: Mapping[str, str]) -> None:
        """Resolve ``%NAME%`` placeholders, create the engine, reflect the table. Idempotent."""
        if self._query is not None:
            return
        owner = f"the source of table `{self._qualified}`"
        url = urls.resolve_url(self.url_template, settings, owner)
        self._masked_url = urls.render_masked(url)
        self._secrets = urls.url_secrets(url)
        engine = self._create_engine(url)
        try:
            with self._db_errors("reflect"), engine.connect() as conn:
                table = self._reflect(conn)
                keys = (*self._cursor_names, *(self._pk_names or ()))
                self._text_times = sqlite_times.adopt(conn, table, keys, self._qualified)
                if self._cursor_names[0] in table.c:
                    zones.check_writer_zone(
                        conn,
                        table.c[self._cursor_names[0]],
                        self._zone,
                        self._qualified,
                        self._clock.now(),
                        explicit=self._zone_given,
                    )
            self._engine, self._query = engine, self._build(table, engine.dialect)
            names = tuple(column.name for column in self._query.selected)
            self._shape = RowShape(
                names,
                cursor_of=picker([names.index(c.name) for c in self._query.cursor]),
                pk_of=picker([names.index(c.name) for c in self._query.pk]),
                deleted=None
                if self._soft_delete is None
                else deletion_test(self._query.table.c[self._soft_delete], names),
            )
            self._description = SourceDescription(
                table=self._qualified,
                cursor=self._cursor_names,
                pk=tuple(c.name for c in self._query.pk),
                where=shards.described(self._where_print, self._query.shard),
                columns=names,
            )
            with self._db_errors("horizon"):  # a connection lost here is transient too
                self._horizon.prepare(self.horizon_target())
        except BaseException:
            self._engine = self._query = self._description = None
            engine.dispose()
            raise
        logger.info(
            "action=source_open table=%s url=%s cursor=%s pk=%s horizon=%s",
            self._qualified,
            self._masked_url,
            ",".join(self._cursor_names),
            ",".join(self.description.pk),
            self._horizon.name,
        )

    def horizon(self) -> Horizon:
        """The bound of the next batch, from the horizon strategy (the lag costs no query)."""
        self._require_open()
        with self._db_errors("horizon"):
            bound = self._horizon.bound(self.horizon_target(), self._clock.now())
        return Horizon(
            bound=bound,
            method=self._horizon.name if bound is not None else "none",
            detail=getattr(self._horizon, "detail", ""),
            hold=getattr(self._horizon, "hold", None),
            fix=getattr(self._horizon, "fix", None),
            privileges=getattr(self._horizon, "privileges", ()),
        )

    def fetch(self, after: Position | None, limit: int, horizon: Horizon) -> Sequence[SourceRow]:
        """Up to ``limit`` rows strictly after ``after`` and below ``horizon``, in keyset order."""
        rows = self._select(after, limit, horizon)
        try:
            return self._shape.rows(rows)
        except CodecError as exc:
            raise self._unstorable(exc) from exc

    def fetch_changes(
        self, after: Position | None, limit: int, horizon: Horizon, poller: str
    ) -> Sequence[Change]:
        """What :meth:`fetch` returns, as ``poller``'s ``Change`` objects (``ChangeSource``)."""
        if type(self).fetch is not SqlSource.fetch:  # a subclass reads its own way: honour it
            rows = self.fetch(after, limit, horizon)
            return [Change(row.data, row.position, poller, row.op) for row in rows]
        return self.changes_of(self.select(after, limit, horizon), poller)

    def select(self, after: Position | None, limit: int, horizon: Horizon) -> SelectedRows:
        """The database's part of :meth:`fetch_changes`, on any thread (``ReadAheadSource``)."""
        selected = self._select(after, limit, horizon)
        try:
            return SelectedRows(selected, self._shape.last(selected))
        except CodecError as exc:
            raise self._unstorable(exc) from exc

    def changes_of(self, selected: SelectedRows, poller: str) -> Sequence[Change]:
        """The rows :meth:`select` returned as ``poller``'s changes (``ReadAheadSource``)."""
        return self._shape.changes(selected.rows, poller, selected.last)

    def latest(self, horizon: Horizon) -> Position | None:
        """Position of the last row below ``horizon`` (for ``seek --now``), or ``None``."""
        query = self._require_open()
        statement = query.latest(horizon.bound is not None, until=horizon.until is not None)
        parameters = query.parameters(None, horizon.bound, self._params, horizon.until)
        with self._db_errors("latest"), self.engine.connect() as conn:
            row = conn.execute(statement, parameters).first()
        if row is None:
            return None
        count = len(query.cursor)
        return self._position(tuple(row[:count]), tuple(row[count:]))

    def rows_after(self, after: Position | None, horizon: Horizon, cap: int) -> int:
        """Rows :meth:`fetch` would still return after ``after``, counting at most ``cap``."""
        query = self._require_open()
        self._check_position(after, query)
        with self._db_errors("count"), self.engine.connect() as conn:
            return backlog.rows_after(conn, query, after, horizon, params=self._params, cap=cap)

    def parse_cursor(self, text: str) -> tuple[KeyValue, ...]:
        """Operator text as cursor values; composite cursors take comma-separated values.

        Whitespace around comma-separated values is ignored; a single text cursor is taken as
        is. Date-times use ISO 8601; bytes (``rowversion``) are hexadecimal, ``0x`` optional.
        """
        return parse_cursor(text, self._require_open().cursor, self._zone, self._qualified)

    def check(self) -> SourceHealth:
        """Count NULL-cursor rows (raising ``NullCursorError`` if so configured); check indexes
        (and a shard's generated column): see :func:`.health.findings`."""
        query = self._require_open()
        with self._db_errors("check"), self.engine.connect() as conn:
            null_rows, warnings = health.findings(
                conn,
                query,
                self._params,
                qualified=self._qualified,
                schema=self._schema,
                raise_on_null=self._on_null_cursor == "raise",
                logger=logger,
            )
            sqlite_times.recheck(conn, query.table, self._text_times, self._qualified)
        return SourceHealth(null_cursor_rows=null_rows, warnings=tuple(warnings))

    def describe_order(self) -> list[str]:
        """How the database compares the key (collations, a naive cursor's zones): validate."""
        query = self._require_open()
        columns = [*query.cursor, *query.pk]
        with self._db_errors("describe"), self.engine.connect() as conn:
            return collations.describe(conn, columns, self._schema, self._zone)

    def close(self) -> None:
        """Dispose of the engine and its pool; :meth:`open` may be called again."""
        engine, self._engine, self._query, self._description = self._engine, None, None, None
        if engine is not None:
            engine.dispose()
            logger.info("action=source_close table=%s", self._qualified)

    def __repr__(self) -> str:
        return (
            f"SqlSource(url={self._masked_url!r}, table={self._qualified!r}, "
            f"cursor={list(self._cursor_names)!r}, pk={self._pk_names and list(self._pk_names)!r})"
        )

    # -- internals ---------------------------------------------------------------------------

    def _require_open(self) -> KeysetQuery:
        if self._query is None:
            raise SourceError(
                f"The source of table `{self._qualified}` is not open: call `open(settings)` "
                "before reading from it."
            )
        return self._query

    def _create_engine(self, url: sa.URL) -> sa.Engine:
        engine = engines.create(
            url,
            self._engine_options,
            self._masked_url,
            self._scrub,
            connect_timeout=self._connect_timeout,
        )
        if self._credential is not None:
            entra.sign_in_with_tokens(engine, self._credential, self._masked_url)
        return engine

    def _reflect(self, conn: sa.Connection) -> sa.Table:
        try:
            # The primary key only when `pk=` does not name the key.
            return config.reflect_table(
                conn, self._table_name, self._schema, primary_key=self._pk_names is None
            )
        except sa_exc.NoSuchTableError:
            existing = sa.inspect(conn).get_table_names(schema=self._schema)
        raise config.missing_table(
            self._table_name, self._schema, existing, self._masked_url
        ) from None

    def horizon_target(self) -> HorizonTarget:
        """What the horizon strategy is given of this source (and nothing else)."""
        cursor, zone, lag = self.cursor_columns[0], self._zone, self._lag
        return HorizonTarget(self.engine, cursor, zone, lag, self._qualified)

    def _build(self, table: sa.Table, dialect: sa.Dialect) -> KeysetQuery:
        return config.keyset_query(
            table,
            dialect.name,
            driver=dialect.driver,
            cursor=self._cursor_names,
            pk=self._pk_names,
            columns=self._column_names,
            soft_delete=self._soft_delete,
            where=self._where,
            qualified=self._qualified,
            shard=None if self._shard is None else (self._shard, dialect),
        )

    def _check_position(self, after: Position | None, query: KeysetQuery) -> None:
        config.check_position(after, query, self._qualified, self.description.pk)

    def _select(self, after: Position | None, limit: int, horizon: Horizon) -> Sequence[Any]:
        query = self._require_open()
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ConfigurationError(f"`limit={limit!r}` must be a positive number of rows.")
        self._check_position(after, query)
        if any(t.text_format is None for t in self._text_times):
            with self._db_errors("fetch"), self.engine.connect() as conn:
                sqlite_times.recheck(conn, query.table, self._text_times, self._qualified)
        statement = query.batch(
            query.start_of(after), horizon.bound is not None, limit, until=horizon.until is not None
        )
        parameters = query.parameters(after, horizon.bound, self._params, horizon.until)
        with self._db_errors("fetch"), self.engine.connect() as conn:
            return driver_rows(conn.execute(statement, parameters))

    def _position(self, cursor: tuple[Any, ...], pk: tuple[Any, ...]) -> Position:
        try:
            return Position(cursor=cursor, pk=pk)
        except CodecError as exc:
            raise self._unstorable(exc) from exc

    def _unstorable(self, exc: CodecError) -> SourceError:
        return SourceError(
            f"A row of `{self._qualified}` has a cursor or key value a checkpoint cannot hold: "
            f"{exc}"
        )

    @contextmanager
    def _db_errors(self, action: str) -> Iterator[None]:
        """Translate driver errors at the edge, with the password masked."""
        try:
            yield
        except AfdbError:
            raise
        except sa_exc.SQLAlchemyError as exc:
            raise translate(exc, action, self._qualified, self._masked_url, self._scrub) from exc
        except (ValueError, TypeError) as exc:  # result processors: a value the type cannot read
            raise SourceError(
                f"Reading `{self._qualified}` ({action}) failed: {self._scrub(str(exc))}"
            ) from exc

    def _scrub(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text
