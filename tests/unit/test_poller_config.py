"""``PollerConfig``'s rules are one pydantic model: every bad value is named in one error, in
our words (the value and the fix), wherever a configuration is made (the decorator, an engine,
``dataclasses.replace``)."""

from __future__ import annotations

import dataclasses

import pytest

import azure_functions_db as afdb
from azure_functions_db.core.config import PollerConfig, _Rules
from azure_functions_db.errors import ConfigurationError


def test_one_error_names_every_bad_value_in_our_words():
    with pytest.raises(ConfigurationError) as info:
        PollerConfig(name="orders", batch_size=0, poison="skip", pipeline="yes", stall_runs=-1)
    message = str(info.value)
    assert message.startswith("The configuration of poller `orders` has 4 problems: (1) ")
    for words in (
        "`batch_size=0` must be a positive integer (e.g. `batch_size=1000`)",
        "Unknown poison policy `'skip'`; use `poison=\"halt\"`",
        "`stall_runs=-1` must be a positive integer (runs, e.g. `stall_runs=5`)",
        "`pipeline='yes'` must be True or False.",
    ):
        assert words in message
    # In the order of the fields, each once.
    assert message.index("batch_size") < message.index("poison") < message.index("stall_runs")
    assert message.count("(4) ") == 1


def test_one_bad_value_is_its_own_message_alone():
    with pytest.raises(ConfigurationError) as info:
        PollerConfig(name="orders", max_attempts=True)
    assert (
        str(info.value) == "`max_attempts=True` must be a positive integer (e.g. `max_attempts=5`)."
    )


def test_a_bad_name_is_named_even_beside_other_bad_values():
    with pytest.raises(ConfigurationError) as info:
        PollerConfig(name="-orders", time_budget="4 minutes")
    message = str(info.value)
    assert "The configuration of poller `-orders` has 2 problems" in message
    assert "Invalid poller name `'-orders'`" in message
    assert "`time_budget='4 minutes'` must be a positive number" in message


def test_rules_that_tie_fields_together_follow_once_each_field_is_right():
    with pytest.raises(ConfigurationError) as info:
        PollerConfig(name="orders", time_budget=10, lease_duration=60, poll_interval=20)
    message = str(info.value)
    assert "`poll_interval=20` must be shorter than `time_budget=10`" in message
    assert "`time_budget=10` is too short for `lease_duration=60`" in message


def test_replace_checks_the_new_values_too():
    config = PollerConfig(name="orders")
    with pytest.raises(ConfigurationError, match="checkpoint_every=0"):
        dataclasses.replace(config, checkpoint_every=0)
    assert dataclasses.replace(config, checkpoint_every=10_000).checkpoint_every == 10_000


def test_every_field_of_the_config_has_a_place_in_the_rules():
    names = {field.name for field in dataclasses.fields(PollerConfig)}
    assert set(_Rules.model_fields) == names


def test_the_decorator_reports_every_bad_option_at_once():
    app = afdb.PollerBlueprint()
    source = afdb.SqlSource(url="sqlite://", table="orders", cursor="updated_at", pk="id")
    with pytest.raises(ConfigurationError) as info:
        app.poller(
            name="orders",
            schedule="0 */1 * * * *",
            source=source,
            batch_size=-5,
            lease_duration=0,
            start="yesterday",
        )
    message = str(info.value)
    assert "has 3 problems" in message
    assert "`batch_size=-5`" in message
    assert "`lease_duration=0`" in message
    assert "`start='yesterday'` is not a starting point" in message
