"""A backfill chunk without a transactional sink coalesces its checkpoint commits (one at least
every ``CHUNK_CHECKPOINT_SECONDS``, and at its end) and stays resumable: a failed chunk commits
what its handler took before the failure, and the rerun delivers the rest. Real PostgreSQL and
the real local state store; ``run_chunk`` as a Spark task calls it (tests/integration/
test_backfill.py runs the same chunks on Spark, test_backfill_delta.py with a sink, which
commits every batch).
"""

from __future__ import annotations

import datetime as dt
import os
import textwrap
from collections import Counter
from pathlib import Path

import pytest
import sqlalchemy as sa

from azure_functions_db.core.checkpoint import Checkpoint, PollerKey
from azure_functions_db.errors import HandlerError
from azure_functions_db.runtime.loader import load_pollers
from azure_functions_db.spark.chunk import CHUNK_CHECKPOINT_SECONDS, run_chunk
from azure_functions_db.spark.plan import prepare_run
from azure_functions_db.spark.records import chunk_key, chunk_range
from azure_functions_db.state.local import LocalStateStore
from tests.support.source_kit import Db

pytestmark = pytest.mark.postgres

ROWS = 400
BATCH = 5

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
        source=afdb.SqlSource(
            url="%BC_DB%", table="orders", cursor="updated_at", pk="id",
            schema=os.environ["BC_SCHEMA"],
        ),
        batch_size=int(os.environ["BC_BATCH"]),
    )
    def on_orders(batch: afdb.Batch) -> None:
        with Path(os.environ["BC_OUT"]).open("a") as f:
            f.write("".join(f"{c.data['id']}\\n" for c in batch))
        fail = int(os.environ.get("BC_FAIL_AT", "0"))
        if fail and any(c.data["id"] == fail for c in batch):
            raise RuntimeError(f"row {fail} fails")
        time.sleep(float(os.environ.get("BC_SLOW", "0")))
    """
)


class CountingStore(LocalStateStore):
    """The local store, counting the checkpoint writes of each record."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.writes: Counter[PollerKey] = Counter()

    def replace(self, checkpoint: Checkpoint, etag: str) -> str:
        self.writes[checkpoint.key] += 1
        return super().replace(checkpoint, etag)


@pytest.fixture
def app(tmp_path: Path, pg: Db, monkeypatch: pytest.MonkeyPatch) -> Path:
    pg.table(
        "orders",
        [
            sa.Column("id", sa.Integer, primary_key=True),
            sa.Column("updated_at", sa.DateTime, nullable=False),
        ],
        [
            {"id": i, "updated_at": dt.datetime(2026, 1, 1) + dt.timedelta(seconds=i // 4)}
            for i in range(1, ROWS + 1)
        ],
        index=["updated_at", "id"],
    )
    path = tmp_path / "function_app.py"
    path.write_text(APP)
    monkeypatch.setenv("BC_DB", pg.url)
    monkeypatch.setenv("BC_SCHEMA", pg.schema or "")
    monkeypatch.setenv("BC_BATCH", str(BATCH))
    monkeypatch.setenv("BC_OUT", str(tmp_path / "delivered.txt"))
    for name in ("BC_FAIL_AT", "BC_SLOW"):
        monkeypatch.delenv(name, raising=False)
    return path


def plan(app: Path, store: LocalStateStore) -> None:
    definition = load_pollers(str(app))["orders"]
    definition.source.open(dict(os.environ))
    try:
        prepare_run(
            definition,
            store,
            namespace="backfill",
            run_id="c1",
            start=None,
            end=None,
            partitions=1,
            by="test",
            now=definition.clock.now(),
        )
    finally:
        definition.source.close()


def chunk(app: Path, store: LocalStateStore) -> int:
    definition = load_pollers(str(app))["orders"]
    try:
        done = run_chunk(
            definition, store, dict(os.environ), namespace="backfill", run_id="c1", index=0
        )
    finally:
        definition.source.close()
    return done.rows


def delivered(app: Path) -> list[int]:
    return [int(line) for line in (app.parent / "delivered.txt").read_text().split()]


def test_a_chunk_commits_its_checkpoint_about_every_second_not_every_batch(
    app: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    store = CountingStore(tmp_path / "state")
    plan(app, store)
    key = chunk_key("backfill", "orders", "c1", 0)
    # 80 batches taking at least 2.4 s: some commits while the chunk runs, far fewer than 80.
    monkeypatch.setenv("BC_SLOW", str(3 * CHUNK_CHECKPOINT_SECONDS / (ROWS // BATCH)))
    assert chunk(app, store) == ROWS
    assert sorted(delivered(app)) == list(range(1, ROWS + 1))
    stored = store.read(key)
    assert stored is not None
    planned = chunk_range(stored.checkpoint)
    assert planned is not None
    assert planned.finished(stored.checkpoint)
    assert stored.checkpoint.stats.rows == ROWS
    # The fence, at least one commit during the run, the last one (which ends on the chunk's
    # end: no separate finished marker).
    assert 3 <= store.writes[key] <= ROWS // BATCH // 4


def test_a_chunk_whose_last_row_is_gone_is_marked_finished_at_its_end(
    app: Path, tmp_path: Path, pg: Db
):
    store = CountingStore(tmp_path / "state")
    plan(app, store)
    key = chunk_key("backfill", "orders", "c1", 0)
    with pg.engine.begin() as conn:  # the planned end row is deleted before the chunk runs
        conn.execute(sa.text(f"DELETE FROM {pg.qualified('orders')} WHERE id = {ROWS}"))
    assert chunk(app, store) == ROWS - 1
    stored = store.read(key)
    assert stored is not None
    planned = chunk_range(stored.checkpoint)
    assert planned is not None
    assert planned.end.pk == (ROWS,)
    assert planned.finished(stored.checkpoint)  # moved to the end by the marker
    assert chunk(app, store) == 0  # and a rerun finds it finished


def test_a_failed_chunk_keeps_what_it_delivered_and_the_rerun_delivers_the_rest(
    app: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    store = CountingStore(tmp_path / "state")
    plan(app, store)
    key = chunk_key("backfill", "orders", "c1", 0)
    monkeypatch.setenv("BC_FAIL_AT", "303")
    with pytest.raises(HandlerError):
        chunk(app, store)
    stored = store.read(key)
    assert stored is not None
    # The batches before the failing one were committed before the failure was counted.
    assert stored.checkpoint.stats.rows == 300
    assert stored.checkpoint.position is not None
    assert stored.checkpoint.position.pk == (300,)
    first = delivered(app)
    monkeypatch.delenv("BC_FAIL_AT")
    assert chunk(app, store) == ROWS - 300
    second = delivered(app)[len(first) :]
    assert sorted(second) == list(range(301, ROWS + 1))  # from the failed batch on, once
    assert set(first) | set(second) == set(range(1, ROWS + 1))
