"""The ``afdb`` commands read settings the way ``func start`` does and never guess where state
lives: ``local.settings.json`` next to the app, ``--settings FILE``, the environment on top; the
store each command used is printed (text and JSON); ``--state`` chooses it; ``seek --dry-run``
writes nothing."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from azure_functions_db.cli import EXIT_FAILED, EXIT_OK, EXIT_USAGE, main
from azure_functions_db.errors import ConfigurationError, SettingNotFoundError
from azure_functions_db.runtime.local_settings import read_settings
from azure_functions_db.runtime.poller import default_state_store
from tests.e2e.test_cli import APP, delivered
from tests.support.sqlite_orders import Orders


@pytest.fixture(autouse=True)
def _environment():
    """The CLI exports the settings it read into its process's environment, as func start
    does for the worker: here that process is the test's, so restore it."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture
def app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The test_cli app, its settings in local.settings.json only (nothing in the environment)."""
    orders = Orders(tmp_path / "orders.db")
    orders.insert(range(1, 11))
    orders.close()
    for name in ("CLI_DB", "CLI_OUT", "CLI_FAIL", "AFDB_STATE", "FUNCTIONS_WORKER_RUNTIME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AFDB_STATE_DIR", str(tmp_path / "state"))
    path = tmp_path / "function_app.py"
    path.write_text(APP)
    values = {"CLI_DB": orders.url, "CLI_OUT": str(tmp_path / "delivered.txt")}
    (tmp_path / "local.settings.json").write_text(json.dumps({"Values": values}))
    return path


def test_commands_read_local_settings_json_next_to_the_app(app, capsys):
    assert main(["run", str(app), "--once"]) == EXIT_OK
    assert delivered(app) == list(range(1, 11))
    out = capsys.readouterr().out
    assert f"orders: state local:{app.parent / 'state'}" in out


def test_the_environment_overrides_the_file_and_settings_names_another(
    app, tmp_path, monkeypatch, capsys
):
    other = Orders(tmp_path / "other.db")
    other.insert(range(50, 53))
    other.close()
    monkeypatch.setenv("CLI_DB", other.url)
    assert main(["run", str(app), "--once"]) == EXIT_OK
    assert delivered(app) == [50, 51, 52]
    named = tmp_path / "elsewhere.json"
    named.write_text(json.dumps({"Values": {"CLI_OUT": str(tmp_path / "x.txt")}}))
    monkeypatch.delenv("CLI_DB")
    capsys.readouterr()
    assert main(["run", str(app), "--once", "--settings", str(named)]) == EXIT_FAILED
    out = " ".join((capsys.readouterr().out).split())  # the console wraps long lines
    assert "`CLI_DB`" in out
    assert f"{named} (Values)" in out  # which sources were read
    assert "the environment" in out


def test_a_missing_settings_file_is_refused(app, tmp_path, capsys):
    assert main(["status", str(app), "--settings", str(tmp_path / "nope.json")]) == EXIT_USAGE
    assert "no such file" in capsys.readouterr().err


def test_seek_dry_run_names_the_store_and_writes_nothing(app, capsys):
    assert main(["run", str(app), "--once"]) == EXIT_OK
    capsys.readouterr()
    args = ["seek", str(app), "--poller", "orders", "--beginning", "--dry-run", "--json"]
    assert main(args) == EXIT_OK
    doc = json.loads(capsys.readouterr().out)
    assert doc["dry_run"] is True
    assert doc["store"] == f"local:{app.parent / 'state'}"
    assert doc["from"] is not None  # the stored position, unchanged
    assert doc["to"] is None
    assert main(["status", str(app), "--json"]) == EXIT_OK
    (status,) = json.loads(capsys.readouterr().out)
    assert status["position"] is not None  # nothing moved
    assert status["store"] == doc["store"]


def test_state_is_chosen_by_flag_not_by_a_hidden_variable(app, monkeypatch, capsys):
    """FUNCTIONS_WORKER_RUNTIME in local.settings.json (every Python app has it) would pick
    Blob Storage; the command says so, and `--state local` keeps the local folder."""
    values = json.loads((app.parent / "local.settings.json").read_text())
    values["Values"]["FUNCTIONS_WORKER_RUNTIME"] = "python"
    values["Values"]["AzureWebJobsStorage"] = "UseDevelopmentStorage=true"
    (app.parent / "local.settings.json").write_text(json.dumps(values))
    args = ["seek", str(app), "--poller", "orders", "--now", "--dry-run"]
    assert main([*args, "--state", "local"]) == EXIT_OK
    assert f"in local:{app.parent / 'state'}: would move" in capsys.readouterr().out
    settings = read_settings(app, None, environ={})
    assert default_state_store(settings).describe().startswith("blob:")
    local = read_settings(app, None, state="local", environ={})
    assert default_state_store(local).describe().startswith("local:")


def test_afdb_state_setting_values_are_checked():
    with pytest.raises(ConfigurationError, match="AFDB_STATE"):
        default_state_store({"AFDB_STATE": "cloud"})


def test_read_settings_converts_values_and_names_its_sources(tmp_path):
    (tmp_path / "local.settings.json").write_text(
        json.dumps({"IsEncrypted": False, "Values": {"A": "1", "B": 2, "C": True}})
    )
    settings = read_settings(tmp_path / "function_app.py", None, environ={"A": "env"})
    assert (settings["A"], settings["B"], settings["C"]) == ("env", "2", "true")
    assert settings.sources == (f"{tmp_path / 'local.settings.json'} (Values)", "the environment")
    from azure_functions_db.core.settings import setting_value

    with pytest.raises(SettingNotFoundError, match=r"not defined \(read: .*local.settings.json"):
        setting_value(settings, "MISSING", "a test")
    (tmp_path / "local.settings.json").write_text('{"Values": {"D": {"nested": 1}}}')
    with pytest.raises(ConfigurationError, match=r"Values.D.*must be a string"):
        read_settings(tmp_path, None, environ={})


@pytest.mark.parametrize("command", [["run", "--once"], ["validate"]])
def test_a_url_setting_with_an_unencoded_at_sign_echoes_nothing_of_it(app, command, capsys):
    values = json.loads((app.parent / "local.settings.json").read_text())
    values["Values"]["CLI_DB"] = "mysql+pymysql://u:Sup3r@Secr/et#Xy@host/db"
    (app.parent / "local.settings.json").write_text(json.dumps(values))
    code = main([command[0], str(app), *command[1:]])
    out, err = capsys.readouterr()
    assert code != EXIT_OK
    assert "percent-encode" in (out + err).lower()
    for fragment in ("Sup3r", "Secr", "et#Xy", "et%23Xy", "Xy@host"):
        assert fragment not in out + err, (out, err)


def _as_functions_developer(app: Path, storage: str) -> None:
    """What deploy.md has users add: FUNCTIONS_WORKER_RUNTIME and AzureWebJobsStorage."""
    values = json.loads((app.parent / "local.settings.json").read_text())
    values["Values"]["FUNCTIONS_WORKER_RUNTIME"] = "python"
    values["Values"]["AzureWebJobsStorage"] = storage
    (app.parent / "local.settings.json").write_text(json.dumps(values))


def test_a_default_store_that_moved_away_from_the_checkpoint_is_refused(app, capsys):
    """Run without FUNCTIONS_WORKER_RUNTIME (local store), then as a Functions developer with
    Azurite (Blob chosen, empty): no second delivery of history, both stores named."""
    from devkit.azurite import Azurite, unavailable_reason

    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    assert main(["run", str(app), "--once"]) == EXIT_OK
    assert delivered(app) == list(range(1, 11))
    with Azurite(app.parent / "azurite") as azurite:
        _as_functions_developer(app, azurite.connection_string)
        capsys.readouterr()
        assert main(["run", str(app), "--once"]) == EXIT_USAGE
        err = capsys.readouterr().err
        assert delivered(app) == list(range(1, 11))  # nothing delivered again
        assert "local:" in err
        assert "blob:" in err
        assert "--state local" in err
        assert "AccountKey" not in err
        # On purpose: --state local goes on where it was; --state azure starts in Blob.
        assert main(["run", str(app), "--once", "--state", "local"]) == EXIT_OK
        assert delivered(app) == list(range(1, 11))


def test_an_unreachable_default_blob_store_names_its_endpoint_and_the_way_out(app, capsys):
    import time

    _as_functions_developer(
        app,
        "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=a2V5;"
        "BlobEndpoint=http://127.0.0.1:9/devstoreaccount1;",
    )
    began = time.monotonic()
    assert main(["run", str(app), "--once"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert time.monotonic() - began < 15  # not half a minute of retries
    assert "http://127.0.0.1:9/devstoreaccount1/afdb-state" in err
    assert "--state local" in err
    assert "Azurite" in err
    assert "a2V5" not in err
