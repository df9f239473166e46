"""Which backfill run a rerun without ``--run-id`` takes up: the poller's latest unfinished one
(said in a ``backfill_resumed`` warning), none when every run finished, and a refusal naming the
run when other bounds were asked for (resuming would ignore them)."""

from __future__ import annotations

import datetime as dt
import logging

import pytest

from azure_functions_db.errors import ConfigurationError
from azure_functions_db.spark.job import _unfinished_run
from azure_functions_db.spark.records import RunRecord, unfinished_runs
from azure_functions_db.state.memory import MemoryStateStore

T = dt.datetime(2026, 11, 26, 12, tzinfo=dt.UTC)


def record(
    run_id: str, *, poller: str = "orders", finished: bool = False, hour: int = 0
) -> RunRecord:
    return RunRecord(
        poller=poller,
        run_id=run_id,
        namespace="backfill",
        h0=None,
        start=None,
        end=None,
        chunks=4,
        estimate=100,
        phase="finished" if finished else "planned",
        by="test",
        planned_at=T + dt.timedelta(hours=hour),
    )


def store_with(*records: RunRecord) -> MemoryStateStore:
    store = MemoryStateStore()
    for r in records:
        store.create(r.to_checkpoint(None))
    return store


def test_the_latest_unfinished_run_of_the_poller_is_taken_up(caplog):
    store = store_with(
        record("old", hour=0),
        record("done", hour=1, finished=True),
        record("new", hour=2),
        record("theirs", poller="other", hour=3),
    )
    assert [r.run_id for r in unfinished_runs(store, "backfill", "orders")] == ["old", "new"]
    with caplog.at_level(logging.WARNING):
        assert _unfinished_run(store, "backfill", "orders", bounded=False) == "new"
    assert "action=backfill_resumed" in caplog.text
    assert "run=new" in caplog.text


def test_no_unfinished_run_starts_a_new_one():
    store = store_with(record("done", finished=True))
    assert _unfinished_run(store, "backfill", "orders", bounded=False) is None


def test_other_bounds_with_an_unfinished_run_are_refused_naming_it():
    store = store_with(record("k1"))
    with pytest.raises(ConfigurationError, match=r"`--run-id k1`.*`--new-run`"):
        _unfinished_run(store, "backfill", "orders", bounded=True)
