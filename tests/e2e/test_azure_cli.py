"""``afdb run``, ``status`` and ``seek`` on an app whose poller keeps its state in Azure Blob or
Table storage (a real Azurite), connected the way the Functions host connects: through the
``AzureWebJobsStorage`` setting. Nothing is created by hand: the containers and tables are
fresh names the poller must create itself.
"""

from __future__ import annotations

import datetime as dt
import json
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
from azure.data.tables import TableServiceClient
from azure.storage.blob import BlobServiceClient

from azure_functions_db.cli import EXIT_FAILED, EXIT_OK, main
from azure_functions_db.core.checkpoint import Checkpoint, PollerKey
from azure_functions_db.core.ports import StateStore
from azure_functions_db.ops.seek import operator_identity
from azure_functions_db.state.blob import BlobStateStore
from azure_functions_db.state.table import TableStateStore
from devkit.azurite import ACCOUNT_NAME, Azurite
from tests.support.sqlite_orders import T0, Orders

KEY = PollerKey("live", "orders")

APP = textwrap.dedent(
    """
    import os
    from pathlib import Path
    import azure_functions_db as afdb

    db = afdb.PollerBlueprint()
    OUT = Path(os.environ["CLI_OUT"])

    @db.poller(
        name="orders",
        schedule="0 0 * * * *",
        source=afdb.SqlSource(url="%CLI_DB%", table="orders", cursor="updated_at", pk="id"),
        batch_size=4,
        state={state},
    )
    def on_orders(batch: afdb.Batch) -> None:
        with OUT.open("a") as f:
            f.writelines(f"{{c.pk}}\\n" for c in batch)
    """
)


@dataclass(frozen=True)
class AzureApp:
    """An app file on Azure state, and a second store on the same state for the test's own use."""

    path: Path
    kind: str
    container: str
    table: str | None
    connection_string: str

    def store(self) -> StateStore:
        settings = {"AzureWebJobsStorage": self.connection_string}
        if self.kind == "blob":
            return BlobStateStore(settings=settings, container=self.container)
        assert self.table is not None
        return TableStateStore(settings=settings, table=self.table, lease_container=self.container)

    @property
    def described(self) -> str:
        return (
            f"blob:{ACCOUNT_NAME}/{self.container}"
            if self.kind == "blob"
            else f"table:{ACCOUNT_NAME}/{self.table}"
        )

    def state_exists(self) -> bool:
        """Whether the container (and, for Table, the table) exists in the account."""
        with BlobServiceClient.from_connection_string(self.connection_string) as blobs:
            container = blobs.get_container_client(self.container).exists()
        if self.kind == "blob":
            return container
        with TableServiceClient.from_connection_string(self.connection_string) as tables:
            table = any(t.name == self.table for t in tables.list_tables())
        return container or table

    def checkpoint(self) -> Checkpoint:
        stored = self.store().read(KEY)
        assert stored is not None
        return stored.checkpoint


@pytest.fixture
def fresh_names(azurite_container: str, azurite_table_name: str) -> tuple[str, str]:
    """A container and a table name that exist nowhere yet (both deleted after the test)."""
    return azurite_container, azurite_table_name


@pytest.fixture(params=["blob", "table"])
def app(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    azurite: Azurite,
    fresh_names: tuple[str, str],
) -> AzureApp:
    kind = request.param
    azurite_container, azurite_table_name = fresh_names
    if kind == "blob":
        state = f"afdb.BlobStateStore(container={azurite_container!r})"
        table = None
    else:
        state = (
            f"afdb.TableStateStore(table={azurite_table_name!r}, "
            f"lease_container={azurite_container!r})"
        )
        table = azurite_table_name
    orders = Orders(tmp_path / "orders.db")
    orders.insert(range(1, 11))
    orders.close()
    path = tmp_path / "function_app.py"
    path.write_text(APP.format(state=state))
    monkeypatch.setenv("AzureWebJobsStorage", azurite.connection_string)
    monkeypatch.setenv("CLI_DB", orders.url)
    monkeypatch.setenv("CLI_OUT", str(tmp_path / "delivered.txt"))
    # A local state directory that must stay unused: the app names its Azure store.
    monkeypatch.setenv("AFDB_STATE_DIR", str(tmp_path / "local-state"))
    return AzureApp(path, kind, azurite_container, table, azurite.connection_string)


def delivered(app: AzureApp) -> list[int]:
    out = app.path.parent / "delivered.txt"
    return [int(x) for x in out.read_text().split()] if out.exists() else []


def status_json(app: AzureApp, capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    capsys.readouterr()
    assert main(["status", str(app.path), "--json"]) == EXIT_OK
    (doc,) = json.loads(capsys.readouterr().out)
    assert isinstance(doc, dict)
    return doc


LAST = {
    "cursor": [{"t": "datetime", "v": (T0 + dt.timedelta(seconds=3)).isoformat() + ".000000"}],
    "pk": [{"t": "int", "v": "10"}],
}


def test_status_of_a_poller_that_never_ran_creates_nothing(app, capsys):
    assert not app.state_exists()
    doc = status_json(app, capsys)
    assert doc["store"] == app.described
    assert (doc["position"], doc["fence"], doc["committed_at"], doc["attempts"]) == (
        None,
        None,
        None,
        0,
    )
    assert doc["lease"] == {"state": "free", "holder": None, "fence": 0}
    assert doc["error"] is None
    assert not app.state_exists(), "`afdb status` must only read"


def test_run_creates_its_state_and_status_shows_it(app, capsys):
    assert not app.state_exists()
    before = dt.datetime.now(dt.UTC)
    assert main(["run", str(app.path), "--once"]) == EXIT_OK
    assert "orders: caught_up, 3 batch(es), 10 row(s)" in capsys.readouterr().out
    assert delivered(app) == list(range(1, 11))
    assert app.state_exists()
    assert not (app.path.parent / "local-state").exists()

    doc = status_json(app, capsys)
    assert doc["store"] == app.described
    assert (doc["poller"], doc["namespace"], doc["fence"], doc["attempts"]) == (
        "orders",
        "live",
        1,
        0,
    )
    assert doc["position"] == LAST
    assert doc["lease"] == {"state": "free", "holder": None, "fence": 1}
    assert doc["stats"] == {"batches": 3, "rows": 10}
    assert doc["last_error"] is None
    committed = dt.datetime.fromisoformat(str(doc["committed_at"]))
    assert before - dt.timedelta(seconds=5) <= committed <= dt.datetime.now(dt.UTC)

    # The stored record says the same (read through the store, not the CLI).
    cp = app.checkpoint()
    assert (cp.fence, cp.stats.rows, cp.seek) == (1, 10, None)

    # A second run: nothing new, the fence goes up, the position stays.
    assert main(["run", str(app.path), "--once"]) == EXIT_OK
    assert delivered(app) == list(range(1, 11))
    doc = status_json(app, capsys)
    assert (doc["fence"], doc["position"]) == (2, LAST)
    assert doc["lease"] == {"state": "free", "holder": None, "fence": 2}


def test_seek_beginning_replays_everything_and_stores_the_audit(app, capsys):
    assert main(["run", str(app.path), "--once"]) == EXIT_OK
    capsys.readouterr()
    before = dt.datetime.now(dt.UTC)
    code = main(
        ["seek", str(app.path), "--poller", "orders", "--beginning", "--reason", "replay after fix"]
    )
    assert code == EXIT_OK
    out = capsys.readouterr().out
    assert "moved from" in out
    assert "to (beginning)" in out

    cp = app.checkpoint()
    assert cp.position is None
    assert cp.fence == 2  # the seek holds its own lease, with its own fence
    assert cp.seek is not None
    assert cp.seek.by == operator_identity()
    assert cp.seek.reason == "replay after fix"
    assert cp.seek.from_position is not None
    assert cp.seek.from_position.to_json() == LAST
    assert cp.seek.to_position is None
    assert cp.seek.at >= before - dt.timedelta(seconds=5)
    assert cp.stats.rows == 10  # history is kept

    doc = status_json(app, capsys)
    assert doc["position"] is None
    assert doc["lease"] == {"state": "free", "holder": None, "fence": 2}

    assert main(["run", str(app.path), "--once"]) == EXIT_OK
    assert delivered(app) == list(range(1, 11)) * 2
    doc = status_json(app, capsys)
    assert (doc["position"], doc["fence"]) == (LAST, 3)


def test_seek_json_names_both_positions(app, capsys):
    assert main(["run", str(app.path), "--once"]) == EXIT_OK
    capsys.readouterr()
    assert main(["seek", str(app.path), "--poller", "orders", "--now", "--json"]) == EXIT_OK
    doc = json.loads(capsys.readouterr().out)
    assert (doc["from"], doc["to"]["pk"], doc["fence"]) == (LAST, LAST["pk"], 2)
    assert doc["by"] == operator_identity()
    cp = app.checkpoint()
    assert cp.seek is not None
    assert (cp.seek.reason, cp.fence) == ("", 2)


def test_seek_refused_while_another_owner_holds_the_lease(app, capsys):
    assert main(["run", str(app.path), "--once"]) == EXIT_OK
    store = app.store()
    grant = store.acquire(KEY, "busy-instance", 30)
    assert grant is not None
    try:
        doc = status_json(app, capsys)
        assert doc["lease"] == {"state": "held", "holder": "busy-instance", "fence": 2}
        assert doc["fence"] == 1  # the checkpoint's fence: the holder has not written yet

        code = main(["seek", str(app.path), "--poller", "orders", "--beginning", "--reason", "x"])
        assert code == EXIT_FAILED
        assert "busy-instance" in capsys.readouterr().err
        cp = app.checkpoint()
        assert (cp.position.to_json() if cp.position else None, cp.seek) == (LAST, None)

        # A run meanwhile is a clean no-op that names the holder.
        assert main(["run", str(app.path), "--once"]) == EXIT_OK
        assert "lease_held by busy-instance" in capsys.readouterr().out
    finally:
        store.release(grant)

    assert main(["seek", str(app.path), "--poller", "orders", "--beginning"]) == EXIT_OK
    cp = app.checkpoint()
    assert cp.position is None
    assert cp.fence == 3
    assert delivered(app) == list(range(1, 11))
