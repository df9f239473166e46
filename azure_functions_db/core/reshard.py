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

from azure_functions_db.core.checkpoint import Checkpoint
from azure_functions_db.core.config import PollerConfig
from azure_functions_db.errors import ReshardError


def refusal(checkpoint: Checkpoint, config: PollerConfig) -> ReshardError | None:
    """Why a run under ``config`` must not deliver from ``checkpoint`` (``None``: it may)."""
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
    return None
