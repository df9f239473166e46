"""The ``afdb`` command line against real app files, SQLite tables and local state."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from azure_functions_db.cli import EXIT_FAILED, EXIT_OK, EXIT_USAGE, main
from tests.support.sqlite_orders import T0, Orders

APP = textwrap.dedent(
    """
    import os
    from pathlib import Path
    import azure_functions_db as afdb

    db = afdb.PollerBlueprint()
    OUT = Path(os.environ["CLI_OUT"])

    @db.poller(
        name="orders",
        schedule=os.environ.get("CLI_SCHEDULE", "0 0 * * * *"),
        source=afdb.SqlSource(url="%CLI_DB%", table="orders", cursor="updated_at", pk="id"),
        batch_size=4,
    )
    def on_orders(batch: afdb.Batch) -> None:
        if os.environ.get("CLI_FAIL"):
            raise RuntimeError("handler says no")
        with OUT.open("a") as f:
            f.writelines(f"{c.pk}\\n" for c in batch)
    """
)


@pytest.fixture
def app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    orders = Orders(tmp_path / "orders.db")
    orders.insert(range(1, 11))
    orders.close()
    path = tmp_path / "function_app.py"
    path.write_text(APP)
    monkeypatch.setenv("CLI_DB", orders.url)
    monkeypatch.setenv("CLI_OUT", str(tmp_path / "delivered.txt"))
    monkeypatch.setenv("AFDB_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("CLI_FAIL", raising=False)
    return path


def delivered(app: Path) -> list[int]:
    out = app.parent / "delivered.txt"
    return [int(x) for x in out.read_text().split()] if out.exists() else []


def status_json(app: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    capsys.readouterr()
    assert main(["status", str(app), "--json"]) == EXIT_OK
    (doc,) = json.loads(capsys.readouterr().out)
    assert isinstance(doc, dict)
    return doc


def test_run_once_delivers_and_reports(app, capsys):
    assert main(["run", str(app), "--once"]) == EXIT_OK
    assert delivered(app) == list(range(1, 11))
    out = capsys.readouterr().out
    assert "orders: caught_up, 3 batch(es), 10 row(s)" in out
    assert main(["run", str(app), "--once"]) == EXIT_OK
    assert delivered(app) == list(range(1, 11))


def test_status_json_is_stable(app, capsys):
    doc = status_json(app, capsys)
    assert doc["position"] is None
    assert main(["run", str(app), "--once"]) == EXIT_OK
    doc = status_json(app, capsys)
    assert set(doc) == {
        "poller",
        "namespace",
        "store",
        "position",
        "position_text",
        "fence",
        "lease",
        "committed_at",
        "attempts",
        "last_error",
        "stats",
        "error",
        "health",
        "quarantine",
    }
    assert doc["health"]["state"] == "healthy"
    assert doc["health"]["lag_rows"] == 0
    assert doc["health"]["last_success_at"] is not None
    assert doc["quarantine"] == {"records": 0, "rows": 0}
    assert (doc["poller"], doc["namespace"], doc["fence"], doc["attempts"]) == (
        "orders",
        "live",
        1,
        0,
    )
    assert doc["lease"] == {"state": "free", "holder": None, "fence": 1}
    assert doc["stats"] == {"batches": 3, "rows": 10}
    assert doc["position"] == {
        "cursor": [{"t": "datetime", "v": (T0 + dt.timedelta(seconds=3)).isoformat() + ".000000"}],
        "pk": [{"t": "int", "v": "10"}],
    }
    assert str(doc["store"]).startswith("local:")


def test_status_table_for_people(app, capsys):
    main(["run", str(app), "--once"])
    capsys.readouterr()
    assert main(["status", str(app)]) == EXIT_OK
    out = capsys.readouterr().out
    assert "orders" in out
    assert "live" in out


def test_failed_run_exits_non_zero_and_status_shows_attempts(app, capsys, monkeypatch):
    monkeypatch.setenv("CLI_FAIL", "1")
    assert main(["run", str(app), "--once"]) == EXIT_FAILED
    assert "orders: failed" in capsys.readouterr().out
    doc = status_json(app, capsys)
    assert doc["attempts"] == 1
    assert "handler says no" in str(doc["last_error"])
    assert delivered(app) == []


def test_seek_beginning_replays_and_is_audited(app, capsys):
    main(["run", str(app), "--once"])
    assert main(["seek", str(app), "--poller", "orders", "--beginning", "--reason", "replay"]) == 0
    assert "moved from" in capsys.readouterr().out
    main(["run", str(app), "--once"])
    assert delivered(app) == list(range(1, 11)) * 2


def test_seek_now_skips_history_and_new_rows_still_come(app, capsys):
    assert main(["seek", str(app), "--poller", "orders", "--now", "--json"]) == EXIT_OK
    doc = json.loads(capsys.readouterr().out)
    assert doc["from"] is None
    assert doc["to"]["pk"] == [{"t": "int", "v": "10"}]
    main(["run", str(app), "--once"])
    assert delivered(app) == []
    orders = Orders(app.parent / "orders.db")
    orders.insert([11, 12], base=T0 + dt.timedelta(days=1))
    orders.close()
    main(["run", str(app), "--once"])
    assert delivered(app) == [11, 12]


def test_seek_cursor_restarts_at_that_cursor_inclusive(app, capsys):
    main(["run", str(app), "--once"])
    at = (T0 + dt.timedelta(seconds=2)).isoformat(sep=" ")
    assert main(["seek", str(app), "--poller", "orders", "--cursor", at]) == EXIT_OK
    main(["run", str(app), "--once"])
    assert delivered(app)[10:] == [6, 7, 8, 9, 10]  # ids 6-8 share that cursor


def test_seek_refuses_while_the_lease_is_held(app, capsys):
    from azure_functions_db.core.checkpoint import PollerKey
    from azure_functions_db.state.local import LocalStateStore

    store = LocalStateStore(app.parent / "state")
    grant = store.acquire(PollerKey("live", "orders"), "busy-instance", 30)
    assert grant is not None
    assert main(["seek", str(app), "--poller", "orders", "--beginning"]) == EXIT_FAILED
    assert "busy-instance" in capsys.readouterr().err
    store.release(grant)


def test_seek_with_an_unparsable_cursor_names_it(app, capsys):
    code = main(["seek", str(app), "--poller", "orders", "--cursor", "yesterday-ish"])
    assert code == EXIT_USAGE
    assert "yesterday-ish" in capsys.readouterr().err


def test_unknown_poller_and_missing_app_are_usage_errors(app, capsys, tmp_path):
    assert main(["run", str(app), "--once", "--poller", "ordrs"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "ordrs" in err
    assert "orders" in err
    assert main(["status", str(tmp_path / "nope.py")]) == EXIT_USAGE
    assert "nope.py" in capsys.readouterr().err


def test_app_without_pollers_is_a_usage_error(tmp_path, capsys):
    empty = tmp_path / "empty_app.py"
    empty.write_text("x = 1\n")
    assert main(["status", str(empty)]) == EXIT_USAGE
    assert "defines no pollers" in capsys.readouterr().err


@pytest.mark.slow
def test_scheduled_run_follows_the_ncrontab_schedule_until_sigterm(app):
    env = {**os.environ, "CLI_SCHEDULE": "* * * * * *"}  # every second
    proc = subprocess.Popen(
        [sys.executable, "-m", "azure_functions_db", "run", str(app)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 30
        # The first run's last batch is 9-10 (< batch_size), so it ends after delivering it;
        # row 11 can only come from a later run.
        while delivered(app) != [*range(1, 11)] and time.monotonic() < deadline:
            time.sleep(0.05)
        orders = Orders(app.parent / "orders.db")
        orders.insert([11], base=T0 + dt.timedelta(days=1))
        orders.close()
        while delivered(app) != [*range(1, 12)] and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=30)[0].decode()
    assert delivered(app) == list(range(1, 12)), out
    assert proc.returncode == 0, out
    assert out.count("orders: caught_up") >= 2


def test_app_given_as_module_and_attribute(app, capsys, monkeypatch):
    package = app.parent / "pkg_for_cli_test"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "pollers.py").write_text(APP)
    monkeypatch.syspath_prepend(str(app.parent))
    assert main(["run", "pkg_for_cli_test.pollers:db", "--once"]) == EXIT_OK
    assert delivered(app) == list(range(1, 11))
    assert main(["status", "pkg_for_cli_test.pollers:nope"]) == EXIT_USAGE
    assert "has no `nope`" in capsys.readouterr().err


def test_error_text_with_brackets_is_printed_verbatim(app, capsys, monkeypatch, tmp_path):
    # A changed cursor's error lists columns as ['updated_at']; markup must not eat them.
    main(["run", str(app), "--once"])
    changed = tmp_path / "changed_app.py"
    changed.write_text(APP.replace('cursor="updated_at"', 'cursor="id"'))
    assert main(["run", str(changed), "--once"]) == EXIT_FAILED
    out = capsys.readouterr().out
    assert "cursor ['updated_at'] pk ['id']" in out


def test_status_piped_shows_every_value_whole_and_the_last_error(app, capsys, monkeypatch):
    """Piped (or narrower than 120 columns): one block per poller, no value cut to `…`; the
    reason of a failed run is shown; a poller run by hand is not judged stalled."""
    assert main(["run", str(app), "--once"]) == EXIT_OK
    capsys.readouterr()
    assert main(["status", str(app)]) == EXIT_OK  # run by hand long ago: not stalled
    out = capsys.readouterr().out
    assert "…" not in out
    assert "position:" in out
    assert "(cursor=(2026-01-01T12:00:03), pk=(10))" in out  # whole, on one line
    monkeypatch.setenv("CLI_DB", "sqlite:///" + str(app.parent / "missing" / "nope.db"))
    assert main(["run", str(app), "--once"]) == EXIT_FAILED
    capsys.readouterr()
    main(["status", str(app)])
    out = capsys.readouterr().out
    assert "the latest run failed: SourceError" in out
    doc = status_json_any(app, capsys)
    assert "SourceError" in str(doc["health"]["last_error"])


def status_json_any(app: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    capsys.readouterr()
    main(["status", str(app), "--json"])
    (doc,) = json.loads(capsys.readouterr().out)
    assert isinstance(doc, dict)
    return doc


def test_a_failed_run_is_printed_once(app, capsys, monkeypatch):
    """The command's own `failed:` line, not the runner's log line as well."""
    import logging

    monkeypatch.setenv("CLI_DB", "sqlite:///" + str(app.parent / "missing" / "nope.db"))
    root = logging.getLogger()
    saved = list(root.handlers)
    for handler in saved:
        root.removeHandler(handler)  # as in a fresh process: basicConfig installs its own
    try:
        assert main(["run", str(app), "--once"]) == EXIT_FAILED
        out, err = capsys.readouterr()
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in saved:
            root.addHandler(handler)
    text = out + err
    assert text.count("unable to open database file") == 1, text


def test_run_json_is_one_object_per_run(app, capsys, monkeypatch):
    assert main(["run", str(app), "--once", "--json"]) == EXIT_OK
    (line,) = capsys.readouterr().out.splitlines()
    doc = json.loads(line)
    assert (doc["poller"], doc["ok"], doc["status"], doc["rows"]) == (
        "orders",
        True,
        "caught_up",
        10,
    )
    assert doc["position"]["pk"] == [{"t": "int", "v": 10}] or doc["position_text"].endswith(
        "pk=(10))"
    )
    assert doc["store"].startswith("local:")
    monkeypatch.setenv("CLI_FAIL", "1")
    monkeypatch.setenv("CLI_DB", "sqlite:///" + str(app.parent / "missing" / "nope.db"))
    assert main(["run", str(app), "--once", "--json"]) == EXIT_FAILED
    (line,) = capsys.readouterr().out.splitlines()
    failed = json.loads(line)
    assert (failed["ok"], failed["status"]) == (False, "failed")
    assert "unable to open database file" in failed["error"]
