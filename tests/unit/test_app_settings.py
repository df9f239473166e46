"""AppSettings: the AFDB_* settings read into one pydantic model, errors naming the setting."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from azure_functions_db.errors import ConfigurationError
from azure_functions_db.runtime.poller import default_state_store
from azure_functions_db.runtime.settings import AppSettings


def test_defaults_when_nothing_is_set():
    settings = AppSettings.read({"UNRELATED": "x"})
    assert settings.state_dir == Path(".afdb/state")
    assert settings.otel_metrics is True


def test_a_blank_state_dir_is_the_default_and_a_set_one_is_used(tmp_path):
    assert AppSettings.read({"AFDB_STATE_DIR": "  "}).state_dir == Path(".afdb/state")
    assert AppSettings.read({"AFDB_STATE_DIR": str(tmp_path)}).state_dir == tmp_path
    store = default_state_store({"AFDB_STATE_DIR": str(tmp_path / "s")})
    assert str(tmp_path / "s") in store.describe()


@pytest.mark.parametrize(
    ("value", "enabled"),
    [("", True), ("yes", True), ("ON", True), ("no", False), (" Off ", False), ("0", False)],
)
def test_the_metrics_switch(value, enabled):
    assert AppSettings.read({"AFDB_OTEL_METRICS": value}).otel_metrics is enabled


def test_a_typo_in_the_metrics_switch_keeps_metrics_on_and_is_logged(caplog):
    with caplog.at_level(logging.WARNING, logger="azure_functions_db"):
        assert AppSettings.read({"AFDB_OTEL_METRICS": "ture"}).otel_metrics is True
    assert "action=metrics_setting_invalid" in caplog.text


def test_an_unusable_value_names_the_setting_and_the_fix():
    with pytest.raises(ConfigurationError) as caught:
        AppSettings.read({"AFDB_STATE_DIR": 5})  # type: ignore[dict-item]
    message = str(caught.value)
    assert "`AFDB_STATE_DIR`" in message
    assert "set it to a directory path" in message


def test_the_model_is_frozen():
    settings = AppSettings.read({})
    with pytest.raises(ValueError, match="frozen"):
        settings.otel_metrics = False  # type: ignore[misc]
