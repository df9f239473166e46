"""Checkpoint commits off the critical path: the next batch is fetched and handed to the handler
while the previous batch's compare-and-set commit is in flight.

At most one commit is outstanding and commits land strictly in order (each is written over the
etag the previous one returned). Batches handed over while a commit is in flight do not wait for
it one at a time: they are grouped, and go together with the next commit once it landed (group
commit, the default), as long as the rows not yet acknowledged stay within the duplicate window
(:data:`GROUP_BATCHES` batches, or the rows of the last :data:`GROUP_SECONDS`, whichever is
more); beyond it the run waits for the commit in flight. With no commit in flight, a batch
starts one only once :data:`PACE_BATCHES` batches are waiting and the store rested since its
last commit as long as that commit took, or once the oldest waited :data:`PACE_SECONDS` (the
run's first batch at once): a fast store gets a commit per few batches rather than one per
batch (each costs the local store two fsyncs), a slow one (Azure Storage, tens of
milliseconds a write) is kept busy at most about half the time, with fewer, larger commits,
and the drain does not slow down to the store's pace. With
explicit coalescing (``checkpoint_every``/``checkpoint_seconds``) several batches share one
commit even when nothing is in flight: their record is held back until enough rows or seconds
went by. Either way a record held back is written at the latest before anything else happens to
the checkpoint (see :meth:`CommitPipe.settle`).

Nothing about a batch is reported, acknowledged to the source or counted until its commit
returned: :meth:`CommitPipe.settle` waits for it on the run's own
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
from azure_functions_db.core.config import PollerConfig
from azure_functions_db.errors import (
    CheckpointConflictError,
    ConfigurationError,
    TransientStoreError,
)

#: Group commit's duplicate window: batches handed over while a commit is in flight wait for the
#: next commit (instead of each waiting for the one before) while the rows not yet acknowledged,
#: in flight and waiting, are at most this many batches' worth...
GROUP_BATCHES = 10
#: ... or while the oldest of them was handed over less than this many seconds ago (the rows of
#: one second of work), whichever allows more.
GROUP_SECONDS = 1.0
#: Group commit's pace: with no commit in flight, batches wait for more until they are this many
#: batches' worth of rows (and the time since the last commit landed is at least what that
#: commit took, up to the limit below)...
PACE_BATCHES = 4
#: ... or the oldest of them was handed over this many seconds ago (a fast store then writes a
#: few commits per second of work instead of one per batch; the duplicate window is unchanged).
PACE_SECONDS = 0.1

#: Logs one structured event: ``log(level, action, **fields)``.
LogEvent = Callable[..., None]
#: Reports a batch once its commit landed: ``done(landed)``, ``landed`` the ``monotonic()`` time
#: the write returned (on the commit thread: before the next batch's handler ended, maybe).
Landed = Callable[[float], None]


@dataclass
class _Pending:
    batch: Batch  # the last batch the commit acknowledges
    new: Checkpoint
    done: Landed
    future: Future[float] | None  # the write, returning when it landed; None: held back
    rows: int = 0  # rows the commit acknowledges (0: the batch's)
    since: float = 0.0  # when the first batch it acknowledges was handed over (monotonic)


class CommitPipe:
    """The commits of one run under one claim, at most one in flight.

    Args:
        claim: The held poller whose checkpoint the commits write.
        pipelined: ``False`` writes each commit at once, on the run's thread (the order of a
            run without the pipe).
        log: The run's structured log.
        rejected: Called on the run's thread with a batch whose commit lost compare-and-set.
        every_rows, every_seconds: Coalescing: hold batches back until this many rows or
            seconds went by; ``None`` for both: commit every batch.
        latest_seconds: Coalescing: batches due while the commit before them is still in
            flight are not waited for but held on (they go with a later batch's commit, so the
            run never stalls on a round trip), at most this long (``lease_duration / 2``).
        monotonic: The engine clock's ``monotonic``: when batches were held back, when a
            commit landed.
        group_rows: Group commit (without explicit coalescing): batches handed over while a
            commit is in flight go with the next commit while the rows not yet acknowledged are
            at most this many, or the oldest of them came less than ``group_seconds`` ago;
            ``None``: each batch's commit waits for the one before.
        group_seconds: See ``group_rows``.
        pace_rows, pace_seconds: Group commit's pace (see :meth:`_paced`); ``pace_rows=0``:
            none, each commit starts as soon as the batch is handed over with none in flight.
    """

    def __init__(
        self,
        claim: Claim,
        *,
        pipelined: bool,
        log: LogEvent,
        rejected: Callable[[Batch], None],
        every_rows: int | None = None,
        every_seconds: float | None = None,
        latest_seconds: float | None = None,
        monotonic: Callable[[], float],
        group_rows: int | None = None,
        group_seconds: float = GROUP_SECONDS,
        pace_rows: int = 0,
        pace_seconds: float = PACE_SECONDS,
    ) -> None:
        self._claim = claim
        self._pipelined = pipelined
        self._log = log
        self._rejected = rejected
        self._pending: _Pending | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._every_rows = every_rows
        self._every_seconds = every_seconds
        self._latest_seconds = latest_seconds
        self._monotonic = monotonic
        self._held: list[_Pending] = []  # coalesced batches, not yet submitted
        self._held_rows = 0
        self._held_since = 0.0
        self._group_rows = group_rows
        self._group_seconds = group_seconds
        self._pace_rows = pace_rows
        self._pace_seconds = pace_seconds
        self._submitted = False  # whether a commit was submitted in this run
        # The last commit's write: when it landed and how long it took (monotonic seconds).
        self._last_landed = 0.0
        self._last_took = 0.0

    @property
    def checkpoint(self) -> Checkpoint:
        """The record as it is once every batch handed to the pipe is committed: what the next
        batch is read after and numbered from."""
        if self._held:
            return self._held[-1].new
        return self._pending.new if self._pending is not None else self._claim.checkpoint

    @property
    def busy(self) -> bool:
        """Whether a commit is held back, in flight, or written and not yet reported."""
        return self._pending is not None or bool(self._held)

    def add(self, batch: Batch, new: Checkpoint, done: Landed) -> None:
        """Commit ``new`` (the record after ``batch``): now, or with later batches when
        coalescing and neither ``every_rows`` rows nor ``every_seconds`` went by since the
        first batch held back (or they did, but the commit before is still in flight and
        ``latest_seconds`` did not go by)."""
        if self._every_rows is None and self._every_seconds is None:
            self._group(batch, new, done)
            return
        now = self._monotonic()
        if not self._held:
            self._held_since = now
        self._held.append(_Pending(batch, new, done, None))
        self._held_rows += len(batch)
        rows_due = self._every_rows is not None and self._held_rows >= self._every_rows
        time_due = self._every_seconds is not None and now - self._held_since >= self._every_seconds
        if not (rows_due or time_due):
            return
        pending, latest = self._pending, self._latest_seconds
        in_flight = pending is not None and pending.future is not None and not pending.future.done()
        if in_flight and latest is not None and now - self._held_since < latest:
            return  # due, but the commit before is on its way: these go with a later one
        self._flush()

    def _group(self, batch: Batch, new: Checkpoint, done: Landed) -> None:
        """Group commit: with no commit in flight, commit ``batch`` (and any batches waiting)
        now; while one is in flight, let ``batch`` wait for the next commit, unless that would
        take the rows not yet acknowledged past the duplicate window (then wait for the commit
        in flight, and commit everything waiting)."""
        now = self._monotonic()
        pending, limit = self._pending, self._group_rows
        in_flight = pending is not None and pending.future is not None and not pending.future.done()
        if in_flight and limit is not None:
            assert pending is not None
            unacknowledged = (pending.rows or len(pending.batch)) + self._held_rows + len(batch)
            # The commit in flight acknowledges the oldest batch not acknowledged yet.
            if unacknowledged <= limit or now - pending.since < self._group_seconds:
                self._held.append(_Pending(batch, new, done, None, since=now))
                self._held_rows += len(batch)
                return
        self._held.append(_Pending(batch, new, done, None, since=now))
        self._held_rows += len(batch)
        if in_flight or self._paced(now):
            self._flush()

    def _paced(self, now: float) -> bool:
        """Whether the batches waiting are enough for a commit of their own (the run's first
        batch always is: its commit starts at once; without the pipeline, every batch is):
        enough rows once the store rested as long as its last commit took (a slow store is
        busy at most about half the time), or a wait of the pace's limit."""
        if not self._pipelined or not self._submitted or not self._pace_rows:
            return True  # (no pace: a sink's commit goes while the next batch is handled)
        if now - self._held[0].since >= self._pace_seconds:
            return True
        rested = now - self._last_landed >= min(self._last_took, self._pace_seconds)
        return rested and self._held_rows >= self._pace_rows

    def _flush(self) -> None:
        """Submit the batches held back as one commit (their last record)."""
        if not self._held:
            return
        held, self._held, rows = self._held, [], self._held_rows
        self._held_rows = 0
        last = held[-1]

        def done(landed: float) -> None:
            for each in held:
                each.done(landed)

        self.submit(last.batch, last.new, done, rows=rows, since=held[0].since)

    def submit(
        self, batch: Batch, new: Checkpoint, done: Landed, *, rows: int = 0, since: float = 0.0
    ) -> None:
        """Commit ``new`` (the record after ``batch``), after the commit before it landed;
        ``done(landed)`` runs on this thread once it did (report, acknowledge, count)."""
        self._wait()
        self._claim.keeper.ensure_held()
        self._submitted = True
        if not self._pipelined:
            # Written here and now, its outcome reported the same way as a pipelined one's.
            written: Future[float] = Future()
            try:
                landed = self._write(new)
            except Exception as exc:  # noqa: BLE001 - raised again by _wait, once reported
                written.set_exception(exc)
            else:
                written.set_result(landed)
            self._pending = _Pending(batch, new, done, written, rows, since)
            self._wait()
            return
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="afdb-commit")
        future = self._executor.submit(self._write, new)
        self._pending = _Pending(batch, new, done, future, rows, since)

    def _write(self, new: Checkpoint) -> float:
        began = self._monotonic()
        self._claim.write(new)
        landed = self._monotonic()
        self._last_landed, self._last_took = landed, landed - began
        return landed

    def ensure_held(self) -> None:
        """Raise if the lease is lost. When it was lost while a commit was in flight (the commit
        thread found the record changed by another writer), that commit's own error is the
        cause and is raised (``CheckpointConflictError``), as without the pipe. With group
        commit, batches waiting for a commit that has landed are committed now."""
        if self._claim.keeper.lost_reason() is not None and self._pending is not None:
            self._wait()
        self._claim.keeper.ensure_held()
        if self._held and self._every_rows is None and self._every_seconds is None:
            # Group commit: batches waiting for a commit that landed meanwhile go now, not
            # after the next handler call.
            pending = self._pending
            landed = pending is None or pending.future is None or pending.future.done()
            if landed and self._paced(self._monotonic()):
                self._flush()

    def settle(self) -> None:
        """Commit the batches held back, wait for the commit in flight; report them, or raise
        the commit's error (``commit_rejected`` for a lost compare-and-set,
        ``commit_ambiguous_lost`` for an unknown outcome)."""
        self._flush()
        self._wait()

    def _wait(self) -> None:
        pending, self._pending = self._pending, None
        if pending is None:
            return
        batch = pending.batch
        try:
            assert pending.future is not None, "a held batch is submitted before it is waited for"
            landed = pending.future.result()
        except CheckpointConflictError:
            rows = pending.rows or len(batch)
            self._log(logging.WARNING, "commit_rejected", fence=batch.fence, rows=rows)
            self._rejected(batch)
            raise
        except TransientStoreError:
            self._log(logging.WARNING, "commit_ambiguous_lost", fence=batch.fence)
            raise
        self._log(
            logging.INFO,
            "batch_committed",
            fence=batch.fence,
            rows=pending.rows or len(batch),
            attempt=batch.attempt,
            position=pending.new.position,
        )
        pending.done(landed)

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


def check_coalescing(config: PollerConfig, *, sink: bool) -> None:
    """Refuse coalesced commits with a transactional sink, which commits each batch with its
    position: the checkpoint must follow every batch (the catch-up rule: one batch behind)."""
    if sink and (config.checkpoint_every is not None or config.checkpoint_seconds is not None):
        raise ConfigurationError(
            f"Poller `{config.name}` has a transactional sink and coalesced commits "
            "(`checkpoint_every`/`checkpoint_seconds`): the sink commits each batch with its "
            "position, so the checkpoint must follow every batch. Remove the coalescing."
        )
