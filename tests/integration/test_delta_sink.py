"""DeltaSink beyond its contract: writers of one table racing (the live poller and backfill
chunks), a poller mirroring rows with MERGE, options and a missing table."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from azure_functions_db.core.batch import Batch
from azure_functions_db.core.checkpoint import PollerKey
from azure_functions_db.core.engine import Engine, PollerConfig
from azure_functions_db.core.ports import SinkMark
from azure_functions_db.errors import ConfigurationError, SinkFencedError
from azure_functions_db.sinks.delta import DeltaSink, DeltaWriter, batch_app
from azure_functions_db.sources.memory import MemorySource
from azure_functions_db.state.memory import MemoryStateStore
from azure_functions_db.testing.clock import FakeClock
from azure_functions_db.testing.sink_contract import contract_batch

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string())])


def opened(path: Path, **options: Any) -> DeltaSink:
    sink = DeltaSink(str(path), schema=SCHEMA, **options)
    sink.open({})
    return sink


def test_writers_of_one_table_racing_all_land_once(tmp_path: Path) -> None:
    """Four pollers (a live one and three backfill chunks) create one new table and commit 15
    batches each into it at once: every commit lands after retrying on top of the others,
    each once."""
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        key = PollerKey("backfill", f"orders~run~{n}")
        try:
            sink = opened(tmp_path / "t")  # all four create the new table at once
            sink.claim(key, 1)
            before = None
            for b in range(15):
                ids = [n * 1000 + b * 2, n * 1000 + b * 2 + 1]
                batch = contract_batch(1, ids, before=before)
                with sink.transaction(key, batch, b + 1) as w:
                    assert w is not None
                    w.insert(batch)
                before = batch.position_after
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    table = DeltaTable(str(tmp_path / "t"))
    ids = [r["id"] for r in table.to_pyarrow_table().to_pylist()]
    assert sorted(ids) == sorted(n * 1000 + i for n in range(4) for i in range(30))
    for n in range(4):
        assert table.transaction_version(batch_app(PollerKey("backfill", f"orders~run~{n}"))) == 15


def test_a_poller_mirrors_rows_and_soft_deletes_with_merge(tmp_path: Path) -> None:
    rows = [{"id": i, "v": i, "name": f"n{i}", "gone": False} for i in range(1, 8)]
    source = MemorySource("orders", "v", "id", rows)
    sink = opened(tmp_path / "mirror", key=["id"])

    def mirror(batch: Batch, writer: DeltaWriter) -> None:
        row = [{"id": c.data["id"], "name": c.data["name"]} for c in batch]
        writer.upsert([r for r, c in zip(row, batch, strict=True) if not c.data["gone"]])
        writer.delete([r for r, c in zip(row, batch, strict=True) if c.data["gone"]])

    store = MemoryStateStore(FakeClock())
    config = PollerConfig(name="orders", batch_size=3)
    Engine(config, source, store, mirror, FakeClock(), owner="a", sink=sink).run({})
    source.insert(
        [
            {"id": 8, "v": 8, "name": "n8", "gone": False},
            {"id": 3, "v": 9, "name": "", "gone": True},
        ]
    )
    Engine(config, source, store, mirror, FakeClock(), owner="a", sink=sink).run({})
    table = DeltaTable(str(tmp_path / "mirror"))
    assert sorted(r["id"] for r in table.to_pyarrow_table().to_pylist()) == [1, 2, 4, 5, 6, 7, 8]
    stored = store.read(config.key)
    mark = sink.mark(config.key)
    assert stored is not None
    assert mark is not None
    assert (mark.sequence, mark.after) == (
        stored.checkpoint.stats.batches,
        stored.checkpoint.position,
    )


def test_a_missing_table_without_a_schema_says_how_to_fix_it(tmp_path: Path) -> None:
    sink = DeltaSink(str(tmp_path / "none"))
    with pytest.raises(ConfigurationError, match=r"no Delta table at .*pass `schema=`"):
        sink.open({})


def test_merges_need_the_key(tmp_path: Path) -> None:
    sink = opened(tmp_path / "t")
    with pytest.raises(ConfigurationError, match=r"pass `key=\[...\]` to DeltaSink"):
        DeltaWriter(None).upsert([{"id": 1, "name": "x"}])
    assert sink.describe().endswith("/t")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"uri": ""}, "`uri=''` must be the table's location"),
        ({"uri": "x", "key": []}, "`key=[]` must name the columns"),
        ({"uri": "x", "key": ["id", "id"]}, "each once"),
        ({"uri": "x", "storage_options": {"a": 1}}, "`storage_options` must map option names"),
    ],
)
def test_bad_options_name_the_value_and_the_fix(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        DeltaSink(**options)
    assert message in str(caught.value)


def test_a_log_cleaned_up_past_the_last_batch_keeps_sequence_and_fence(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Delta drops old log entries (after a checkpoint, past the retention) but keeps the
    application transaction versions: a quiet poller still knows its sequence and fence, and
    is told the positions are gone instead of failing."""
    import logging

    sink = opened(tmp_path / "t")
    key = PollerKey("live", "orders")
    sink.claim(key, 1)
    before = None
    for b in range(2):
        batch = contract_batch(1, [b * 2, b * 2 + 1], before=before)
        with sink.transaction(key, batch, b + 1) as w:
            assert w is not None
            w.insert(batch)
        before = batch.position_after
    sink.claim(PollerKey("live", "other"), 1)  # another writer's commit, after this poller's
    table = DeltaTable(str(tmp_path / "t"))
    table.create_checkpoint()
    for entry in (tmp_path / "t" / "_delta_log").glob("*.json"):
        if int(entry.stem) < table.version():  # what log cleanup removes: before the checkpoint
            entry.unlink()
    assert sink.mark(key) == SinkMark(1, 2, batch.position_before, before, 2)  # kept in memory
    later = opened(tmp_path / "t")  # the poller's next process: it reads the table
    with caplog.at_level(logging.WARNING):
        mark = later.mark(key)
    assert mark is not None
    assert (mark.fence, mark.sequence, mark.after) == (1, 2, None)
    assert "action=sink_history_missing" in caplog.text
    assert later.claim(key, 2) is not None  # the poller goes on


@pytest.mark.parametrize("merge", [False, True], ids=["append", "merge"])
def test_a_stale_owner_whose_open_table_missed_the_new_claim_commits_nothing(
    tmp_path: Path, merge: bool
) -> None:
    """Two processes: the old owner keeps its table open (as of its own last commit) and does
    not read the log before its handler; the newer owner's claim landed meanwhile. The old
    owner's commit fails on top of the claim, and it is refused: nothing of it is in the
    table, and the table's record is the new owner's."""
    options: dict[str, Any] = {"key": ["id"]} if merge else {}
    old, new = opened(tmp_path / "t", **options), opened(tmp_path / "t", **options)
    key = PollerKey("live", "orders")
    old.claim(key, 1)
    first = contract_batch(1, [1, 2])
    with old.transaction(key, first, 1) as w:
        assert w is not None
        (w.upsert if merge else w.insert)(first)
    assert new.claim(key, 2) == SinkMark(1, 1, None, first.position_after, 2)
    stale = contract_batch(1, [3, 4], before=first.position_after)

    def stale_batch() -> None:
        with old.transaction(key, stale, 2) as w:
            assert w is not None  # the old owner's open table has not seen the claim yet
            (w.upsert if merge else w.insert)(stale)

    with pytest.raises(SinkFencedError):
        stale_batch()
    table = DeltaTable(str(tmp_path / "t"))
    assert sorted(r["id"] for r in table.to_pyarrow_table().to_pylist()) == [1, 2]
    assert old.mark(key) == new.mark(key) == SinkMark(2, 1, None, first.position_after, 2)


def test_another_writers_commits_between_batches_are_read_before_the_next_commit(
    tmp_path: Path,
) -> None:
    """A poller and another writer (a backfill chunk) take turns: each of the poller's commits
    lands on top of the other's after one lost race at most, and the marks stay each one's."""
    poller, chunk = opened(tmp_path / "t"), opened(tmp_path / "t")
    mine, theirs = PollerKey("live", "orders"), PollerKey("backfill", "orders~run~0")
    poller.claim(mine, 1)
    chunk.claim(theirs, 1)
    before: dict[PollerKey, Any] = {mine: None, theirs: None}
    for b in range(4):
        for sink, key, base in ((poller, mine, 0), (chunk, theirs, 100)):
            batch = contract_batch(1, [base + b], before=before[key])
            with sink.transaction(key, batch, b + 1) as w:
                assert w is not None
                w.insert(batch)
            before[key] = batch.position_after
    table = DeltaTable(str(tmp_path / "t"))
    assert sorted(r["id"] for r in table.to_pyarrow_table().to_pylist()) == [
        0,
        1,
        2,
        3,
        *range(100, 104),
    ]
    for key in (mine, theirs):
        mark = poller.mark(key)
        assert mark == chunk.mark(key)
        assert mark is not None
        assert (mark.sequence, mark.after) == (4, before[key])
