"""What a run does about a reshard (``afdb reshard``, :mod:`azure_functions_db.ops.reshard`).

A reshard retires the pollers that read a table so far (the shards of the old count, or the
unsharded poller) at one position ``T`` and starts the new ones there. Two records make that safe
against any deployment order:

- a retired poller's checkpoint says so (``Checkpoint.retired``); its runs refuse, so an old
  deployment that is still running cannot deliver past ``T`` what the new shards deliver again;
- a new poller defined with ``resharded_from`` refuses to run until the reshard positioned its
  checkpoint (an audited seek), instead of starting from ``start`` and delivering the whole table
  again.

Both refusals are :class:`~azure_functions_db.errors.ReshardError`: the run fails, loudly, every
time, and nothing is acknowledged.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from azure_functions_db.core.checkpoint import Checkpoint, PollerKey
from azure_functions_db.core.config import PollerConfig
from azure_functions_db.core.ports import StateStore
from azure_functions_db.errors import ReshardError

#: Pollers (by store and key) that looked for other shard counts in this process, and found none.
_LOOKED: set[tuple[int, PollerKey]] = set()
_SHARD_NAME = re.compile(r"^(?P<group>.+)\.shard-(?P<index>\d+)-of-(?P<count>\d+)$")


def shard_count(name: str, group: str) -> int | None:
    """How many shards the poller ``name`` is one of, for the decorator ``group`` (1: the
    unsharded poller ``group`` itself; ``None``: not one of its pollers)."""
    if name == group:
        return 1
    match = _SHARD_NAME.match(name)
    return int(match["count"]) if match and match["group"] == group else None


def refusal(
    checkpoint: Checkpoint, config: PollerConfig, store: StateStore | None = None
) -> ReshardError | None:
    """Why a run under ``config`` must not deliver from ``checkpoint`` (``None``: it may). With
    ``store``, a poller that never ran also looks for pollers of another shard count of its
    table still in use (``shards=`` changed without a reshard)."""
    name, namespace = config.name, config.namespace
    if checkpoint.retired and not config.draining:
        return ReshardError(
            f"Poller `{name}` was retired by a reshard ({checkpoint.retired}): its rows are now "
            "read by the new pollers. Remove it from the app (it refuses every run), or "
            f"`afdb seek APP --poller {name}` to bring it back.",
            poller=name,
            namespace=namespace,
        )
    waiting = checkpoint.position is None and checkpoint.seek is None
    if config.resharded_from is not None and waiting and not config.draining:
        group = config.group or config.name
        return ReshardError(
            f"Poller `{name}` is new in a reshard from {config.resharded_from} shard(s) of "
            f"`{group}` and waits to be positioned: run `afdb reshard APP --poller {group}` "
            "(it drains the old pollers and starts the new ones where they stopped).",
            poller=name,
            namespace=namespace,
        )
    fresh = checkpoint.position is None and checkpoint.seek is None
    if store is None or not fresh or checkpoint.stats.batches or config.draining:
        return None
    if (id(store), checkpoint.key) in _LOOKED:  # once per process: an idle poller's runs
        return None  # over an empty table stay as cheap as they were
    refused = _other_counts(store, config, checkpoint.key)
    if refused is None:
        _LOOKED.add((id(store), checkpoint.key))
    return refused


def first_position_refusal(config: PollerConfig, store: StateStore) -> ReshardError | None:
    """Why a poller that has no position yet must not be given one other than by ``afdb
    reshard`` (``start="now"``, a backfill's handoff): it waits for a reshard, or pollers of
    another shard count of its table are in use. ``None``: it may."""
    if config.draining:
        return None
    if config.resharded_from is not None:
        return refusal(Checkpoint(key=config.key), config)
    return _other_counts(store, config, config.key)


def checked_start(
    config: PollerConfig, store: StateStore, start: Callable[[], Checkpoint]
) -> Callable[[], Checkpoint]:
    """``start`` (the first record of a ``start="now"`` poller, made under its lease), after
    :func:`first_position_refusal`: positioned at the table's newest row, a poller whose
    ``shards=`` changed without a reshard would skip the rows after the old checkpoints."""

    def first() -> Checkpoint:
        if (refused := first_position_refusal(config, store)) is not None:
            raise refused
        return start()

    return first


def _other_counts(store: StateStore, config: PollerConfig, key: PollerKey) -> ReshardError | None:
    group = config.group or config.name
    mine = shard_count(config.name, group)
    for other in store.list_keys(key.namespace):
        count = shard_count(other.poller, group)
        if count is None or count == mine or config.resharded_from is not None:
            continue
        stored = store.read(other)
        if stored is None or stored.checkpoint.retired is not None:
            continue
        return ReshardError(
            f"Poller `{config.name}` is new, but `{other.poller}` ({count} shard(s) of "
            f"`{group}`) has a checkpoint: starting here would deliver its rows again, or skip "
            f"some. Add `resharded_from={count}` to the decorator and run `afdb reshard APP "
            f"--poller {group}` (docs/scale.md), or remove that checkpoint if it is stale.",
            poller=config.name,
            namespace=config.namespace,
        )
    return None
