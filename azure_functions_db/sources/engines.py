"""The source's SQLAlchemy engine: created with our pool defaults, then set up per dialect.

Per engine, never globally: PostgreSQL learns the types SQLAlchemy does not know (``xid8``), and
MySQL/MariaDB connections read ``TIMESTAMP`` columns in UTC.

Reads autocommit. Everything a source reads is one statement (a keyset batch, a horizon, a
count), so a transaction around it buys nothing and costs a ``BEGIN`` and the pool's
reset-on-return ``ROLLBACK`` per checkout: two round trips, and on PostgreSQL the rollback of a
transaction that read ``pg_stat_activity`` is most of a horizon query's time. Each statement then
sees the database as of its own start, as it does under PostgreSQL's default READ COMMITTED
(MySQL's REPEATABLE READ snapshot only ever spanned one statement here, since every checkout
ended with a rollback). Writes (the outbox's deletes) take a real transaction:
:func:`transaction`. Only for dialects that can tell an autocommit connection apart, so the
pool's rollback can be skipped on those; others keep the driver's default.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

from azure_functions_db.errors import ConfigurationError
from azure_functions_db.sources import _pgtypes as pgtypes

DEFAULT_CONNECT_TIMEOUT = 10.0

# The URL forms we install drivers for, by backend: a URL without `+driver` selects SQLAlchemy's
# default driver (psycopg2, MySQLdb), which `afdb[postgres]`/`afdb[mysql]` do not install.
_PG = ("postgresql+psycopg://user:password@host:5432/db", "postgres")
_MY = ("mysql+pymysql://user:password@host:3306/db", "mysql")
_DRIVER_URLS = {
    "postgresql": _PG,
    "postgres": _PG,
    "mysql": _MY,
    "mariadb": _MY,
    "mssql": ("mssql+pyodbc://user:password@host/db?driver=ODBC+Driver+18+for+SQL+Server", "mssql"),
}


def check_connect_timeout(value: object) -> float:
    """``connect_timeout=`` as seconds: a positive number."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 3600:
        raise ConfigurationError(
            f"`connect_timeout={value!r}` must be a number of seconds between 0 and 3600 "
            f"(e.g. `connect_timeout={DEFAULT_CONNECT_TIMEOUT:g}`)."
        )
    return float(value)


def create(
    url: sa.URL,
    engine_options: Mapping[str, Any],
    masked_url: str,
    scrub: Callable[[str], str],
    *,
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
) -> sa.Engine:
    """An engine for ``url``; errors name ``masked_url`` and pass through ``scrub``."""
    backend = url.drivername.partition("+")[0]
    if url.drivername == "postgres":  # not a SQLAlchemy name at all (Heroku-style URLs)
        driverless_url_error(url.drivername, masked_url)
    # No pre-ping: it would double the round trips of an idle run. A pooled connection the
    # server dropped fails as a disconnect, SQLAlchemy invalidates it, and the engine's
    # bounded retry of TransientSourceError takes a fresh one. Recycling keeps connections
    # younger than typical server-side idle timeouts.
    options: dict[str, Any] = {"pool_pre_ping": False, "pool_recycle": 1800}
    try:
        options.update(_autocommit_reads(url))
        options.update(engine_options)
        options["connect_args"] = _with_connect_timeout(
            url, dict(options.get("connect_args") or {}), connect_timeout
        )
        engine = sa.create_engine(url, **options)
    except ImportError as exc:  # also SQLAlchemy's NoSuchModuleError
        if "+" not in url.drivername and backend in _DRIVER_URLS:
            driverless_url_error(url.drivername, masked_url, exc)
        raise ConfigurationError(
            f"Cannot load the database driver for `{masked_url}` ({exc}). Install it, "
            "e.g. `pip install afdb[postgres]` (or `[mysql]`, `[mssql]`)."
        ) from exc
    except (sa_exc.ArgumentError, TypeError) as exc:
        raise ConfigurationError(
            f"Cannot create an engine for `{masked_url}` with `engine_options="
            f"{sorted(engine_options)}`: {scrub(str(exc))}"
        ) from exc
    pgtypes.register(engine)
    utc_sessions(engine)
    _bound_pymysql_handshake(engine, connect_timeout)
    return engine


def shared_across_threads(engine: sa.Engine) -> bool:
    """Whether a connection taken on another thread reaches the same database: not with a
    connection per thread (``SingletonThreadPool``, SQLAlchemy's pool for an in-memory SQLite)
    nor one connection for all (``StaticPool``: the driver may refuse another thread)."""
    return not isinstance(engine.pool, sa.pool.SingletonThreadPool | sa.pool.StaticPool)


def driverless_url_error(drivername: str, masked_url: str, cause: Exception | None = None) -> None:
    """Raise: a URL that names no driver (``mysql://``) selects one afdb does not install."""
    example, extra = _DRIVER_URLS[drivername.partition("+")[0]]
    form = example.split("://", 1)[0]
    raise ConfigurationError(
        f"The database URL `{masked_url}` names no driver (`{drivername}://`), which selects "
        f"one afdb does not install. Use `{form}://`, e.g. `{example}`, with the `afdb[{extra}]` "
        "extra."
    ) from cause


def _with_connect_timeout(
    url: sa.URL, connect_args: dict[str, Any], timeout: float
) -> dict[str, Any]:
    """``connect_args`` with the driver's connect/login timeout, unless the URL or the caller
    set it already. SQLite opens a file: nothing to bound."""
    driver = url.get_driver_name()
    option = {"psycopg": "connect_timeout", "psycopg2": "connect_timeout", "pymysql":
              "connect_timeout", "pyodbc": "timeout"}.get(driver)  # fmt: skip
    if option is None or option in connect_args or option in url.query:
        return connect_args
    if driver.startswith("psycopg"):
        # libpq takes whole seconds and treats less than 2 as 2.
        connect_args[option] = max(2, round(timeout))
    elif driver == "pyodbc":
        connect_args[option] = max(1, round(timeout))
    else:
        connect_args[option] = timeout
    return connect_args


def _bound_pymysql_handshake(engine: sa.Engine, timeout: float) -> None:
    """PyMySQL's ``connect_timeout`` bounds only the TCP connect; the server's greeting and the
    login are read with ``read_timeout`` (none by default), so a server that accepts and then
    says nothing hangs the connect for ever. Bound those reads by the connect timeout, then
    give the connection back its own read timeout for queries. Neither listener connects: the
    driver's connect runs after every ``do_connect`` listener (Entra ID sign-in puts its token
    into the arguments in one of them)."""
    if engine.dialect.driver != "pymysql":
        return

    @sa.event.listens_for(engine, "do_connect")
    def _bound(dialect: Any, record: Any, cargs: Any, cparams: dict[str, Any]) -> None:
        record.info[_QUERY_READ_TIMEOUT] = cparams.get("read_timeout")
        cparams["read_timeout"] = cparams.get("connect_timeout") or timeout

    @sa.event.listens_for(engine, "connect", insert=True)
    def _unbound(dbapi_connection: Any, record: Any) -> None:
        # PyMySQL keeps the query read timeout in `_read_timeout` and applies it before each
        # read; there is no public setter.
        dbapi_connection._read_timeout = record.info.pop(_QUERY_READ_TIMEOUT, None)


_QUERY_READ_TIMEOUT = "afdb_query_read_timeout"


def utc_sessions(engine: sa.Engine) -> None:
    """Every connection of ``engine`` runs in UTC (PostgreSQL, MySQL/MariaDB).

    PostgreSQL: ``timestamptz`` values arrive as UTC instants, whatever the role's, database's
    or client's (``PGTZ``) zone, so the same row version reads (and hashes into ``event_id``)
    the same in every process. The session's ``SET`` leaves ``reset_val`` at the default zone
    new sessions get, which :mod:`._zones` checks against ``cursor_timezone``.

    MySQL/MariaDB: every connection of ``engine`` reads ``TIMESTAMP`` columns in UTC.

    The server converts ``TIMESTAMP`` values (stored in UTC) to the session's zone, which is the
    server's ``SYSTEM`` zone unless set: in a zone with daylight saving time, the hour repeated in
    autumn would read as equal wall-clock values for different instants, and positions bound back
    in that zone are ambiguous. ``DATETIME`` columns are not converted (they hold wall-clock time
    in ``cursor_timezone``).
    """
    statement = {
        "mysql": "SET time_zone = '+00:00'",
        "mariadb": "SET time_zone = '+00:00'",
        "postgresql": "SET TIME ZONE 'UTC'",
    }.get(engine.dialect.name)
    if statement is None:
        return

    @sa.event.listens_for(engine, "connect")
    def _set_utc(dbapi_connection: Any, connection_record: Any) -> None:
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(statement)
        finally:
            cursor.close()
        if engine.dialect.name == "postgresql":
            dbapi_connection.commit()  # end the transaction the SET began, keep the setting


def _autocommit_reads(url: sa.URL) -> dict[str, Any]:
    """``AUTOCOMMIT``, and no rollback of autocommit connections, where the dialect supports it.

    ``skip_autocommit_rollback`` needs the dialect to tell an autocommit connection apart
    (psycopg, pymysql, pysqlite, pyodbc, ... do); a connection switched to a transaction by
    :func:`transaction` is still rolled back normally. ``engine_options`` may override both.
    """
    dialect = url.get_dialect()
    if dialect.detect_autocommit_setting is sa.engine.Dialect.detect_autocommit_setting:
        return {}
    return {"isolation_level": "AUTOCOMMIT", "skip_autocommit_rollback": True}


@contextmanager
def transaction(engine: sa.Engine) -> Iterator[sa.Connection]:
    """A connection in a real transaction, committed at the end and rolled back on an error.

    On an engine whose reads autocommit, the connection runs at the database's default isolation
    level for this block; the pool puts it back in autocommit when it is returned.
    """
    with engine.connect() as conn:
        if _autocommits(conn):
            try:
                conn.execution_options(isolation_level=conn.default_isolation_level)
            except Exception as exc:
                # Switching the isolation talks to the server on some drivers (PyMySQL sends
                # `SET autocommit`), outside SQLAlchemy's disconnect handling: on a connection
                # the server closed (KILL, a restart) the driver's own error comes out, and the
                # pool would hand the dead connection out again and again. Drop it, and say it
                # as the lost connection it most likely is (a retry takes a new one).
                conn.invalidate(exc)
                raise sa_exc.DisconnectionError(
                    f"the connection failed when its transaction began ({type(exc).__name__}: "
                    f"{exc})"
                ) from exc
        with conn.begin():
            yield conn


def _autocommits(conn: sa.Connection) -> bool:
    dbapi_connection = conn.connection.dbapi_connection
    if dbapi_connection is None:
        return False
    try:
        return bool(conn.dialect.detect_autocommit_setting(dbapi_connection))
    except NotImplementedError:
        return False
