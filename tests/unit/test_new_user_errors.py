"""What a new user meets first: errors that name the value and the fix, runs that cannot hang.

Issue 16, item 4: the handler's own error under `afdb run`, a connect timeout on a hung server,
a URL without a driver, an unresolved Key Vault reference, Ctrl-C during `afdb run --once`,
the corrupt-lease advice and the `batch_size` wording.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

import azure_functions_db as afdb
from azure_functions_db.cli import EXIT_FAILED, EXIT_INTERRUPTED, main
from azure_functions_db.core.checkpoint import PollerKey
from azure_functions_db.core.engine import PollerConfig
from azure_functions_db.errors import (
    ConfigurationError,
    SourceError,
    StateStoreError,
    UnresolvedSettingError,
)
from azure_functions_db.runtime.poller import resolve_schedule
from azure_functions_db.state.local import LocalStateStore
from azure_functions_db.state.storage import resolve_storage
from tests.support.sqlite_orders import Orders

KEY_VAULT = "@Microsoft.KeyVault(SecretUri=https://kv-orders.vault.azure.net/secrets/db-url/)"

APP = textwrap.dedent(
    """
    import os
    import time
    from pathlib import Path
    import azure_functions_db as afdb

    db = afdb.PollerBlueprint()

    @db.poller(
        name="orders",
        schedule="0 0 * * * *",
        source=afdb.SqlSource(url="%NU_DB%", table="orders", cursor="updated_at", pk="id"),
        batch_size=4,
    )
    def on_orders(batch):
        if os.environ.get("NU_FAIL"):
            raise RuntimeError("payment service said 503 for order 7")
        if os.environ.get("NU_STARTED"):
            Path(os.environ["NU_STARTED"]).touch()
            time.sleep(60)
    """
)


@pytest.fixture
def app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    orders = Orders(tmp_path / "orders.db")
    orders.insert(range(1, 10))
    orders.close()
    path = tmp_path / "function_app.py"
    path.write_text(APP)
    monkeypatch.setenv("NU_DB", orders.url)
    monkeypatch.setenv("AFDB_STATE_DIR", str(tmp_path / "state"))
    for name in ("NU_FAIL", "NU_STARTED"):
        monkeypatch.delenv(name, raising=False)
    return path


# -- afdb run shows what the handler raised ----------------------------------------------------


def test_afdb_run_shows_the_handler_exception_and_its_traceback_with_v(app, capsys, monkeypatch):
    monkeypatch.setenv("NU_FAIL", "1")
    assert main(["run", str(app), "--once"]) == EXIT_FAILED
    err = capsys.readouterr().err
    assert "handler raised RuntimeError: payment service said 503 for order 7" in err
    assert "Traceback" not in err
    assert main(["run", str(app), "--once", "-v"]) == EXIT_FAILED
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err
    assert 'raise RuntimeError("payment service said 503 for order 7")' in err


@pytest.mark.slow
def test_ctrl_c_during_run_once_prints_one_line_and_acknowledges_nothing(app, tmp_path):
    started = tmp_path / "started"
    env = {**os.environ, "NU_STARTED": str(started)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "azure_functions_db", "run", str(app), "--once"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not started.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert started.exists(), proc.communicate(timeout=5)
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == EXIT_INTERRUPTED
    assert "Traceback" not in err
    assert err.strip().splitlines() == [
        "interrupted; batch not acknowledged (it is delivered again on the next run)"
    ]
    stored = LocalStateStore(tmp_path / "state").read(PollerKey("live", "orders"))
    assert stored is not None
    assert stored.checkpoint.position is None
    # The lease was released on the way out: the next run starts at once.
    assert LocalStateStore(tmp_path / "state").inspect(PollerKey("live", "orders")).holder is None


# -- a hung database server cannot hang a run ----------------------------------------------


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A TCP port that accepts connections and never sends a byte (a hung server)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            with contextlib.suppress(TimeoutError, OSError):
                accepted.append(server.accept()[0])

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    for conn in accepted:
        conn.close()
    server.close()


def open_in_thread(source: afdb.SqlSource) -> BaseException | None:
    """Open ``source`` in a thread; the error it ended with. Fails the test if it hangs."""
    outcome: list[BaseException | None] = []

    def target() -> None:
        try:
            source.open({})
        except BaseException as exc:
            outcome.append(exc)
        else:
            outcome.append(None)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(120)  # liveness, not speed: without a timeout the connect never returns
    assert outcome, "source.open() hung on a server that never answers"
    return outcome[0]


@pytest.mark.parametrize(
    "url", ["postgresql+psycopg://u@127.0.0.1:{port}/db", "mysql+pymysql://u@127.0.0.1:{port}/db"]
)
def test_connect_to_a_hung_server_times_out(silent_server, url):
    source = afdb.SqlSource(
        url=url.format(port=silent_server),
        table="orders",
        cursor="updated_at",
        pk="id",
        connect_timeout=2,
    )
    try:
        error = open_in_thread(source)
    finally:
        source.close()
    assert isinstance(error, SourceError), error


@pytest.mark.mysql
def test_pymysql_queries_keep_no_read_timeout_after_a_bounded_connect(mysql_url, mysql_db):
    """The handshake is bounded by connect_timeout; a query may still run longer than it."""
    from devkit import dbservers

    url = dbservers.mysql_url(mysql_db)
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE orders (id INT PRIMARY KEY, updated_at DATETIME(6))"))
    engine.dispose()
    source = afdb.SqlSource(
        url=url, table="orders", cursor="updated_at", pk="id", connect_timeout=1
    )
    try:
        source.open({})
        with source.engine.connect() as conn:
            assert conn.execute(sa.text("SELECT SLEEP(2)")).scalar() == 0
    finally:
        source.close()


@pytest.mark.parametrize(
    ("url", "use"),
    [
        ("mysql://root@127.0.0.1/test", "mysql+pymysql://"),
        ("mariadb://root@127.0.0.1/test", "mysql+pymysql://"),
        ("postgres://app:s3cret@db.example.com/orders", "postgresql+psycopg://"),
    ],
)
def test_a_url_without_a_driver_names_the_url_to_use(url, use, monkeypatch):
    # As on a machine with only what our extras install: no psycopg2, no MySQLdb, no mariadb.
    for module in ("psycopg2", "MySQLdb", "mariadb"):
        monkeypatch.setitem(sys.modules, module, None)
    source = afdb.SqlSource(url=url, table="orders", cursor="updated_at", pk="id")
    with pytest.raises(ConfigurationError) as err:
        source.open({})
    assert f"Use `{use}`" in str(err.value)
    assert "s3cret" not in str(err.value)


# -- an unresolved Key Vault reference is named as such ---------------------------------------


def test_unresolved_key_vault_reference_in_a_source_url_is_named(tmp_path):
    source = afdb.SqlSource(url="%ORDERS_DB_URL%", table="orders", cursor="updated_at", pk="id")
    with pytest.raises(UnresolvedSettingError) as err:
        source.open({"ORDERS_DB_URL": KEY_VAULT})
    message = str(err.value)
    assert "`ORDERS_DB_URL`" in message
    assert "Key Vault reference" in message
    assert "Key Vault Secrets User" in message
    assert "cannot be parsed" not in message


def test_unresolved_key_vault_reference_in_a_schedule_or_storage_setting_is_named():
    with pytest.raises(UnresolvedSettingError, match="`ORDERS_SCHEDULE`"):
        resolve_schedule("%ORDERS_SCHEDULE%", {"ORDERS_SCHEDULE": KEY_VAULT}, "orders")
    with pytest.raises(UnresolvedSettingError, match="`AzureWebJobsStorage`"):
        resolve_storage({"AzureWebJobsStorage": KEY_VAULT}, "AzureWebJobsStorage")


def test_an_unresolved_reference_does_not_break_importing_the_app(tmp_path, monkeypatch):
    monkeypatch.setenv("NU_KV_URL", KEY_VAULT)
    db = afdb.PollerBlueprint()
    source = afdb.SqlSource(url="%NU_KV_URL%", table="orders", cursor="updated_at", pk="id")
    db.poller(name="orders", schedule="0 0 * * * *", source=source)(lambda batch: None)
    assert "orders" in db.pollers


# -- wording -----------------------------------------------------------------------------------


def test_corrupt_lease_advice_repairs_the_fence_and_never_says_delete(tmp_path):
    store = LocalStateStore(tmp_path)
    key = PollerKey("live", "orders")
    assert store.acquire(key, "a", 30) is not None
    store.lease_path(key).write_text('{"fence": "seven"}')
    with pytest.raises(StateStoreError) as err:
        store.inspect(key)
    message = str(err.value)
    assert "or delete it" not in message
    assert "Do not delete it" in message
    assert '"fence": N' in message


@pytest.mark.parametrize("value", [0, -3, 2.5, "10", True])
def test_batch_size_must_be_a_positive_integer(value):
    with pytest.raises(ConfigurationError, match="must be a positive integer"):
        PollerConfig(name="orders", batch_size=value)


def test_time_budget_is_a_positive_number():
    with pytest.raises(ConfigurationError, match="must be a positive number"):
        PollerConfig(name="orders", time_budget=0)


def test_a_bad_url_fails_the_run_naming_the_fix(app, capsys, monkeypatch):
    # Importing the app opens nothing (issue 11): the poller's run reports the URL.
    monkeypatch.setenv("NU_DB", "mysql://root@127.0.0.1/test")
    monkeypatch.setitem(sys.modules, "MySQLdb", None)
    assert main(["run", str(app), "--once"]) == EXIT_FAILED
    assert "mysql+pymysql://" in capsys.readouterr().out
