"""``poison="quarantine"`` with real processes and the real CLI, on the local store and on
Azurite: one poison row in a batch of 1,000, SIGKILL at every step of the quarantine and of the
replay, and the invariant checked after every process: the checkpoint never passes a row that is
neither delivered nor in a quarantine record.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from azure_functions_db.core.checkpoint import PollerKey
from azure_functions_db.core.ports import StateStore
from azure_functions_db.state.blob import BlobStateStore
from azure_functions_db.state.local import LocalStateStore
from azure_functions_db.state.table import TableStateStore
from devkit.azurite import Azurite
from tests.support.once import finish

pytestmark = pytest.mark.slow

APP = Path(__file__).resolve().parents[1] / "support" / "quarantine_app.py"
KEY = PollerKey("live", "orders")
ROWS, POISON = 1000, 500
T0 = dt.datetime(2026, 1, 1, 12, 0, 0)


class World:
    """One scenario's files: the orders table, the state, the ledger of delivered ids."""

    def __init__(self, folder: Path, store: str, azure: dict[str, str] | None = None) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.db = folder / "orders.db"
        engine = sa.create_engine(f"sqlite:///{self.db}")
        with engine.begin() as conn:
            conn.exec_driver_sql(
                "CREATE TABLE orders (id INTEGER PRIMARY KEY, updated_at TIMESTAMP NOT NULL, "
                "poison INTEGER NOT NULL)"
            )
            conn.exec_driver_sql("CREATE INDEX ix_orders ON orders (updated_at, id)")
            conn.execute(
                sa.text("INSERT INTO orders VALUES (:id, :at, :poison)"),
                [
                    {"id": i, "at": T0 + dt.timedelta(seconds=i), "poison": int(i == POISON)}
                    for i in range(1, ROWS + 1)
                ],
            )
        engine.dispose()
        self.ledger = folder / "ledger.jsonl"
        self.fixed = folder / "fixed"
        self.env = {
            "QA_DB": f"sqlite:///{self.db}",
            "QA_STORE": store,
            "QA_STATE_DIR": str(folder / "state"),
            "QA_LEDGER": str(self.ledger),
            "QA_FIXED": str(self.fixed),
            "QA_ATTEMPTS": "2",
            **(azure or {}),
        }
        self.store: StateStore
        if store == "local":
            self.store = LocalStateStore(folder / "state")
        elif store == "blob":
            self.store = BlobStateStore(settings=azure, container=self.env["QA_CONTAINER"])
        else:
            self.store = TableStateStore(
                settings=azure,
                table=self.env["QA_TABLE"],
                lease_container=self.env["QA_CONTAINER"],
            )

    def cli(self, *args: str, **env: str) -> tuple[int, str]:
        command = [sys.executable, "-m", "azure_functions_db", *args]
        proc = subprocess.Popen(
            command,
            env={**os.environ, **self.env, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        code, out = finish(proc)
        self.check()  # after every process, killed or not
        return code, out

    def run(self, **env: str) -> tuple[int, str]:
        return self.cli("run", str(APP), "--once", **env)

    def quarantine(self, *args: str, **env: str) -> tuple[int, str]:
        return self.cli("quarantine", args[0], str(APP), "--poller", "orders", *args[1:], **env)

    def delivered(self) -> list[int]:
        if not self.ledger.exists():
            return []
        return [i for line in self.ledger.read_text().splitlines() for i in json.loads(line)["ids"]]

    def records(self) -> list[Any]:
        found = []
        for record_id in self.store.list_quarantined(KEY):
            stored = self.store.read_quarantined(KEY, record_id)
            assert stored is not None
            found.append(stored.record)
        return found

    def position(self) -> int:
        stored = self.store.read(KEY)
        if stored is None or stored.checkpoint.position is None:
            return 0
        pk = stored.checkpoint.position.pk[0]
        assert isinstance(pk, int)
        return pk

    def check(self) -> None:
        """Never passed without a record: every row up to the checkpoint was delivered or is
        in a record (the rows' ids grow with their cursor, so "up to" is by id here)."""
        covered = set(self.delivered()) | {c.pk for r in self.records() for c in r.changes}
        missing = sorted(set(range(1, self.position() + 1)) - covered)
        assert missing == [], (
            f"the checkpoint passed rows with no delivery and no record: {missing}"
        )

    def drain(self) -> None:
        """Run until the poller is at the end (an Azure lease of a killed process is held
        until it expires: up to 15 s)."""
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            code, out = self.run()
            if self.position() == ROWS and code == 0:
                return
            if "lease_held" in out:
                time.sleep(1)
        raise AssertionError(f"did not reach the end: at {self.position()}\n{out}")


def killed(result: tuple[int, str]) -> str:
    code, out = result
    assert code == -signal.SIGKILL, f"expected a SIGKILL, got {code}:\n{out}"
    return out


def assert_one_poison_record(world: World, state: str = "quarantined") -> Any:
    good = set(range(1, ROWS + 1)) - {POISON}
    assert good <= set(world.delivered())
    holding = [r for r in world.records() if any(c.pk == POISON for c in r.changes)]
    assert len(holding) == 1, holding
    (record,) = holding
    assert [c.pk for c in record.changes] == [POISON]
    assert record.state == state
    return record


def scenario(world: World) -> None:
    """The whole story with no kill: fail, fail (attempts 2) and quarantine the one row, then
    replay it after a fix."""
    code, out = world.run()
    assert code == 1, out
    assert "attempt 1" in out, out
    assert world.position() == 0
    code, out = world.run()
    assert code == 0, out
    assert "action=batch_quarantined" in out, out
    assert "action=poison_isolating" in out, out
    assert world.position() == ROWS
    record = assert_one_poison_record(world)
    assert POISON not in world.delivered()
    # The operator's view, then a replay that still fails (recorded, exit 1), then after a fix.
    code, out = world.quarantine("list", "--json")
    assert code == 0, out
    (listed,) = json.loads(out)
    assert (listed["id"], listed["rows"], listed["state"]) == (record.id, 1, "quarantined")
    code, out = world.quarantine("replay", record.id)
    assert code == 1, out
    assert "stays quarantined" in out, out
    world.fixed.touch()
    code, out = world.quarantine("replay", record.id, "--reason", "fixed the parser")
    assert code == 0, out
    replayed = assert_one_poison_record(world, "replayed")
    assert [e.action for e in replayed.history] == ["quarantined", "replay_failed", "replayed"]
    assert replayed.history[-1].detail == "fixed the parser"
    assert world.delivered().count(POISON) == 1
    code, out = world.quarantine("replay", record.id)
    assert code == 1, out
    assert "--again" in out, out
    code, out = world.quarantine("list", "--json")
    assert json.loads(out) == []


def test_one_poison_row_in_a_thousand_on_the_local_store(tmp_path: Path) -> None:
    scenario(World(tmp_path, "local"))


def test_one_poison_row_in_a_thousand_on_azurite_blob(
    tmp_path: Path, azurite: Azurite, azurite_container: str
) -> None:
    azure = {"AzureWebJobsStorage": azurite.connection_string, "QA_CONTAINER": azurite_container}
    scenario(World(tmp_path, "blob", azure))


def test_one_poison_row_in_a_thousand_on_azurite_table(
    tmp_path: Path, azurite: Azurite, azurite_container: str, azurite_table_name: str
) -> None:
    azure = {
        "AzureWebJobsStorage": azurite.connection_string,
        "QA_CONTAINER": azurite_container,
        "QA_TABLE": azurite_table_name,
    }
    scenario(World(tmp_path, "table", azure))


# Every store call of a quarantining run, one kill each: the fencing write, the attempt count,
# the commits of the good halves, the record, the checkpoint's move past it, the rest.
QUARANTINE_STEPS = [
    *(f"replace:{n}:{when}" for n in range(1, 15) for when in ("before", "after")),
    "put_quarantined:1:before",
    "put_quarantined:1:after",
    "advance:1:before",
    "advance:1:after",
]


# On Azure a killed owner's lease stays held until it expires (15 s), so Azurite gets the
# steps around the record (and one commit of a good half), not all of them.
AZURE_STEPS = [
    "replace:3:after",
    "put_quarantined:1:before",
    "put_quarantined:1:after",
    "advance:1:before",
    "advance:1:after",
]


@pytest.mark.parametrize(
    ("store", "steps"), [("local", QUARANTINE_STEPS), ("blob", AZURE_STEPS)], ids=["local", "blob"]
)
def test_kill_9_at_every_step_of_quarantining_loses_nothing(
    tmp_path: Path, store: str, steps: list[str], request: pytest.FixtureRequest
) -> None:
    azure = None
    if store == "blob":
        azurite = request.getfixturevalue("azurite")
        azure = {"AzureWebJobsStorage": azurite.connection_string}
    kills = 0
    for i, step in enumerate(steps):
        if azure is not None:
            azure["QA_CONTAINER"] = f"{request.getfixturevalue('azurite_container')}-{i}"
        world = World(tmp_path / f"s{i}", store, azure)
        before = kills
        result = world.run(QA_KILL=step, QA_ATTEMPTS="1")
        world.env["QA_ATTEMPTS"] = "1"
        if result[0] == -signal.SIGKILL:
            kills += 1
            world.drain()
        else:
            assert result[0] == 0, result[1]
        assert_one_poison_record(world)
        assert world.position() == ROWS
        assert kills >= before
    # The quarantining run makes well over a dozen store calls: most steps were real kills.
    assert kills >= min(20, len(steps)), kills


REPLAY_STEPS = [
    "replace:1:after",  # fenced, handler not called yet
    "replace_quarantined:1:before",  # handler returned, record not updated
    "replace_quarantined:1:after",  # record says replayed, checkpoint not counted yet
    "replace:2:before",
    "replace:2:after",
]


def once_the_lease_is_free(call: Any) -> tuple[int, str]:
    """``call()`` again while a killed owner's lease is still held (Azure: up to 15 s)."""
    deadline = time.monotonic() + 60
    while True:
        code, out = call()
        if ("held by" not in out and "lease_held" not in out) or time.monotonic() > deadline:
            return code, out
        time.sleep(1)


@pytest.mark.parametrize(
    ("store", "step"),
    [
        *(("local", step) for step in REPLAY_STEPS),
        # On Azurite the two steps around the record's update (a killed replay's lease is held
        # until it expires, so not every step).
        ("blob", "replace_quarantined:1:before"),
        ("blob", "replace_quarantined:1:after"),
    ],
)
def test_kill_9_at_every_step_of_a_replay_loses_nothing(
    tmp_path: Path, store: str, step: str, request: pytest.FixtureRequest
) -> None:
    azure = None
    if store == "blob":
        azure = {
            "AzureWebJobsStorage": request.getfixturevalue("azurite").connection_string,
            "QA_CONTAINER": request.getfixturevalue("azurite_container"),
        }
    world = World(tmp_path, store, azure)
    world.env["QA_ATTEMPTS"] = "1"
    assert world.run()[0] == 0
    record = assert_one_poison_record(world)
    world.fixed.touch()
    killed(world.quarantine("replay", record.id, QA_KILL=step))
    after = assert_one_poison_record(world, state=world.records()[0].state)
    if after.state == "quarantined":  # the kill came before the record said replayed
        code, out = once_the_lease_is_free(lambda: world.quarantine("replay", record.id))
        assert code == 0, out
    assert_one_poison_record(world, "replayed")
    assert POISON in world.delivered()
    # The poller goes on normally afterwards.
    code, out = once_the_lease_is_free(world.run)
    assert code == 0, out
    assert world.position() == ROWS


def test_halt_is_unchanged_no_record_and_no_move(tmp_path: Path) -> None:
    world = World(tmp_path, "local")
    world.env["QA_POLICY"] = "halt"
    for attempt in (1, 2, 3):
        code, out = world.run()
        assert code == 1, out
        if attempt >= 2:
            assert "Poison batch" in out, out
    assert world.position() == 0
    assert world.records() == []
    assert world.delivered() == []
