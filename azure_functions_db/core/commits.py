"""Checkpoint commits off the critical path: the next batch is fetched and handed to the handler
while the previous batch's compare-and-set commit is in flight.

At most one commit is outstanding and commits land strictly in order (each is written over the
etag the previous one returned). Nothing about a batch is reported, acknowledged to the source
or counted until its commit returned: :meth:`CommitPipe.settle` waits for it on the run's own
thread and raises its error there, which ends the run and leaves every later batch
unacknowledged (the next run delivers them again). A run never ends with a commit in flight.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from azure_functions_db.core.batch import Batch
from azure_functions_db.core.checkpoint import Checkpoint
from azure_functions_db.core.claim import Claim
from azure_functions_db.errors import CheckpointConflictError, TransientStoreError

#: Logs one structured event: ``log(level, action, **fields)``.
LogEvent = Callable[..., None]


@dataclass
class _Pending:
    batch: Batch
    new: Checkpoint
    done: Callable[[], None]
    future: Future[None] | None  # None: written already (not pipelined)


class CommitPipe:
    """The commits of one run under one claim, at most one in flight.

    Args:
        claim: The held poller whose checkpoint the commits write.
        pipelined: ``False`` writes each commit at once, on the run's thread (the order of a
            run without the pipe).
        log: The run's structured log.
        rejected: Called on the run's thread with a batch whose commit lost compare-and-set.
    """

    def __init__(
        self,
        claim: Claim,
        *,
        pipelined: bool,
        log: LogEvent,
        rejected: Callable[[Batch], None],
    ) -> None:
        self._claim = claim
        self._pipelined = pipelined
        self._log = log
        self._rejected = rejected
        self._pending: _Pending | None = None
        self._executor: ThreadPoolExecutor | None = None

    @property
    def checkpoint(self) -> Checkpoint:
        """The record as it is once every submitted commit landed: what the next batch is read
        after and numbered from."""
        return self._pending.new if self._pending is not None else self._claim.checkpoint

    @property
    def busy(self) -> bool:
        """Whether a commit is in flight (or written and not yet reported)."""
        return self._pending is not None

    def submit(self, batch: Batch, new: Checkpoint, done: Callable[[], None]) -> None:
        """Commit ``new`` (the record after ``batch``), after the commit before it landed;
        ``done()`` runs on this thread once it did (report, acknowledge, count)."""
        self.settle()
        self._claim.keeper.ensure_held()
        if not self._pipelined:
            self._pending = _Pending(batch, new, done, None)
            try:
                self._claim.write(new)
            except BaseException:
                self._pending = None
                raise
            self.settle()
            return
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="afdb-commit")
        future = self._executor.submit(self._claim.write, new)
        self._pending = _Pending(batch, new, done, future)

    def settle(self) -> None:
        """Wait for the commit in flight; report it, or raise its error (``commit_rejected``
        for a lost compare-and-set, ``commit_ambiguous_lost`` for an unknown outcome)."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        batch = pending.batch
        try:
            if pending.future is not None:
                pending.future.result()
        except CheckpointConflictError:
            self._log(logging.WARNING, "commit_rejected", fence=batch.fence, rows=len(batch))
            self._rejected(batch)
            raise
        except TransientStoreError:
            self._log(logging.WARNING, "commit_ambiguous_lost", fence=batch.fence)
            raise
        self._log(
            logging.INFO,
            "batch_committed",
            fence=batch.fence,
            rows=len(batch),
            attempt=batch.attempt,
            position=pending.new.position,
        )
        pending.done()

    def close(self, *, failing: bool) -> None:
        """End of the run: settle the commit in flight. When the run is failing already its
        error is the one to report: the commit's own error is logged, not raised."""
        try:
            if failing:
                try:
                    self.settle()
                except Exception as exc:  # noqa: BLE001 - the run's own error wins
                    self._log(logging.DEBUG, "commit_after_failure", error=repr(exc))
            else:
                self.settle()
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None
