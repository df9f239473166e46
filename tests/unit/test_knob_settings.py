"""Tuning knobs from app settings: ``batch_size="%NAME%"`` (and ``time_budget``,
``max_attempts``, ``poll_interval``) is read when the poller's engine is made, validated at once,
and a bad value names the setting and the range."""

from __future__ import annotations

from pathlib import Path

import pytest

import azure_functions_db as afdb
from azure_functions_db.errors import ConfigurationError, SettingNotFoundError
from tests.support.sqlite_orders import Orders
from tests.unit.test_blueprint import orders

__all__ = ["orders"]  # fixture: seven rows


def blueprint(
    orders: Orders, tmp_path: Path, seen: list[int], schedule: str = "0 * * * * *", **knobs
) -> afdb.PollerBlueprint:
    db = afdb.PollerBlueprint()

    @db.poller(
        name="tuned",
        schedule=schedule,
        source=afdb.SqlSource(url=orders.url, table="orders", cursor="updated_at", pk="id"),
        state=afdb.LocalStateStore(tmp_path / "state"),
        **knobs,
    )
    def handler(batch: afdb.Batch) -> None:
        seen.append(len(batch))

    return db


def test_knobs_are_read_from_settings_when_the_run_starts(orders, tmp_path):
    seen: list[int] = []
    db = blueprint(
        orders, tmp_path, seen, batch_size="%TUNED_BATCH%", max_attempts="%TUNED_ATTEMPTS%"
    )
    poller = db.pollers["tuned"]
    assert poller.config.batch_size == 1000  # nothing is read at decoration
    report = poller.run_once({"TUNED_BATCH": " 3 ", "TUNED_ATTEMPTS": "2"})
    assert report.rows == 7
    assert seen == [3, 3, 1]
    assert poller.engine().config.max_attempts == 2


def test_a_missing_knob_setting_is_named(orders, tmp_path):
    db = blueprint(orders, tmp_path, [], time_budget="%TUNED_BUDGET%")
    with pytest.raises(SettingNotFoundError, match="TUNED_BUDGET"):
        db.pollers["tuned"].run_once({})


def test_every_bad_knob_is_named_in_one_error_with_its_range(orders, tmp_path):
    db = blueprint(
        orders,
        tmp_path,
        [],
        batch_size="%TUNED_BATCH%",
        time_budget="%TUNED_BUDGET%",
        max_attempts="%TUNED_ATTEMPTS%",
        poll_interval="%TUNED_POLL%",
    )
    settings = {
        "TUNED_BATCH": "1.5",
        "TUNED_BUDGET": "-1",
        "TUNED_ATTEMPTS": "x",
        "TUNED_POLL": "1",
    }
    with pytest.raises(ConfigurationError) as caught:
        db.pollers["tuned"].run_once(settings)
    message = str(caught.value)
    for needle in (
        "`batch_size` from setting `TUNED_BATCH` is `1.5`: use a whole number of rows",
        "`time_budget` from setting `TUNED_BUDGET` is `-1`: use a number of seconds above 0",
        "`max_attempts` from setting `TUNED_ATTEMPTS` is `x`",
    ):
        assert needle in message
    assert "TUNED_POLL" not in message  # a good one is not blamed


def test_a_knob_valid_alone_but_not_with_the_others_names_its_setting(orders, tmp_path):
    db = blueprint(orders, tmp_path, [], time_budget="%TUNED_BUDGET%", lease_duration=30)
    with pytest.raises(ConfigurationError, match=r"time_budget=5.*`TUNED_BUDGET`"):
        db.pollers["tuned"].run_once({"TUNED_BUDGET": "5"})  # a run must outlive a heartbeat


@pytest.mark.parametrize("value", ["ten", "%NOT CLOSED", "%A%B%"])
def test_a_knob_string_that_is_not_one_setting_reference_fails_at_decoration(
    orders, tmp_path, value
):
    with pytest.raises(ConfigurationError, match="neither a number nor an app setting"):
        blueprint(orders, tmp_path, [], batch_size=value)


def test_every_missing_knob_setting_is_named_at_once(orders, tmp_path):
    db = blueprint(orders, tmp_path, [], batch_size="%TUNED_BATCH%", time_budget="%TUNED_BUDGET%")
    with pytest.raises(ConfigurationError, match="`TUNED_BATCH`, `TUNED_BUDGET`"):
        db.pollers["tuned"].run_once({})


def test_validate_checks_the_knob_and_schedule_settings(orders, tmp_path):
    """`afdb validate` said `0 error(s)` for `batch_size="%ORDERS_BATCH%"` with
    `ORDERS_BATCH=abc`; now each knob and the schedule's setting is a finding."""
    from azure_functions_db.ops.validate import validate_poller

    db = blueprint(
        orders,
        tmp_path,
        [],
        schedule="%TUNED_SCHEDULE%",
        batch_size="%TUNED_BATCH%",
        max_attempts="%TUNED_ATTEMPTS%",
    )
    poller = db.pollers["tuned"]
    bad = validate_poller(poller, {"TUNED_BATCH": "abc", "TUNED_SCHEDULE": "every minute"})
    errors = [f for f in bad.findings if f.level == "error"]
    text = " ".join(f.message for f in errors)
    assert "TUNED_ATTEMPTS" in text  # missing
    assert "every minute" in text
    assert "`TUNED_SCHEDULE`" in text  # the bad schedule names its setting
    good = validate_poller(
        poller, {"TUNED_BATCH": "5", "TUNED_ATTEMPTS": "2", "TUNED_SCHEDULE": "0 * * * * *"}
    )
    assert [f.message for f in good.findings if f.level == "error"] == []
    assert any("`batch_size` = 5" in f.message for f in good.findings)
    wrong = validate_poller(
        poller, {"TUNED_BATCH": "abc", "TUNED_ATTEMPTS": "2", "TUNED_SCHEDULE": "0 * * * * *"}
    )
    assert any("`TUNED_BATCH` is `abc`" in f.message for f in wrong.findings if f.level == "error")


def _mysql_poller(**knobs: object) -> afdb.PollerBlueprint:
    db = afdb.PollerBlueprint()

    @db.poller(
        name="products",
        schedule="* * * * * *",
        source=afdb.SqlSource(
            url="%MYSQL_DB%", table="Products", cursor="az_func_updated_at", pk="ProductId"
        ),
        **knobs,  # type: ignore[arg-type]
    )
    def handler(batch: afdb.Batch) -> None:
        pass

    return db


TRIGGER_SETTINGS = {
    "MYSQL_DB": "mysql+pymysql://app@db.example/shop",
    "MySql_Trigger_MaxBatchSize": "250",
    "MySql_Trigger_PollingIntervalMs": "500",
}


def test_a_mysql_poller_reads_the_mysql_triggers_settings_for_what_it_leaves_out(caplog):
    caplog.set_level("INFO", logger="azure_functions_db.runtime.knobs")
    config = _mysql_poller().pollers["products"].config_for(TRIGGER_SETTINGS)
    assert config.batch_size == 250
    assert config.poll_interval == 0.5  # milliseconds in the trigger's setting
    logged = [r.getMessage() for r in caplog.records]
    assert any("action=setting_alias" in m and "MySql_Trigger_MaxBatchSize" in m for m in logged), (
        logged
    )
    # The older name, as the trigger reads it when the newer one is not set.
    legacy = {"MYSQL_DB": TRIGGER_SETTINGS["MYSQL_DB"], "MySql_Trigger_BatchSize": "40"}
    assert _mysql_poller().pollers["products"].config_for(legacy).batch_size == 40
    # What the poller sets itself wins; without the settings, our defaults.
    mine = _mysql_poller(batch_size=100, poll_interval=2).pollers["products"]
    assert (mine.config_for(TRIGGER_SETTINGS).batch_size, mine.config.poll_interval) == (100, 2)
    plain = _mysql_poller().pollers["products"].config_for({"MYSQL_DB": legacy["MYSQL_DB"]})
    assert (plain.batch_size, plain.poll_interval) == (1000, None)


def test_the_mysql_triggers_settings_are_not_read_for_other_databases():
    postgres = {**TRIGGER_SETTINGS, "MYSQL_DB": "postgresql+psycopg://app@db.example/shop"}
    config = _mysql_poller().pollers["products"].config_for(postgres)
    assert (config.batch_size, config.poll_interval) == (1000, None)


def test_a_bad_mysql_trigger_setting_is_named():
    bad = {**TRIGGER_SETTINGS, "MySql_Trigger_PollingIntervalMs": "fast"}
    with pytest.raises(ConfigurationError, match="`MySql_Trigger_PollingIntervalMs`, which is"):
        _mysql_poller().pollers["products"].config_for(bad)


def test_a_mysql_trigger_setting_out_of_range_for_the_poller_is_named():
    """A polling interval longer than the poller's time budget: the error names the trigger's
    setting it came from."""
    slow = {**TRIGGER_SETTINGS, "MySql_Trigger_PollingIntervalMs": "300000"}
    with pytest.raises(ConfigurationError, match="`MySql_Trigger_PollingIntervalMs`"):
        _mysql_poller().pollers["products"].config_for(slow)
