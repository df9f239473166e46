"""A local state store that kills its own process right after a sink committed a batch: the
window between the sink's commit and the checkpoint's, for the e2e tests' child processes.

The child's handler calls :func:`handled` once it has written; with ``SINK_KILL=1`` in the
environment, the store's next checkpoint write (the commit after that batch) sends SIGKILL to its
own process, so nothing after the sink's commit runs.
"""

from __future__ import annotations

import os
import signal

from azure_functions_db.core.checkpoint import Checkpoint
from azure_functions_db.state.local import LocalStateStore

_HANDLED: list[int] = []


def handled(rows: int) -> None:
    """Record that the handler wrote a batch of ``rows`` (arms the kill)."""
    _HANDLED.append(rows)


class DiesAfterTheSinkCommit(LocalStateStore):
    """:class:`LocalStateStore` whose checkpoint write after a handled batch is a SIGKILL."""

    def replace(self, new: Checkpoint, etag: str) -> str:
        if os.environ.get("SINK_KILL") == "1" and _HANDLED:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().replace(new, etag)
