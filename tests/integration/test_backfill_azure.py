"""Spark backfill with the poller's checkpoints in Azure Blob Storage (Azurite), on ``local[2]``.

Under Functions a poller keeps its state in a ``BlobStateStore``, so that is where a backfill of
it keeps its run and chunk records and where it seeds the live poller. The executors reach the
store through the app settings the driver ships them (here the Azurite connection string), as a
Databricks or Synapse job would with the app's settings.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from azure_functions_db.cli import EXIT_OK, main
from azure_functions_db.core.checkpoint import PollerKey
from azure_functions_db.spark import backfill
from azure_functions_db.spark.records import chunk_key, chunk_range, run_key
from azure_functions_db.state.blob import BlobStateStore
from devkit.azurite import ACCOUNT_KEY, Azurite
from tests.support.sqlite_orders import T0, Orders

from .test_backfill import APP, delivered

pytestmark = [
    pytest.mark.spark,
    pytest.mark.filterwarnings("ignore:unclosed <socket.socket:ResourceWarning"),
]


@pytest.fixture
def blob_app(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, azurite: Azurite, azurite_container: str
) -> tuple[Path, Orders, BlobStateStore]:
    path = tmp_path / "function_app.py"
    path.write_text(APP)  # the poller of tests/integration/test_backfill.py, on Blob state here
    orders = Orders(tmp_path / "orders.db")
    monkeypatch.setenv("BF_DB", orders.url)
    monkeypatch.setenv("BF_OUT", str(tmp_path / "delivered.txt"))
    monkeypatch.setenv("BF_CONTAINER", azurite_container)
    monkeypatch.setenv("BF_BATCH", "7")
    monkeypatch.setenv("AzureWebJobsStorage", azurite.connection_string)
    monkeypatch.setenv("AFDB_STATE_DIR", str(tmp_path / "local-state"))  # must stay unused
    store = BlobStateStore(
        settings={"AzureWebJobsStorage": azurite.connection_string}, container=azurite_container
    )
    return path, orders, store


def test_backfill_keeps_its_records_in_the_pollers_blob_store_and_hands_off(blob_app, spark, capfd):
    app, orders, store = blob_app
    orders.insert(range(1, 51))
    report = backfill(app, "orders", partitions=3, spark=spark, run_id="b1")
    out = app.parent / "delivered.txt"
    assert set(delivered(out, "backfill")) == set(range(1, 51))
    assert (report.chunks, report.chunks_run, report.rows) == (3, 3, 50)
    # The run record and every chunk's checkpoint are in the poller's container, finished.
    assert store.read(run_key("backfill", "orders", "b1")) is not None
    for index in range(3):
        stored = store.read(chunk_key("backfill", "orders", "b1", index))
        assert stored is not None
        chunk = chunk_range(stored.checkpoint)
        assert chunk is not None
        assert chunk.finished(stored.checkpoint)
    # The live poller, which had no checkpoint, was seeded there with H0.
    live = store.read(PollerKey("live", "orders"))
    assert live is not None
    assert live.checkpoint.position == report.h0
    assert not (app.parent / "local-state").exists()
    # Live polling on the same Blob state delivers only what came after H0.
    orders.insert(range(51, 56), base=T0 + dt.timedelta(hours=1))
    assert main(["run", str(app), "--once"]) == EXIT_OK
    assert sorted(delivered(out, "live")) == list(range(51, 56))
    # Status reads the finished run from Blob; a rerun of it redoes nothing.
    printed = capfd.readouterr()
    assert main(["status", str(app), "--json"]) == EXIT_OK
    status = capfd.readouterr()
    docs = json.loads(status.out)
    (run,) = [d for d in docs if d["namespace"] == "backfill"]
    assert "finished" in run["detail"]
    again = backfill(app, "orders", spark=spark, run_id="b1")
    assert (again.chunks_run, again.chunks_skipped, again.rows) == (0, 3, 0)
    # The account key shipped to the executors never shows in anything printed, theirs included.
    everything = printed.out + printed.err + status.out + status.err
    printed = capfd.readouterr()
    everything += printed.out + printed.err
    assert ACCOUNT_KEY not in everything
    assert ACCOUNT_KEY not in repr(report)


def test_a_chunk_task_does_not_show_the_settings_it_carries():
    from azure_functions_db.spark.task import ChunkTask

    secret = "AccountKey=" + ACCOUNT_KEY
    task = ChunkTask("app.py", "orders", "backfill", "r1", 0, (("AzureWebJobsStorage", secret),))
    assert ACCOUNT_KEY not in repr(task)
    assert ACCOUNT_KEY not in str(task)
