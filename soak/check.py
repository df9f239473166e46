"""The soak's checker: reads an evidence folder and judges the delivery contract.

Violations (any one fails the soak):

(a) ``missing``: a committed (id, version) of which neither that version nor a later version of
    the same id was ever handed to a handler that logged it.
(b) ``regressions``: between two monitor samples the checkpoint's position, the checkpoint's
    fence or the lease's fence went down; or one sample saw the lease's fence below the
    checkpoint's (the sample reads the checkpoint first, so the lease's can only be higher).
(c) ``stale_calls``: a handler call that started under fence f after a fence above f had been
    granted (a ``lease_acquired`` event or a monitor sample had shown it, earlier on the
    machine's monotonic clock) or stored in the checkpoint. Azurite forgets live leases when it
    restarts (Azure does not), so a call whose lease was dropped that way, between its grant
    and its start, is counted apart (``stale_after_lease_dropped``): no engine can see that
    before it next talks to the store, and what must hold then is that the fence stops it once
    the new owner has stored its fence in the checkpoint: ``stale_commits`` (a violation)
    counts such calls whose batch was committed anyway although a higher fence was stored
    (seen by the monitor, or committed by another process) before the call started. A grant
    alone does not stop the old owner's commits: the new owner logs ``lease_acquired`` before
    its fencing write, and a commit landing in between is one the fence came too late for
    (``committed_before_fencing``, reported, not a violation; the new owner reads after it).
(e) ``phantoms``: a delivered (id, version) that no writer committed (rolled back, aborted, or a
    COMMIT with an unknown outcome that the history table shows did not commit).
(f) the ``SqlSink`` or the ``DeltaSink`` (exactly-once): a (id, version) the handlers' sink
    transactions committed twice (``sink_duplicates``), or a committed (id, version) of which
    neither that version nor a later one of its id reached the sink (``sink_missing``): the
    sink must hold each delivered version exactly once, through every fault.
(h) the ``QueueSink`` (at-least-once): a committed (id, version) of which neither that version
    nor a later one of its id came off the queue or was quarantined (``queue_missing``); or
    messages of one version that carry different ``event_id`` values, or one ``event_id`` on
    messages of different versions (``queue_bad_ids``): the consumer's dedup key must name
    exactly one row version. Messages of a version sent more than once are counted
    (``queue_duplicates``), not judged.
(g) ``poison="quarantine"``: the handler always fails on a planted poison version
    (:func:`poisoned`); the poller quarantines it. A version counts as accounted for in (a) and
    (f) when a quarantine record holds it (or a later version of its id); a quarantined version
    no writer committed is a phantom (e); a planted version that is neither delivered, nor
    quarantined, nor superseded is missing (a). Good versions a record holds (a random handler
    failure while a poison batch was split) are reported, not judged.
(a) ``unsharded``: with a sharded poller (``shards=``), a committed version of a row the database
    puts in no shard (its shard value is NULL or not one of ``0 .. N-1``). Each shard's folder
    is judged on the rows the database puts in its shard (``shards-<poller>.json``, dumped from
    the product's shard expression at the end): a version of another shard's row it delivered
    is a phantom, and its sink and queue are judged on its rows.
``harness``: the evidence contradicts itself (a COMMIT the writer saw return is not in the history
    table, or the drain did not finish): the run proves nothing.

Reported, not judged: (d) the duplicate ratio; the longest time the checkpoint stood still while
committed rows waited; the COMMIT-to-delivery delay (p50, p99); faults by kind.

Positions are compared in Python here, which is exact for the soak tables' own keys and only
for them: PostgreSQL's (``timestamptz``, ``bigint``), and MariaDB's (naive ``DATETIME(6)``, an
ASCII ``VARCHAR`` id of letters, digits and ``-`` under the default case-insensitive collation,
which orders as its upper-case form does). The product never orders positions in Python.

A soak keeps one folder per poller under the evidence folder (``meta.json`` names them), judged
each on its own with the shared ``faults.jsonl`` (and the shared ``writers/`` and
``history.json`` when the folder has none: pollers of one table); :func:`check` finds them.

``python -m soak.check FOLDER`` judges a kept evidence folder again.
"""

from __future__ import annotations

import bisect
import datetime as dt
import itertools
import json
import math
import re
import sys
import zlib
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from devkit.evidence import read_all

Row = int | str
Pair = tuple[Row, int]


def poisoned(row: Row, version: int) -> bool:
    """Whether the soak's handler fails on every batch holding this version (about 1 in 997;
    a string id counts as its collation sees it, case-insensitively)."""
    number = row if isinstance(row, int) else zlib.crc32(row.upper().encode())
    return (number * 31 + version) % 997 == 7


#: What the soak's handler raises on purpose (soak.handling): a quarantine record of good
#: versions with another error is a sink or the engine failing on good rows.
INJECTED = ("soak: injected handler failure", "soak: planted poison version")

# The engine's events that end a handler call's batch: acknowledged, or not.
_ENDS_OF_A_CALL = ("batch_committed", "commit_rejected", "lease_lost", "handler_failed")
EXAMPLES = 10
#: The report's counts of the writers' own outcomes (not of a poller's deliveries).
WRITERS_OUTCOMES = ("unknown_commits", "unknown_resolved_committed", "rolled_back")


@dataclass
class Report:
    """What the checker found; ``violations`` empty means the contract held."""

    control: bool = False
    seed: int | None = None
    seconds: float = 0.0
    faults: dict[str, int] = field(default_factory=dict)
    committed: int = 0
    unknown_commits: int = 0
    unknown_resolved_committed: int = 0
    rolled_back: int = 0
    handler_calls: int = 0
    handler_failures: int = 0
    handler_freezes: int = 0
    delivered: int = 0
    distinct_delivered: int = 0
    duplicate_ratio: float = 0.0
    missing: int = 0
    missing_examples: list[Pair] = field(default_factory=list)
    phantoms: int = 0
    phantom_examples: list[Pair] = field(default_factory=list)
    regressions: list[str] = field(default_factory=list)
    stale_calls: int = 0
    stale_examples: list[str] = field(default_factory=list)
    stale_after_lease_dropped: int = 0
    stale_commits: int = 0
    committed_before_fencing: int = 0
    harness: list[str] = field(default_factory=list)
    samples: int = 0
    sample_errors: int = 0
    longest_standstill: float = 0.0
    delay_p50: float | None = None
    delay_p99: float | None = None
    poller_exits: int = 0
    sink_rows: int | None = None
    sink_missing: int = 0
    sink_missing_examples: list[Pair] = field(default_factory=list)
    sink_duplicates: int = 0
    sink_duplicate_examples: list[Pair] = field(default_factory=list)
    quarantine_records: int | None = None
    quarantined: int = 0
    poison_planted: int = 0
    poison_quarantined: int = 0
    quarantined_good: int = 0
    wrongly_quarantined: list[str] = field(default_factory=list)
    queue_messages: int | None = None
    queue_duplicates: int = 0
    queue_missing: int = 0
    queue_missing_examples: list[Pair] = field(default_factory=list)
    queue_bad_ids: int = 0
    queue_bad_id_examples: list[str] = field(default_factory=list)
    overruns: int = 0
    unsharded: int = 0
    unsharded_examples: list[Pair] = field(default_factory=list)

    @property
    def violations(self) -> list[str]:
        found = []
        if self.missing:
            found.append(f"(a) {self.missing} committed version(s) never delivered")
        if self.unsharded:
            found.append(f"(a) {self.unsharded} committed version(s) of rows in no shard")
        if self.regressions:
            found.append(f"(b) {len(self.regressions)} regression(s) of checkpoint or fence")
        if self.stale_calls:
            found.append(f"(c) {self.stale_calls} handler call(s) under a stale fence")
        if self.stale_commits:
            found.append(f"(c) {self.stale_commits} batch(es) committed after the lease was lost")
        if self.phantoms:
            found.append(f"(e) {self.phantoms} delivered version(s) that no writer committed")
        if self.sink_duplicates:
            found.append(f"(f) {self.sink_duplicates} version(s) written to the sink twice")
        if self.sink_missing:
            found.append(f"(f) {self.sink_missing} committed version(s) the sink never got")
        if self.wrongly_quarantined:
            found.append(
                f"(g) {len(self.wrongly_quarantined)} quarantine record(s) of good versions "
                "for an error the soak did not inject"
            )
        if self.queue_missing:
            found.append(f"(h) {self.queue_missing} committed version(s) never came off the queue")
        if self.queue_bad_ids:
            found.append(f"(h) {self.queue_bad_ids} event_id(s) naming no single row version")
        found.extend(f"harness: {h}" for h in self.harness)
        return found

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "violations": self.violations}

    def markdown(self, command: str) -> str:
        """The row docs/guarantees.md keeps for the last long run."""
        faults = ", ".join(f"{k} {v}" for k, v in sorted(self.faults.items()))
        return "\n".join(
            [
                "| Command | Duration | Faults | Committed versions | Missing | Regressions "
                "| Stale-fence calls | Phantoms | Duplicates | Longest standstill "
                "| COMMIT to delivery p50 / p99 | SqlSink / DeltaSink | QueueSink |",
                "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
                f"| `{command}` | {self.seconds:.0f} s | {sum(self.faults.values())}: {faults} "
                f"| {self.committed} ({self.unknown_commits} unknown COMMITs) | {self.missing} "
                f"| {len(self.regressions)} | {self.stale_calls} "
                f"(+{self.stale_after_lease_dropped} after Azurite forgot a live lease, "
                f"{self.stale_commits} of them committed) "
                f"| {self.phantoms} "
                f"| {self.delivered - self.distinct_delivered} "
                f"(ratio {self.duplicate_ratio:.4f}) | {self.longest_standstill:.1f} s "
                f"| {self.delay_p50 or 0:.2f} s / {self.delay_p99 or 0:.2f} s "
                f"| {self._sink_line()} | {self._queue_line()} |",
                "",
                f"Quarantine: {self._quarantine_line()}.",
            ]
        )

    def _quarantine_line(self) -> str:
        if self.quarantine_records is None:
            return "not recorded"
        return (
            f"{self.quarantine_records} record(s), {self.quarantined} version(s): "
            f"{self.poison_quarantined} of {self.poison_planted} planted poison, "
            f"{self.quarantined_good} good (a handler failure while splitting)"
        )

    def _sink_line(self) -> str:
        if self.sink_rows is None:
            return "not recorded"

        def examples(pairs: list[Pair]) -> str:
            return f" {pairs[:3]}" if pairs else ""

        return (
            f"{self.sink_rows} row(s); duplicates {self.sink_duplicates}"
            f"{examples(self.sink_duplicate_examples)}, missing {self.sink_missing}"
            f"{examples(self.sink_missing_examples)}"
        )

    def _queue_line(self) -> str:
        if self.queue_messages is None:
            return "not recorded"
        examples = f" {self.queue_missing_examples[:3]}" if self.queue_missing else ""
        return (
            f"{self.queue_messages} message(s); sent again {self.queue_duplicates}, missing "
            f"{self.queue_missing}{examples}, event_id faults {self.queue_bad_ids}"
        )

    def summary(self) -> str:
        faults = ", ".join(f"{k} {v}" for k, v in sorted(self.faults.items())) or "none"

        def secs(value: float | None) -> str:
            return "-" if value is None else f"{value:.2f}s"

        lines = [
            f"mode               {'CONTROL (horizon off)' if self.control else 'horizon on'}",
            f"seed / duration    {self.seed} / {self.seconds:.0f}s",
            f"faults             {sum(self.faults.values())} ({faults})",
            f"committed versions {self.committed} ({self.unknown_commits} unknown COMMITs, "
            f"{self.unknown_resolved_committed} of them committed; {self.rolled_back} rolled "
            "back)",
            f"handler calls      {self.handler_calls} ({self.handler_failures} failed, "
            f"{self.handler_freezes} froze past the lease, {self.overruns} overran budget and "
            "lease)",
            f"delivered          {self.delivered} ({self.distinct_delivered} distinct; "
            f"duplicate ratio {self.duplicate_ratio:.3f})",
            f"(a) missing        {self.missing} {self.missing_examples[:3] or ''}",
            f"(b) regressions    {len(self.regressions)} {self.regressions[:2] or ''}",
            f"(c) stale calls    {self.stale_calls} {self.stale_examples[:2] or ''}",
            f"    lease dropped  {self.stale_after_lease_dropped} call(s) after Azurite forgot a "
            f"live lease on restart (stale commits: {self.stale_commits}; committed before the "
            f"new owner stored its fence: {self.committed_before_fencing})",
            f"(e) phantoms       {self.phantoms} {self.phantom_examples[:3] or ''}",
            f"(f) Sql/DeltaSink  {self._sink_line()}",
            f"(h) QueueSink      {self._queue_line()} {self.queue_bad_id_examples[:2] or ''}",
            f"(g) quarantine     {self._quarantine_line()} {self.wrongly_quarantined[:2] or ''}",
            f"monitor samples    {self.samples} ({self.sample_errors} failed reads)",
            f"longest standstill {secs(self.longest_standstill)} with committed rows waiting",
            f"commit->delivery   p50 {secs(self.delay_p50)}, p99 {secs(self.delay_p99)}",
            f"poller exits       {self.poller_exits} (unexpected; restarted)",
        ]
        lines.extend(f"harness            {h}" for h in self.harness)
        return "\n".join(lines)


def _row(value: Any) -> Row:
    return value if isinstance(value, str) else int(value)


def _pairs(rows: Iterable[Sequence[Any]]) -> list[Pair]:
    return [(_row(r[0]), int(r[1])) for r in rows]


def _order(row: Row) -> Row:
    """A key's place in its table's order: a string id under a case-insensitive collation
    orders as its upper-case form."""
    return row.upper() if isinstance(row, str) else row


def _position(raw: Sequence[Any] | None) -> tuple[dt.datetime, Row] | None:
    if raw is None:
        return None
    return dt.datetime.fromisoformat(str(raw[0])), _order(_row(raw[1]))


def _percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def check(folder: Path) -> Report:
    """Judge the evidence in ``folder`` (the layout ``soak.run`` writes); for a soak of several
    pollers, each poller's folder on its own, in one report (:func:`merge`)."""
    meta = json.loads((folder / "meta.json").read_text())
    names = meta.get("poller_names")
    if names:
        return merge({name: _check_one(folder / name, folder) for name in names}, meta)
    return _check_one(folder, folder)


def merge(reports: Mapping[str, Report], meta: Mapping[str, Any]) -> Report:
    """One report of several pollers' reports: counts added, examples and findings kept with
    the poller's name, the faults (shared) once, the worst standstill and delays."""
    merged = Report(
        control=bool(meta.get("control")),
        seed=meta.get("seed"),
        seconds=float(meta.get("seconds", 0)),
        poller_exits=int(meta.get("poller_exits", 0)),
    )
    merged.harness.extend(meta.get("harness", []))
    # PostgreSQL's pollers read one table: its writers' outcomes are every poller's, counted
    # once; MariaDB's read a table each, whose outcomes add up (a transaction over two tables
    # counts in each).
    shared = meta.get("db", "pg") == "pg"
    for name, part in reports.items():
        merged.faults = part.faults
        for f in fields(Report):
            if f.name in ("control", "seed", "seconds", "poller_exits", "faults"):
                continue
            if shared and f.name in WRITERS_OUTCOMES:
                setattr(merged, f.name, getattr(part, f.name))
                continue
            mine, theirs = getattr(merged, f.name), getattr(part, f.name)
            if f.name in ("longest_standstill", "delay_p50", "delay_p99"):
                known = [v for v in (mine, theirs) if v is not None]
                setattr(merged, f.name, max(known) if known else None)
            elif isinstance(theirs, list):
                mine.extend(x if not isinstance(x, str) else f"{name}: {x}" for x in theirs)
            elif isinstance(theirs, int | float) and not isinstance(theirs, bool):
                setattr(merged, f.name, (mine or 0) + theirs)
    if merged.delivered:
        merged.duplicate_ratio = merged.delivered / max(1, merged.distinct_delivered) - 1
    merged.harness = list(dict.fromkeys(merged.harness))
    return merged


def _check_one(folder: Path, shared: Path) -> Report:
    """Judge one poller's evidence in ``folder``; ``faults.jsonl`` is in ``shared``."""
    meta = json.loads((folder / "meta.json").read_text())
    report = Report(
        control=bool(meta.get("control")),
        seed=meta.get("seed"),
        seconds=float(meta.get("seconds", 0)),
        poller_exits=int(meta.get("poller_exits", 0)),
    )
    report.harness.extend(meta.get("harness", []))
    kind = meta.get("sink")  # the poller's sink (a bool in a single-poller soak's meta)
    needed = {"sql": "sink.json", "delta": "sink.json", "queue": "queue.jsonl"}.get(str(kind))
    if isinstance(kind, str) and needed and not (folder / needed).exists():
        report.harness.append(f"its {kind} sink's evidence `{needed}` is missing")
    faults = read_all(shared, "faults.jsonl")
    # A fault the driver had to skip (Azurite already frozen) is not counted.
    report.faults = dict(
        Counter(str(f["kind"]) for f in faults if f["ev"] == "fault" and not f.get("skipped"))
    )
    own = folder if (folder / "history.json").exists() else shared
    history = set(_pairs(json.loads((own / "history.json").read_text())))
    writers = folder / "writers" if (folder / "writers").exists() else shared / "writers"
    commits = _commits(read_all(writers), history, report)
    every = int(meta.get("rows_every", 1))  # a poller reading a share of the rows (where=)
    if every > 1:  # its versions are the rows it reads; another one it delivered is a phantom
        commits = {p: t for p, t in commits.items() if isinstance(p[0], int) and p[0] % every == 0}
    mine = _shard(meta, shared, commits, report)
    commits = {p: t for p, t in commits.items() if mine(p[0])}
    report.committed = len(commits)  # the versions it owes
    handlers = _Handlers(read_all(folder / "events"), report)
    parked = _quarantined(folder, commits, report)
    # (a) every committed version, or a later one of its id, was delivered or quarantined
    newest = {row: max(v for _, v in seen) for row, seen in handlers.deliveries.items()}
    for row, version in parked:
        newest[row] = max(version, newest.get(row, -1))
    missing = sorted(p for p in commits if newest.get(p[0], -1) < p[1])
    report.missing, report.missing_examples = len(missing), missing[:EXAMPLES]
    # (e) nothing delivered or quarantined that was not committed
    phantoms = sorted(p for p in set(handlers.delivered) | parked if p not in commits)
    report.phantoms, report.phantom_examples = len(phantoms), phantoms[:EXAMPLES]
    # (b) the monitor's samples
    samples = read_all(folder, "samples.jsonl")
    report.samples = len(samples)
    report.sample_errors = sum(1 for s in samples if s.get("error"))
    good = [s for s in samples if not s.get("error")]
    _regressions(good, report)
    # (c) what the monitor saw granted or stored counts as known from then on
    for s in good:
        handlers.grants.append((float(s["t"]), int(s["lease_fence"])))
        if s.get("cp_fence") is not None:
            handlers.grants.append((float(s["t"]), int(s["cp_fence"])))
            handlers.stored.append((float(s["t"]), int(s["cp_fence"])))
    restarts = [
        (float(f["t"]) - float(f.get("seconds", 0)), float(f["t"]))
        for f in faults
        if f["ev"] == "fault" and f["kind"] == "restart_azurite" and not f.get("skipped")
    ]
    _stale_calls(handlers, restarts, report)
    _liveness(commits, handlers, good, set(missing), report)
    _sink(folder, commits, parked, report, mine)
    _queue(folder, commits, parked, report, mine)
    return report


def _shard(
    meta: Mapping[str, Any], shared: Path, commits: Mapping[Pair, float], report: Report
) -> Callable[[Row], bool]:
    """Whether a row is this poller's: for one shard of a sharded poller, whether the database
    puts it in that shard (``shard_map``); the first shard's folder counts the committed
    versions of rows in no shard (``unsharded``)."""
    shard = meta.get("shard")
    if not shard:
        return lambda _row: True
    index, count = int(shard["index"]), int(shard["count"])
    path = shared / str(meta["shard_map"])
    if not path.exists():
        report.harness.append(f"the shard map `{path.name}` is missing")
        return lambda _row: True
    # A string id under a case-insensitive collation is one row in any case.
    owner = {_order(_row(r[0])): r[1] for r in json.loads(path.read_text())}
    if index == 0:
        valid = set(range(count))
        stray = sorted(p for p in commits if owner.get(_order(p[0])) not in valid)
        report.unsharded, report.unsharded_examples = len(stray), stray[:EXAMPLES]
    return lambda row: owner.get(_order(row)) == index


def _quarantined(folder: Path, commits: Mapping[Pair, float], report: Report) -> set[Pair]:
    """(g) the versions the poller's quarantine records hold (``quarantine.json``)."""
    report.poison_planted = sum(1 for p in commits if poisoned(*p))
    path = folder / "quarantine.json"
    if not path.exists():
        return set()
    records = json.loads(path.read_text())
    parked = set(_pairs(r for record in records for r in record["rows"]))
    report.quarantine_records, report.quarantined = len(records), len(parked)
    report.poison_quarantined = sum(1 for p in parked if poisoned(*p))
    report.quarantined_good = len(parked) - report.poison_quarantined
    for record in records:
        error = record.get("error")  # not recorded by soaks before 2026-11-27
        good = [p for p in _pairs(record["rows"]) if not poisoned(*p)]
        if error is not None and good and not any(m in str(error) for m in INJECTED):
            report.wrongly_quarantined.append(f"{record['id']}: {good[:3]} ({error})")
    return parked


def _sink(
    folder: Path,
    commits: Mapping[Pair, float],
    parked: set[Pair],
    report: Report,
    mine: Callable[[Row], bool],
) -> None:
    """(f) the SqlSink holds every committed version (or a later one of its id) exactly once
    (of its own rows: shards share one sink table)."""
    path = folder / "sink.json"
    if not path.exists():
        return
    rows = [p for p in _pairs(json.loads(path.read_text())) if mine(p[0])]
    report.sink_rows = len(rows)
    counts = Counter(rows)
    twice = sorted(p for p, n in counts.items() if n > 1)
    report.sink_duplicates, report.sink_duplicate_examples = len(twice), twice[:EXAMPLES]
    lost = _lost(commits, [*counts, *parked])
    report.sink_missing, report.sink_missing_examples = len(lost), lost[:EXAMPLES]


def _lost(commits: Mapping[Pair, float], present: Iterable[Pair]) -> list[Pair]:
    """The committed versions of which neither that version nor a later one of its id is
    ``present`` (in a sink, on a queue, or quarantined)."""
    newest: dict[Row, int] = {}
    for row, version in present:
        newest[row] = max(version, newest.get(row, -1))
    return sorted(p for p in commits if newest.get(p[0], -1) < p[1])


def _queue(
    folder: Path,
    commits: Mapping[Pair, float],
    parked: set[Pair],
    report: Report,
    mine: Callable[[Row], bool],
) -> None:
    """(h) every committed version (or a later one of its id) came off the queue at least
    once, and each ``event_id`` names one version (``queue.jsonl``, the consumer's log)."""
    path = folder / "queue.jsonl"
    if not path.exists():
        return
    logged = read_all(folder, "queue.jsonl")
    messages = [m for m in logged if m["ev"] == "message" and mine(_row(m["row"][0]))]
    unread = [m for m in logged if m["ev"] == "bad_message"]
    if unread:
        report.harness.append(
            f"{len(unread)} message(s) the consumer could not read, e.g. {unread[0]}"
        )
    report.queue_messages = len(messages)
    ids_of: dict[Pair, set[str]] = defaultdict(set)
    pairs_of: dict[str, set[Pair]] = defaultdict(set)
    for m in messages:
        pair = (_row(m["row"][0]), int(m["row"][1]))
        ids_of[pair].add(str(m["event_id"]))
        pairs_of[str(m["event_id"])].add(pair)
    report.queue_duplicates = len(messages) - len(ids_of)
    bad = [f"{p} carried {sorted(ids)}" for p, ids in ids_of.items() if len(ids) > 1]
    bad += [f"{e} named {sorted(ps)}" for e, ps in pairs_of.items() if len(ps) > 1]
    report.queue_bad_ids, report.queue_bad_id_examples = len(bad), bad[:EXAMPLES]
    lost = _lost(commits, [*ids_of, *parked])
    report.queue_missing, report.queue_missing_examples = len(lost), lost[:EXAMPLES]


def _commits(
    writers: Iterable[dict[str, Any]], history: set[Pair], report: Report
) -> dict[Pair, float]:
    """Every committed (id, version) with the time its COMMIT returned (NaN when unknown).

    The history table, written in the same transactions, is the database's own word: a COMMIT
    with an unknown outcome committed iff its rows are there."""
    committed: dict[Pair, float] = {}
    not_committed: set[Pair] = set()
    for ev in writers:
        pairs = _pairs(ev.get("rows", []))
        if ev["ev"] == "commit":
            committed.update(dict.fromkeys(pairs, float(ev["t"])))
            lost = [p for p in pairs if p not in history]
            if lost:
                report.harness.append(
                    f"COMMIT returned for {lost[:3]} but the history table lacks them"
                )
        elif ev["ev"] == "unknown" and pairs:  # (MariaDB: of a transaction on this table)
            report.unknown_commits += 1
            landed = [p for p in pairs if p in history]
            report.unknown_resolved_committed += 1 if landed else 0
            for pair in landed:
                committed.setdefault(pair, float(ev["t"]))
            not_committed.update(p for p in pairs if p not in history)
        elif ev["ev"] in ("rollback", "aborted"):
            report.rolled_back += len(pairs)
            not_committed.update(pairs)
    for pair in history - committed.keys():
        # Committed with no writer line at all (a writer killed between COMMIT and its log).
        committed[pair] = math.nan
    contradicted = sorted(history & not_committed)
    if contradicted:
        report.harness.append(f"rolled back per the writer, yet in history: {contradicted[:3]}")
    report.committed = len(committed)
    return committed


class _Handlers:
    """What the handlers were given, and every fence grant the pollers logged."""

    def __init__(self, events: Iterable[dict[str, Any]], report: Report) -> None:
        self.deliveries: dict[Row, list[tuple[float, int]]] = defaultdict(list)
        self.delivered = Counter[Pair]()
        self.grants: list[tuple[float, int]] = []
        self.own_grants: list[tuple[float, int]] = []  # from the pollers' lease_acquired only
        # Fences known to be stored in the checkpoint by then: monitor samples, commits.
        self.stored: list[tuple[float, int]] = []
        # Per process, what became of each batch: committed, or stopped.
        self.ends: dict[int, list[dict[str, Any]]] = defaultdict(list)
        self.starts: list[dict[str, Any]] = []
        # What each call handed back, by (process, the call's start time).
        self.calls: dict[tuple[int, float], dict[str, Any]] = {}
        for ev in events:
            kind = ev["ev"]
            if kind == "deliver":
                for pair in _pairs(ev["rows"]):
                    self.delivered[pair] += 1
                    self.deliveries[pair[0]].append((float(ev["t"]), pair[1]))
                if ev.get("started") is not None:
                    self.calls[(int(ev["pid"]), float(ev["started"]))] = ev
            elif kind == "start":
                self.starts.append(ev)
            elif kind == "fail":
                report.handler_failures += 1
            elif kind == "freeze":
                report.handler_freezes += 1
            elif kind == "overrun":
                report.overruns += 1
            elif kind == "log" and ev.get("action") == "lease_acquired":
                self.grants.append((float(ev["t"]), int(ev["fence"])))
                self.own_grants.append((float(ev["t"]), int(ev["fence"])))
            if kind == "log" and ev.get("action") == "batch_committed" and "fence" in ev:
                self.stored.append((float(ev["t"]), int(ev["fence"])))
            if kind == "log" and ev.get("action") in _ENDS_OF_A_CALL:
                self.ends[int(ev["pid"])].append(ev)
        report.handler_calls = len(self.starts)
        report.delivered = sum(self.delivered.values())
        report.distinct_delivered = len(self.delivered)
        if self.delivered:
            report.duplicate_ratio = report.delivered / len(self.delivered) - 1


def _stale_calls(
    handlers: _Handlers, restarts: Sequence[tuple[float, float]], report: Report
) -> None:
    """(c): a handler call that started after a higher fence was granted or stored."""
    granted_at = {fence: t for t, fence in handlers.own_grants}
    highest = _highest_by(handlers.grants)
    stored = _highest_by(handlers.stored)
    for start in handlers.starts:
        if highest(float(start["t"])) > int(start["fence"]):
            began = granted_at.get(int(start["fence"]), float(start["t"]))
            if any(r0 <= float(start["t"]) and r1 >= began for r0, r1 in restarts):
                report.stale_after_lease_dropped += 1
                # What must hold then: once a higher fence is stored, the fence stops that
                # batch: it is never committed.
                if _committed_later(handlers, start):
                    if stored(float(start["t"])) > int(start["fence"]):
                        report.stale_commits += 1
                    else:
                        report.committed_before_fencing += 1
                continue
            report.stale_calls += 1
            if len(report.stale_examples) < EXAMPLES:
                report.stale_examples.append(
                    f"pid {start['pid']} started under fence {start['fence']} at "
                    f"t={float(start['t']):.3f}; fence {highest(float(start['t']))} was known by "
                    "then"
                )


def _highest_by(known: Sequence[tuple[float, int]]) -> Callable[[float], int]:
    """``at(t)``: the highest fence among ``known`` (time, fence) seen before ``t`` (0: none)."""
    ordered = sorted(known)
    times = [t for t, _ in ordered]
    highest = list(itertools.accumulate((fence for _, fence in ordered), max))

    def at(t: float) -> int:
        index = bisect.bisect_left(times, t) - 1
        return highest[index] if index >= 0 else 0

    return at


def _committed_later(handlers: _Handlers, start: dict[str, Any]) -> bool:
    """Whether the batch of the call ``start`` was committed under its fence: a later
    ``batch_committed`` of its process and fence at or past the batch's last position. The
    commit in flight and coalesced commits acknowledge earlier batches after a later call
    started, so the next commit line is not this call's; a commit acknowledges every batch up
    to its position. A call that handed nothing back (it failed, or its process died) cannot
    have been committed."""
    pid, began, fence = int(start["pid"]), float(start["t"]), int(start["fence"])
    call = handlers.calls.get((pid, began))
    end = _position(call.get("after")) if call is not None else None
    if end is None:
        return False
    for e in handlers.ends[pid]:
        if e["action"] != "batch_committed" or float(e["t"]) <= began:
            continue
        if int(e.get("fence", -1)) != fence:
            continue
        landed = _logged_position(str(e.get("position", "")))
        if landed is None or landed >= end:
            return True  # a commit line without a position is counted against the run
    return False


def _logged_position(text: str) -> tuple[dt.datetime, Row] | None:
    """A position as the engine logs it: ``(cursor=(<ISO time>), pk=(<id>))``, a string id
    in quotes."""
    match = re.fullmatch(r"\(cursor=\(([^)]*)\), pk=\((-?\d+|'[^']*')\)\)", text.strip())
    if match is None:
        return None
    pk = match.group(2)
    row: Row = pk[1:-1] if pk.startswith("'") else int(pk)
    return dt.datetime.fromisoformat(match.group(1)), _order(row)


def _liveness(
    commits: dict[Pair, float],
    handlers: _Handlers,
    samples: Sequence[dict[str, Any]],
    missing: set[Pair],
    report: Report,
) -> None:
    timed = sorted(t for t in commits.values() if not math.isnan(t))
    report.longest_standstill = _standstill(samples, timed)
    delays = []
    for pair, committed_at in commits.items():
        if math.isnan(committed_at) or pair in missing:
            continue
        seen = handlers.deliveries[pair[0]]
        first = min((t for t, v in seen if v >= pair[1]), default=None)
        if first is not None:
            delays.append(max(0.0, first - committed_at))
    report.delay_p50, report.delay_p99 = _percentile(delays, 0.5), _percentile(delays, 0.99)


def _regressions(samples: Sequence[dict[str, Any]], report: Report) -> None:
    last_position: tuple[dt.datetime, Row] | None = None
    last_cp = last_lease = 0
    for s in samples:
        at = f"t={float(s['t']):.3f}"
        lease, cp = int(s["lease_fence"]), s.get("cp_fence")
        if lease < last_lease:
            report.regressions.append(f"lease fence {last_lease} -> {lease} at {at}")
        last_lease = max(last_lease, lease)
        if cp is None:
            continue
        cp = int(cp)
        if cp < last_cp:
            report.regressions.append(f"checkpoint fence {last_cp} -> {cp} at {at}")
        if lease < cp:
            report.regressions.append(f"lease fence {lease} below checkpoint fence {cp} at {at}")
        last_cp = max(last_cp, cp)
        position = _position(s.get("position"))
        if last_position is not None and (position is None or position < last_position):
            report.regressions.append(
                f"checkpoint moved back {last_position} -> {position} at {at}"
            )
        if position is not None:
            last_position = position if last_position is None else max(position, last_position)


def _standstill(samples: Sequence[dict[str, Any]], commits: Sequence[float]) -> float:
    """The longest time from a writer's COMMIT to the checkpoint's next move, over the periods
    in which the checkpoint stood still."""
    longest = 0.0
    begin = 0
    for i in range(1, len(samples) + 1):
        if i < len(samples) and samples[i].get("position") == samples[begin].get("position"):
            continue
        start = float(samples[begin]["t"])
        end = float(samples[min(i, len(samples) - 1)]["t"])  # the first sample that moved
        first = bisect.bisect_right(commits, start)
        if first < len(commits) and commits[first] < end:
            longest = max(longest, end - commits[first])
        begin = i
    return longest


def main(argv: Sequence[str]) -> int:
    markdown = "--markdown" in argv
    folders = [a for a in argv if a != "--markdown"]
    if len(folders) != 1:
        sys.stderr.write("usage: python -m soak.check [--markdown] EVIDENCE_FOLDER\n")
        return 2
    folder = Path(folders[0])
    report = check(folder)
    if markdown:
        meta = json.loads((folder / "meta.json").read_text())
        command = (
            f"make soak SECONDS={meta['seconds']:g} SEED={meta['seed']} DB={meta.get('db', 'pg')}"
        )
        if meta.get("sink") is False:  # `make soak` has no such switch: the module's command
            every = meta.get("checkpoint_every")
            command = f"python -m soak --seconds {meta['seconds']:g} --seed {meta['seed']} "
            command += "--no-sink" + (f" --checkpoint-every {every}" if every else "")
        elif float(meta.get("fault_every", 4.0)) != 4.0 or int(meta.get("shards", 1)) > 1:
            command = (
                f"python -m soak --db {meta.get('db', 'pg')} --seconds {meta['seconds']:g} "
                f"--fault-every {float(meta.get('fault_every', 4.0)):g} --seed {meta['seed']}"
            )
        if int(meta.get("shards", 1)) > 1:
            command += f" --shards {int(meta['shards'])}"
        sys.stdout.write(report.markdown(command) + "\n")
    else:
        sys.stdout.write(report.summary() + "\n")
    return 1 if report.violations else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
