"""The names Functions users know from Azure's SQL and MySQL triggers get our equivalent, not a
bare ``TypeError``; a typo gets the closest name; the signatures stay as they were."""

from __future__ import annotations

import inspect

import pytest

import azure_functions_db as afdb
from azure_functions_db.errors import ConfigurationError


@pytest.mark.parametrize(
    ("make", "answer"),
    [
        (lambda: afdb.SqlSource(connection_string_setting="ORDERS_DB", table="t", cursor="c"),
         "`connection=`"),
        (lambda: afdb.SqlSource(url="sqlite://", table_name="orders", cursor="c"), "`table=`"),
        (lambda: afdb.SqlSink(connection_string_setting="OUT_DB"), "`connection=`"),
        (
            lambda: afdb.PollerBlueprint().poller(
                name="orders",
                schedule="*/30 * * * * *",
                source=afdb.SqlSource(url="sqlite://", table="t", cursor="c"),
                max_batch_size=100,
            ),
            "`batch_size=`",
        ),
        (
            lambda: afdb.PollerBlueprint().poller(
                name="orders",
                schedule="*/30 * * * * *",
                source=afdb.SqlSource(url="sqlite://", table="t", cursor="c"),
                leases_table_name="leases",
            ),
            "state store",
        ),
    ],
)  # fmt: skip
def test_trigger_names_are_answered_with_ours(make, answer):
    with pytest.raises(ConfigurationError) as caught:
        make()
    assert answer in str(caught.value)
    assert "trigger" in str(caught.value)


def test_a_typo_gets_the_closest_name():
    with pytest.raises(ConfigurationError, match=r"`cursro=`\. Did you mean `cursor=`\?"):
        afdb.SqlSource(url="sqlite://", table="t", cursro="c")


def test_signatures_are_unchanged_for_tools():
    assert "cursor" in inspect.signature(afdb.SqlSource).parameters
    assert "batch_size" in inspect.signature(afdb.PollerBlueprint.poller).parameters
    assert "connection" in inspect.signature(afdb.SqlSink).parameters
