"""The chaos soak's own checks: the checker catches every kind of violation it claims to, the
fault schedule replays from its seed, and the control mode (no late-commit horizon) really loses
rows on real PostgreSQL + Azurite and is reported failed. CI runs the full soak (`make soak`)."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from soak.check import check, poisoned
from soak.run import KINDS, REPO, schedule

T0 = "2026-11-25 10:00:00+00:00"


def _lines(path: Path, events: Sequence[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"pid": 1, "wall": 0, **e}) + "\n" for e in events))


class Evidence:
    """A synthetic evidence folder in the layout ``soak.run`` writes."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.writers: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.samples: list[dict[str, Any]] = []
        self.history: set[tuple[int, int]] = set()
        self.faults: list[dict[str, Any]] = [{"ev": "fault", "t": 1, "kind": "kill_poller"}]
        self.meta: dict[str, Any] = {"seed": 1, "seconds": 10}

    def commit(self, t: float, *pairs: tuple[int, int], outcome: str = "commit") -> None:
        self.writers.append({"ev": outcome, "t": t, "rows": [list(p) for p in pairs]})
        if outcome == "commit":
            self.history.update(pairs)

    def deliver(self, t: float, fence: int, *pairs: tuple[int, int]) -> None:
        """A handler call at ``t`` given ``pairs``; its batch ends at the last pair's id."""
        self.events.append({"ev": "start", "t": t, "fence": fence})
        after = [T0, pairs[-1][0]] if pairs else None
        self.events.append(
            {"ev": "deliver", "t": t + 0.01, "fence": fence, "rows": pairs, "started": t}
            | ({"after": after} if after else {})
        )

    def grant(self, t: float, fence: int) -> None:
        self.events.append({"ev": "log", "t": t, "action": "lease_acquired", "fence": fence})

    def sample(self, t: float, cp: int | None, lease: int, position: list[Any] | None) -> None:
        self.samples.append(
            {"ev": "sample", "t": t, "cp_fence": cp, "lease_fence": lease, "position": position}
        )

    def judge(self) -> Any:
        (self.root / "meta.json").write_text(json.dumps(self.meta))
        (self.root / "history.json").write_text(json.dumps(sorted(self.history)))
        _lines(self.root / "faults.jsonl", self.faults)
        _lines(self.root / "writers" / "writer-0.jsonl", self.writers)
        _lines(self.root / "events" / "poller-1.jsonl", self.events)
        _lines(self.root / "samples.jsonl", self.samples)
        return check(self.root)


@pytest.fixture
def ev(tmp_path: Path) -> Evidence:
    e = Evidence(tmp_path)
    e.grant(0.5, 1)
    e.commit(1.0, (1, 1), (2, 2))
    e.commit(2.0, (1, 3))
    e.sample(1.5, 1, 1, None)
    return e


def test_a_clean_run_has_no_violations(ev: Evidence) -> None:
    ev.deliver(2.5, 1, (1, 3), (2, 2))
    ev.deliver(3.0, 1, (2, 2))  # a duplicate is allowed, and counted
    ev.sample(3.5, 1, 1, [T0, 2])
    report = ev.judge()
    assert report.violations == []
    assert (report.committed, report.distinct_delivered, report.delivered) == (3, 2, 3)
    assert report.duplicate_ratio == pytest.approx(0.5)
    assert report.delay_p50 is not None
    assert report.faults == {"kill_poller": 1}


def test_a_committed_version_never_delivered_is_missing(ev: Evidence) -> None:
    ev.deliver(2.5, 1, (1, 1), (2, 2))  # id 1 only at version 1; version 3 committed later
    report = ev.judge()
    assert (report.missing, report.missing_examples) == (1, [(1, 3)])
    assert any(v.startswith("(a)") for v in report.violations)


def test_a_delivered_version_that_rolled_back_or_never_landed_is_a_phantom(ev: Evidence) -> None:
    ev.commit(2.1, (3, 4), outcome="rollback")
    ev.commit(2.2, (4, 5), outcome="unknown")  # not in the history table: did not commit
    ev.deliver(2.5, 1, (1, 3), (2, 2), (3, 4), (4, 5))
    report = ev.judge()
    assert (report.phantoms, report.phantom_examples) == (2, [(3, 4), (4, 5)])
    assert report.unknown_commits == 1
    assert report.unknown_resolved_committed == 0


def test_an_unknown_commit_that_landed_must_be_delivered(ev: Evidence) -> None:
    ev.commit(2.2, (4, 5), outcome="unknown")
    ev.history.add((4, 5))
    ev.deliver(2.5, 1, (1, 3), (2, 2))
    report = ev.judge()
    assert report.unknown_resolved_committed == 1
    assert report.missing_examples == [(4, 5)]


def test_checkpoint_or_fence_going_back_is_a_regression(ev: Evidence) -> None:
    ev.deliver(2.5, 1, (1, 3), (2, 2))
    ev.sample(3.0, 2, 2, ["2026-11-25 10:00:05+00:00", 9])
    ev.sample(3.5, 2, 2, [T0, 9])  # position back
    ev.sample(4.0, 1, 2, ["2026-11-25 10:00:05+00:00", 9])  # checkpoint fence back
    ev.sample(4.5, 3, 2, ["2026-11-25 10:00:05+00:00", 9])  # lease fence below checkpoint's
    report = ev.judge()
    assert len(report.regressions) == 3, report.regressions
    assert "moved back" in report.regressions[0]
    assert "checkpoint fence 2 -> 1" in report.regressions[1]
    assert "below checkpoint fence 3" in report.regressions[2]


def test_a_handler_started_after_a_higher_fence_was_granted_is_stale(ev: Evidence) -> None:
    ev.grant(2.2, 2)
    ev.deliver(2.1, 1, (1, 3))  # before the grant: fine
    ev.deliver(2.5, 1, (2, 2))  # after fence 2 was granted: stale
    report = ev.judge()
    assert report.stale_calls == 1
    assert "fence 2 was known" in report.stale_examples[0]


def test_a_skewed_pollers_call_after_a_higher_fence_is_stale_whatever_its_wall_clock(
    ev: Evidence,
) -> None:
    """A poller running 30 s behind (``skew_poller``) writes wall times that put its call
    before the new owner's grant; the checker orders events by the monotonic clock, which
    libfaketime leaves alone, and still finds the call stale."""
    ev.faults.append({"ev": "fault", "t": 2.0, "kind": "skew_poller", "skew_seconds": -30})
    ev.grant(2.2, 2)
    ev.deliver(2.5, 1, (2, 2))
    for event in ev.events[-2:]:
        event["wall"] = -30.0  # behind every other process's wall clock
    report = ev.judge()
    assert report.stale_calls == 1
    assert "fence 2 was known" in report.stale_examples[0]
    assert report.faults["skew_poller"] == 1


def _dropped_lease(ev: Evidence, then: str, *, fenced: bool = True) -> Any:
    """Fence 1 granted at 0.5; Azurite restarts (2.0-2.4) and forgets it; fence 2 is granted
    at 2.45 (and, ``fenced``, seen stored in the checkpoint at 2.47); the fence-1 owner,
    unaware, starts a call at 2.5, and then ``then`` happens."""
    ev.faults.append({"ev": "fault", "t": 2.4, "kind": "restart_azurite", "seconds": 0.4})
    ev.grant(2.45, 2)
    if fenced:
        ev.sample(2.47, 2, 2, [T0, 1])
    ev.deliver(2.5, 1, (1, 3), (2, 2))
    ev.events.append({"ev": "log", "t": 2.6, "action": then, "fence": 1, "position": _at(2)})
    return ev.judge()


def _at(pk: int) -> str:
    """A position as the engine logs it, on the evidence's one cursor value."""
    return f"(cursor=({T0.replace(' ', 'T')}), pk=({pk}))"


def test_a_call_after_azurite_forgot_the_lease_is_counted_apart_if_the_fence_stopped_it(
    ev: Evidence,
) -> None:
    report = _dropped_lease(ev, "commit_rejected")
    assert (report.stale_calls, report.stale_after_lease_dropped) == (0, 1)
    assert report.violations == []


def test_a_batch_committed_after_azurite_forgot_the_lease_is_a_violation(ev: Evidence) -> None:
    report = _dropped_lease(ev, "batch_committed")
    assert report.stale_commits == 1
    assert any("committed after the lease was lost" in v for v in report.violations)


def test_a_commit_before_the_new_owner_stored_its_fence_is_reported_not_judged(
    ev: Evidence,
) -> None:
    """The new owner logs its grant before its fencing write: the old owner's commit may land
    in between (the fence came too late for it; the new owner reads after it). Seen in the
    MariaDB soak, seed 3111: Azurite restarted, the old owner committed 0.34 s after the new
    grant, whose fencing write then lost compare-and-set to that commit."""
    report = _dropped_lease(ev, "batch_committed", fenced=False)
    assert (report.stale_commits, report.committed_before_fencing) == (0, 1)
    assert report.violations == []


def test_the_commit_of_an_earlier_batch_reported_late_is_not_the_stale_calls(
    ev: Evidence,
) -> None:
    # The batch before (ending at id 1) was committed in flight before Azurite forgot the
    # lease; the run's thread reports it only after the next call started (a long handler).
    ev.faults.append({"ev": "fault", "t": 2.4, "kind": "restart_azurite", "seconds": 0.4})
    ev.grant(2.45, 2)
    ev.sample(2.47, 2, 2, [T0, 1])
    ev.deliver(2.5, 1, (2, 2), (3, 1))
    ev.events.append(
        {"ev": "log", "t": 2.6, "action": "batch_committed", "fence": 1, "position": _at(1)}
    )
    ev.events.append({"ev": "log", "t": 2.7, "action": "commit_rejected", "fence": 1})
    report = ev.judge()
    assert (report.stale_after_lease_dropped, report.stale_commits) == (1, 0)
    # A later commit past the call's batch does acknowledge it: a violation (the new owner's
    # fence was stored at 2.47).
    ev.events.append(
        {"ev": "log", "t": 2.8, "action": "batch_committed", "fence": 1, "position": _at(4)}
    )
    assert ev.judge().stale_commits == 1


def test_a_fence_the_monitor_saw_stored_counts_too(ev: Evidence) -> None:
    ev.sample(2.2, 5, 5, [T0, 1])
    ev.deliver(2.5, 1, (1, 3), (2, 2))
    assert ev.judge().stale_calls == 1


def test_a_torn_last_line_is_skipped(ev: Evidence) -> None:
    ev.deliver(2.5, 1, (1, 3), (2, 2))
    ev.judge()
    with (ev.root / "events" / "poller-1.jsonl").open("a") as handle:
        handle.write('{"ev": "deliver", "t": 9, "rows": [[7, ')
    assert check(ev.root).violations == []


def test_a_commit_the_history_table_lacks_voids_the_run(ev: Evidence) -> None:
    ev.deliver(2.5, 1, (1, 3), (2, 2))
    ev.history.discard((2, 2))
    report = ev.judge()
    assert any("history table lacks" in v for v in report.violations)


def test_the_schedule_replays_from_its_seed() -> None:
    first = schedule(7, 1800, 4.0)
    assert first == schedule(7, 1800, 4.0)
    assert first != schedule(8, 1800, 4.0)
    assert len(first) >= 100
    assert {f.kind for f in first} == set(KINDS)
    assert all(3 <= f.at <= 1797 for f in first)
    assert all(b.at > a.at for a, b in itertools.pairwise(first))
    long_pauses = [f.duration for f in first if f.kind in ("stop_poller", "pause_azurite_long")]
    assert min(long_pauses) > 15  # past the 15 s lease and the 15 s storage read timeout


def test_even_cis_short_soak_meets_every_fault_kind() -> None:
    for seed in range(1, 200):
        faults = schedule(seed, 45, 4.0)
        assert {f.kind for f in faults} == set(KINDS), seed
        assert all(3 <= f.at < 42 for f in faults), seed
        assert all(b.at > a.at for a, b in itertools.pairwise(faults)), seed
        # No fault of the first round lands while Azurite is paused (it would be skipped).
        first = faults[: len(KINDS)]
        paused = [(f.at, f.at + f.duration) for f in first if f.kind.startswith("pause_azurite")]
        hits = [f for f in first if "azurite" in f.kind for a, b in paused if a < f.at < b]
        assert not hits, (seed, hits)


def _control_soak(out: Path, *db: str) -> tuple[subprocess.CompletedProcess[str], Any]:
    """A calm 30 s soak in control mode on ``db``; its process and report."""
    from devkit.azurite import unavailable_reason

    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    args = ["--control", "--calm", "--seconds", "30", "--seed", "5", "--out", str(out)]
    done = subprocess.run(
        [sys.executable, "-m", "soak", *args, *db],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["control"] is True
    assert report["missing"] > 0, report
    assert report["harness"] == []
    assert "(a)" in done.stderr
    assert "seed 5" in done.stderr
    return done, report


def test_control_mode_loses_rows_and_the_soak_says_so(pg_url: str, tmp_path: Path) -> None:
    """With the horizon off, late commits are passed over: the checker must report them lost
    (the proof that it can fail), and nothing else may be wrong. Calm (no faults, no frozen
    handler), so the pollers poll every second and the loss comes from the horizon alone."""
    out = tmp_path / "evidence"
    pg = pg_url.replace("postgresql+psycopg://", "postgresql://", 1)
    done, _ = _control_soak(out, "--pollers", "2", "--db", "pg", "--pg", pg)
    assert str(out) in done.stderr


def test_the_sqlsink_must_hold_each_committed_version_once(ev: Evidence) -> None:
    ev.deliver(2.5, 1, (1, 3), (2, 2))
    ev.deliver(3.0, 1, (2, 2))  # a redelivery the sink must not apply twice
    (ev.root / "sink.json").write_text(json.dumps([[1, 1, 1], [1, 3, 1], [2, 2, 1]]))
    assert ev.judge().violations == []
    (ev.root / "sink.json").write_text(json.dumps([[1, 3, 1], [2, 2, 1], [2, 2, 2]]))
    twice = ev.judge()
    assert (twice.sink_duplicates, twice.sink_duplicate_examples) == (1, [(2, 2)])
    assert any(v.startswith("(f)") for v in twice.violations)
    (ev.root / "sink.json").write_text(json.dumps([[1, 1, 1], [2, 2, 1]]))
    lost = ev.judge()
    assert (lost.sink_missing, lost.sink_missing_examples) == (1, [(1, 3)])
    assert "SqlSink" in lost.markdown("make soak")


def test_a_quarantined_version_is_accounted_for_and_a_quarantined_phantom_is_not(
    ev: Evidence,
) -> None:
    poison = next((9, v) for v in range(1, 2000) if poisoned(9, v))
    ev.commit(2.1, poison)
    ev.deliver(2.5, 1, (1, 3), (2, 2))
    (ev.root / "sink.json").write_text(json.dumps([[1, 3, 1], [2, 2, 1]]))
    missed = ev.judge()  # the planted version went nowhere
    assert missed.missing_examples == [poison]
    assert missed.sink_missing_examples == [poison]
    assert missed.poison_planted == 1
    record = {"id": "q-1", "state": "quarantined", "rows": [list(poison)]}
    (ev.root / "quarantine.json").write_text(json.dumps([record]))
    parked = ev.judge()
    assert parked.violations == []
    assert (parked.quarantine_records, parked.poison_quarantined, parked.quarantined_good) == (
        1,
        1,
        0,
    )
    assert "1 of 1 planted poison" in parked.summary()
    phantom = {"id": "q-2", "state": "quarantined", "rows": [[7, 7]]}  # never committed
    (ev.root / "quarantine.json").write_text(json.dumps([record, phantom]))
    assert ev.judge().phantom_examples == [(7, 7)]


def test_mariadb_control_mode_loses_rows_and_the_soak_says_so(
    mysql_url: str, tmp_path: Path
) -> None:
    """The MariaDB soak (three pollers of one server, string keys, a naive cursor in +05:30)
    with the horizon off loses late commits, and says so, for each poller's table."""
    out = tmp_path / "evidence"
    server = mysql_url.replace("mysql+pymysql://", "mysql://", 1)
    _control_soak(out, "--pollers", "1", "--db", "mariadb", "--mariadb", server)
    names = json.loads((out / "meta.json").read_text())["poller_names"]
    assert len(names) == 3
    assert all((out / name / "history.json").exists() for name in names)


def test_string_keys_order_as_the_case_insensitive_collation_does(ev: Evidence) -> None:
    """`a10` sorts before `B1` in the database (and after it byte-wise): no regression."""
    ev.sample(3.0, 1, 1, [T0, "a10-X"])
    ev.sample(3.5, 1, 1, [T0, "B1-y"])
    assert ev.judge().regressions == []
    ev.sample(4.0, 1, 1, [T0, "a9"])  # back below B1 under the collation too
    assert len(ev.judge().regressions) == 1


def test_a_soak_of_several_pollers_is_judged_per_poller(tmp_path: Path) -> None:
    """Each poller's folder on its own, with the shared faults; a version missing from one
    poller's table fails the run and names the poller."""
    names = ["pa", "pb"]
    for name in names:
        (tmp_path / name).mkdir()
        e = Evidence(tmp_path / name)
        e.grant(0.5, 1)
        e.commit(1.0, ("a1-X", 1), ("B2-y", 2))
        e.sample(1.5, 1, 1, None)
        e.deliver(2.5, 1, ("a1-X", 1), *([("B2-y", 2)] if name == "pa" else []))
        e.judge()
    (tmp_path / "meta.json").write_text(
        json.dumps({"seed": 1, "seconds": 10, "poller_names": names})
    )
    _lines(tmp_path / "faults.jsonl", [{"ev": "fault", "t": 1, "kind": "terminate_pollers"}])
    report = check(tmp_path)
    assert report.missing == 1
    assert report.missing_examples == [("B2-y", 2)]
    assert report.committed == 4
    assert report.faults == {"terminate_pollers": 1}
    assert any(v.startswith("(a)") for v in report.violations)


def _sharded(
    root: Path,
    owner: dict[int, int | None],
    delivered: dict[int, list[tuple[int, int]]],
    sink: list[list[int]] | None = None,
) -> Any:
    """A soak of one poller split over two shards (rows 1 and 2; ``owner``: the shard the
    database put each row in), each shard delivering ``delivered[shard]``; judged."""
    names = ["s.shard-0-of-2", "s.shard-1-of-2"]
    for index, name in enumerate(names):
        (root / name).mkdir(parents=True)
        e = Evidence(root / name)
        e.meta |= {"shard": {"index": index, "count": 2, "of": "s"}, "shard_map": "shards-t.json"}
        e.grant(0.5, 1)
        e.commit(1.0, (1, 1), (2, 2))
        e.commit(2.0, (1, 3))
        e.sample(1.5, 1, 1, None)
        if delivered[index]:
            e.deliver(2.5, 1, *delivered[index])
        if sink is not None:  # the shards share one sink table
            (e.root / "sink.json").write_text(json.dumps(sink))
        e.judge()
    (root / "shards-t.json").write_text(json.dumps([[row, s] for row, s in owner.items()]))
    (root / "meta.json").write_text(json.dumps({"seed": 1, "seconds": 10, "poller_names": names}))
    _lines(root / "faults.jsonl", [{"ev": "fault", "t": 1, "kind": "kill_poller"}])
    return check(root)


def test_each_shard_owes_the_versions_of_the_rows_the_database_puts_in_it(
    tmp_path: Path,
) -> None:
    """Shard 0 owes row 1's versions and shard 1 row 2's: together every committed version,
    once; a row the other shard delivered is a phantom, one delivered by none is missing, and a
    row the database puts in no shard fails the run even though no shard owes it."""
    owner: dict[int, int | None] = {1: 0, 2: 1}
    clean = _sharded(tmp_path / "clean", owner, {0: [(1, 3)], 1: [(2, 2)]})
    assert clean.violations == []
    assert clean.committed == 3  # each version owed by one shard
    crossed = _sharded(tmp_path / "crossed", owner, {0: [(1, 3)], 1: [(2, 2), (1, 3)]})
    assert (crossed.phantoms, crossed.phantom_examples) == (1, [(1, 3)])
    lost = _sharded(tmp_path / "lost", owner, {0: [(1, 1)], 1: [(2, 2)]})
    assert lost.missing_examples == [(1, 3)]
    nowhere = _sharded(tmp_path / "nowhere", {1: 0, 2: None}, {0: [(1, 3)], 1: []})
    assert (nowhere.unsharded, nowhere.unsharded_examples, nowhere.missing) == (1, [(2, 2)], 0)
    assert any("in no shard" in v for v in nowhere.violations)
    # One sink table: each shard is judged on its own rows, so a duplicate counts once.
    sink = [[1, 3, 1], [2, 2, 1], [2, 2, 2]]
    shared = _sharded(tmp_path / "sink", owner, {0: [(1, 3)], 1: [(2, 2)]}, sink)
    assert (shared.sink_rows, shared.sink_duplicates) == (3, 1)
    assert shared.sink_duplicate_examples == [(2, 2)]


def test_a_duplicate_in_the_delta_table_fails_the_run(ev: Evidence) -> None:
    """The DeltaSink poller's table, read back by the driver's own code: a version written
    twice is a violation of (f), a version it lacks too."""
    import pyarrow as pa
    from deltalake import write_deltalake

    from soak.readback import delta_rows

    ev.deliver(2.5, 1, (1, 3), (2, 2))

    def table(rows: list[tuple[int, int]], name: str) -> str:
        uri = str(ev.root / name)
        columns = {
            "id": [r for r, _ in rows],
            "version": [v for _, v in rows],
            "fence": [1] * len(rows),
            "pid": [1] * len(rows),
        }
        write_deltalake(uri, pa.table({k: pa.array(v, pa.int64()) for k, v in columns.items()}))
        return uri

    good = delta_rows(table([(1, 3), (2, 2)], "good"))
    (ev.root / "sink.json").write_text(json.dumps(good))
    assert ev.judge().violations == []
    twice = delta_rows(table([(1, 3), (2, 2), (2, 2)], "twice"))
    (ev.root / "sink.json").write_text(json.dumps(twice))
    report = ev.judge()
    assert (report.sink_duplicates, report.sink_duplicate_examples) == (1, [(2, 2)])
    assert any(v.startswith("(f)") for v in report.violations)
    short = delta_rows(table([(2, 2)], "short"))
    (ev.root / "sink.json").write_text(json.dumps(short))
    assert ev.judge().sink_missing_examples == [(1, 1), (1, 3)]


def _messages(ev: Evidence, *messages: tuple[int, int, str, str]) -> None:
    _lines(
        ev.root / "queue.jsonl",
        [
            {"ev": "message", "t": 3.0, "row": [row, version], "event_id": eid, "message": mid}
            for row, version, eid, mid in messages
        ],
    )


def test_the_queue_must_carry_every_version_once_or_more_under_one_event_id(
    ev: Evidence,
) -> None:
    ev.deliver(2.5, 1, (1, 3), (2, 2))
    # (1, 1) is superseded by (1, 3); (2, 2) sent twice (a batch sent again): reported only.
    _messages(ev, (1, 3, "e13", "m1"), (2, 2, "e22", "m2"), (2, 2, "e22", "m3"))
    sent_again = ev.judge()
    assert sent_again.violations == []
    assert (sent_again.queue_messages, sent_again.queue_duplicates) == (3, 1)
    _messages(ev, (2, 2, "e22", "m2"))
    lost = ev.judge()
    assert (lost.queue_missing, lost.queue_missing_examples) == (2, [(1, 1), (1, 3)])
    assert any(v.startswith("(h)") for v in lost.violations)
    assert "QueueSink" in lost.markdown("make soak")
    _messages(ev, (1, 3, "e13", "m1"), (2, 2, "e22", "m2"), (2, 2, "other", "m3"))
    assert ev.judge().queue_bad_ids == 1  # one version under two event ids
    _messages(ev, (1, 3, "same", "m1"), (2, 2, "same", "m2"))
    shared = ev.judge()
    assert shared.queue_bad_ids == 1  # one event id naming two versions
    assert any("event_id" in v for v in shared.violations)


def test_a_poller_reading_a_share_of_the_rows_owes_only_their_versions(ev: Evidence) -> None:
    """The queue poller forwards the rows whose id is a multiple of ``rows_every`` (where=):
    the other rows' versions are not missing, and delivering one is a phantom."""
    ev.meta["rows_every"] = 2
    ev.deliver(2.5, 1, (2, 2))
    assert ev.judge().violations == []  # (1, 1) and (1, 3) are not its rows
    ev.meta["rows_every"] = 1
    assert ev.judge().missing == 2  # the same deliveries from a poller of every row
    ev.meta["rows_every"] = 2
    ev.deliver(3.0, 1, (1, 3))
    assert ev.judge().phantoms == 1  # a row its filter excludes came through


def test_a_fault_kind_left_out_is_never_scheduled() -> None:
    faults = schedule(3, 600, 4.0, frozenset({"refuse_db", "pause_azurite_long"}))
    kinds = {f.kind for f in faults}
    assert kinds == set(KINDS) - {"refuse_db", "pause_azurite_long"}
    assert schedule(3, 600, 4.0) == schedule(3, 600, 4.0)


def test_a_handler_that_outlived_its_lease_is_caught_if_its_writes_land(ev: Evidence) -> None:
    """``overrun_handler``: a call under fence 1 sleeps past its budget and lease; fence 2
    delivers the same rows. The call began before fence 2 existed, so it is not a stale call;
    what guards the run is that its late sink write and its late checkpoint commit must be
    refused: if they landed, the sink holds the rows twice (f) and the checkpoint's fence goes
    back (b)."""
    ev.events.append({"ev": "start", "t": 2.0, "fence": 1})
    ev.events.append({"ev": "overrun", "t": 2.0, "fence": 1, "seconds": 48})
    ev.grant(20.0, 2)
    ev.deliver(20.5, 2, (1, 3), (2, 2))
    ev.sample(21.0, 2, 2, [T0, 2])
    (ev.root / "sink.json").write_text(json.dumps([[1, 3, 2], [2, 2, 2]]))
    refused = ev.judge()
    assert refused.violations == []
    assert refused.overruns == 1
    assert refused.stale_calls == 0
    (ev.root / "sink.json").write_text(json.dumps([[1, 3, 2], [2, 2, 2], [1, 3, 1], [2, 2, 1]]))
    ev.sample(50.5, 1, 2, [T0, 2])  # the stale owner's checkpoint commit landed too
    landed = ev.judge()
    assert landed.sink_duplicates == 2
    assert any("checkpoint fence 2 -> 1" in r for r in landed.regressions)


def test_good_versions_quarantined_for_an_error_the_soak_did_not_inject_fail_the_run(
    ev: Evidence,
) -> None:
    """A sink that fails on good rows until the poller parks them must not pass as
    "accounted for": the record's error tells an injected failure from a real one."""
    ev.deliver(2.5, 1, (1, 3))
    split = {
        "id": "q-1",
        "state": "quarantined",
        "rows": [[2, 2]],
        "error": "RuntimeError: soak: injected handler failure",
    }
    (ev.root / "quarantine.json").write_text(json.dumps([split]))
    assert ev.judge().violations == []
    sink = {**split, "id": "q-2", "error": "SinkError: QueueSink could not send a message"}
    (ev.root / "quarantine.json").write_text(json.dumps([sink]))
    report = ev.judge()
    assert report.missing == 0  # accounted for ...
    assert len(report.wrongly_quarantined) == 1  # ... but for a failure nobody injected
    assert any(v.startswith("(g)") for v in report.violations)
