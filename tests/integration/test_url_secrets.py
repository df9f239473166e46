"""A password with ``@ / # % : ?`` in an app setting reaches the real PostgreSQL server as the
password, with the host, port and database intact (the server's trust authentication accepts
any password, so a connection that works proves the URL was not cut at a special character)."""

from __future__ import annotations

import datetime as dt

import pytest
import sqlalchemy as sa

from azure_functions_db.sinks.sql import SqlSink
from azure_functions_db.sources import SqlSource
from devkit import dbservers
from tests.support.source_kit import Db

pytestmark = pytest.mark.postgres

PASSWORDS = ["p@ss/w#rd", "@/#%:?", "100%x&y=z", "a:b@c:5432/d"]
TEMPLATE = (
    f"postgresql+psycopg://{dbservers.PG_USER}:%PW%@{dbservers.PG_HOST}:{dbservers.PG_PORT}/"
    f"{dbservers.PG_DATABASE}"
)


def _orders(pg: Db) -> None:
    when = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    pg.table(
        "orders",
        [sa.Column("id", sa.Integer, primary_key=True), sa.Column("at", sa.DateTime(True))],
        [{"id": i, "at": when} for i in (1, 2, 3)],
    )


def _drained(source: SqlSource, settings: dict[str, str]) -> list[int]:
    source.open(settings)
    try:
        horizon = source.horizon()
        return [row.data["id"] for row in source.fetch(None, 10, horizon)]
    finally:
        source.close()


@pytest.mark.parametrize("password", PASSWORDS)
def test_a_password_setting_with_url_syntax_reaches_the_right_server(pg: Db, password):
    _orders(pg)
    source = SqlSource(TEMPLATE, table="orders", cursor="at", schema=pg.schema, horizon="none")
    assert _drained(source, {"PW": password}) == [1, 2, 3]
    assert password not in repr(source)


def test_a_setting_holding_the_whole_url_and_a_url_object(pg: Db):
    _orders(pg)
    url = sa.URL.create(
        "postgresql+psycopg",
        dbservers.PG_USER,
        "p@ss/w#rd",
        dbservers.PG_HOST,
        dbservers.PG_PORT,
        dbservers.PG_DATABASE,
    )
    whole = url.render_as_string(hide_password=False)
    by_setting = SqlSource(
        connection="ORDERS_DB", table="orders", cursor="at", schema=pg.schema, horizon="none"
    )
    assert _drained(by_setting, {"ORDERS_DB": whole}) == [1, 2, 3]
    by_object = SqlSource(url, table="orders", cursor="at", schema=pg.schema, horizon="none")
    assert _drained(by_object, {}) == [1, 2, 3]


def test_the_sql_sink_takes_the_password_setting_too(pg: Db):
    sink = SqlSink(TEMPLATE, position_table="afdb_positions", schema=pg.schema)
    sink.open({"PW": "p@ss/w#rd"})
    try:
        assert "p@ss" not in sink.describe()
    finally:
        sink.close()


@pytest.mark.parametrize("encoded", ["p%C3%A4ss", "%C3%A4%40x%CE%A9", "ab%C2%A4ss%40"])
def test_a_percent_encoded_password_in_the_url_opens(pg: Db, encoded):
    """``%C3%`` and ``%A4ss%`` are escapes, not references to settings ``C3`` or ``A4ss``."""
    _orders(pg)
    url = TEMPLATE.replace("%PW%", encoded)
    source = SqlSource(url, table="orders", cursor="at", schema=pg.schema, horizon="none")
    assert _drained(source, {}) == [1, 2, 3]
    sink = SqlSink(url, position_table="afdb_positions", schema=pg.schema)
    sink.open({})
    sink.close()


def test_a_role_the_server_refuses_fails_at_once_not_as_transient(pg: Db, caplog):
    """An authentication failure is no outage: no retries, the server's reason in one error."""
    import logging

    from azure_functions_db.errors import SourceError, TransientSourceError

    url = TEMPLATE.replace(f"{dbservers.PG_USER}:%PW%", "nosuch_afdb_role:%PW%")
    source = SqlSource(url, table="orders", cursor="at", schema=pg.schema, horizon="none")
    with caplog.at_level(logging.WARNING), pytest.raises(SourceError) as caught:
        source.open({"PW": "wrong-password"})
    assert not isinstance(caught.value, TransientSourceError)
    assert "nosuch_afdb_role" in str(caught.value)
    assert "wrong-password" not in str(caught.value)
    assert "transient_error_retry" not in caplog.text
