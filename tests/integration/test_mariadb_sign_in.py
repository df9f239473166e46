"""Signing in to the real MariaDB: an Entra ID token (``credential=``) reaches PyMySQL as the
password, for a source and a sink (the handshake bound's own ``do_connect`` listener used to
connect first, without it), and a wrong one fails at once. The server checks passwords, so a
connection that works proves what it was given."""

from __future__ import annotations

import datetime as dt
import secrets
import uuid
from collections.abc import Iterator
from typing import Any, NamedTuple

import pytest
import sqlalchemy as sa

from azure_functions_db.errors import SourceError
from azure_functions_db.sinks.sql import SqlSink
from azure_functions_db.sources import SqlSource
from devkit import dbservers

pytestmark = pytest.mark.mysql


class Token(NamedTuple):
    token: str
    expires_on: int


class FakeCredential:
    def __init__(self, token: str) -> None:
        self.token = token
        self.calls = 0

    def get_token(self, *scopes: str, **_: Any) -> Token:
        self.calls += 1
        return Token(self.token, int(dt.datetime.now(dt.UTC).timestamp()) + 3600)


class User(NamedTuple):
    name: str
    password: str
    database: str


def _user(mysql_db: str, password: str) -> Iterator[User]:
    name = f"afdb_{uuid.uuid4().hex[:8]}"
    root = sa.create_engine(dbservers.mysql_url(mysql_db), poolclass=sa.NullPool)
    with root.begin() as conn:
        conn.exec_driver_sql(
            "CREATE TABLE orders (id int PRIMARY KEY, at datetime(6) NOT NULL) ENGINE=InnoDB"
        )
        conn.exec_driver_sql(
            "INSERT INTO orders VALUES (1, '2026-01-01 00:00:00'), (2, '2026-01-01 00:00:01')"
        )
        conn.execute(sa.text(f"CREATE USER '{name}'@'%' IDENTIFIED BY :pw"), {"pw": password})
        conn.execute(sa.text(f"GRANT ALL ON `{mysql_db}`.* TO '{name}'@'%'"))
    try:
        yield User(name, password, mysql_db)
    finally:
        with root.begin() as conn:
            conn.execute(sa.text(f"DROP USER '{name}'@'%'"))
        root.dispose()


@pytest.fixture
def token_user(mysql_db: str) -> Iterator[User]:
    yield from _user(mysql_db, "tok-" + secrets.token_urlsafe(24))


def _url(user: User, password: str | None = None) -> str:
    secret = f":{password}" if password is not None else ""
    return f"mysql+pymysql://{user.name}{secret}@127.0.0.1:3306/{user.database}"


def _ids(source: SqlSource) -> list[int]:
    source.open({})
    try:
        return [row.data["id"] for row in source.fetch(None, 10, source.horizon())]
    finally:
        source.close()


def test_a_source_signs_in_with_the_token(token_user: User) -> None:
    credential = FakeCredential(token_user.password)
    source = SqlSource(_url(token_user), "orders", "at", credential=credential, horizon="none")
    assert _ids(source) == [1, 2]
    assert credential.calls >= 1


def test_a_sink_signs_in_with_the_token(token_user: User) -> None:
    credential = FakeCredential(token_user.password)
    sink = SqlSink(_url(token_user), credential=credential)
    sink.open({})
    try:
        assert "tok-" not in sink.describe()
    finally:
        sink.close()
    assert credential.calls >= 1


def test_a_wrong_token_fails_at_once_naming_no_secret(token_user: User) -> None:
    credential = FakeCredential("tok-wrong-" + secrets.token_hex(8))
    source = SqlSource(_url(token_user), "orders", "at", credential=credential, horizon="none")
    with pytest.raises(SourceError) as caught:
        source.open({})
    assert "TransientSourceError" not in type(caught.value).__name__
    assert "Access denied" in str(caught.value)
    assert credential.token not in str(caught.value)


def test_an_ado_net_connection_string_signs_in(token_user: User) -> None:
    """The form the Azure portal shows for Azure Database for MySQL, in a setting."""
    text = (
        f"Server=127.0.0.1;Port=3306;Database={token_user.database};Uid={token_user.name};"
        f"Pwd={token_user.password};SslMode=Preferred;"
    )
    source = SqlSource(connection="ORDERS_DB", table="orders", cursor="at", horizon="none")
    source.open({"ORDERS_DB": text})
    try:
        assert [row.data["id"] for row in source.fetch(None, 10, source.horizon())] == [1, 2]
        assert token_user.password not in repr(source)
    finally:
        source.close()
