"""The sample app (``function_app.py``) loads and runs in the real Python worker (SPEC §8).

What runs, and what is stood in:

- **Real**: the Python worker library ``azure-functions-runtime`` (pinned below; it needs Python
  >= 3.13, so it runs in a venv of its own, ``.venv-worker``, built and cached by the
  ``worker_python`` fixture), ``azure-functions``, this package, PostgreSQL and Azurite. The worker
  indexes ``function_app.py`` with its own loader (``index_function_app``,
  ``process_indexed_function``, ``Registry.add_indexed_function``, where a parameter the
  bindings do not declare raises ``FunctionLoadError``), answers the metadata and load requests,
  decodes the timer payload with the ``azure.functions`` converter and invokes the function.
- **Stood in**: the gRPC transport with the worker's proxy around the library, and the protobuf
  message classes. The modern proxy worker, which holds the compiled protos, is not published on
  PyPI (it ships with Core Tools and the platform images), and Core Tools cannot be installed here.
  ``tests/support/worker_driver.py`` plays host and proxy, passing messages as Python objects to the
  library's public entry points; ``tests/support/worker_protos.py`` supplies the ``protos`` module
  the proxy would hand the library, with the real messages' field names and protobuf's checks.

So this is the closest we get to ``func start`` without Core Tools: everything from the worker's
request handlers inwards is the code that runs in Azure.

The driver runs as a subprocess of the 3.13 interpreter, with a timeout, and prints one JSON
document; its stderr (the worker's and the app's logs) is echoed, so a failing test shows it.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from devkit.azurite import Azurite

REPO = Path(__file__).resolve().parents[2]
TESTS = Path(__file__).resolve().parents[1] / "support"
DRIVER = TESTS / "worker_driver.py"
PROBE = TESTS / "worker_app_probe.py"
SAMPLE_APP = REPO / "function_app.py"
HOST_JSON = REPO / "host.json"
LOCAL_SETTINGS = REPO / "local.settings.example.json"

#: The worker venv: Python 3.13, the worker library and azure-functions pinned, this repo
#: installed editable with the extras the sample's requirements.txt names.
WORKER_VENV = REPO / ".venv-worker"
WORKER_LOCK = REPO / ".venv-worker.lock"
WORKER_RUNTIME_VERSION = "1.3.0"
AZURE_FUNCTIONS_VERSION = "2.3.0"
WORKER_PINS = (
    f"azure-functions-runtime=={WORKER_RUNTIME_VERSION}",
    f"azure-functions=={AZURE_FUNCTIONS_VERSION}",
)
WORKER_EXTRAS = "azure,postgres"
WORKER_PYTHON_SETTING = "AFDB_WORKER_PYTHON"  # an explicit interpreter overrides the search
INSTALL_TIMEOUT = 900
DRIVER_TIMEOUT = 240

STATE_CONTAINER = "afdb-state"  # BlobStateStore's default, which the sample app uses
SCHEDULE = "*/30 * * * * *"
ORDERS = 5
_BASE = dt.datetime(2024, 5, 1, 12, 0, tzinfo=dt.UTC)  # orders.updated_at start here

# Settings of the developer's or CI's shell that would change what the worker process sees.
_NOT_INHERITED = re.compile(
    r"^(AFDB_|AzureWebJobs|AzureFunctions|FUNCTIONS_|WEBSITE_|ORDERS_|PYTHON|VIRTUAL_ENV$|PYTEST)"
)


# -- the Python 3.13 worker environment ----------------------------------------------------------


def _python_version(executable: str) -> str | None:
    """``sys.version`` of ``executable`` when it is Python 3.13, else ``None``."""
    try:
        proc = subprocess.run(
            [executable, "-c", "import sys; print(sys.version_info[:2] == (3, 13), sys.version)"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    flag, _, version = proc.stdout.strip().partition(" ")
    return version if proc.returncode == 0 and flag == "True" else None


def find_python313() -> tuple[str, str] | None:
    """A Python 3.13 interpreter and its version: ``$AFDB_WORKER_PYTHON``, else ``python3.13``
    on PATH, else a pyenv 3.13."""
    explicit = os.environ.get(WORKER_PYTHON_SETTING)
    if explicit:
        version = _python_version(explicit)
        return (explicit, version) if version else None
    candidates = [shutil.which("python3.13") or ""]
    pyenv_root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    candidates += [
        str(p) for p in sorted(pyenv_root.glob("versions/3.13*/bin/python3.13"), reverse=True)
    ]
    for candidate in filter(None, candidates):
        version = _python_version(candidate)
        if version:
            return candidate, version
    return None


def _venv_key(executable: str, version: str) -> str:
    """What the cached venv was built from; a change of any part rebuilds it."""
    material = {
        "pyproject": hashlib.sha256((REPO / "pyproject.toml").read_bytes()).hexdigest(),
        "pins": WORKER_PINS,
        "extras": WORKER_EXTRAS,
        "python": [executable, version],
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


def _run_or_fail(command: list[str], what: str) -> None:
    try:
        proc = subprocess.run(
            command, capture_output=True, text=True, timeout=INSTALL_TIMEOUT, check=False
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{what} timed out after {INSTALL_TIMEOUT}s: {' '.join(command)}\n{exc}")
    if proc.returncode != 0:
        pytest.fail(
            f"{what} failed (exit {proc.returncode}): {' '.join(command)}\n"
            f"--- stdout ---\n{proc.stdout[-4000:]}\n--- stderr ---\n{proc.stderr[-8000:]}"
        )


@pytest.fixture(scope="session")
def worker_python() -> Path:
    """The Python of ``.venv-worker`` (Python 3.13 + the real worker library), built if needed.

    The venv is cached across runs, keyed by pyproject.toml, the pins and the base interpreter
    (a stamp file written last, so an interrupted build is redone). A missing Python 3.13 skips
    the worker tests, and CI fails on that skip.
    """
    found = find_python313()
    if found is None:
        pytest.skip(
            "Python 3.13 not found (the real Functions worker, azure-functions-runtime, needs "
            f"Python >= 3.13): install it (e.g. `pyenv install 3.13`) or set "
            f"{WORKER_PYTHON_SETTING}=/path/to/python3.13"
        )
    executable, version = found
    key = _venv_key(executable, version)
    python = WORKER_VENV / "bin" / "python"
    stamp = WORKER_VENV / ".afdb-worker-stamp"
    with WORKER_LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one builder at a time (parallel sessions)
        if python.exists() and stamp.is_file() and stamp.read_text() == key:
            return python
        shutil.rmtree(WORKER_VENV, ignore_errors=True)
        _run_or_fail([executable, "-m", "venv", str(WORKER_VENV)], "creating the worker venv")
        _run_or_fail(
            [
                str(python),
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                *WORKER_PINS,
                "-e",
                f"{REPO}[{WORKER_EXTRAS}]",
            ],
            "installing the worker venv",
        )
        stamp.write_text(key)
    return python


# -- running the driver ----------------------------------------------------------------------------


def worker_env(**settings: str) -> dict[str, str]:
    """The worker process's environment: the shell's basics plus the app settings given."""
    env = {k: v for k, v in os.environ.items() if not _NOT_INHERITED.match(k)}
    env["FUNCTIONS_WORKER_RUNTIME"] = "python"
    env.update(settings)
    return env


def run_driver(python: Path, app_dir: Path, env: dict[str, str], *args: str) -> dict[str, Any]:
    """Run the driver on ``app_dir``; its stderr is echoed (pytest shows it for a failing test)."""
    command = [str(python), "-P", str(DRIVER), str(app_dir), *args]
    try:
        proc = subprocess.run(
            command,
            env=env,
            cwd=app_dir,
            capture_output=True,
            text=True,
            timeout=DRIVER_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        stderr = exc.stderr.decode() if isinstance(exc.stderr, bytes) else exc.stderr or ""
        pytest.fail(f"the worker driver timed out after {DRIVER_TIMEOUT}s\n{stderr[-8000:]}")
    sys.stderr.write(proc.stderr)
    if proc.returncode != 0:
        pytest.fail(f"the worker driver exited {proc.returncode}:\n{proc.stderr[-8000:]}")
    try:
        report: dict[str, Any] = json.loads(proc.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"the worker driver printed no JSON document:\n{proc.stdout[-4000:]}")
    sys.stderr.write("\n--- driver report ---\n" + json.dumps(report, indent=2) + "\n")
    return report


def events(invocation: dict[str, Any], action: str) -> list[dict[str, Any]]:
    return [e for e in invocation["events"] if e["action"] == action]


# -- the database and the state container ------------------------------------------------------


@dataclass(frozen=True)
class OrdersDb:
    """The scratch schema holding ``orders``; ``url`` is the app's ``ORDERS_DB_URL`` (the test
    database with that schema as its search_path)."""

    admin_url: str
    schema: str

    @property
    def url(self) -> str:
        return f"{self.admin_url}?options=-csearch_path%3D{self.schema}"

    def insert(self, ids: range, base: dt.datetime) -> None:
        """Orders ``ids`` (status ``s<id>``); two orders share each timestamp from ``base`` on,
        so the keyset order needs the pk too."""
        import sqlalchemy as sa

        engine = sa.create_engine(self.admin_url, poolclass=sa.NullPool)
        try:
            with engine.begin() as conn:
                conn.execute(
                    sa.text(
                        f'INSERT INTO "{self.schema}".orders (id, updated_at, status) '
                        "VALUES (:id, :at, :status)"
                    ),
                    [
                        {
                            "id": i,
                            "at": base + dt.timedelta(seconds=i // 2),
                            "status": f"s{i}",
                        }
                        for i in ids
                    ],
                )
        finally:
            engine.dispose()


@pytest.fixture
def orders_db(pg_url: str, pg_schema: str) -> OrdersDb:
    """``orders`` (id, updated_at timestamptz, status) in a scratch schema, with 5 rows."""
    import sqlalchemy as sa

    engine = sa.create_engine(pg_url, poolclass=sa.NullPool)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(
                f'CREATE TABLE "{pg_schema}".orders (id bigint PRIMARY KEY, '
                "updated_at timestamptz NOT NULL, status text)"
            )
    finally:
        engine.dispose()
    db = OrdersDb(pg_url, pg_schema)
    db.insert(range(1, ORDERS + 1), _BASE)
    return db


def _audit_rows(url: str) -> list[tuple[Any, ...]]:
    import sqlalchemy as sa

    engine = sa.create_engine(url, poolclass=sa.NullPool)
    try:
        with engine.connect() as conn:
            return [
                tuple(row)
                for row in conn.exec_driver_sql(
                    "SELECT order_id, status, event_id FROM order_audit ORDER BY order_id"
                )
            ]
    finally:
        engine.dispose()


def _delete_container(connection_string: str) -> None:
    from azure.core.exceptions import HttpResponseError, ResourceNotFoundError
    from azure.storage.blob import BlobLeaseClient, BlobServiceClient

    with BlobServiceClient.from_connection_string(connection_string) as service:
        container = service.get_container_client(STATE_CONTAINER)
        try:
            container.delete_container()
        except ResourceNotFoundError:
            pass
        except HttpResponseError as exc:
            if exc.error_code != "LeaseIdMissing":
                raise
            BlobLeaseClient(container).break_lease(lease_break_period=0)
            container.delete_container()


@pytest.fixture
def storage(azurite: Azurite) -> Iterator[str]:
    """``AzureWebJobsStorage`` for the worker: the shared Azurite, with no ``afdb-state``
    container before the test (the sample's state container name is fixed) and none after."""
    _delete_container(azurite.connection_string)
    yield azurite.connection_string
    azurite.ensure_running()
    _delete_container(azurite.connection_string)


def _checkpoint_blob(connection_string: str, poller: str) -> Any:
    """The checkpoint record of ``live/<poller>``, read straight from the blob in Azurite."""
    from azure.core.exceptions import ResourceNotFoundError
    from azure.storage.blob import BlobServiceClient

    from azure_functions_db.core.checkpoint import PollerKey, decode_checkpoint
    from azure_functions_db.state.blob import BlobStateStore

    name = BlobStateStore.checkpoint_name(PollerKey(namespace="live", poller=poller))
    with BlobServiceClient.from_connection_string(connection_string) as service:
        blob = service.get_blob_client(STATE_CONTAINER, name)
        try:
            data = blob.download_blob().readall()
        except ResourceNotFoundError:
            pytest.fail(f"no checkpoint blob {STATE_CONTAINER}/{name} in Azurite")
    return decode_checkpoint(data)


def _app_dir(tmp_path: Path, source: str | None = None) -> Path:
    """A function app directory: the repo's function_app.py and host.json, or ``source``."""
    app = tmp_path / "app"
    app.mkdir()
    shutil.copy(HOST_JSON, app / "host.json")
    if source is None:
        shutil.copy(SAMPLE_APP, app / "function_app.py")
    else:
        (app / "function_app.py").write_text(textwrap.dedent(source))
    return app


# -- the sample app in the worker ------------------------------------------------------------------


@pytest.mark.worker
@pytest.mark.postgres
def test_sample_app_indexes_loads_and_delivers_in_the_real_worker(
    worker_python: Path, orders_db: OrdersDb, storage: str, tmp_path: Path
) -> None:
    app = _app_dir(tmp_path)
    env = worker_env(AzureWebJobsStorage=storage, ORDERS_DB_URL=orders_db.url)
    report = run_driver(
        worker_python, app, env, "--invoke", "poll_orders", "--times", "2", "--past-due-from", "2"
    )

    assert report["worker"] == {
        "library": "azure-functions-runtime",
        "python": report["worker"]["python"],
        "version": WORKER_RUNTIME_VERSION,
    }
    assert report["worker"]["python"].startswith("3.13.")
    # Indexing (worker_init_request): no FunctionLoadError.
    assert report["init"]["status"] == "Success", report["init"]["exception"]
    assert report["init"]["exception"] is None

    # functions_metadata_request: exactly one function, the timer of the `orders` poller.
    metadata = report["metadata"]
    assert metadata["status"] == "Success"
    assert metadata["use_default_metadata_indexing"] is False
    (function,) = metadata["functions"]
    assert function["name"] == "poll_orders"
    assert function["language"] == "python"
    assert function["directory"] == str(app.resolve())
    assert function["script_file"] == "function_app.py"
    assert function["retry_options"] is None
    assert function["bindings"] == {
        "timer": {"type": "timerTrigger", "direction": "in", "data_type": "undefined"}
    }
    (raw,) = function["raw_bindings"]
    assert raw["type"] == "timerTrigger"
    assert raw["name"] == "timer"
    assert raw["direction"] == "IN"
    assert raw["schedule"] == SCHEDULE
    assert raw.get("runOnStartup", False) is False

    # function_load_request
    assert report["load"] == {
        "poll_orders": {"function_id": function["function_id"], "status": "Success"}
    }

    # invocation_request x2: the first delivers every order once, the second (past due) nothing.
    first, second = report["invocations"]
    for invocation in (first, second):
        assert invocation["status"] == "Success", invocation["exception"]
        assert invocation["response_invocation_id"] == invocation["invocation_id"]
        assert invocation["has_return_value"] is False
    (done,) = events(first, "run_done")
    assert (done["status"], done["batches"], done["rows"]) == ("caught_up", 1, ORDERS)
    assert events(first, "lease_acquired")
    assert events(first, "batch_committed")
    assert not events(first, "timer_past_due")
    assert any(f"{ORDERS} new audit rows" in line for line in first["app_log"]), first["app_log"]
    assert events(second, "timer_past_due") == [
        {"action": "timer_past_due", "level": "INFO", "poller": "orders"}
    ]
    (done,) = events(second, "run_done")
    assert (done["status"], done["batches"], done["rows"]) == ("caught_up", 0, 0)
    assert not events(second, "batch_committed")
    assert second["app_log"] == []

    # The handler's visible side effect: one audit row per order.
    audit = _audit_rows(orders_db.url)
    assert [(order_id, status) for order_id, status, _ in audit] == [
        (i, f"s{i}") for i in range(1, ORDERS + 1)
    ]
    assert len({event_id for *_, event_id in audit}) == ORDERS

    # The checkpoint lives in Azurite (the default BlobStateStore under a Functions host).
    checkpoint = _checkpoint_blob(storage, "orders")
    assert checkpoint.position is not None
    assert checkpoint.position.pk == (ORDERS,)
    assert checkpoint.position.cursor == (_BASE + dt.timedelta(seconds=ORDERS // 2),)
    assert (checkpoint.stats.batches, checkpoint.stats.rows) == (1, ORDERS)
    assert checkpoint.attempts == 0
    assert checkpoint.fence == 2  # each invocation took the lease once and fenced the checkpoint

    # A new worker process (a restart) picks up from that checkpoint: only the new order.
    orders_db.insert(range(ORDERS + 1, ORDERS + 2), _BASE + dt.timedelta(hours=1))
    again = run_driver(worker_python, app, env, "--invoke", "poll_orders")
    (third,) = again["invocations"]
    assert third["status"] == "Success", third["exception"]
    (done,) = events(third, "run_done")
    assert (done["batches"], done["rows"]) == (1, 1)
    assert [order_id for order_id, *_ in _audit_rows(orders_db.url)] == list(range(1, ORDERS + 2))
    checkpoint = _checkpoint_blob(storage, "orders")
    assert checkpoint.position is not None
    assert checkpoint.position.pk == (ORDERS + 1,)
    assert (checkpoint.stats.batches, checkpoint.stats.rows) == (2, ORDERS + 1)


FAILING_APP = """
    import azure.functions as func

    import azure_functions_db as afdb

    db = afdb.PollerBlueprint()


    @db.poller(
        name="orders-failing",
        schedule="*/30 * * * * *",
        source=afdb.SqlSource(url="%ORDERS_DB_URL%", table="orders", cursor="updated_at", pk="id"),
    )
    def on_orders(batch: afdb.Batch) -> None:
        raise RuntimeError("the handler failed on purpose")


    app = func.FunctionApp()
    app.register_functions(db)
"""


@pytest.mark.worker
@pytest.mark.postgres
def test_a_failing_handler_fails_the_invocation_in_the_real_worker(
    worker_python: Path, orders_db: OrdersDb, storage: str, tmp_path: Path
) -> None:
    app = _app_dir(tmp_path, FAILING_APP)
    env = worker_env(AzureWebJobsStorage=storage, ORDERS_DB_URL=orders_db.url)
    report = run_driver(worker_python, app, env, "--invoke", "poll_orders_failing")

    assert report["init"]["status"] == "Success", report["init"]["exception"]
    assert report["load"]["poll_orders_failing"]["status"] == "Success"
    (invocation,) = report["invocations"]
    # The host sees a failed invocation, with the poller's error and the handler's cause.
    assert invocation["status"] == "Failure"
    exception = invocation["exception"]
    assert exception["message"].startswith("HandlerError: "), exception["message"]
    assert "RuntimeError: the handler failed on purpose" in exception["stack_trace"]
    assert events(invocation, "handler_failed")
    assert not events(invocation, "batch_committed")

    # Nothing was acknowledged; the failed attempt is counted on the checkpoint in Azurite.
    checkpoint = _checkpoint_blob(storage, "orders-failing")
    assert checkpoint.position is None
    assert checkpoint.attempts == 1
    assert checkpoint.last_error is not None
    assert "RuntimeError" in checkpoint.last_error
    assert checkpoint.stats.rows == 0


ASYNC_APP = """
    import asyncio

    import azure.functions as func

    import azure_functions_db as afdb

    db = afdb.PollerBlueprint()
    CLIENT = {}  # made on first use, bound to the loop it was made on (as aio clients are)


    @db.poller(
        name="orders-async",
        schedule="*/30 * * * * *",
        batch_size=2,
        source=afdb.SqlSource(url="%ORDERS_DB_URL%", table="orders", cursor="updated_at", pk="id"),
    )
    async def on_orders(batch: afdb.Batch) -> None:
        if not CLIENT:
            CLIENT["lock"] = asyncio.Lock()
            CLIENT["loop"] = asyncio.get_running_loop()
        if asyncio.get_running_loop() is not CLIENT["loop"]:
            raise RuntimeError("the shared client is bound to a different event loop")
        async with CLIENT["lock"]:
            await asyncio.sleep(0)


    app = func.FunctionApp()
    app.register_functions(db)
"""


@pytest.mark.worker
@pytest.mark.postgres
def test_an_async_handler_keeps_its_loop_bound_client_in_the_real_worker(
    worker_python: Path, orders_db: OrdersDb, storage: str, tmp_path: Path
) -> None:
    """Several batches in one invocation, and a second invocation, on the one handler loop."""
    app = _app_dir(tmp_path, ASYNC_APP)
    env = worker_env(AzureWebJobsStorage=storage, ORDERS_DB_URL=orders_db.url)
    report = run_driver(worker_python, app, env, "--invoke", "poll_orders_async", "--times", "2")

    assert report["init"]["status"] == "Success", report["init"]["exception"]
    first, second = report["invocations"]
    assert first["status"] == "Success", first.get("exception")
    # 2 + 2 + 1 rows; group commit may write two batches in one commit
    assert sum(int(e["rows"]) for e in events(first, "batch_committed")) == 5
    (done,) = events(first, "run_done")
    assert (done["batches"], done["rows"]) == (3, 5)
    assert not events(first, "handler_failed")
    assert second["status"] == "Success", second.get("exception")
    checkpoint = _checkpoint_blob(storage, "orders-async")
    assert checkpoint.stats.rows == 5


BROKEN_APP = """
    import azure.functions as func

    app = func.FunctionApp()


    @app.timer_trigger(arg_name="timer", schedule="*/30 * * * * *")
    def poll_broken(timer: func.TimerRequest, extra: str) -> None:
        pass
"""


@pytest.mark.worker
@pytest.mark.parametrize(
    "port", [5432, 1], ids=["database-without-orders-table", "no-database-server"]
)
def test_sample_app_indexes_with_the_example_settings_whatever_the_database(
    worker_python: Path, tmp_path: Path, port: int
) -> None:
    """local.settings.example.json as it is: its database has no `orders` table (or, on
    port 1, no server at all). Indexing does no I/O, so the app's function is indexed and loads;
    the missing table is the business of the poller's runs."""
    values = dict(json.loads(LOCAL_SETTINGS.read_text())["Values"])
    values["ORDERS_DB_URL"] = values["ORDERS_DB_URL"].replace(":5432/", f":{port}/")
    report = run_driver(worker_python, _app_dir(tmp_path), worker_env(**values))
    assert report["init"]["status"] == "Success", report["init"]["exception"]
    (function,) = report["metadata"]["functions"]
    assert function["name"] == "poll_orders"
    assert report["load"][function["name"]]["status"] == "Success"


@pytest.mark.worker
def test_the_harness_sees_a_function_load_error(worker_python: Path, tmp_path: Path) -> None:
    """A parameter no binding declares is a FunctionLoadError in the worker's indexing: the
    driver must report it (so a pass of the sample app above means it had none)."""
    app = _app_dir(tmp_path, BROKEN_APP)
    report = run_driver(worker_python, app, worker_env())

    assert report["init"]["status"] == "Failure"
    message = report["init"]["exception"]["message"]
    assert message.startswith("FunctionLoadError: cannot load the poll_broken function"), message
    assert "extra" in message
    assert "metadata" not in report


RETRY_APP = """
    import azure.functions as func

    import azure_functions_db as afdb

    db = afdb.PollerBlueprint()
    source = afdb.SqlSource(url="%ORDERS_DB_URL%", table="orders", cursor="updated_at", pk="id")


    @db.poller(
        name="fixed",
        schedule="0 */5 * * * *",
        source=source,
        retry=afdb.FunctionsRetry("fixed_delay", max_retry_count=2, delay_interval="00:00:30"),
    )
    def on_fixed(batch: afdb.Batch) -> None:
        pass


    @db.poller(
        name="backoff",
        schedule="%BACKOFF_SCHEDULE%",
        source=source,
        run_on_startup=True,
        use_monitor=False,
        retry=afdb.FunctionsRetry(
            "exponential_backoff",
            max_retry_count=3,
            minimum_interval="00:00:10",
            maximum_interval="00:15:00",
        ),
    )
    def on_backoff(batch: afdb.Batch) -> None:
        pass


    app = func.FunctionApp()
    app.register_functions(db)
"""


@pytest.mark.worker
def test_timer_options_and_host_retry_policies_index_in_the_real_worker(
    worker_python: Path, tmp_path: Path
) -> None:
    """The decorator's other timer options and both host retry strategies go through the
    worker's indexing (``build_retry_protos``) as the retry options the host gets."""
    app = _app_dir(tmp_path, RETRY_APP)
    report = run_driver(worker_python, app, worker_env())  # no ORDERS_DB_URL: no source check

    assert report["init"]["status"] == "Success", report["init"]["exception"]
    by_name = {f["name"]: f for f in report["metadata"]["functions"]}
    assert set(by_name) == {"poll_fixed", "poll_backoff"}
    assert by_name["poll_fixed"]["retry_options"] == {
        "max_retry_count": 2,
        "retry_strategy": 1,  # fixed_delay
        "delay_interval": 30.0,
    }
    assert by_name["poll_backoff"]["retry_options"] == {
        "max_retry_count": 3,
        "retry_strategy": 0,  # exponential_backoff
        "minimum_interval": 10.0,
        "maximum_interval": 900.0,
    }
    (raw,) = by_name["poll_backoff"]["raw_bindings"]
    assert raw["schedule"] == "%BACKOFF_SCHEDULE%"
    assert raw["runOnStartup"] is True
    assert raw["useMonitor"] is False
    assert report["load"] == {
        name: {"function_id": f["function_id"], "status": "Success"} for name, f in by_name.items()
    }


# -- the sample app on the dev Python (3.11) and the host settings -------------------------------


@pytest.fixture(scope="module")
def sample_app() -> dict[str, Any]:
    """What ``worker_app_probe.py`` sees in function_app.py, imported afresh (a subprocess on
    this Python, with no app settings: importing the app needs neither the database nor
    storage)."""
    proc = subprocess.run(
        [sys.executable, "-P", str(PROBE), str(SAMPLE_APP)],
        env={k: v for k, v in os.environ.items() if not _NOT_INHERITED.match(k)},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    report: dict[str, Any] = json.loads(proc.stdout)
    return report


def test_get_functions_has_one_timer_function_per_poller(sample_app: dict[str, Any]) -> None:
    functions, pollers = sample_app["functions"], sample_app["pollers"]
    assert sorted(pollers) == ["orders"]
    assert [f["name"] for f in functions] == ["poll_orders"]
    for function in functions:
        assert function["parameters"] == ["timer"]  # only the timer: nothing else to bind
        assert function["is_async"] is True  # the run goes to a thread; the loop stays free
        (binding,) = function["bindings"]
        assert binding["type"] == "timerTrigger"
        assert binding["name"] == "timer"
        assert binding["direction"] == "IN"
        poller = function["name"].removeprefix("poll_")
        assert binding["schedule"] == pollers[poller]["schedule"] == SCHEDULE
        assert function["retry"] is None


def _timespan_seconds(value: str) -> float:
    """A host.json timespan ``[d.]hh:mm:ss`` in seconds."""
    match = re.fullmatch(r"(?:(\d+)\.)?(\d{1,2}):([0-5]\d):([0-5]\d)", value)
    assert match, f"functionTimeout {value!r} is not a [d.]hh:mm:ss timespan"
    days, hours, minutes, seconds = (int(g or 0) for g in match.groups())
    return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)


def test_host_json_is_v2_with_the_bundle_and_a_timeout_above_every_run(
    sample_app: dict[str, Any],
) -> None:
    """functionTimeout must outlast a whole run: the time budget (after which no new batch
    starts) plus a margin of two lease durations for the batch in flight and the release."""
    host = json.loads(HOST_JSON.read_text())
    assert host["version"] == "2.0"
    bundle = host["extensionBundle"]
    assert bundle["id"] == "Microsoft.Azure.Functions.ExtensionBundle"
    assert bundle["version"] == "[4.*, 5.0.0)"
    timeout = _timespan_seconds(host["functionTimeout"])
    for name, poller in sample_app["pollers"].items():
        config = poller["config"]
        needed = config["time_budget"] + 2 * config["lease_duration"]
        assert timeout > needed, (
            f"host.json functionTimeout {host['functionTimeout']} ({timeout:.0f}s) is not above "
            f"poller `{name}`'s time_budget {config['time_budget']}s + 2 x lease_duration "
            f"{config['lease_duration']}s = {needed:.0f}s"
        )


def test_local_settings_example_runs_the_sample_against_azurite() -> None:
    settings = json.loads(LOCAL_SETTINGS.read_text())
    values = settings["Values"]
    assert settings["IsEncrypted"] is False
    assert values["FUNCTIONS_WORKER_RUNTIME"] == "python"
    assert values["AzureWebJobsStorage"] == "UseDevelopmentStorage=true"
    assert values["ORDERS_DB_URL"].startswith("postgresql+psycopg://")
