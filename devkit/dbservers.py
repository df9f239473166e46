"""The PostgreSQL and MariaDB servers of the service tier: URLs, reachability, scratch namespaces.

Both servers run locally and in CI (PostgreSQL 15 on 127.0.0.1:5432 with trust auth, MariaDB
10.11 on 127.0.0.1:3306 as ``root`` without a password). Every test gets a fresh namespace of
its own, named ``t_`` + 12 hex digits: a schema in PostgreSQL's database ``test``, a database in
MariaDB. Tests create their tables there; the namespace is dropped afterwards.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import sqlalchemy as sa

PG_HOST, PG_PORT, PG_USER, PG_DATABASE = "127.0.0.1", 5432, "postgres", "test"
MYSQL_HOST, MYSQL_PORT, MYSQL_USER, MYSQL_DATABASE = "127.0.0.1", 3306, "root", "test"
CONNECT_TIMEOUT = 3  # seconds; an unreachable server is reported quickly, not after minutes


def pg_url(*, port: int = PG_PORT, database: str = PG_DATABASE) -> str:
    """``postgresql+psycopg://postgres@127.0.0.1:5432/test`` (tables go in a schema)."""
    return f"postgresql+psycopg://{PG_USER}@{PG_HOST}:{port}/{database}"


def mysql_url(database: str = MYSQL_DATABASE, *, port: int = MYSQL_PORT) -> str:
    """``mysql+pymysql://root@127.0.0.1:3306/<database>``."""
    return f"mysql+pymysql://{MYSQL_USER}@{MYSQL_HOST}:{port}/{database}"


def scratch_name() -> str:
    """A fresh schema/database name: ``t_`` + 12 hex digits."""
    return f"t_{uuid.uuid4().hex[:12]}"


def unavailable_reason(url: str, what: str) -> str | None:
    """Why the server at ``url`` cannot be used (driver missing, no answer), or ``None``."""
    try:
        engine = sa.create_engine(
            url, connect_args={"connect_timeout": CONNECT_TIMEOUT}, poolclass=sa.NullPool
        )
    except ImportError as exc:
        return f"{what}: the driver is not installed ({exc}); run `pip install -e '.[dev]'`"
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1").scalar_one()
    except sa.exc.DBAPIError as exc:
        first = str(exc.orig).strip().splitlines()[0] if str(exc.orig).strip() else ""
        return f"{what} at {url} does not answer: {type(exc.orig).__name__}: {first}"
    finally:
        engine.dispose()
    return None


@contextmanager
def admin_engine(url: str) -> Iterator[sa.Engine]:
    """A short-lived engine without pooling (nothing stays connected after the block)."""
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    try:
        yield engine
    finally:
        engine.dispose()


@contextmanager
def pg_schema(url: str) -> Iterator[str]:
    """A fresh schema in PostgreSQL's ``test`` database, dropped with CASCADE afterwards."""
    name = scratch_name()
    with admin_engine(url) as engine:
        with engine.begin() as conn:
            conn.exec_driver_sql(f'CREATE SCHEMA "{name}"')
        try:
            yield name
        finally:
            with engine.begin() as conn:
                conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


@contextmanager
def mysql_database(url: str) -> Iterator[str]:
    """A fresh MariaDB database, dropped afterwards."""
    name = scratch_name()
    with admin_engine(url) as engine:
        with engine.begin() as conn:
            conn.exec_driver_sql(f"CREATE DATABASE `{name}`")
        try:
            yield name
        finally:
            with engine.begin() as conn:
                conn.exec_driver_sql(f"DROP DATABASE IF EXISTS `{name}`")
