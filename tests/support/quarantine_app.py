"""The function app ``tests/e2e/test_quarantine_processes.py`` runs with the real CLI in child
processes: one ``poison="quarantine"`` poller on a SQLite ``orders`` table, its state in a local
directory or on Azurite, and a store that can SIGKILL its own process at a chosen step.

Environment:
    QA_DB           SQLAlchemy URL of the SQLite file (table ``orders``: id, updated_at, poison)
    QA_STORE        ``local`` (QA_STATE_DIR), ``blob`` or ``table`` (AzureWebJobsStorage,
                    QA_CONTAINER, QA_TABLE)
    QA_LEDGER       JSON lines, one per handler call that returned: ``{"pid", "ids"}`` (fsynced)
    QA_FIXED        a file; while it exists the handler takes poison rows too
    QA_ATTEMPTS     max_attempts (default 2); QA_POLICY: ``quarantine`` (default) or ``halt``
    QA_KILL         ``<method>:<n>:<before|after>``: SIGKILL this process at the n-th call of
                    the store's ``method`` (``replace``, ``put_quarantined``,
                    ``replace_quarantined``; ``advance``: a checkpoint write after a record
                    was written), before it reaches the store or after it returned
"""

from __future__ import annotations

import json
import os
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import azure_functions_db as afdb
from azure_functions_db.core.batch import Batch

ENV = os.environ
_calls: Counter[str] = Counter()


def _kill_point() -> tuple[str, int, str] | None:
    spec = ENV.get("QA_KILL")
    if not spec:
        return None
    method, n, when = spec.split(":")
    return method, int(n), when


class _KillAt:
    """Store methods that die at the ``QA_KILL`` step (a mixin over a real store)."""

    def _step(self, method: str, when: str) -> None:
        point = _kill_point()
        if point is not None and point == (method, _calls[method], when):
            os.kill(os.getpid(), signal.SIGKILL)

    def _call(self, method: str, *args: Any) -> Any:
        _calls[method] += 1
        # "advance": a checkpoint write after a quarantine record was written (the move past it)
        moving = method == "replace" and _calls["put_quarantined"] > 0
        if moving:
            _calls["advance"] += 1
        for when in ("before", "after"):
            if when == "after":
                result = getattr(super(), method)(*args)
            self._step(method, when)
            if moving:
                self._step("advance", when)
        return result

    def replace(self, *args: Any) -> Any:
        return self._call("replace", *args)

    def put_quarantined(self, *args: Any) -> Any:
        return self._call("put_quarantined", *args)

    def replace_quarantined(self, *args: Any) -> Any:
        return self._call("replace_quarantined", *args)


def _store() -> Any:
    kind = ENV.get("QA_STORE", "local")
    if kind == "local":
        base: type = afdb.LocalStateStore
        args: tuple[Any, ...] = (ENV["QA_STATE_DIR"],)
        kwargs: dict[str, Any] = {}
    elif kind == "blob":
        base, args, kwargs = afdb.BlobStateStore, (), {"container": ENV["QA_CONTAINER"]}
    else:
        base, args = afdb.TableStateStore, ()
        kwargs = {"table": ENV["QA_TABLE"], "lease_container": ENV["QA_CONTAINER"]}
    killing = type("Killing" + base.__name__, (_KillAt, base), {})
    return killing(*args, **kwargs)


db = afdb.PollerBlueprint()


@db.poller(
    name="orders",
    schedule="*/5 * * * * *",
    source=afdb.SqlSource(url="%QA_DB%", table="orders", cursor="updated_at", pk="id"),
    state=_store(),
    batch_size=1000,
    max_attempts=int(ENV.get("QA_ATTEMPTS", "2")),
    poison=ENV.get("QA_POLICY", "quarantine"),  # type: ignore[arg-type]
    lease_duration=15,
)
def on_orders(batch: Batch) -> None:
    if not Path(ENV["QA_FIXED"]).exists():
        bad = [c.pk for c in batch if c.data["poison"]]
        if bad:
            raise ValueError(f"cannot process order(s) {bad}")
    line = json.dumps({"pid": os.getpid(), "ids": [c.pk for c in batch]}) + "\n"
    fd = os.open(ENV["QA_LEDGER"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
