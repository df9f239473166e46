"""A local state store that kills its own process with SIGKILL right after its ``KILL_AT``-th
state-changing call (lease acquire, checkpoint create or replace): a crash after every step of
an operator command in turn, for the e2e tests' child processes. Without ``KILL_AT`` it is a
plain :class:`LocalStateStore`."""

from __future__ import annotations

import os
import signal
from typing import Any

from azure_functions_db.state.local import LocalStateStore


class KillsAtCall(LocalStateStore):
    """:class:`LocalStateStore` that dies right after its ``KILL_AT``-th write (see module)."""

    calls = 0

    def _count(self) -> None:
        KillsAtCall.calls += 1
        if str(KillsAtCall.calls) == os.environ.get("KILL_AT"):
            os.kill(os.getpid(), signal.SIGKILL)

    def acquire(self, *args: Any, **kwargs: Any) -> Any:
        grant = super().acquire(*args, **kwargs)
        self._count()
        return grant

    def create(self, *args: Any, **kwargs: Any) -> Any:
        etag = super().create(*args, **kwargs)
        self._count()
        return etag

    def replace(self, *args: Any, **kwargs: Any) -> Any:
        etag = super().replace(*args, **kwargs)
        self._count()
        return etag
