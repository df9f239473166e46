"""``afdb reshard``: move a table's pollers from one shard count to another with no gap and
nothing delivered twice.

The app defines the new pollers (``shards=M, resharded_from=N``; either may be 1, the unsharded
poller), which refuse to run until this positions them. Each step is idempotent, so a reshard
stopped anywhere (SIGKILL included) resumes by running it again:

1. **Where and retire**, under every old poller's lease at once: ``T`` is where a new poller
   was positioned by an earlier call, if one was; else the farthest of the old checkpoints as
   the database orders the keys (each was below its poller's commit-safe horizon, so every row
   up to ``T`` is committed and none can commit below it later). Each old checkpoint records
   ``T`` and the new pollers (:class:`~azure_functions_db.core.retirement.Retirement`, schema
   2); from then on its runs refuse, so an old deployment still running cannot deliver past it.
2. **Drain** each old poller to ``T``: its own engine, handler and sink (runs under its lease,
   read through a view bounded at ``T``), until it has delivered every row of its shard up to
   ``T``.
3. **Position**, under every old poller's lease again: check each is still retired at ``T``
   (another call may have moved it: then stop), and position each new poller there (an audited
   seek) unless this reshard did already; it then delivers its shard's rows after ``T``.

Every row at or before ``T`` is delivered by an old poller and every row after by a new one.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any, cast

from azure_functions_db.core.checkpoint import Checkpoint
from azure_functions_db.core.claim import Claim, Claimer
from azure_functions_db.core.logs import log_event
from azure_functions_db.core.ports import (
    AcknowledgingSource,
    BacklogSource,
    Horizon,
    Source,
    SourceRow,
)
from azure_functions_db.core.position import Position
from azure_functions_db.core.retirement import Retirement
from azure_functions_db.core.retry import Retrying
from azure_functions_db.core.sink_catch_up import catch_up_with_sink
from azure_functions_db.errors import ConfigurationError, LeaseHeldError, ReshardError
from azure_functions_db.ops.seek import operator_identity
from azure_functions_db.runtime.poller import PollerDefinition, ShardGroup
from azure_functions_db.sources.shards import Shard
from azure_functions_db.spark.chunk import BoundedSource

logger = logging.getLogger(__name__)

Progress = Callable[[str], None]


@dataclass(frozen=True)
class ReshardResult:
    """What a reshard did (or, ``dry_run``, would do)."""

    group: str
    old: tuple[str, ...]
    new: tuple[str, ...]
    at: Position | None
    by: str
    store: str
    drained: Mapping[str, int] = field(default_factory=dict)  # rows delivered per old poller
    positioned: tuple[str, ...] = ()  # new pollers this call positioned
    quarantined: Mapping[str, int] = field(default_factory=dict)  # batches left, per old poller
    dry_run: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "poller": self.group,
            "old": list(self.old),
            "new": list(self.new),
            "at": self.at.to_json() if self.at is not None else None,
            "by": self.by,
            "store": self.store,
            "drained": dict(self.drained),
            "positioned": list(self.positioned),
            "quarantined": dict(self.quarantined),
            "dry_run": self.dry_run,
        }

    def lines(self) -> list[str]:
        at = str(self.at) if self.at is not None else "(beginning)"
        if self.dry_run:
            return [
                f"{self.group} in {self.store}: would retire {', '.join(self.old)} and start "
                f"{', '.join(self.new)} after {at} (dry run, nothing written)"
            ]
        drained = sum(self.drained.values())
        return [
            f"{self.group} in {self.store}: retired {', '.join(self.old)} at {at} "
            f"({drained} row(s) delivered while draining them)",
            f"positioned {', '.join(self.positioned) or 'none (already positioned)'}; "
            f"{', '.join(self.new)} deliver what comes after, by {self.by}",
            *(
                f"{name}: {count} quarantined batch(es) left: `afdb quarantine list APP "
                f"--poller {name}` (the retired poller keeps its records)"
                for name, count in self.quarantined.items()
            ),
        ]


def group_of(definitions: Mapping[str, PollerDefinition], name: str) -> list[PollerDefinition]:
    """The pollers the decorator ``name`` defined, which must be waiting for a reshard."""
    found = [d for d in definitions.values() if d.group is not None and d.group.name == name]
    if not found:
        raise ConfigurationError(
            f"No poller `{name}` to reshard; defined: {', '.join(sorted(definitions))}. Name "
            "the decorator's `name=` (not one shard)."
        )
    group = found[0].group
    assert group is not None
    if group.resharded_from is None:
        raise ConfigurationError(
            f"Poller `{name}` has no `resharded_from=`: set it to the shard count before (1 for "
            f"the unsharded poller) beside `shards={group.count}`, deploy, then reshard."
        )
    return found


def reshard(
    new: Sequence[PollerDefinition],
    settings: Mapping[str, str],
    *,
    by: str | None = None,
    wait: float = 60.0,
    dry_run: bool = False,
    progress: Progress | None = None,
) -> ReshardResult:
    """Reshard the group of ``new`` (see the module's docstring). Raises
    :class:`LeaseHeldError` when a lease stays held for ``wait`` seconds, :class:`ReshardError`
    when no old poller has a checkpoint, one was retired by another reshard, or another call
    moved the position meanwhile (run it again), and what a drain run raises (a handler's
    failure: the reshard stops there; run it again)."""
    by = by or operator_identity()
    say = progress or (lambda _line: None)
    group = new[0].group if new else None
    if group is None or group.resharded_from is None or any(d.group is not group for d in new):
        raise ConfigurationError(
            "reshard() takes the pollers of one decorator with `resharded_from=` (see group_of)"
        )
    old = old_definitions(new[0], group)
    store = new[0].store(settings)
    base = group.source
    base.open(settings)
    reason = f"afdb reshard: {group.resharded_from} -> {group.count} shard(s) of {group.name}"
    stored = _old_checkpoints(old, group, settings)
    started, target = _positioned(new, settings, reason)
    if not started:
        target = _farthest(base, [cp.position for cp in stored if cp is not None])
    result = ReshardResult(
        group=group.name,
        old=tuple(d.name for d in old),
        new=tuple(d.name for d in new),
        at=target,
        by=by,
        store=store.describe(),
        dry_run=dry_run,
    )
    if dry_run:
        return result
    owner = f"afdb-reshard:{by}"
    with _all_claimed(old, settings, owner, wait) as claims:
        # Under every old poller's lease (none moves, no other reshard call retires them):
        # the position is the farthest of their checkpoints, ordered by the database; each was
        # below its own poller's commit-safe horizon, so every row up to it is committed.
        started, target = _positioned(new, settings, reason)
        if started:
            _check_retired_at(old, claims, target, group)
        else:
            for definition, claim in zip(old, claims, strict=True):
                _check_not_retired_elsewhere(definition, claim.checkpoint, group)
                _sink_caught_up(definition, claim, settings)
            target = _farthest(base, [c.checkpoint.position for c in claims])
            retirement = Retirement(group.name, group.count, target, by, new[0].clock.now())
            for claim in claims:
                claim.write(dataclasses.replace(claim.checkpoint, retired=retirement))
            ends = target or "(beginning)"
            say(f"{group.name}: retired {', '.join(result.old)}; they end at {ends}")
    drained = {d.name: _drain(d, settings, target, wait, say) for d in old}
    positioned = []
    with _all_claimed(old, settings, owner, wait) as claims:
        _check_retired_at(old, claims, target, group)  # no other call moved them since
        for definition in new:
            definition.source.open(settings)  # its description names the shard's term
            with _claimed(definition, settings, owner, wait) as claim:
                cp = claim.checkpoint
                if _ours(cp, reason):
                    continue  # positioned by an earlier call: it may have delivered since
                claim.write(
                    cp.sought(
                        target,
                        fence=claim.fence,
                        by=by,
                        at=definition.clock.now(),
                        reason=reason,
                        source=definition.source.description,
                    )
                )
            positioned.append(definition.name)
            say(f"{definition.name}: starts after {target or '(beginning)'}")
    quarantined = {d.name: n for d in old if (n := _quarantined(d, settings))}
    log_event(
        logger,
        logging.WARNING,
        "resharded",
        poller=group.name,
        old=",".join(result.old),
        new=",".join(result.new),
        at=target,
        by=by,
        quarantined=sum(quarantined.values()) or None,
    )
    return dataclasses.replace(
        result,
        at=target,
        drained=drained,
        positioned=tuple(positioned),
        quarantined=quarantined,
    )


def _old_checkpoints(
    old: Sequence[PollerDefinition], group: ShardGroup, settings: Mapping[str, str]
) -> list[Checkpoint | None]:
    """The old pollers' checkpoints; refuses when none exists (a wrong ``resharded_from``, or
    another state store) and when another reshard retired one."""
    found = []
    for definition in old:
        stored = definition.store(settings).read(definition.config.key)
        cp = stored.checkpoint if stored is not None else None
        if cp is not None:
            _check_not_retired_elsewhere(definition, cp, group)
        found.append(cp)
    if all(cp is None for cp in found):
        where = old[0].store(settings).describe()
        raise ReshardError(
            f"None of {', '.join(d.name for d in old)} has a checkpoint in {where}: is "
            f"`resharded_from={group.resharded_from}` the count the rows came from, and this the "
            "app's state store? If they never ran, leave `resharded_from` out.",
            poller=group.name,
        )
    return found


def _check_not_retired_elsewhere(
    definition: PollerDefinition, checkpoint: Checkpoint, group: ShardGroup
) -> None:
    """Refuse an old checkpoint another reshard (into another shard count) retired."""
    retired = checkpoint.retired
    if retired is not None and (retired.group, retired.shards) != (group.name, group.count):
        raise ReshardError(
            f"Poller `{definition.name}` was retired by another reshard ({retired}), not "
            f"into {group.count} shard(s) of `{group.name}`: finish that one, or `afdb seek` "
            "it back first.",
            poller=definition.name,
            namespace=definition.config.namespace,
        )


def _sink_caught_up(
    definition: PollerDefinition, claim: Claim, settings: Mapping[str, str]
) -> None:
    """Under the old poller's lease: fence its transactional sink (a stale owner's sink commit
    can no longer land) and move its checkpoint to the batch the sink committed past it, if
    one did (as every run starts): ``T`` then counts that batch, which the new pollers would
    otherwise write to the sink again."""
    sink = definition.sink
    if sink is None:
        return
    cfg = definition.config
    log = _logger(definition)
    retrying = Retrying(
        retries=cfg.infra_retries, delay=cfg.retry_delay, clock=definition.clock, log=log
    )
    retrying(sink.open, settings)

    def advanced(position: Position, rows: int, before: Position | None) -> Checkpoint:
        return claim.checkpoint.advanced(
            position,
            fence=claim.fence,
            at=definition.clock.now(),
            rows=rows,
            source=claim.checkpoint.source,
            read_after=before,
        )

    catch_up_with_sink(sink, claim, cfg.key, retrying=retrying, advanced=advanced, log=log)


def _logger(definition: PollerDefinition) -> Callable[..., None]:
    cfg = definition.config

    def log(level: int, action: str, **fields: object) -> None:
        log_event(logger, level, action, poller=cfg.name, namespace=cfg.namespace, **fields)

    return log


def _farthest(source: Source, positions: Sequence[Position | None]) -> Position | None:
    """The farthest of ``positions`` in the table's key order, as the database orders it: a
    position replaces the one kept when the table holds rows after that one, up to it."""
    if not isinstance(source, BacklogSource):
        raise ConfigurationError(f"`{source!r}` cannot order positions: it cannot reshard")
    kept: Position | None = None
    for position in positions:
        if position is None:
            continue
        if not position.pk:
            raise ReshardError(
                f"An old poller's checkpoint {position} has no key values (a seek to a cursor): "
                "let it run once past a row, then reshard."
            )
        if kept is None or source.rows_after(kept, Horizon(None, "none", until=position), cap=1):
            kept = position
    return kept


def _check_retired_at(
    old: Sequence[PollerDefinition],
    claims: Sequence[Claim],
    target: Position | None,
    group: ShardGroup,
) -> None:
    for definition, claim in zip(old, claims, strict=True):
        _check_not_retired_elsewhere(definition, claim.checkpoint, group)
        retired = claim.checkpoint.retired
        if retired is None or retired.at != target:
            raise ReshardError(
                f"Poller `{definition.name}` is no longer retired where this reshard positions "
                f"the new pollers ({target or '(beginning)'}): another call moved it. Run "
                "`afdb reshard` again.",
                poller=definition.name,
                namespace=definition.config.namespace,
            )


@contextmanager
def _all_claimed(
    definitions: Sequence[PollerDefinition], settings: Mapping[str, str], owner: str, wait: float
) -> Iterator[list[Claim]]:
    """Every poller's lease at once (taken in order, released together)."""
    with ExitStack() as leases:
        yield [leases.enter_context(_claimed(d, settings, owner, wait)) for d in definitions]


def _quarantined(definition: PollerDefinition, settings: Mapping[str, str]) -> int:
    """Batches still quarantined under a (retired) poller: `afdb quarantine` reaches them by
    its name."""
    store = definition.store(settings)
    key = definition.config.key
    count = 0
    for record_id in store.list_quarantined(key):
        stored = store.read_quarantined(key, record_id)
        count += stored is not None and stored.record.state == "quarantined"
    return count


def old_definitions(template: PollerDefinition, group: ShardGroup) -> list[PollerDefinition]:
    """The pollers before the reshard: ``resharded_from`` shards of the group's source, or the
    unsharded poller."""
    count = group.resharded_from
    assert count is not None
    parts: list[tuple[str, str | None, Source]]
    if count == 1:
        parts = [(group.name, None, group.source)]
    else:
        split = getattr(group.source, "shard", None)
        if not callable(split):
            raise ConfigurationError(f"The source of `{group.name}` cannot shard.")
        parts = [
            (Shard(i, count).poller_name(group.name), group.name, split(i, count))
            for i in range(count)
        ]
    config = dataclasses.replace(template.config, resharded_from=None, draining=False)
    return [
        dataclasses.replace(
            template,
            config=dataclasses.replace(config, name=name, group=owner),
            source=source,
            group=None,
        )
        for name, owner, source in parts
    ]


def _ours(checkpoint: Checkpoint, reason: str) -> bool:
    """Whether this reshard positioned the (new) poller of ``checkpoint``."""
    seek = checkpoint.seek
    return checkpoint.retired is None and seek is not None and seek.reason == reason


def _positioned(
    new: Sequence[PollerDefinition], settings: Mapping[str, str], reason: str
) -> tuple[bool, Position | None]:
    """Whether an earlier call positioned a new poller, and where (the position is then fixed);
    refuses a new poller that has a position of its own."""
    found: tuple[bool, Position | None] = (False, None)
    for definition in new:
        stored = definition.store(settings).read(definition.config.key)
        cp = stored.checkpoint if stored is not None else None
        if cp is None or cp.retired is not None or (cp.position is None and cp.seek is None):
            continue  # never ran, retired before, or waiting: positioned below
        if not _ours(cp, reason) or cp.seek is None:
            raise ReshardError(
                f"Poller `{definition.name}` already has a position of its own ({cp.position}), "
                "not one from this reshard: it ran before. Move it with `afdb seek`, or "
                "choose another shard count.",
                poller=definition.name,
                namespace=definition.config.namespace,
            )
        found = (True, cp.seek.to_position)
    return found


@contextmanager
def _claimed(
    definition: PollerDefinition, settings: Mapping[str, str], owner: str, wait: float
) -> Iterator[Claim]:
    """The poller's lease and fenced checkpoint, waiting up to ``wait`` seconds for it."""
    cfg, clock = definition.config, definition.clock
    log = _logger(definition)
    store = definition.store(settings)
    claimer = Claimer(
        store,
        cfg.key,
        owner=owner,
        duration=cfg.lease_duration,
        clock=clock,
        retrying=Retrying(retries=cfg.infra_retries, delay=cfg.retry_delay, clock=clock, log=log),
        log=log,
    )
    deadline = time.monotonic() + wait
    while True:
        with claimer.hold(None) as claim:
            if claim is not None:
                yield claim
                return
        if time.monotonic() >= deadline:
            raise LeaseHeldError(cfg.name, cfg.namespace, store.inspect(cfg.key).holder)
        time.sleep(1.0)


def _acknowledge(self: BoundedSource, rows: Sequence[SourceRow], position: Position) -> None:
    cast(AcknowledgingSource, self.inner).acknowledge(rows, position)


def _bounded(source: Source, at: Position) -> Source:
    """The old poller's rows up to ``at``: a backfill chunk's view, which also acknowledges
    when the source does (an outbox deletes what the drain delivers, as its runs do)."""
    view = type(BoundedSource(source, at))
    if isinstance(source, AcknowledgingSource):
        view = type(f"Acknowledging{view.__name__}", (view,), {"acknowledge": _acknowledge})
    return view(source, at)


def _drain(
    definition: PollerDefinition,
    settings: Mapping[str, str],
    at: Position | None,
    wait: float,
    say: Progress,
) -> int:
    """Run the retired poller until it delivered its rows up to ``at``; the rows delivered."""
    if at is None:
        return 0
    config = dataclasses.replace(
        definition.config, draining=True, start="beginning", poll_interval=None
    )  # a run ends when it caught up, even for a poller in the low-latency mode
    runner = dataclasses.replace(definition, config=config, source=_bounded(definition.source, at))
    rows, deadline = 0, time.monotonic() + wait
    while True:
        report = runner.run_once(settings, manual=True)
        rows += report.rows
        if report.status == "caught_up":
            say(f"{definition.name}: drained ({rows} row(s) delivered)")
            return rows
        if report.status == "lease_held":
            if time.monotonic() >= deadline:
                raise LeaseHeldError(config.name, config.namespace, report.holder)
            time.sleep(1.0)
        else:
            deadline = time.monotonic() + wait  # budget_spent: progress; run again
            say(f"{definition.name}: draining, {rows} row(s) delivered so far")
