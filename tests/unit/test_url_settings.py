"""Secrets inside database URLs are never mangled: ``%NAME%`` values go into their own part of
the URL, a setting may hold the whole URL (``connection=``), and a ``sqlalchemy.URL`` is taken as
it is."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from azure_functions_db.errors import ConfigurationError
from azure_functions_db.sinks.sql import SqlSink
from azure_functions_db.sources import SqlSource
from azure_functions_db.sources.urls import masked_url, resolve_url

NASTY = ["p@ss/w#rd", "a:b?c=d&e", "100%sure", "@/#%:?", "x%PW%y", " spaced ", "ü€"]
TEMPLATE = "postgresql+psycopg://app:%PW%@db.example.com:5432/orders"


@pytest.mark.parametrize("password", NASTY)
def test_a_password_setting_stays_the_password(password):
    url = resolve_url(TEMPLATE, {"PW": password}, "test")
    assert url.password == password
    assert (url.username, url.host, url.port, url.database) == (
        "app",
        "db.example.com",
        5432,
        "orders",
    )
    # And it survives the round trip through text that a driver or a log would see.
    assert sa.make_url(url.render_as_string(hide_password=False)).password == password


@pytest.mark.parametrize("value", NASTY)
def test_every_part_takes_its_setting_as_its_own_text(value):
    template = "postgresql+psycopg://%USER%:%PW%@%HOST%:5432/%DB%?sslmode=%SSL%&application_name=x"
    settings = {"USER": value, "PW": value, "HOST": "h1", "DB": value, "SSL": value}
    url = resolve_url(template, settings, "test")
    assert (url.username, url.password, url.host, url.database) == (value, value, "h1", value)
    assert url.query == {"sslmode": value, "application_name": "x"}


def test_a_placeholder_in_the_port_or_the_driver_is_pasted_in():
    url = resolve_url(
        "%DIALECT%://u:%PW%@h:%PORT%/db",
        {"DIALECT": "postgresql+psycopg", "PW": "pw", "PORT": "6432"},
        "test",
    )
    assert (url.drivername, url.port, url.password) == ("postgresql+psycopg", 6432, "pw")


def test_a_setting_with_the_whole_url_is_parsed_as_a_url():
    text = "mysql+pymysql://root:p%40ss@127.0.0.1:3306/test"
    url = resolve_url("%ORDERS_DB%", {"ORDERS_DB": text}, "test")
    assert (url.drivername, url.password, url.host) == ("mysql+pymysql", "p@ss", "127.0.0.1")


def test_a_url_object_is_taken_as_it_is():
    made = sa.URL.create("postgresql+psycopg", "app", "p@ss/w#rd", "db", 5432, "orders")
    assert resolve_url(made, {}, "test") is made
    assert "p@ss" not in masked_url(made)
    assert "p@ss" not in repr(SqlSource(made, table="orders", cursor="updated_at"))


def test_a_missing_setting_is_named_and_no_value_is_shown():
    with pytest.raises(ConfigurationError, match="PW") as caught:
        resolve_url(TEMPLATE, {"OTHER": "secret-value"}, "the source of table `orders`")
    assert "secret-value" not in str(caught.value)


def test_connection_names_a_setting_and_excludes_url():
    source = SqlSource(connection="ORDERS_DB", table="orders", cursor="updated_at")
    assert "%ORDERS_DB%" in repr(source)
    with pytest.raises(ConfigurationError, match="not both"):
        SqlSource("sqlite://", connection="ORDERS_DB", table="orders", cursor="updated_at")
    with pytest.raises(ConfigurationError, match="name of an app setting"):
        SqlSource(connection="orders db", table="orders", cursor="updated_at")
    with pytest.raises(ConfigurationError, match="not a database URL"):
        SqlSource(table="orders", cursor="updated_at")
    assert "%TARGET_DB%" in repr(SqlSink(connection="TARGET_DB"))


@pytest.mark.parametrize(
    ("password", "encoded"),
    [
        ("päss", "p%C3%A4ss"),  # %C3% looks like a reference to a setting C3
        ("ä@x", "%C3%A4%40x"),  # and %A4%
        ("ab¤ss@", "ab%C2%A4ss%40"),  # %A4ss% looks like a reference to A4ss
        ("Ωmega#1", "%CE%A9mega%231"),
    ],
)
def test_a_percent_encoded_url_is_not_read_as_holding_settings(password, encoded):
    text = f"postgresql+psycopg://app:{encoded}@db.example.com:5432/orders"
    url = resolve_url(text, {}, "test")
    assert (url.password, url.host, url.database) == (password, "db.example.com", "orders")
    assert encoded not in masked_url(text)
    assert password not in masked_url(text)


def test_a_reference_whose_name_starts_with_hex_digits_is_still_a_reference():
    template = "postgresql+psycopg://app:%DB_PW%@%DB_HOST%/%DB%?application_name=%AB%"
    settings = {"DB_PW": "p@ss", "DB_HOST": "h", "DB": "orders", "AB": "x"}
    url = resolve_url(template, settings, "test")
    assert (url.password, url.host, url.database, url.query) == (
        "p@ss",
        "h",
        "orders",
        {"application_name": "x"},
    )
    with pytest.raises(ConfigurationError, match="DB_PW"):
        resolve_url(template, {"DB_HOST": "h", "DB": "orders", "AB": "x"}, "test")


def test_a_literal_percent_name_is_written_encoded():
    url = resolve_url("postgresql+psycopg://app:%25PW%25@h/db", {}, "test")
    assert url.password == "%PW%"


@pytest.mark.parametrize(
    "whole",
    [
        "mysql+pymysql://u:Sup3r@Secr/et#Xy@host/db",
        "postgresql+psycopg://app:p@ss@db.example.com:5432/orders",
        "mysql+pymysql://us@er:pw@host/db?charset=utf8mb4",
    ],
)
def test_a_url_with_an_unencoded_at_sign_is_refused_showing_nothing_of_it(whole):
    """A password with an `@` cannot be split where the user meant: say so and how to fix it,
    and print no fragment of the user, password or host."""
    for template, settings in ((whole, {}), ("%DB%", {"DB": whole})):
        with pytest.raises(ConfigurationError) as caught:
            resolve_url(template, settings, "the source of table `orders`")
        message = str(caught.value)
        assert "percent-encode" in message.lower()
        assert "%40" in message
        for fragment in ("Sup3r", "Secr", "et#Xy", "et%23Xy", "p@ss", "ss@db", "us@er", "er:pw"):
            assert fragment not in message
    assert masked_url(whole) == "<database url>"
    source = SqlSource(whole, table="orders", cursor="updated_at")
    for fragment in ("Sup3r", "Secr", "p@ss", "us@er"):
        assert fragment not in repr(source)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "Server=orders.mysql.database.azure.com;Port=3306;Database=shop;Uid=app;Pwd=p@ssw#rd;",
            ("mysql+pymysql", "orders.mysql.database.azure.com", 3306, "shop", "app", "p@ssw#rd"),
        ),
        (
            "Host=pg.example.com;Database=shop;Username=app;Password='a;b=c'",
            ("postgresql+psycopg", "pg.example.com", None, "shop", "app", "a;b=c"),
        ),
        (
            "Server=tcp:sql.example.net,1433;Initial Catalog=shop;User ID=app;Password=x@y;"
            "Encrypt=True;",
            ("mssql+pyodbc", "sql.example.net", 1433, "shop", "app", "x@y"),
        ),
        (
            "server=db;port=5432;database=shop;user id=app;password=pw",
            ("postgresql+psycopg", "db", 5432, "shop", "app", "pw"),
        ),
    ],
)
def test_an_ado_net_connection_string_in_a_setting_is_converted(text, expected):
    """The form the Azure portal and the Functions SQL/MySQL triggers use, each value in its own
    part of the URL."""
    url = resolve_url("%ORDERS_DB%", {"ORDERS_DB": text}, "test")
    assert (url.drivername, url.host, url.port, url.database, url.username, url.password) == (
        expected
    )
    assert expected[-1] not in masked_url(url)


def test_an_ado_net_string_that_names_no_database_kind_says_which_key_to_add():
    text = "Server=db.example.com;Database=shop;User Id=app;Password=s3cret-value"
    with pytest.raises(ConfigurationError, match="Port=3306") as caught:
        resolve_url("%ORDERS_DB%", {"ORDERS_DB": text}, "test")
    assert "s3cret-value" not in str(caught.value)
    assert "db.example.com" not in str(caught.value)
