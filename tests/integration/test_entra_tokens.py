"""Entra ID sign-in (``credential=``): each new connection to the real PostgreSQL server gets
the credential's token as its password, a token is reused until five minutes before it expires
and then fetched again, and no token reaches a log or an error. (The server's trust
authentication accepts any password; what it was given is read from the connection hook.)"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any, NamedTuple

import pytest
import sqlalchemy as sa

from azure_functions_db.errors import ConfigurationError
from azure_functions_db.sinks.sql import SqlSink
from azure_functions_db.sources import SqlSource, entra
from devkit import dbservers
from tests.support.source_kit import Db

pytestmark = pytest.mark.postgres


class Token(NamedTuple):
    token: str
    expires_on: int


class FakeCredential:
    """Hands out ``tok-1``, ``tok-2``, ... each valid ``lifetime`` seconds from ``now``."""

    def __init__(self, now: list[float], lifetime: float = 3600) -> None:
        self.now, self.lifetime = now, lifetime
        self.scopes: list[str] = []

    def get_token(self, *scopes: str, **_: Any) -> Token:
        self.scopes.extend(scopes)
        return Token(f"tok-{len(self.scopes)}", int(self.now[0] + self.lifetime))


def _passwords(engine: sa.Engine) -> list[str]:
    seen: list[str] = []

    @sa.event.listens_for(engine, "do_connect")
    def record(dialect: Any, rec: Any, cargs: Any, cparams: dict[str, Any]) -> None:
        seen.append(cparams.get("password"))

    return seen


def test_each_new_connection_signs_in_with_a_current_token(pg: Db, monkeypatch, caplog):
    when = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    pg.table(
        "orders",
        [sa.Column("id", sa.Integer, primary_key=True), sa.Column("at", sa.DateTime(True))],
        [{"id": 1, "at": when}],
    )
    now = [1_000_000.0]
    monkeypatch.setattr(entra.time, "time", lambda: now[0])
    credential = FakeCredential(now)
    source = SqlSource(
        dbservers.pg_url(),
        table="orders",
        cursor="at",
        schema=pg.schema,
        horizon="none",
        credential=credential,
    )
    with caplog.at_level(logging.DEBUG):
        source.open({})
        try:
            seen = _passwords(source.engine)
            source.engine.dispose()  # a new pool: the next read opens a new connection
            assert [r.data["id"] for r in source.fetch(None, 10, source.horizon())] == [1]
            assert seen[-1] == "tok-1"  # reused: fetched once for reflection, still valid
            now[0] += 3600 - 299  # within five minutes of expiry
            source.engine.dispose()
            source.fetch(None, 10, source.horizon())
            assert seen[-1] == "tok-2"
        finally:
            source.close()
    assert set(credential.scopes) == {entra.SCOPES["postgresql"]}
    assert "tok-" not in caplog.text


def test_the_sql_sink_signs_in_with_tokens_too(pg: Db, monkeypatch):
    credential = FakeCredential([0.0])
    sink = SqlSink(dbservers.pg_url(), schema=pg.schema, credential=credential)
    sink.open({})
    sink.close()
    assert credential.scopes == [entra.SCOPES["postgresql"]]


def test_a_credential_must_be_one_and_only_for_azure_databases(tmp_path):
    with pytest.raises(ConfigurationError, match="not a token credential"):
        SqlSource("sqlite://", table="t", cursor="c", credential="my-password")
    source = SqlSource(
        f"sqlite:///{tmp_path / 'x.db'}", table="t", cursor="c", credential=FakeCredential([0.0])
    )
    with pytest.raises(ConfigurationError, match="remove `credential=`"):
        source.open({})
