"""MariaDB for the benchmarks: a scratch database on the server of ``AFDB_BENCH_MYSQL_URL``
(default the tests' server), created for one benchmark and dropped afterwards."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from benchmarks import pg_fixture as pg

MYSQL_URL_ENV = "AFDB_BENCH_MYSQL_URL"
DEFAULT_MYSQL_URL = "mysql+pymysql://root@127.0.0.1:3306/test"


@dataclass(frozen=True)
class ScratchDatabase:
    """A scratch database: its name, its SQLAlchemy URL (password included: for engines, never
    for printing) and PyMySQL's connection options without the database."""

    name: str
    url: str
    options: dict[str, Any]

    def connect(self, *, autocommit: bool = False) -> Any:
        """A new PyMySQL connection to the scratch database."""
        import pymysql

        return pymysql.connect(database=self.name, autocommit=autocommit, **self.options)


@contextmanager
def scratch_database() -> Iterator[ScratchDatabase | str]:
    """A new database on the MariaDB server, dropped afterwards; or why there is none (no
    PyMySQL, or the server does not answer)."""
    try:
        import pymysql
    except ImportError as exc:
        yield f"needs PyMySQL (the `mysql` extra): {exc}"
        return
    url = sa.make_url(os.environ.get(MYSQL_URL_ENV, DEFAULT_MYSQL_URL))
    name = f"afdb_bench_{uuid.uuid4().hex[:10]}"
    options: dict[str, Any] = {
        "host": url.host or "127.0.0.1",
        "port": url.port or 3306,
        "user": url.username or "root",
        "password": url.password or "",
        "connect_timeout": pg.CONNECT_TIMEOUT,
    }
    try:
        admin = pymysql.connect(autocommit=True, **options)
    except pymysql.Error as exc:
        yield f"MariaDB at {url.render_as_string(hide_password=True)} does not answer ({exc})"
        return
    with admin:
        admin.cursor().execute(f"CREATE DATABASE `{name}`")
    try:
        yield ScratchDatabase(
            name, url.set(database=name).render_as_string(hide_password=False), options
        )
    finally:
        with pymysql.connect(autocommit=True, **options) as admin:
            admin.cursor().execute(f"DROP DATABASE IF EXISTS `{name}`")
