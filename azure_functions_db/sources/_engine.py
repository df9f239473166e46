"""The source's SQLAlchemy engine: created with our pool defaults, then set up per dialect.

Per engine, never globally: PostgreSQL learns the types SQLAlchemy does not know (``xid8``), and
MySQL/MariaDB connections read ``TIMESTAMP`` columns in UTC.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

from azure_functions_db.errors import ConfigurationError
from azure_functions_db.sources import _pgtypes as pgtypes


def create(
    url: sa.URL,
    engine_options: Mapping[str, Any],
    masked_url: str,
    scrub: Callable[[str], str],
) -> sa.Engine:
    """An engine for ``url``; errors name ``masked_url`` and pass through ``scrub``."""
    # No pre-ping: it would double the round trips of an idle run. A pooled connection the
    # server dropped fails as a disconnect, SQLAlchemy invalidates it, and the engine's
    # bounded retry of TransientSourceError takes a fresh one. Recycling keeps connections
    # younger than typical server-side idle timeouts.
    options = {"pool_pre_ping": False, "pool_recycle": 1800, **engine_options}
    try:
        engine = sa.create_engine(url, **options)
    except ImportError as exc:  # also SQLAlchemy's NoSuchModuleError
        raise ConfigurationError(
            f"Cannot load the database driver for `{masked_url}` ({exc}). Install it, "
            "e.g. `pip install azure-functions-db[postgres]` (or `[mysql]`, `[mssql]`)."
        ) from exc
    except (sa_exc.ArgumentError, TypeError) as exc:
        raise ConfigurationError(
            f"Cannot create an engine for `{masked_url}` with `engine_options="
            f"{sorted(engine_options)}`: {scrub(str(exc))}"
        ) from exc
    pgtypes.register(engine)
    utc_sessions(engine)
    return engine


def utc_sessions(engine: sa.Engine) -> None:
    """MySQL/MariaDB: every connection of ``engine`` reads ``TIMESTAMP`` columns in UTC.

    The server converts ``TIMESTAMP`` values (stored in UTC) to the session's zone, which is the
    server's ``SYSTEM`` zone unless set: in a zone with daylight saving time, the hour repeated in
    autumn would read as equal wall-clock values for different instants, and positions bound back
    in that zone are ambiguous. ``DATETIME`` columns are not converted (they hold wall-clock time
    in ``cursor_timezone``).
    """
    if engine.dialect.name not in ("mysql", "mariadb"):
        return

    @sa.event.listens_for(engine, "connect")
    def _set_utc(dbapi_connection: Any, connection_record: Any) -> None:
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute("SET time_zone = '+00:00'")
        finally:
            cursor.close()
