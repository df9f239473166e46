"""How one poller runs: :class:`PollerConfig`, validated on construction.

The rules are a pydantic model (:class:`_Rules`) whose field validators are our own checks, so
a configuration with several bad values fails once, with one error that names each of them in
our words (the value and the fix), not at the first.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from functools import partial
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError, model_validator
from pydantic_core import PydanticCustomError

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
            The default. Batches handled while a commit is in flight go together with the next
            commit (group commit), within the duplicate window of
            :mod:`azure_functions_db.core.commits`: a crash delivers again at most ten batches,
            or the rows of the last second plus one batch. ``False`` commits each batch before
            reading the next.
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
        group: For one shard of a sharded poller (``shards=``), the poller's own name: its
            changes and their ``event_id`` carry it, the same in every shard and after a
            reshard, while ``name`` (``orders.shard-1-of-4``) keys the shard's checkpoint,
            lease, logs and health.
        resharded_from: The shard count this poller's rows came from (1: the unsharded poller
            ``group or name``): until ``afdb reshard`` positions it, a run without a position
            refuses (``ReshardError``) instead of starting from ``start``.
        draining: Set by ``afdb reshard`` only: a run of a retired poller that delivers its
            last rows, up to where the new shards start.
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
    group: str | None = None
    resharded_from: int | None = None
    draining: bool = False

    def __post_init__(self) -> None:
        values = {field.name: getattr(self, field.name) for field in fields(self)}
        try:
            _Rules.model_validate(values)
        except ValidationError as exc:
            raise ConfigurationError(_one_message(self.name, exc)) from None

    @property
    def coalesce_seconds(self) -> float | None:
        """Seconds after which commits held back are written (``None``: no coalescing)."""
        if self.checkpoint_every is None and self.checkpoint_seconds is None:
            return None
        half_lease = self.lease_duration / 2
        return min(self.checkpoint_seconds or half_lease, half_lease)

    @property
    def changes_poller(self) -> str:
        """The poller name the changes (and their ``event_id``) carry."""
        return self.group or self.name

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


def _check_resharded_from(value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 64:
        raise ConfigurationError(
            f"`resharded_from={value!r}` must be the shard count the rows came from, 1 (the "
            "unsharded poller) to 64."
        )


def _check_flag(what: str, value: object) -> None:
    if not isinstance(value, bool):
        raise ConfigurationError(f"`{what}={value!r}` must be True or False.")


def _check_poison(value: object) -> None:
    if value not in ("halt", "quarantine"):
        raise ConfigurationError(
            f'Unknown poison policy `{value!r}`; use `poison="halt"` (keep retrying the '
            'batch and alert) or `poison="quarantine"` (park it in a quarantine record and '
            "go on; replay it later with `afdb quarantine replay`)."
        )


def _check_start(value: object) -> None:
    if value not in ("beginning", "now"):
        raise ConfigurationError(
            f'`start={value!r}` is not a starting point: use `start="beginning"` (the '
            'default: a new poller delivers every row already in the table) or `start="now"` '
            "(its first run records the newest row as the checkpoint and delivers only rows "
            "that change after it)."
        )


def _rule(check: Callable[[Any], None], *, optional: bool = False) -> Any:
    """One of our checks as a pydantic field validator: the value as it is, or our message
    (``optional``: ``None`` passes)."""

    def validate(value: object) -> object:
        if value is None and optional:
            return value
        try:
            check(value)
        except ConfigurationError as exc:
            raise PydanticCustomError("afdb_config", "{message}", {"message": str(exc)}) from None
        return value

    return BeforeValidator(validate)


def _positive(what: str, hint: str, *, integer: bool = False, optional: bool = False) -> Any:
    return _rule(partial(_check_positive, what, hint=hint, integer=integer), optional=optional)


class _Rules(BaseModel):
    """Every rule of :class:`PollerConfig`, checked together: pydantic runs each field's rule
    and collects every failure, so one error names every bad value (then the rules that tie
    fields together, once each field is right)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Annotated[object, _rule(partial(_check_name, "poller name"))]
    namespace: Annotated[object, _rule(partial(_check_name, "namespace"))]
    batch_size: Annotated[object, _positive("batch_size", "e.g. `batch_size=1000`", integer=True)]
    time_budget: Annotated[object, _positive("time_budget", "seconds, e.g. `time_budget=240`")]
    lease_duration: Annotated[object, _positive("lease_duration", "seconds, 15 to 60 on Azure")]
    max_attempts: Annotated[
        object, _positive("max_attempts", "e.g. `max_attempts=5`", integer=True)
    ]
    poison: Annotated[object, _rule(_check_poison)]
    bisect: Annotated[object, _rule(partial(_check_flag, "bisect"))]
    infra_retries: object
    retry_delay: object
    health_interval: object
    # A backfill chunk's record: `<poller>~<run id>~<index>`.
    record: Annotated[
        object,
        _rule(
            partial(_check_name, "checkpoint record name", extra="~", longest=127), optional=True
        ),
    ]
    chunk: object
    hold_warning: Annotated[object, _positive("hold_warning", "seconds, e.g. `hold_warning=300`")]
    stall_after: Annotated[
        object, _positive("stall_after", "seconds, e.g. `stall_after=300`", optional=True)
    ]
    stall_runs: Annotated[
        object, _positive("stall_runs", "runs, e.g. `stall_runs=5`", integer=True)
    ]
    pipeline: Annotated[object, _rule(partial(_check_flag, "pipeline"))]
    checkpoint_every: Annotated[
        object, _positive("checkpoint_every", "rows, e.g. 10000", integer=True, optional=True)
    ]
    checkpoint_seconds: Annotated[
        object, _positive("checkpoint_seconds", "seconds, e.g. 5", optional=True)
    ]
    poll_interval: Annotated[object, _positive("poll_interval", "seconds, e.g. 1", optional=True)]
    start: Annotated[object, _rule(_check_start)]
    group: Annotated[object, _rule(partial(_check_name, "poller name"), optional=True)]
    resharded_from: Annotated[object, _rule(_check_resharded_from, optional=True)]
    draining: Annotated[object, _rule(partial(_check_flag, "draining"))]

    @model_validator(mode="after")
    def _together(self) -> _Rules:
        budget, lease, poll = self.time_budget, self.lease_duration, self.poll_interval
        assert isinstance(budget, int | float)
        assert isinstance(lease, int | float)
        problems: list[str] = []
        if isinstance(poll, int | float) and poll >= budget:
            problems.append(
                f"`poll_interval={poll}` must be shorter than `time_budget={budget}`: a run "
                "polls again only while its budget lasts."
            )
        if budget <= lease / 3:
            problems.append(
                f"`time_budget={budget}` is too short for `lease_duration={lease}`: a run must "
                "last longer than a third of its lease. Raise time_budget or lower lease_duration."
            )
        if problems:
            raise PydanticCustomError("afdb_config", "{message}", {"message": " ".join(problems)})
        return self


def _one_message(poller: object, exc: ValidationError) -> str:
    """Our messages of every rule ``exc`` reports, as one: the message alone when one rule
    failed, else each numbered."""
    problems = [str(error["ctx"]["message"]) for error in exc.errors() if "ctx" in error]
    problems += [
        f"`{'.'.join(map(str, e['loc']))}`: {e['msg']}" for e in exc.errors() if "ctx" not in e
    ]
    if len(problems) == 1:
        return problems[0]
    listed = " ".join(f"({n}) {text}" for n, text in enumerate(problems, 1))
    return f"The configuration of poller `{poller}` has {len(problems)} problems: {listed}"
