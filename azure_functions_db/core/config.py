"""How one poller runs: :class:`PollerConfig`, validated on construction."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from azure_functions_db.core.checkpoint import PollerKey
from azure_functions_db.errors import ConfigurationError


@dataclass(frozen=True)
class PollerConfig:
    """How one poller runs. Validated on construction; errors name the value and the fix.

    Attributes:
        name: Stable poller id; the checkpoint is keyed by it (never by a function name).
        namespace: ``live`` for the timer poller; backfills use their own namespace.
        batch_size: Rows per handler call.
        time_budget: Seconds after which a run starts no new batch (keep it well below the
            host's ``functionTimeout``).
        lease_duration: Seconds a lease lives without renewal (Azure allows 15-60).
        max_attempts: Failures of the same batch after which it is reported as poison.
        poison: ``halt`` keeps retrying the batch on every run and reports ``PoisonBatchError``;
            ``quarantine`` stores the batch in a quarantine record (written before the checkpoint
            moves past it) and goes on (``afdb quarantine`` lists, replays and drops them).
        bisect: With ``quarantine``: split a poison batch in halves until the failing rows are
            alone, so the good rows still reach the handler (and only the bad ones are parked).
        stall_after: Seconds without a successful run after which a run reports the poller
            ``stalled`` (and the same number of runs in a row with a growing backlog,
            ``falling_behind``, is ``stall_runs``); ``None``: not judged.
        stall_runs: Consecutive runs with a growing backlog that make a poller
            ``falling_behind``.
        pipeline: Fetch and handle the next batch while the previous batch's checkpoint commit
            is in flight (at most one, in order; see :mod:`azure_functions_db.core.commits`).
            The default; ``False`` commits each batch before reading the next.
        checkpoint_every: Coalesce commits: one checkpoint write per this many rows (several
            batches), instead of one per batch; ``None``: every batch. A crash then delivers up
            to this many rows again, plus those read while the commit before was in flight
            (batches due then are not waited for: they go with the next commit). Not with a
            transactional sink.
        checkpoint_seconds: Coalesce commits: one checkpoint write at least every this many
            seconds. With either option a run also commits at its end, before counting a
            failure, and at least every ``lease_duration / 2`` seconds.
        poll_interval: Low-latency mode: a run that caught up waits this many seconds and reads
            again, under the same lease, until its ``time_budget`` is spent, instead of ending
            (rows arrive within about this long without a per-second timer). ``None``: a run
            ends when it caught up.
        start: Where a new poller (no checkpoint yet) starts: ``"beginning"`` delivers every row
            already in the table; ``"now"`` makes its first run record the newest row below the
            horizon as the checkpoint (created by ``If-None-Match``, so a concurrent first run
            keeps the one created first) and deliver only rows after it. Ignored once the
            poller has a checkpoint (``afdb seek`` moves it).
        infra_retries: Bounded retries (with backoff and jitter) of transient database and
            storage errors within a run.
        retry_delay: Base delay of that backoff, in seconds.
        health_interval: Seconds between source health checks (NULL-cursor counts).
        record: The name of the checkpoint record, when it is not ``name``: a backfill chunk
            keeps its own record, while its batches and ``event_id`` still carry the poller's
            ``name``.
        chunk: Which backfill chunk this is (``Batch.chunk``); ``None`` for a live poller.
        hold_warning: Seconds an open transaction may hold rows back behind the horizon before
            each run logs it as a WARNING (``action=horizon_held``); below it, INFO.
    """

    name: str
    namespace: str = "live"
    batch_size: int = 1000
    time_budget: float = 240.0
    lease_duration: float = 30.0
    max_attempts: int = 5
    poison: Literal["halt", "quarantine"] = "halt"
    bisect: bool = True
    infra_retries: int = 3
    retry_delay: float = 0.5
    health_interval: float = 300.0
    record: str | None = None
    chunk: str | None = None
    hold_warning: float = 300.0
    stall_after: float | None = None
    stall_runs: int = 5
    pipeline: bool = True
    checkpoint_every: int | None = None
    checkpoint_seconds: float | None = None
    poll_interval: float | None = None
    start: Literal["beginning", "now"] = "beginning"

    def __post_init__(self) -> None:
        _check_name("poller name", self.name)
        if self.record is not None:  # a backfill chunk: `<poller>~<run id>~<index>`
            _check_name("checkpoint record name", self.record, extra="~", longest=127)
        _check_name("namespace", self.namespace)
        _check_positive("batch_size", self.batch_size, "e.g. `batch_size=1000`", integer=True)
        _check_positive("time_budget", self.time_budget, "seconds, e.g. `time_budget=240`")
        _check_positive("lease_duration", self.lease_duration, "seconds, 15 to 60 on Azure")
        _check_positive("max_attempts", self.max_attempts, "e.g. `max_attempts=5`", integer=True)
        _check_positive("hold_warning", self.hold_warning, "seconds, e.g. `hold_warning=300`")
        if self.poison not in ("halt", "quarantine"):
            raise ConfigurationError(
                f'Unknown poison policy `{self.poison!r}`; use `poison="halt"` (keep retrying the '
                'batch and alert) or `poison="quarantine"` (park it in a quarantine record and '
                "go on; replay it later with `afdb quarantine replay`)."
            )
        if not isinstance(self.bisect, bool):
            raise ConfigurationError(f"`bisect={self.bisect!r}` must be True or False.")
        if self.stall_after is not None:
            _check_positive("stall_after", self.stall_after, "seconds, e.g. `stall_after=300`")
        _check_positive("stall_runs", self.stall_runs, "runs, e.g. `stall_runs=5`", integer=True)
        if self.checkpoint_every is not None:
            _check_positive(
                "checkpoint_every", self.checkpoint_every, "rows, e.g. 10000", integer=True
            )
        if self.poll_interval is not None:
            _check_positive("poll_interval", self.poll_interval, "seconds, e.g. 1")
            if self.poll_interval >= self.time_budget:
                raise ConfigurationError(
                    f"`poll_interval={self.poll_interval}` must be shorter than `time_budget="
                    f"{self.time_budget}`: a run polls again only while its budget lasts."
                )
        if self.checkpoint_seconds is not None:
            _check_positive("checkpoint_seconds", self.checkpoint_seconds, "seconds, e.g. 5")
        if self.start not in ("beginning", "now"):
            raise ConfigurationError(
                f'`start={self.start!r}` is not a starting point: use `start="beginning"` (the '
                'default: a new poller delivers every row already in the table) or `start="now"` '
                "(its first run records the newest row as the checkpoint and delivers only rows "
                "that change after it)."
            )
        if not isinstance(self.pipeline, bool):
            raise ConfigurationError(f"`pipeline={self.pipeline!r}` must be True or False.")
        if self.time_budget <= self.lease_duration / 3:
            raise ConfigurationError(
                f"`time_budget={self.time_budget}` is too short for `lease_duration="
                f"{self.lease_duration}`: a run must outlive at least one heartbeat. Raise "
                "time_budget or lower lease_duration."
            )

    @property
    def coalesce_seconds(self) -> float | None:
        """Seconds after which commits held back are written (``None``: no coalescing)."""
        if self.checkpoint_every is None and self.checkpoint_seconds is None:
            return None
        half_lease = self.lease_duration / 2
        return min(self.checkpoint_seconds or half_lease, half_lease)

    @property
    def key(self) -> PollerKey:
        """Where the checkpoint and lease live: the namespace and the record's name."""
        return PollerKey(namespace=self.namespace, poller=self.record or self.name)


_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


def _check_name(what: str, value: object, *, extra: str = "", longest: int = 63) -> None:
    if (
        not isinstance(value, str)
        or not 1 <= len(value) <= longest
        or not set(value) <= _NAME_CHARS | set(extra)
        or value[0] in "-."
    ):
        raise ConfigurationError(
            f"Invalid {what} `{value!r}`: use 1-63 letters, digits, `-`, `_` or `.`, starting "
            f'with a letter or digit (e.g. "orders"). It keys the checkpoint, so keep it stable.'
        )


def _check_positive(what: str, value: object, hint: str, *, integer: bool = False) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or (integer and not isinstance(value, int))
        or value <= 0
    ):
        kind = "integer" if integer else "number"
        raise ConfigurationError(f"`{what}={value!r}` must be a positive {kind} ({hint}).")
