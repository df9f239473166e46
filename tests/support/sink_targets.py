"""The target databases of the ``SqlSink`` tests: a SQLite file, the test's PostgreSQL schema or
its MariaDB database (the fixture's ``request.param``), their tables, and sinks opened on them."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from azure_functions_db.sinks.sql import SqlSink
from devkit import dbservers


def target(
    request: pytest.FixtureRequest, tmp_path: Path | None = None
) -> tuple[str, dict[str, Any]]:
    """The URL and engine options of the target ``request.param`` names: ``sqlite`` (a file in
    ``tmp_path``), ``postgres`` (the test's ``pg_schema`` on the search path) or ``mysql``
    (the test's ``mysql_db``)."""
    if request.param == "sqlite":
        assert tmp_path is not None, "a SQLite target needs tmp_path"
        return f"sqlite:///{tmp_path / 'target.db'}", {}
    if request.param == "postgres":
        schema = request.getfixturevalue("pg_schema")
        return dbservers.pg_url(), {"connect_args": {"options": f"-c search_path={schema}"}}
    return dbservers.mysql_url(request.getfixturevalue("mysql_db")), {}


def create_tables(
    url: str, options: dict[str, Any], statements: Callable[[sa.Dialect], Iterable[str]]
) -> None:
    """Run the ``CREATE TABLE`` statements ``statements(dialect)`` gives, in one transaction."""
    engine = sa.create_engine(url, poolclass=sa.NullPool, **options)
    try:
        with engine.begin() as conn:
            for statement in statements(engine.dialect):
                conn.exec_driver_sql(statement)
    finally:
        engine.dispose()


@contextmanager
def opened_sinks(url: str, options: dict[str, Any]) -> Iterator[Callable[..., SqlSink]]:
    """``make(**engine_options)``: a new opened sink on the target, as another process would
    hold it (``engine_options`` added to ``options``); every one closed afterwards."""
    made: list[SqlSink] = []

    def make(**extra: Any) -> SqlSink:
        sink = SqlSink(url, engine_options={**options, **extra})
        sink.open({})
        made.append(sink)
        return sink

    try:
        yield make
    finally:
        for sink in made:
            sink.close()
