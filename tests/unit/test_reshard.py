"""``afdb reshard`` on SQLite and the local store: 1 -> 3, 3 -> 2 and 2 -> 1 shards, with the old
pollers behind and still running until the reshard retires them. Every row version reaches the
handler at most once and every row's last version reaches it; the new pollers wait for the
reshard and the retired ones refuse, loudly.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import azure_functions_db as afdb
from azure_functions_db.errors import ConfigurationError, ReshardError
from azure_functions_db.ops.reshard import group_of, reshard
from tests.support.sqlite_orders import T0, Orders

Seen = list[tuple[str, int, dt.datetime]]


@pytest.fixture
def orders(tmp_path: Path):
    table = Orders(tmp_path / "orders.db")
    table.insert(range(1, 61))
    yield table
    table.close()


def app(orders: Orders, tmp_path: Path, seen: Seen, **kw: Any) -> afdb.PollerBlueprint:
    db = afdb.PollerBlueprint()

    @db.poller(
        name="orders",
        schedule="*/5 * * * * *",
        source=afdb.SqlSource(url=orders.url, table="orders", cursor="updated_at", pk="id"),
        state=afdb.LocalStateStore(tmp_path / "state"),
        batch_size=4,
        **kw,
    )
    def on_orders(batch: afdb.Batch) -> None:
        seen.extend((batch.poller, c.pk, c.data["updated_at"]) for c in batch)

    return db


def run_all(db: afdb.PollerBlueprint) -> None:
    for definition in db.pollers.values():
        assert definition.run_once({}).status == "caught_up"


def caught_up(db: afdb.PollerBlueprint) -> None:
    for definition in db.pollers.values():
        while definition.run_once({}).status != "caught_up":
            pass


def latest_versions(orders: Orders) -> set[tuple[int, dt.datetime]]:
    with orders.engine.connect() as conn:
        rows = conn.exec_driver_sql("SELECT id, updated_at FROM orders").all()
    return {(pk, dt.datetime.fromisoformat(str(at))) for pk, at in rows}


def check_delivery(orders: Orders, seen: Seen) -> None:
    versions = Counter((pk, at) for _, pk, at in seen)
    assert [v for v, n in versions.items() if n > 1] == [], "a version delivered twice"
    assert latest_versions(orders) <= set(versions), "a row's last version never delivered"


@pytest.mark.parametrize(("before", "after"), [(1, 3), (3, 2), (2, 1)])
def test_reshard_delivers_every_row_once_across_the_change(orders, tmp_path, before, after):
    seen: Seen = []
    old = app(orders, tmp_path, seen, **({"shards": before} if before > 1 else {}))
    run_all(old)
    assert len(seen) == 60
    orders.insert(range(61, 65), base=T0 + dt.timedelta(hours=1))

    new = app(
        orders, tmp_path, seen, resharded_from=before, **({"shards": after} if after > 1 else {})
    )
    waiting = next(iter(new.pollers.values()))
    if waiting.name not in old.pollers:
        with pytest.raises(ReshardError, match="waits to be positioned: run `afdb reshard"):
            waiting.run_once({})
    run_all(old)  # the old deployment still runs, until the reshard retires it
    assert len(seen) == 64
    orders.touch([3, 30, 59], T0 + dt.timedelta(hours=2))
    orders.insert(range(65, 70), base=T0 + dt.timedelta(hours=3))
    first = next(iter(old.pollers.values()))
    assert first.run_once({}).status == "caught_up"  # one old poller ahead, the others behind
    delivered_before = len(seen)

    result = reshard(group_of(new.pollers, "orders"), {}, wait=5)
    assert result.old == tuple(old.pollers)
    assert result.new == tuple(new.pollers)
    assert sum(result.drained.values()) == len(seen) - delivered_before
    assert (sum(result.drained.values()) > 0) == (before > 1)  # the others caught up with it
    assert result.at == first.store({}).read(first.config.key).checkpoint.position
    # Every row up to the reshard's position was delivered by an old poller.
    assert {(pk, at) for _, pk, at in seen} >= {
        (pk, at) for pk, at in latest_versions(orders) if at <= result.at.cursor[0]
    }
    for definition in old.pollers.values():
        with pytest.raises(ReshardError, match="was retired by a reshard"):
            definition.run_once({})

    orders.touch([1, 2, 30], T0 + dt.timedelta(hours=4))
    orders.insert(range(70, 75), base=T0 + dt.timedelta(hours=5))
    caught_up(new)
    check_delivery(orders, seen)
    after_reshard = [(poller, pk) for poller, pk, at in seen[delivered_before:]]
    assert {p for p, _ in after_reshard[sum(result.drained.values()) :]} <= set(new.pollers)

    again = reshard(group_of(new.pollers, "orders"), {}, wait=5)  # done: changes nothing
    assert again.positioned == ()
    assert again.drained == dict.fromkeys(result.old, 0)
    caught_up(new)
    check_delivery(orders, seen)


def test_reshard_needs_resharded_from_and_names_the_decorator(orders, tmp_path):
    plain = app(orders, tmp_path, [], shards=2)
    with pytest.raises(ConfigurationError, match="has no `resharded_from=`"):
        group_of(plain.pollers, "orders")
    with pytest.raises(ConfigurationError, match=r"No poller `orders\.shard-0-of-2` to reshard"):
        group_of(plain.pollers, "orders.shard-0-of-2")
    with pytest.raises(ConfigurationError, match="must differ from the shard count now"):
        app(orders, tmp_path, [], shards=2, resharded_from=2)


def test_a_dry_run_writes_nothing(orders, tmp_path):
    seen: Seen = []
    caught_up(app(orders, tmp_path, seen))
    seen.clear()
    new = app(orders, tmp_path, seen, shards=2, resharded_from=1)
    result = reshard(group_of(new.pollers, "orders"), {}, dry_run=True)
    assert result.dry_run
    assert result.old == ("orders",)
    assert "would retire orders" in result.lines()[0]
    for definition in new.pollers.values():
        assert definition.store({}).read(definition.config.key) is None
    assert seen == []


RESHARD_APP = """
import os
import azure_functions_db as afdb

db = afdb.PollerBlueprint()
count, before = int(os.environ["N"]), os.environ.get("B")


@db.poller(
    name="orders",
    schedule="*/10 * * * * *",
    source=afdb.SqlSource(url=os.environ["SRC"], table="orders", cursor="updated_at", pk="id"),
    state=afdb.LocalStateStore(os.environ["STATE"]),
    **({"shards": count} if count > 1 else {}),
    **({"resharded_from": int(before)} if before else {}),
)
def on_orders(batch):
    pass
"""


def test_the_command_line_reshards_and_status_shows_the_shards_together(
    orders, tmp_path, monkeypatch, capsys
):
    import json

    from azure_functions_db.cli import main

    (tmp_path / "function_app.py").write_text(RESHARD_APP)
    app = str(tmp_path / "function_app.py")
    monkeypatch.setenv("SRC", orders.url)
    monkeypatch.setenv("STATE", str(tmp_path / "state"))
    monkeypatch.setenv("N", "2")
    assert main(["run", app, "--once", "--poller", "orders"]) == 0  # the name runs every shard
    orders.insert(range(61, 64), base=T0 + dt.timedelta(hours=1))
    monkeypatch.setenv("N", "3")
    monkeypatch.setenv("B", "2")
    assert main(["run", app, "--once"]) == 1  # the new shards wait for the reshard
    assert main(["reshard", app, "--poller", "orders.shard-0-of-3"]) == 2  # not the name
    capsys.readouterr()
    assert main(["reshard", app, "--poller", "orders", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["old"] == ["orders.shard-0-of-2", "orders.shard-1-of-2"]
    assert doc["positioned"] == [
        "orders.shard-0-of-3",
        "orders.shard-1-of-3",
        "orders.shard-2-of-3",
    ]
    assert sum(doc["drained"].values()) == 0  # both old shards had read every row
    orders.insert(range(64, 68), base=T0 + dt.timedelta(hours=2))
    assert main(["run", app, "--once"]) == 0
    capsys.readouterr()
    assert main(["status", app, "--poller", "orders"]) == 0
    out = capsys.readouterr().out
    assert "orders: 3 shard(s), 7 row(s) delivered in all, 0 lease(s) held" in out
    assert "orders.shard-2-of-3" in out
    assert "-of-2" not in out  # the retired pollers left the app with the reshard
    assert main(["status", app, "--poller", "orders.shard-1-of-2"]) == 0  # found by name
    out = capsys.readouterr().out
    assert "orders.shard-1-of-2: retired by `afdb reshard` into 3 shard(s) of `orders`" in out
    assert main(["status", app, "--poller", "orders.shard-1-of-2", "--json"]) == 0
    (retired,) = json.loads(capsys.readouterr().out)
    assert retired["retired"]["shards"] == 3
    assert dt.datetime.fromisoformat(retired["retired"]["when"])  # as committed_at: ISO 8601
    assert retired["health"]["state"] == "retired"
    assert main(["quarantine", "list", app, "--poller", "orders.shard-1-of-2"]) == 0
    assert "orders.shard-1-of-2: nothing quarantined" in capsys.readouterr().out  # found by name


def test_a_reshard_that_read_too_early_keeps_the_first_calls_position(
    orders, tmp_path, monkeypatch
):
    """Two calls at once: the second read "not started" before the first ran to the end; under
    the old pollers' leases it reads again and keeps the first call's position (an adversarial
    review saw it choose a later one, delivering 20 versions twice)."""
    from azure_functions_db.ops import reshard as module

    seen: Seen = []
    old = app(orders, tmp_path, seen, shards=2)
    caught_up(old)
    new = app(orders, tmp_path, seen, shards=3, resharded_from=2)
    group = group_of(new.pollers, "orders")
    reason = "afdb reshard: 2 -> 3 shard(s) of orders"
    stale = module._positioned(group, {}, reason)  # the second call's first read...
    first = reshard(group, {}, wait=5)  # ... then the first call runs to the end
    orders.insert(range(61, 81), base=T0 + dt.timedelta(hours=1))
    reads = []
    real = module._positioned

    def late(*args: Any) -> Any:
        reads.append(args)
        return stale if len(reads) == 1 else real(*args)

    monkeypatch.setattr(module, "_positioned", late)
    second = reshard(group_of(new.pollers, "orders"), {}, wait=5)
    assert len(reads) == 2
    assert second.at == first.at
    assert second.drained == dict.fromkeys(first.old, 0)
    assert second.positioned == ()
    caught_up(new)
    check_delivery(orders, seen)


def test_a_reshard_with_no_old_checkpoint_is_refused(orders, tmp_path):
    new = app(orders, tmp_path, [], shards=3, resharded_from=4)  # the old app had 2 shards
    caught_up(app(orders, tmp_path, [], shards=2))
    with pytest.raises(ReshardError, match=r"None of orders\.shard-0-of-4, .* has a checkpoint"):
        reshard(group_of(new.pollers, "orders"), {}, wait=5)
    for definition in new.pollers.values():
        assert definition.store({}).read(definition.config.key) is None  # nothing written


def test_changing_shards_without_a_reshard_is_refused_not_a_second_delivery(orders, tmp_path):
    seen: Seen = []
    caught_up(app(orders, tmp_path, seen, shards=2))
    assert len(seen) == 60
    changed = app(orders, tmp_path, seen, shards=3)  # shards= changed, no resharded_from
    for definition in changed.pollers.values():
        with pytest.raises(ReshardError, match=r"Add `resharded_from=2`"):
            definition.run_once({})
    unsharded = app(orders, tmp_path, seen)
    with pytest.raises(ReshardError, match=r"`orders\.shard-0-of-2` \(2 shard\(s\) of `orders`\)"):
        unsharded.pollers["orders"].run_once({})
    assert len(seen) == 60


@pytest.mark.parametrize("start", ["now", "beginning"])
def test_changing_shards_is_refused_whatever_the_start_and_no_backfill_seeds_a_way_around(
    orders, tmp_path, start
):
    """A `start="now"` poller positions its first record at the table's newest row: with
    `shards=` changed it would skip what the old shards had not read. It is refused before any
    record is made, as with `start="beginning"`; so is a backfill's seed of its checkpoint, and
    a backfill of a poller waiting for its reshard."""
    from azure_functions_db.spark.plan import handoff_bound

    seen: Seen = []
    caught_up(app(orders, tmp_path, seen, shards=2, start=start))
    orders.insert(range(61, 71), base=T0 + dt.timedelta(hours=1))  # not read by the old shards
    changed = app(orders, tmp_path, seen, shards=3, start=start)
    for definition in changed.pollers.values():
        with pytest.raises(ReshardError, match=r"Add `resharded_from=2`"):
            definition.run_once({})
        store = definition.store({})
        if start == "now":
            assert store.read(definition.config.key) is None  # no record at the newest row
        definition.source.open({})
        with pytest.raises(ReshardError, match=r"Add `resharded_from=2`"):
            handoff_bound(definition, store, run_id="r1", by="me", now=T0)
    waiting = app(orders, tmp_path, seen, shards=3, resharded_from=2, start=start)
    for definition in waiting.pollers.values():
        definition.source.open({})
        with pytest.raises(ReshardError, match=r"waits to be positioned"):
            handoff_bound(definition, definition.store({}), run_id="r1", by="me", now=T0)
    assert len(seen) == (60 if start == "beginning" else 0)  # the old shards' only


def test_a_retired_checkpoint_is_a_schema_older_versions_refuse():
    from azure_functions_db.core.checkpoint import (
        Checkpoint,
        PollerKey,
        decode_checkpoint,
        encode_checkpoint,
    )
    from azure_functions_db.core.position import Position
    from azure_functions_db.core.retirement import Retirement
    from azure_functions_db.errors import CodecError

    at = Position((T0,), (7,))
    plain = Checkpoint(PollerKey("live", "orders"), position=at, fence=3)
    assert json.loads(encode_checkpoint(plain))["schema"] == 1
    retired = dataclasses.replace(plain, retired=Retirement("orders", 3, at, "me@host", T0))
    doc = json.loads(encode_checkpoint(retired))
    assert doc["schema"] == 2  # a version before afdb reshard fails to read it: it cannot drop it
    assert decode_checkpoint(encode_checkpoint(retired)) == retired
    for bad in ({**doc, "retired": None}, {**doc, "retired": {}}, {**doc, "schema": 1}):
        with pytest.raises(CodecError):
            decode_checkpoint(json.dumps(bad).encode())


def test_an_outbox_drained_by_a_reshard_deletes_what_the_drain_delivered(tmp_path):
    import sqlalchemy as sa

    url = f"sqlite:///{tmp_path / 'outbox.db'}"
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "CREATE TABLE outbox (id INTEGER PRIMARY KEY AUTOINCREMENT, body TEXT)"
        )
        conn.exec_driver_sql("INSERT INTO outbox (body) VALUES " + ",".join(["('x')"] * 30))
    seen: list[tuple[str, int]] = []

    def outbox_app(**kw: Any) -> afdb.PollerBlueprint:
        db = afdb.PollerBlueprint()

        @db.poller(
            name="events",
            schedule="*/5 * * * * *",
            source=afdb.OutboxSource(url=url, table="outbox", delete_delivered=True),
            state=afdb.LocalStateStore(tmp_path / "state"),
            batch_size=4,
            **kw,
        )
        def on_events(batch: afdb.Batch) -> None:
            seen.extend((batch.poller, c.pk) for c in batch)

        return db

    old = outbox_app(shards=2)
    caught_up(old)
    with engine.begin() as conn:
        conn.exec_driver_sql("INSERT INTO outbox (body) VALUES " + ",".join(["('y')"] * 10))
    first = next(iter(old.pollers.values()))
    report = first.run_once({})  # ahead; the other old shard is behind by its share of 31-40
    assert report.rows == 5, report
    new = outbox_app(shards=3, resharded_from=2)
    result = reshard(group_of(new.pollers, "events"), {}, wait=5)
    assert sum(result.drained.values()) > 0
    with engine.begin() as conn:
        conn.exec_driver_sql("INSERT INTO outbox (body) VALUES " + ",".join(["('z')"] * 5))
    caught_up(new)
    assert sorted(pk for _, pk in seen) == list(range(1, 46))  # each once
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM outbox").scalar_one() == 0
    engine.dispose()


def test_validate_takes_a_sharded_pollers_name_for_its_shards(orders, tmp_path, monkeypatch):
    from azure_functions_db.ops.validate import validate_app

    (tmp_path / "function_app.py").write_text(RESHARD_APP)
    monkeypatch.setenv("SRC", orders.url)
    monkeypatch.setenv("STATE", str(tmp_path / "state"))
    monkeypatch.setenv("N", "2")
    found = validate_app(str(tmp_path / "function_app.py"), None, ["orders"])
    assert [v.poller for v in found] == ["orders.shard-0-of-2", "orders.shard-1-of-2"]


class Crash(BaseException):
    """The process dies here (nothing after it runs)."""


class CrashingStore(afdb.LocalStateStore):
    """Dies on the checkpoint commit of batch ``at`` (after its sink transaction committed)."""

    at: int | None = None

    def replace(self, checkpoint: Any, etag: str) -> str:
        if self.at is not None and checkpoint.stats.batches == self.at:
            self.at = None
            raise Crash
        return super().replace(checkpoint, etag)


def test_a_batch_the_old_sink_holds_past_the_checkpoint_is_not_written_again(orders, tmp_path):
    """The old poller's sink committed a batch whose checkpoint commit never landed (a crash, a
    deploy mid-batch): the reshard counts that batch in T (under the old lease it fences the
    sink and catches the checkpoint up, as a run does), so the new shards do not write it to
    the sink again, and a stale owner of the old poller can no longer commit to the sink."""
    import sqlalchemy as sa

    with orders.engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE applied (id INTEGER, updated_at TIMESTAMP)")
    store = CrashingStore(tmp_path / "state")

    def sinking(**kw: Any) -> afdb.PollerBlueprint:
        db = afdb.PollerBlueprint()

        @db.poller(
            name="orders",
            schedule="*/5 * * * * *",
            source=afdb.SqlSource(url=orders.url, table="orders", cursor="updated_at", pk="id"),
            sink=afdb.SqlSink(url=orders.url),
            state=store,
            batch_size=4,
            **kw,
        )
        def on_orders(batch: afdb.Batch, sink: afdb.SqlWriter) -> None:
            sink.insert(
                "applied", [{"id": c.pk, "updated_at": c.data["updated_at"]} for c in batch]
            )

        return db

    old = sinking().pollers["orders"]
    store.at = 3
    with pytest.raises(Crash):
        old.run_once({})
    stored = store.read(old.config.key)
    assert stored is not None
    assert stored.checkpoint.position is not None
    assert stored.checkpoint.position.pk == (8,)  # batches 1-2; the sink holds batch 3 too
    old.source.close()
    new = sinking(shards=2, resharded_from=1)
    result = reshard(group_of(new.pollers, "orders"), {}, wait=5)
    assert result.at is not None
    assert result.at.pk == (12,)  # batch 3 counted
    caught_up(new)
    with orders.engine.connect() as conn:
        applied = conn.execute(sa.text("SELECT id, updated_at FROM applied")).all()
    counts = Counter((row[0], str(row[1])) for row in applied)
    assert [v for v, n in counts.items() if n > 1] == [], "a version written to the sink twice"
    assert {pk for pk, _ in counts} == set(range(1, 61))


def test_a_reshard_into_another_count_refuses_pollers_another_one_retired(
    orders, tmp_path, monkeypatch
):
    """A reshard 2 -> 3 stopped after it retired the old shards: a reshard 2 -> 4 (another app
    version) is refused, also when it read the old checkpoints before they were retired (the
    check is made again under their leases), and writes nothing."""
    from azure_functions_db.ops import reshard as ops

    caught_up(app(orders, tmp_path, [], shards=2))
    three = app(orders, tmp_path, [], shards=3, resharded_from=2)

    def stop_after_retiring(line: str) -> None:
        if "retired" in line:
            raise Crash

    with pytest.raises(Crash):
        reshard(group_of(three.pollers, "orders"), {}, wait=5, progress=stop_after_retiring)
    four = app(orders, tmp_path, [], shards=4, resharded_from=2)
    with pytest.raises(ReshardError, match=r"retired by another reshard"):
        reshard(group_of(four.pollers, "orders"), {}, wait=5)

    def unchecked(old: Any, _group: Any, settings: Any) -> list[Any]:  # read before retiring
        return [(d.store(settings).read(d.config.key) or _no).checkpoint for d in old]

    monkeypatch.setattr(ops, "_old_checkpoints", unchecked)
    with pytest.raises(ReshardError, match=r"retired by another reshard"):
        reshard(group_of(four.pollers, "orders"), {}, wait=5)
    for definition in four.pollers.values():
        assert definition.store({}).read(definition.config.key) is None  # nothing written
    for definition in three.pollers.values():
        assert definition.store({}).read(definition.config.key) is None  # not positioned


class _NoRecord:
    checkpoint = None


_no = _NoRecord()
