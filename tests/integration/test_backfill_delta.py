"""The Spark backfill's chunk tasks and the live poller write one Delta table through one
DeltaSink (SPEC §7 with issue 13's Delta tier): every row lands exactly once, each chunk under its
own application id, on Spark ``local[2]``."""

from __future__ import annotations

import datetime as dt
import textwrap
from collections import Counter
from pathlib import Path

import pytest

from azure_functions_db.cli import EXIT_OK, main
from azure_functions_db.spark import backfill
from tests.support.sqlite_orders import T0, Orders

pytestmark = [
    pytest.mark.spark,
    pytest.mark.filterwarnings("ignore:unclosed <socket.socket:ResourceWarning"),
]

APP = textwrap.dedent(
    """
    import os
    import pyarrow as pa
    import azure_functions_db as afdb
    from azure_functions_db.sinks.delta import DeltaSink

    db = afdb.PollerBlueprint()
    SCHEMA = pa.schema([("id", pa.int64()), ("namespace", pa.string())])

    @db.poller(
        name="orders",
        schedule="0 0 * * * *",
        source=afdb.SqlSource(url="%BF_DB%", table="orders", cursor="updated_at", pk="id"),
        sink=DeltaSink("%BF_LAKE%", schema=SCHEMA),
        batch_size=7,
    )
    def to_lake(batch, sink):
        sink.insert([{"id": c.data["id"], "namespace": batch.namespace} for c in batch])
    """
)


@pytest.fixture
def app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "function_app.py"
    path.write_text(APP)
    orders = Orders(tmp_path / "orders.db")
    orders.insert(range(1, 61))
    orders.close()
    monkeypatch.setenv("BF_DB", orders.url)
    monkeypatch.setenv("BF_LAKE", str(tmp_path / "lake" / "orders"))
    monkeypatch.setenv("AFDB_STATE_DIR", str(tmp_path / "state"))
    return path


def test_backfill_chunks_and_the_live_poller_write_one_delta_table_once(app, spark) -> None:
    from deltalake import DeltaTable

    report = backfill(app, "orders", partitions=4, spark=spark, run_id="d1")
    assert (report.chunks_run, report.rows) == (4, 60)
    orders = Orders(app.parent / "orders.db")
    orders.insert(range(61, 71), base=T0 + dt.timedelta(hours=1))
    orders.close()
    assert main(["run", str(app), "--once"]) == EXIT_OK
    table = DeltaTable(str(app.parent / "lake" / "orders"))
    rows = table.to_pyarrow_table().to_pylist()
    counts = Counter(r["id"] for r in rows)
    assert counts == Counter(range(1, 71))
    assert {r["id"] for r in rows if r["namespace"] == "live"} == set(range(61, 71))
    # Each chunk recorded its own batches under its own application id.
    chunk_apps = [f"afdb:backfill/orders~d1~{i}" for i in range(4)]
    assert all((table.transaction_version(a) or 0) >= 1 for a in chunk_apps)
    assert table.transaction_version("afdb:live/orders") == 2
    # Running the same backfill again redoes nothing.
    again = backfill(app, "orders", spark=spark, run_id="d1")
    assert again.rows == 0
    assert len(DeltaTable(str(app.parent / "lake" / "orders")).to_pyarrow_table()) == 70
