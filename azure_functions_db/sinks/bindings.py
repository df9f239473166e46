"""Input and output "bindings" for any function: read rows, write rows, outside a poller.

:class:`SqlOutput` writes rows (insert, upsert) from an HTTP-, queue- or any other triggered
function; :class:`SqlInput` reads rows by key or by query. Both take their engine from one
process-wide :class:`EngineProvider` (one SQLAlchemy engine, one pool, per database URL), the
same engine code the sources and sinks use. Nothing connects at construction: the URL is
resolved and the engine made at the first call, so declaring them at module level in
``function_app.py`` does no I/O at import.

Outside a poller there is no checkpoint: an output write is **at-least-once** under the
trigger's own retries (a queue message whose function failed is delivered again, an HTTP
client retries). ``upsert`` makes a repeated write harmless; ``insert`` does not.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

from azure_functions_db.core.batch import Change
from azure_functions_db.errors import ConfigurationError, SinkError
from azure_functions_db.sinks.writes import SqlWriter, sink_error
from azure_functions_db.sources import engines, urls


class EngineProvider:
    """One engine per resolved database URL in this process, shared by every binding."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._engines: dict[str, tuple[sa.Engine, str, tuple[str, ...]]] = {}

    def engine(self, template: str, settings: Mapping[str, str]) -> tuple[sa.Engine, str, Any]:
        """The engine for ``template`` (``%SETTING%`` resolved from ``settings``), its masked
        URL, and a function that removes the URL's secrets from a text."""
        owner = "a SqlInput/SqlOutput binding"
        url = urls.resolve_url(template, settings, owner)
        text = url.render_as_string(hide_password=False)
        with self._lock:
            made = self._engines.get(text)
            if made is None:
                masked, secrets = urls.render_masked(url), urls.url_secrets(url)
                made = (engines.create(url, {}, masked, _scrubber(secrets)), masked, secrets)
                self._engines[text] = made
        engine, masked, secrets = made
        return engine, masked, _scrubber(secrets)

    def dispose(self) -> None:
        """Close every engine's connections (tests; a process that ends needs nothing)."""
        with self._lock:
            made, self._engines = list(self._engines.values()), {}
        for engine, _, _ in made:
            engine.dispose()


#: The process's engine provider (see :class:`EngineProvider`).
PROVIDER = EngineProvider()


class _Binding:
    def __init__(self, url: str, table: str | None, provider: EngineProvider | None) -> None:
        if not isinstance(url, str) or not url.strip():
            raise ConfigurationError(
                f"`url={url!r}` must be the database's SQLAlchemy URL, e.g. "
                '`url="%ORDERS_DB_URL%"` to read it from an app setting.'
            )
        if table is not None and (not isinstance(table, str) or not table.strip()):
            raise ConfigurationError(f"`table={table!r}` must be a table name.")
        self.url, self.table = url, table
        self._masked = urls.masked_url(url)
        self._provider = provider or PROVIDER
        self._tables: dict[str, sa.Table] = {}
        self._lock = threading.Lock()

    def _engine(self, settings: Mapping[str, str] | None) -> tuple[sa.Engine, str, Any]:
        return self._provider.engine(self.url, os.environ if settings is None else settings)

    def _reflect(self, conn: sa.Connection, name: str) -> sa.Table:
        with self._lock:
            table = self._tables.get(name)
        if table is None:
            schema, _, bare = name.rpartition(".")
            try:
                table = sa.Table(bare, sa.MetaData(), autoload_with=conn, schema=schema or None)
            except sa_exc.NoSuchTableError:
                raise ConfigurationError(
                    f"The database at `{self._masked}` has no table `{name}`."
                ) from None
            with self._lock:
                self._tables[name] = table
        return table

    def _translate(self, exc: sa_exc.SQLAlchemyError, action: str, scrub: Any) -> SinkError:
        what = f"{type(self).__name__} could not {action} at `{self._masked}`"
        return sink_error(exc, what, scrub)


class SqlOutput(_Binding):
    """Write rows into ``table`` from any function, each call in its own transaction.

    At-least-once under the trigger's retries: prefer :meth:`upsert`, which a repeated call
    leaves as one row.
    """

    def __init__(
        self,
        url: str,
        table: str,
        *,
        key: Sequence[str] | None = None,
        provider: EngineProvider | None = None,
    ) -> None:
        super().__init__(url, table, provider)
        self.key = key

    def __repr__(self) -> str:
        return f"SqlOutput(url={self._masked!r}, table={self.table!r})"

    def insert(
        self, rows: Iterable[Mapping[str, Any] | Change], settings: Mapping[str, str] | None = None
    ) -> int:
        """Insert ``rows`` in one transaction; the number inserted."""
        return self._write("insert", rows, settings)

    def upsert(
        self, rows: Iterable[Mapping[str, Any] | Change], settings: Mapping[str, str] | None = None
    ) -> int:
        """Insert ``rows`` or update those whose key exists, in one transaction."""
        return self._write("upsert", rows, settings)

    def _write(
        self,
        op: str,
        rows: Iterable[Mapping[str, Any] | Change],
        settings: Mapping[str, str] | None,
    ) -> int:
        engine, _, scrub = self._engine(settings)
        assert self.table is not None
        try:
            with engines.transaction(engine) as conn:
                writer = SqlWriter(conn, self._reflect)
                if op == "insert":
                    return writer.insert(self.table, rows)
                return writer.upsert(self.table, rows, key=self.key)
        except sa_exc.SQLAlchemyError as exc:
            raise self._translate(exc, f"{op} into `{self.table}`", scrub) from exc


class SqlInput(_Binding):
    """Read rows from any function: by key from ``table``, or by a query."""

    def __init__(
        self, url: str, table: str | None = None, *, provider: EngineProvider | None = None
    ) -> None:
        super().__init__(url, table, provider)

    def __repr__(self) -> str:
        return f"SqlInput(url={self._masked!r}, table={self.table!r})"

    def get(
        self, settings: Mapping[str, str] | None = None, /, **key: Any
    ) -> dict[str, Any] | None:
        """The row of ``table`` whose columns equal ``key`` (e.g. ``get(id=7)``), or ``None``."""
        if self.table is None or not key:
            raise ConfigurationError(
                "`SqlInput.get` needs `table=` on the binding and the key as keyword arguments, "
                "e.g. `orders.get(id=7)`."
            )
        engine, _, scrub = self._engine(settings)
        try:
            with engine.connect() as conn:
                table = self._reflect(conn, self.table)
                unknown = [name for name in key if name not in table.c]
                if unknown:
                    raise ConfigurationError(f"Table `{self.table}` has no column `{unknown[0]}`.")
                query = sa.select(table).where(*(table.c[k] == v for k, v in key.items()))
                rows = conn.execute(query.limit(2)).mappings().all()
        except sa_exc.SQLAlchemyError as exc:
            raise self._translate(exc, f"read `{self.table}`", scrub) from exc
        if len(rows) > 1:
            raise ConfigurationError(
                f"`get({', '.join(f'{k}={v!r}' for k, v in key.items())})` matches more than one "
                f"row of `{self.table}`: pass the whole key, or use `query()`."
            )
        return dict(rows[0]) if rows else None

    def query(
        self, sql: str, settings: Mapping[str, str] | None = None, /, **params: Any
    ) -> list[dict[str, Any]]:
        """The rows of ``sql`` (text with ``:name`` parameters bound from ``params``; never
        splice values into the text)."""
        engine, _, scrub = self._engine(settings)
        try:
            with engine.connect() as conn:
                return [dict(r) for r in conn.execute(sa.text(sql), params).mappings()]
        except sa_exc.SQLAlchemyError as exc:
            raise self._translate(exc, "run a query", scrub) from exc


def _scrubber(secrets: tuple[str, ...]) -> Any:
    def scrub(text: str) -> str:
        for secret in secrets:
            text = text.replace(secret, "***")
        return text

    return scrub
