"""Failure-matrix cases with real processes against Azurite: races, kills, freezes, skew, faults.

Each poller runs in a child process, through the real CLI (``python -m azure_functions_db run
tests/support/azure_proc_app.py``) or through ``tests/support/azure_proc_child.py`` when the test
must inject something into the engine (a frozen monotonic clock, a loop of runs). The source is a
SQLite ``orders`` table, the state is :class:`BlobStateStore` (and :class:`TableStateStore` where
said) on Azurite, with Azure's minimum lease of 15 s. The children write every handler call, every
engine log event and every injected fault to an fsynced event file (see
``tests/support/azure_proc_app.py``); the assertions read that file and the stored checkpoint. Times
are ``time.monotonic()``, one clock for every process on the machine (``seq``, the order of the
appends, where a process's clock is faked).

- two owners racing: one owner at a time, hand-overs continue at the checkpoint (lease, fence);
- owner SIGKILLed mid-handler: taken over only after the service expired its lease; the whole
  batch is redelivered (cases E/F);
- owner SIGSTOPped past its lease, resumed after a takeover: its LeaseKeeper discards the result
  (case H); with a clock that says no time passed and no heartbeat, the store's fence rejects
  its commit, on Blob and on Table (case C); the checkpoint never moves backwards;
- an instance whose clock is 10 minutes ahead (libfaketime) cannot take a live lease (case K);
- a commit whose response is lost (case G), with and without SDK retries, Blob and Table;
- Azurite restarted mid-run, and answering 503 to every third request.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from azure_functions_db.core.checkpoint import PollerKey
from azure_functions_db.core.commits import GROUP_BATCHES
from azure_functions_db.core.ports import StoredCheckpoint
from azure_functions_db.state.blob import BlobStateStore
from azure_functions_db.state.table import TableStateStore
from devkit.azurite import DIE_WITH_PARENT, Azurite
from tests.support.sqlite_orders import Orders

pytestmark = [pytest.mark.slow]

HERE = Path(__file__).resolve().parents[1] / "support"
APP = HERE / "azure_proc_app.py"
CHILD = HERE / "azure_proc_child.py"
LEASE = 15.0  # the Azure minimum, used by every poller here
# Slack for "the lease was granted at most this long before the owner logged it": the acquire
# request, the fence raise and the log line all happen between the grant and the event.
GRANT_SLACK = 1.0
LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1")


# -- child processes ------------------------------------------------------------------------------


@dataclass
class Poller:
    """One poller's world: its SQLite table, its event file, its state, its child environment."""

    name: str
    dir: Path
    azurite: Azurite
    container: str
    rows: int
    store_kind: str = "blob"
    table: str | None = None
    env: dict[str, str] = field(default_factory=dict)

    @property
    def events_path(self) -> Path:
        return self.dir / "events.jsonl"

    @property
    def ready(self) -> Path:
        return self.dir / "ready"

    @property
    def key(self) -> PollerKey:
        return PollerKey("live", self.name)

    def child_env(self, **extra: object) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AZP_")}
        env.update(self.env)
        env.update({k: str(v) for k, v in extra.items() if v is not None})
        return env

    def store(self) -> BlobStateStore | TableStateStore:
        settings = {"AzureWebJobsStorage": self.azurite.connection_string}
        if self.store_kind == "table":
            assert self.table is not None
            return TableStateStore(
                settings=settings, table=self.table, lease_container=self.container
            )
        return BlobStateStore(settings=settings, container=self.container)

    def checkpoint(self) -> StoredCheckpoint:
        stored = self.store().read(self.key)
        assert stored is not None, f"poller {self.name} has no checkpoint"
        return stored

    def events(self) -> list[dict[str, Any]]:
        if not self.events_path.exists():
            return []
        lines = self.events_path.read_text().splitlines()
        # `seq`: the order of the appends, a real-time order that needs no clock.
        return [{**json.loads(line), "seq": n} for n, line in enumerate(lines)]


def make_poller(
    tmp_path: Path,
    name: str,
    azurite: Azurite,
    container: str,
    rows: int,
    *,
    store: str = "blob",
    table: str | None = None,
    **env: object,
) -> Poller:
    folder = tmp_path / name
    folder.mkdir()
    orders = Orders(folder / "orders.db")
    orders.insert(range(1, rows + 1), tie_every=3)
    orders.close()
    poller = Poller(name, folder, azurite, container, rows, store, table)
    poller.env = {
        "AZP_CONN": azurite.connection_string,
        "AZP_CONTAINER": container,
        "AZP_STORE": store,
        "AZP_TABLE": table or "",
        "AZP_DB": orders.url,
        "AZP_POLLER": name,
        "AZP_EVENTS": str(poller.events_path),
        "AZP_READY": str(poller.ready),
        "AZP_BATCH": "10",
        **{k: str(v) for k, v in env.items()},
    }
    return poller


class Children:
    """Child processes of one test; every one is killed (thawed first) when the test ends, and
    by the kernel if the test process itself dies."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.outputs: dict[int, Path] = {}

    def _start(self, argv: list[str], env: dict[str, str], out: Path) -> subprocess.Popen[bytes]:
        with out.open("wb") as sink:
            proc = subprocess.Popen(
                argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                preexec_fn=DIE_WITH_PARENT,  # noqa: PLW1509 - only prctl(), resolved before fork
            )
        self.procs.append(proc)
        self.outputs[proc.pid] = out
        return proc

    def cli(self, poller: Poller, label: str, *args: str, **env: object) -> subprocess.Popen[bytes]:
        """``python -m azure_functions_db run tests/support/azure_proc_app.py ARGS``."""
        argv = [sys.executable, "-m", "azure_functions_db", "run", str(APP), *args]
        return self._start(argv, poller.child_env(**env), poller.dir / f"{label}.out")

    def child(
        self,
        poller: Poller,
        label: str,
        mode: str,
        *,
        env_extra: dict[str, str] | None = None,
        **env: object,
    ) -> subprocess.Popen[bytes]:
        """``python tests/support/azure_proc_child.py MODE`` (engine with injected clock etc.)."""
        child_env = poller.child_env(**env)
        child_env.update(env_extra or {})
        argv = [sys.executable, str(CHILD), mode]
        return self._start(argv, child_env, poller.dir / f"{label}.out")

    def output(self, proc: subprocess.Popen[bytes]) -> str:
        return self.outputs[proc.pid].read_text(errors="replace")

    def wait(self, proc: subprocess.Popen[bytes], timeout: float = 90) -> int:
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"child {proc.pid} still running after {timeout}s:\n{self.output(proc)}")

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.kill(proc.pid, signal.SIGCONT)
                    proc.kill()
                except ProcessLookupError:
                    pass
            proc.wait()


@pytest.fixture
def children() -> Iterator[Children]:
    kids = Children()
    try:
        yield kids
    finally:
        kids.close()


def wait_until(
    check: Callable[[], bool],
    what: str,
    *,
    timeout: float = 60,
    watch: tuple[subprocess.Popen[bytes], ...] = (),
    kids: Children | None = None,
) -> None:
    """Poll ``check``; fail with the children's output if it never holds or one of ``watch``
    exits first."""
    deadline = time.monotonic() + timeout
    while not check():
        for proc in watch:
            if proc.poll() is not None:
                out = kids.output(proc) if kids else ""
                pytest.fail(f"child {proc.pid} exited ({proc.returncode}) before {what}:\n{out}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.02)


# -- reading what happened ------------------------------------------------------------------------


@dataclass
class Call:
    """One handler call: when it started and ended (``end`` is None if it never returned)."""

    pid: int
    fence: int
    ids: list[int]
    before: list[int] | None
    after: list[int]
    start: float
    end: float | None


def calls(events: list[dict[str, Any]], pid: int | None = None) -> list[Call]:
    """Handler calls in start order (optionally of one process)."""
    started: dict[tuple[int, int], Call] = {}
    for e in events:
        if e["ev"] == "start":
            started[(e["pid"], e["call"])] = Call(
                e["pid"], e["fence"], e["ids"], e["before"], e["after"], e["t"], None
            )
        elif e["ev"] == "end":
            started[(e["pid"], e["call"])].end = e["t"]
    found = sorted(started.values(), key=lambda c: c.start)
    return [c for c in found if pid is None or c.pid == pid]


def logs(events: list[dict[str, Any]], action: str, pid: int | None = None) -> list[dict[str, Any]]:
    return [
        e
        for e in events
        if e["ev"] == "log" and e["action"] == action and (pid is None or e["pid"] == pid)
    ]


def runs(events: list[dict[str, Any]], pid: int) -> list[dict[str, Any]]:
    return [e for e in events if e["ev"] == "run" and e["pid"] == pid]


def delivered(events: list[dict[str, Any]], pid: int | None = None) -> Counter[int]:
    """How often each id was handed to a handler that returned."""
    return Counter(i for c in calls(events, pid) if c.end is not None for i in c.ids)


def assert_every_row_delivered(poller: Poller, events: list[dict[str, Any]]) -> Counter[int]:
    """Nothing lost: every id reached a handler call that completed. Returns the duplicates."""
    seen = delivered(events)
    missing = sorted(set(range(1, poller.rows + 1)) - set(seen))
    assert not missing, f"rows never delivered: {missing}"
    duplicates = Counter({i: n - 1 for i, n in seen.items() if n > 1})
    print(f"{poller.name}: {poller.rows} rows, {sum(duplicates.values())} duplicate deliveries")
    return duplicates


def assert_drained(poller: Poller) -> StoredCheckpoint:
    stored = poller.checkpoint()
    position = stored.checkpoint.position
    assert position is not None
    assert position.pk == (poller.rows,)
    return stored


def handover_ok(poller: Poller) -> bool:
    stored = poller.store().read(poller.key)
    return (
        stored is not None
        and stored.checkpoint.position is not None
        and stored.checkpoint.position.pk == (poller.rows,)
    )


# -- 1. two owners racing ------------------------------------------------------------------------


def test_two_owners_racing_never_handle_batches_at_once_and_deliver_every_row(
    tmp_path, azurite, azurite_container, children
):
    """Lease + fence on Blob across processes: one owner at a time, hand-overs continue exactly
    at the checkpoint, every row delivered."""
    poller = make_poller(
        tmp_path, "race", azurite, azurite_container, 400, AZP_SLEEP=0.3, AZP_BUDGET=5.5
    )
    stop = poller.dir / "stop"
    # A: the real local runner on a `* * * * * *` timer. B: a loop of runs that polls every
    # 50 ms while A works and backs off 1.2 s after its own run, so that A's next timer tick
    # wins the following round: both processes own the lease in turn.
    a = children.cli(poller, "a", AZP_SCHEDULE="* * * * * *")
    b = children.child(poller, "b", "loop", AZP_STOP=stop, AZP_POLL=0.05, AZP_BACKOFF=1.2)
    wait_until(
        lambda: handover_ok(poller),
        "the table to be drained",
        timeout=120,
        watch=(a, b),
        kids=children,
    )
    stop.touch()
    a.send_signal(signal.SIGTERM)
    assert children.wait(a) == 0, children.output(a)
    assert children.wait(b) == 0, children.output(b)

    events = poller.events()
    handled = calls(events)
    assert {c.pid for c in handled} == {a.pid, b.pid}, "both processes must have owned the lease"
    assert all(c.end is not None for c in handled)
    for one, two in itertools.pairwise(handled):
        assert one.end is not None
        assert one.end <= two.start, f"two handlers at once: {one} and {two}"
        # Every batch starts where the previous one (in time, in any process) ended: a new
        # owner continues exactly at the committed checkpoint, re-reading and skipping nothing.
        assert two.before == one.after, f"hand-over did not continue at the checkpoint: {two}"
        if two.pid != one.pid:
            assert two.fence > one.fence, f"fence did not go up with the new owner: {two}"
        else:
            assert two.fence >= one.fence
    assert handled[0].before is None
    held = logs(events, "lease_held")
    assert held, "the processes never contended for the lease"
    owners = [k for k, _ in _groups([c.pid for c in handled])]
    print(f"race: {len(handled)} batches, owner sequence {owners}, {len(held)} lease_held runs")
    duplicates = assert_every_row_delivered(poller, events)
    # No run failed, so every batch was acknowledged once: a redelivery here would be a re-read
    # of rows at or below a committed checkpoint, which the contract forbids.
    assert not [e for e in events if e["ev"] == "run" and e["status"] == "failed"]
    assert not duplicates
    stored = assert_drained(poller)
    assert stored.checkpoint.stats.rows == poller.rows
    # Every run that took the lease fenced the checkpoint, including a last one that found
    # nothing to do; so the stored fence is the newest grant, at least that of the last batch.
    assert stored.checkpoint.fence >= max(c.fence for c in handled)


def _groups(items: list[int]) -> list[tuple[int, int]]:
    """Run-length encoding: [(item, count), ...]."""
    out: list[tuple[int, int]] = []
    for item in items:
        if out and out[-1][0] == item:
            out[-1] = (item, out[-1][1] + 1)
        else:
            out.append((item, 1))
    return out


# -- 2. owner killed mid-handler ------------------------------------------------------------------


def test_owner_killed_mid_handler_is_replaced_after_lease_expiry_and_batch_redelivered(
    tmp_path, azurite, azurite_container, children
):
    """Cases E/F on Azure leases: a SIGKILLed owner's lease lives until the service expires it;
    then the next owner (higher fence) redelivers the whole unacknowledged batch."""
    poller = make_poller(
        tmp_path, "killed", azurite, azurite_container, 60, AZP_HOLD_AT=25, AZP_HOLD=600
    )
    victim = children.cli(poller, "victim", "--once")
    wait_until(poller.ready.exists, "the victim mid-handler", watch=(victim,), kids=children)
    victim.kill()
    assert children.wait(victim) == -signal.SIGKILL
    killed_at = time.monotonic()
    events = poller.events()
    (acquired,) = logs(events, "lease_acquired", victim.pid)
    granted = acquired["t"]
    # Killed before its first heartbeat (duration/2.5): the lease expires LEASE after the grant.
    assert killed_at - granted < LEASE / 3 - 0.5, "the victim was too slow to reach row 25"
    victim_calls = calls(events, victim.pid)
    assert [c.ids for c in victim_calls] == [
        list(range(1, 11)),
        list(range(11, 21)),
        list(range(21, 31)),
    ]
    unacked = victim_calls[-1]
    assert unacked.end is None
    assert [e["id"] for e in events if e["ev"] == "row"] == [21, 22, 23, 24]
    checkpoint = poller.checkpoint().checkpoint
    # With the commit in flight (pipeline=True) batch 2's commit, or on a loaded machine even
    # batch 1's, may not have landed yet when the kill came: then those batches come again too
    # (a duplicate, never a loss).
    acknowledged = 0
    if checkpoint.position is not None:
        (acknowledged,) = checkpoint.position.pk
    assert acknowledged in (0, 10, 20)
    again = Counter(range(acknowledged + 1, 21))

    # At once: a run through the CLI finds the dead owner's lease and does nothing; a second
    # process retries every 250 ms until it gets the lease.
    early = children.cli(poller, "early", "--once", AZP_HOLD_AT=0)
    taker = children.child(poller, "taker", "until-run", AZP_HOLD_AT=0, AZP_POLL=0.25)
    assert children.wait(early) == 0, children.output(early)
    assert "lease_held" in children.output(early)
    assert children.wait(taker) == 0, children.output(taker)

    events = poller.events()
    assert not calls(events, early.pid)
    taker_runs = runs(events, taker.pid)
    assert [r["status"] for r in taker_runs[:-1]] == ["lease_held"] * (len(taker_runs) - 1)
    assert len(taker_runs) >= 10, "the taker should have been refused many times"
    assert taker_runs[-1]["status"] == "caught_up"
    (took,) = logs(events, "lease_acquired", taker.pid)
    # Not before the service expired the dead owner's lease, and promptly after.
    assert took["t"] >= granted + LEASE - GRANT_SLACK, took["t"] - granted
    assert took["t"] <= granted + LEASE + 5, took["t"] - granted
    print(f"killed: taker acquired {took['t'] - granted:.2f}s after the victim's grant")

    taker_calls = calls(events, taker.pid)
    first = list(range(acknowledged + 1, acknowledged + 11))
    assert taker_calls[0].ids == first, "the whole unacknowledged batch comes first"
    assert taker_calls[0].before == ([acknowledged] if acknowledged else None)
    assert unacked.before == [20]
    assert taker_calls[0].fence == unacked.fence + 1
    assert [i for c in taker_calls for i in c.ids] == list(range(acknowledged + 1, 61))
    assert assert_every_row_delivered(poller, events) == again
    stored = assert_drained(poller)
    assert stored.checkpoint.fence == unacked.fence + 1 == 2
    assert poller.store().inspect(poller.key).fence == 2


# -- 3. owner frozen longer than the lease ---------------------------------------------------------

# The frozen owner holds the batch of rows 21-30 (batches of 10): two batches are committed,
# the third is in its handler. A hold longer than the freeze costs nothing: time.sleep() ends
# at once on SIGCONT when its (monotonic) deadline passed meanwhile.
HOLD_AT = 25


@dataclass
class Frozen:
    """A frozen owner's story, for the assertions of cases C and H."""

    poller: Poller
    victim: subprocess.Popen[bytes]
    taker: subprocess.Popen[bytes]
    before: StoredCheckpoint
    after: StoredCheckpoint
    resumed_at: float
    events: list[dict[str, Any]]


def freeze_owner_during_takeover(
    pollers: list[Poller], children: Children, start_victim: Callable[[Poller], Any]
) -> list[Frozen]:
    """For each poller at once: its owner is SIGSTOPped mid-handler, another process takes over
    after the lease expired and drains the table, then the owner is SIGCONTed and finishes."""
    victims = [start_victim(p) for p in pollers]
    for poller, victim in zip(pollers, victims, strict=True):
        wait_until(
            poller.ready.exists, f"{poller.name} mid-handler", watch=(victim,), kids=children
        )
        os.kill(victim.pid, signal.SIGSTOP)  # the whole process: handler and heartbeat thread
        wait_until(lambda pid=victim.pid: _state(pid) == "T", f"{poller.name} to stop")
        # Frozen inside the handler: the held batch has not returned, let alone committed.
        assert not [
            e
            for e in poller.events()
            if e["ev"] == "end" and e["pid"] == victim.pid and HOLD_AT in e["ids"]
        ], f"{poller.name} was frozen too late"
    takers = [
        children.child(p, "taker", "until-run", AZP_HOLD_AT=0, AZP_POLL=0.25) for p in pollers
    ]
    for taker in takers:
        assert children.wait(taker) == 0, children.output(taker)
    befores = [p.checkpoint() for p in pollers]
    resumed_at = time.monotonic()
    for victim in victims:
        os.kill(victim.pid, signal.SIGCONT)
    out = []
    for poller, victim, taker, before in zip(pollers, victims, takers, befores, strict=True):
        assert children.wait(victim) == 1, children.output(victim)
        out.append(
            Frozen(poller, victim, taker, before, poller.checkpoint(), resumed_at, poller.events())
        )
    return out


def _state(pid: int) -> str:
    """The state letter of a process (``T`` = stopped by a signal), from ``/proc``."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def assert_stale_owner_discarded(story: Frozen) -> Call:
    """The stale owner finished its handler after the resume, wrote nothing, and the new owner
    redelivered its batch; the checkpoint never moved backwards. Returns the stale call.

    With the commit in flight (``pipeline=True``, the default) the stale owner may also have
    handed the next batch to the handler while its doomed commit was on its way: that batch is
    a second duplicate, never a commit. The batch before the stale one was committed before the
    freeze (the record is unchanged since the takeover: below) and may be reported only once
    the stale handler returned."""
    poller, events = story.poller, story.events
    victim_calls = calls(events, story.victim.pid)
    (stale,) = [c for c in victim_calls if HOLD_AT in c.ids]
    assert stale.end is not None
    assert stale.end >= story.resumed_at, "the handler finished after the resume"
    later = victim_calls[victim_calls.index(stale) + 1 :]
    # Group commit: batches handed over while the doomed commit was in flight, each after the
    # one before, within the duplicate window (ten batches unacknowledged, the stale included).
    assert len(later) <= GROUP_BATCHES - 1, later
    previous = stale
    for extra in later:
        assert extra.before == previous.after, (extra, previous)
        assert extra.start >= story.resumed_at
        previous = extra
    # Where the new owner found the record: the old owner's last commit that landed. Every
    # batch the old owner handled after it is unacknowledged (with group commit, the batch
    # before the stale one may be among them: it waited for the commit in flight).
    first = calls(events, story.taker.pid)[0]
    assert first.before is not None
    unacked = [c for c in victim_calls if c.before is not None and c.before >= first.before]
    assert stale in unacked
    assert unacked[0].before == first.before
    assert len(unacked) <= GROUP_BATCHES, unacked
    late = [
        e for e in logs(events, "batch_committed", story.victim.pid) if e["t"] >= story.resumed_at
    ]
    assert len(late) <= 1, late
    if late:  # reported only once the stale handler returned; landed before the takeover
        assert str(late[0]["position"]).endswith(f"pk=({first.before[0]}))"), late
    # Nothing written at all after the resume: same record, same etag.
    assert story.after.etag == story.before.etag
    assert story.after.checkpoint == story.before.checkpoint
    before, after = story.before.checkpoint.position, story.after.checkpoint.position
    assert before is not None
    assert after is not None
    assert after.key >= before.key  # integer keys: Python orders them as the database does
    assert after.pk == (poller.rows,)
    assert story.after.checkpoint.fence == stale.fence + 1
    assert first.ids == unacked[0].ids
    assert first.fence == stale.fence + 1
    # The stale owner's handlers did run to the end, so every batch it handled after its last
    # commit is a duplicate: the stale one, the ones before it that waited for a commit, and
    # those it handled while the doomed commit was in flight.
    expected = Counter(i for c in unacked for i in c.ids)
    assert assert_every_row_delivered(poller, events) == expected
    took = logs(events, "lease_acquired", story.taker.pid)[0]
    granted = logs(events, "lease_acquired", story.victim.pid)[0]
    assert took["t"] >= granted["t"] + LEASE - GRANT_SLACK
    return stale


def test_case_h_owner_frozen_past_its_lease_counts_it_lost_and_does_not_commit(
    tmp_path, azurite, azurite_container, children
):
    """Case H: the resumed owner's LeaseKeeper finds the lease lost (its last renewal was sent
    a lease duration ago on its own monotonic clock): the stale result is discarded, no commit."""
    poller = make_poller(
        tmp_path, "frozen-h", azurite, azurite_container, 60, AZP_HOLD_AT=HOLD_AT, AZP_HOLD=10
    )
    (story,) = freeze_owner_during_takeover(
        [poller], children, lambda p: children.cli(p, "victim", "--once")
    )
    assert_stale_owner_discarded(story)
    output = children.output(story.victim)
    # The heartbeat thread and the commit both ask the keeper first, and the keeper sees that
    # its last renewal is older than the lease on this process's monotonic clock (the freeze
    # counts: CLOCK_MONOTONIC runs on while a process is stopped).
    assert "failed: Lease for poller `frozen-h`" in output, output
    assert "was lost: not renewed for" in output, output
    assert not logs(story.events, "commit_rejected", story.victim.pid), "the fence was not needed"


@pytest.mark.parametrize("pipeline", ["1", "0"], ids=["pipelined", "serial"])
def test_case_c_stale_owner_that_believes_it_holds_the_lease_is_rejected_by_the_fence(
    tmp_path, azurite, azurite_container, azurite_table_name, children, *, pipeline
):
    """Case C, Blob and Table at once: an owner whose clock says no time passed and whose
    heartbeat never ran commits after the new owner fenced the checkpoint: the store rejects it
    (etag/fence), not the owner's own checks."""
    pollers = [
        make_poller(
            tmp_path,
            f"frozen-c-{store}-{pipeline}",
            azurite,
            azurite_container,
            60,
            store=store,
            table=azurite_table_name,
            AZP_HOLD_AT=HOLD_AT,
            AZP_HOLD=10,
            AZP_PIPELINE=pipeline,
        )
        for store in ("blob", "table")
    ]
    stories = freeze_owner_during_takeover(
        pollers,
        children,
        lambda p: children.child(p, "victim", "once", AZP_CLOCK="frozen", AZP_HEARTBEAT=3600),
    )
    for story in stories:
        stale = assert_stale_owner_discarded(story)
        if pipeline == "0":
            assert calls(story.events, story.victim.pid)[-1] == stale, "no batch past the commit"
        (run,) = runs(story.events, story.victim.pid)
        assert run["error"] == "CheckpointConflictError", (story.poller.name, run)
        assert f"fence {stale.fence + 1} > {stale.fence}" in run["message"], run
        assert logs(story.events, "commit_rejected", story.victim.pid)
        # The owner never suspected anything before the store said no.
        reasons = [e["reason"] for e in logs(story.events, "lease_lost", story.victim.pid)]
        assert reasons == ["checkpoint changed by another writer"], (story.poller.name, reasons)


# -- 4. clock skew ------------------------------------------------------------------------------


def skewed_env(how: str) -> dict[str, str]:
    """How the second owner's wall clock is put 10 minutes ahead.

    ``faketime``: libfaketime (Debian package ``faketime``, installed by .ci/run) skews the whole
    process: ``datetime.now``, ``time.time`` and the ``x-ms-date`` of every storage request. Its
    monotonic clock is faked too (libfaketime 0.9.10 with ``FAKETIME_DONT_FAKE_MONOTONIC`` makes
    Python's ``time.sleep`` fail with EINVAL), so the test orders its events by ``seq``, not by
    time. ``injected``: the engine gets a skewed clock.
    """
    if how == "faketime":
        if not LIBFAKETIME.is_file():
            pytest.skip(f"libfaketime is not installed ({LIBFAKETIME}): apt-get install faketime")
        return {"LD_PRELOAD": str(LIBFAKETIME), "FAKETIME": "+10m"}
    return {"AZP_CLOCK": "skew:600"}


@pytest.mark.parametrize("how", ["faketime", "injected"])
def test_case_k_owner_with_clock_ten_minutes_ahead_cannot_take_a_live_lease(
    tmp_path, azurite, azurite_container, children, how
):
    """Case K: lease expiry is the service's; an instance whose clock is 10 minutes ahead finds
    the live lease held (and runs no handler) until the owner releases it."""
    poller = make_poller(
        tmp_path,
        "skew",
        azurite,
        azurite_container,
        30,
        AZP_HOLD_AT=5,
        AZP_HOLD=6,
        AZP_BUDGET=5.5,
    )
    # The owner holds its first batch for 6 s, then its time budget ends the run: it commits
    # that batch and releases the lease, leaving rows 11-30 for the skewed instance.
    owner = children.cli(poller, "owner", "--once")
    wait_until(poller.ready.exists, "the owner mid-handler", watch=(owner,), kids=children)
    env = skewed_env(how)
    skewed = children.child(
        poller, "skewed", "until-run", AZP_HOLD_AT=0, AZP_POLL=0.3, env_extra=env
    )
    assert children.wait(owner) == 0, children.output(owner)
    assert children.wait(skewed) == 0, children.output(skewed)
    now = dt.datetime.now(dt.UTC)

    events = poller.events()
    (start,) = [e for e in events if e["ev"] == "child_start" and e["pid"] == skewed.pid]
    skew = (dt.datetime.fromisoformat(start["now"]) - now).total_seconds()
    print(f"skew: {how}, the skewed instance's clock was {skew:.0f}s ahead")
    assert 540 < skew < 660, f"the second instance is not skewed ({how}): {skew:.0f}s"
    if how == "faketime":
        sys_now = dt.datetime.fromisoformat(start["sys_now"])
        assert (sys_now - now).total_seconds() > 540, "libfaketime did not skew datetime.now()"

    # The owner's last handler call ended before it committed and released the lease: every
    # run of the skewed instance that ended before that point found the lease held, and none of
    # its handler calls started before it.
    (last,) = [e for e in events if e["ev"] == "end" and e["pid"] == owner.pid]
    skewed_runs = runs(events, skewed.pid)
    while_held = [r for r in skewed_runs if r["seq"] < last["seq"]]
    assert len(while_held) >= 5, "the skewed instance should have tried while the lease was live"
    assert {r["status"] for r in while_held} == {"lease_held"}
    (took,) = logs(events, "lease_acquired", skewed.pid)
    assert took["seq"] > last["seq"]
    assert all(
        e["seq"] > last["seq"] for e in events if e["ev"] == "start" and e["pid"] == skewed.pid
    )
    assert skewed_runs[-1]["status"] == "caught_up"
    # And Azurite did accept the skewed instance's requests: it took the lease once it was free,
    # delivered the rest and committed with its own (future) clock.
    assert [i for c in calls(events, skewed.pid) for i in c.ids] == list(range(11, 31))
    assert not assert_every_row_delivered(poller, events)
    stored = assert_drained(poller)
    assert stored.checkpoint.fence == 2
    assert stored.checkpoint.committed_at is not None
    assert (stored.checkpoint.committed_at - now).total_seconds() > 540


# -- 5. ambiguous commit ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("store", "sdk_retry"),
    [("blob", "on"), ("blob", "off"), ("table", "on"), ("table", "off")],
)
def test_case_g_commit_whose_response_is_lost_is_recognised_as_landed(
    tmp_path, azurite, azurite_container, azurite_table_name, children, *, store, sdk_retry
):
    """Case G: the first batch's checkpoint write (the run's first batch is committed at once;
    the next ones wait for the pace and go together) reaches Azurite, its response is lost.
    With SDK retries the retried conditional write gets 412; without, the store reports a
    transient error and the next write is the later batches' commit. Either way the engine reads
    back, recognises its own write: no duplicate, no loss."""
    poller = make_poller(
        tmp_path,
        f"ambiguous-{store}-{sdk_retry}",
        azurite,
        azurite_container,
        40,
        store=store,
        table=azurite_table_name,
        AZP_FAULT="lose_response:1",
        AZP_SDK_RETRY=sdk_retry,
    )
    run = children.cli(poller, "run", "--once")
    assert children.wait(run) == 0, children.output(run)

    events = poller.events()
    faults = [e for e in events if e["ev"] == "fault"]
    assert [f["fault"] for f in faults] == ["lose_response"]
    (reached,) = [e for e in events if e["ev"] == "fault_reached_server"]
    assert 200 <= reached["status"] < 300, reached  # the write landed
    after = [e for e in events if e["ev"] == "commit_after_fault"]
    (landed,) = logs(events, "commit_ambiguous_landed")
    if sdk_retry == "on":
        assert after[0]["status"] == 412, after  # the SDK's retry of the same conditional write
        assert landed["error"] == "CheckpointConflictError"
    else:
        assert 200 <= after[0]["status"] < 300, after  # no resend: the next batch's commit
        assert landed["error"] == "TransientStoreError"
    assert not logs(events, "commit_rejected")
    assert not assert_every_row_delivered(poller, events), "the write landed: no duplicate"
    stored = assert_drained(poller)
    assert (stored.checkpoint.stats.batches, stored.checkpoint.stats.rows) == (4, 40)


@pytest.mark.parametrize("pipeline", ["1", "0"], ids=["pipelined", "serial"])
def test_case_g_commit_that_never_left_is_redelivered_not_lost(
    tmp_path, azurite, azurite_container, children, pipeline
):
    """Case G, the other outcome: the write never reached the service (no SDK retry). The engine
    reads back, sees it did not land, ends the run; the next run redelivers that batch (and,
    pipelined, the batch handled while that commit was in flight)."""
    poller = make_poller(
        tmp_path,
        f"ambiguous-lost-{pipeline}",
        azurite,
        azurite_container,
        40,
        AZP_PIPELINE=pipeline,
    )
    first = children.cli(poller, "first", "--once", AZP_FAULT="lose_request:2", AZP_SDK_RETRY="off")
    assert children.wait(first) == 1, children.output(first)
    assert logs(poller.events(), "commit_ambiguous_lost")
    position = poller.checkpoint().checkpoint.position
    assert position is not None
    assert position.pk == (10,)
    second = children.cli(poller, "second", "--once")
    assert children.wait(second) == 0, children.output(second)

    events = poller.events()
    duplicates = assert_every_row_delivered(poller, events)
    # Every batch handed over after the last commit that landed (pk 10): the one whose commit
    # was lost and, pipelined, those handled while it was in flight (group commit: within the
    # duplicate window).
    unacked = [c for c in calls(events, first.pid) if c.before is not None and c.before >= [10]]
    assert unacked[0].ids == list(range(11, 21))
    assert len(unacked) <= (GROUP_BATCHES if pipeline == "1" else 1), unacked
    expected = Counter(i for c in unacked for i in c.ids)
    assert duplicates == expected, "exactly the unacknowledged batches, once more"
    assert calls(events, second.pid)[0].ids == list(range(11, 21))
    stored = assert_drained(poller)
    assert stored.checkpoint.stats.rows == 40


# -- 6. Azurite restarted, Azurite busy ---------------------------------------------------------


def test_azurite_restarted_mid_run_loses_nothing(tmp_path, private_azurite, children):
    """A run in progress while the storage service restarts: SDK and engine retries (or the next
    run) carry on; every row is delivered and the checkpoint counts each batch once."""
    poller = make_poller(tmp_path, "restart", private_azurite, "afdb-restart", 200, AZP_SLEEP=0.15)
    first = children.cli(poller, "first", "--once")
    wait_until(
        lambda: len([e for e in poller.events() if e["ev"] == "end"]) >= 5,
        "five batches",
        watch=(first,),
        kids=children,
    )
    down = time.monotonic()
    private_azurite.restart()
    up = time.monotonic()
    code = children.wait(first, timeout=120)
    print(f"restart: Azurite down for {up - down:.2f}s; the run in progress exited {code}")
    # It rides the restart out on retries (it does here), or fails cleanly: an error the CLI
    # reports, never a crash; either way the next run carries on.
    assert code in (0, 1), children.output(first)
    assert "Traceback" not in children.output(first), children.output(first)
    reruns = 0
    while not handover_ok(poller):
        reruns += 1
        assert reruns <= 3, "the poller never caught up after the restart"
        rerun = children.cli(poller, f"rerun{reruns}", "--once")
        children.wait(rerun)
    events = poller.events()
    assert [c for c in calls(events) if c.start > up], "no batch after the restart"
    duplicates = assert_every_row_delivered(poller, events)
    print(f"restart: {reruns} rerun(s), duplicates {sorted(duplicates)}")
    stored = assert_drained(poller)
    assert stored.checkpoint.stats.rows == poller.rows


def test_storage_answering_503_to_every_third_request_loses_nothing(
    tmp_path, azurite, azurite_container, children
):
    """ServerBusy on every third request of each kind (lease, checkpoint read, commit): the
    SDK's retries absorb them; the run drains the table with no loss and no duplicate. Each
    commit waited for (``pipeline=False``): group commit would write the batches handled while
    a retried commit waits in one commit, and leave too few commits for a third to fail."""
    poller = make_poller(
        tmp_path, "busy", azurite, azurite_container, 40, AZP_FAULT="busy:3", AZP_PIPELINE="0"
    )
    run = children.cli(poller, "run", "--once")
    assert children.wait(run) == 0, children.output(run)
    events = poller.events()
    kinds = Counter(e["kind"] for e in events if e["ev"] == "fault")
    print(f"busy: 503s injected by kind {dict(kinds)}")
    assert kinds["commit"] >= 1, kinds
    assert kinds["lease"] >= 1, kinds
    assert not assert_every_row_delivered(poller, events)
    stored = assert_drained(poller)
    assert stored.checkpoint.stats.rows == poller.rows
