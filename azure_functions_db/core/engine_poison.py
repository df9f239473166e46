"""Failed attempts and the poison policies inside a run: count a failed handler call, raise the
poison alert (``halt``), or isolate a poison batch's failing rows by bisection and park them in
quarantine records, each written before the checkpoint moves past it (``quarantine``); a mixin
of :class:`~azure_functions_db.core.engine.Engine`."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from azure_functions_db.core.batch import Batch, Change
from azure_functions_db.core.checkpoint import Checkpoint
from azure_functions_db.core.claim import Claim, Claimer
from azure_functions_db.core.clock import Clock
from azure_functions_db.core.config import PollerConfig
from azure_functions_db.core.observe import RunObserver, RunReport
from azure_functions_db.core.ports import (
    Source,
    SourceRow,
    StateStore,
    StoredQuarantine,
    TransactionalSink,
)
from azure_functions_db.core.quarantine import (
    Action,
    QuarantineEvent,
    QuarantineRecord,
    new_record,
    no_such_record,
)
from azure_functions_db.errors import (
    CheckpointConflictError,
    HandlerError,
    LeaseHeldError,
    PoisonBatchError,
    QuarantineStateError,
    RecordExistsError,
    SinkFencedError,
    TransientSinkError,
)

#: Records one isolation (bisection) of a poison batch may write for single rows; past it, each
#: part that still fails is quarantined whole (a handler that fails on every row would
#: otherwise write one record per row).
ISOLATE_MAX_RECORDS = 16


class _QuarantineDue(Exception):
    """The batch failed ``max_attempts`` times under the ``quarantine`` policy."""

    def __init__(self, error: BaseException, attempts: int) -> None:
        super().__init__(str(error))
        self.error = error
        self.attempts = attempts


def describe_error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class PoisonRuns:
    """What an engine does with a batch that failed ``max_attempts`` times under
    ``poison="quarantine"``."""

    config: PollerConfig
    store: StateStore
    owner: str
    clock: Clock
    observer: RunObserver
    _retrying: Any
    source: Source
    sink: TransactionalSink | None

    if TYPE_CHECKING:

        def _batch(self, cp: Checkpoint, fence: int, changes: Sequence[Change]) -> Batch: ...

        def _invoke(self, batch: Batch, claim: Claim) -> None: ...

        def _delivered(
            self,
            batch: Batch,
            rows: Sequence[SourceRow],
            claim: Claim,
            report: RunReport,
            began: float,
            *,
            handled: tuple[float, float] | None = None,
        ) -> None: ...

        def _log(self, level: int, action: str, **fields: object) -> None: ...

        def _catch_up_with_sink(self, claim: Claim) -> None: ...

        def _settle(self) -> None: ...

    def _failed_attempt(
        self, batch: Batch, claim: Claim, exc: BaseException, *, transient: bool = False
    ) -> NoReturn:
        """Count a failed handler call on the checkpoint and end the run the way its count
        says (``HandlerError``, ``PoisonBatchError``, or quarantine due)."""
        cfg = self.config
        # Any way out of the handler but a normal return is a failed attempt, counted and
        # logged: CancelledError too, and a sys.exit() before it ends the process. Not a
        # Ctrl-C: the operator stopped the run, the batch did not fail (it is delivered again,
        # logged, uncounted). The attempt is counted on the record the previous batch's commit
        # leaves (whose own failure, if any, ends the run instead; a Ctrl-C stays a Ctrl-C).
        try:
            self._settle()
        except BaseException:
            if isinstance(exc, KeyboardInterrupt | SystemExit):
                raise exc from None
            raise
        cp = claim.checkpoint
        if isinstance(exc, KeyboardInterrupt):
            self._log(
                logging.INFO,
                "handler_interrupted",
                fence=batch.fence,
                rows=len(batch),
                position=cp.position,
                error=type(exc).__name__,
                note="stopped_by_the_operator;_not_counted_as_a_failed_attempt",
            )
            raise exc
        failed = cp.failed(fence=batch.fence, error=describe_error(exc), transient=transient)
        # Count the failed attempt on the checkpoint (best effort: the batch stays unacked).
        claim.try_write(failed)
        interrupted = isinstance(exc, SystemExit)
        self._log(
            # sys.exit(): counted and logged, but not an error of the handler's
            logging.INFO if interrupted else logging.ERROR,
            "handler_interrupted" if interrupted else "handler_failed",
            fence=batch.fence,
            rows=len(batch),
            attempt=failed.attempts,
            position=cp.position,
            error=type(exc).__name__,
        )
        self.observer.handler_failed(batch, failed.attempts)
        if interrupted:
            raise exc
        if failed.attempts >= cfg.max_attempts and cfg.poison == "quarantine":
            raise _QuarantineDue(exc, failed.attempts) from exc
        if failed.attempts >= cfg.max_attempts:
            # The alert: same batch, max_attempts failures. Nothing is skipped; an
            # operator fixes the cause or moves past it with `afdb seek`.
            self._log(
                logging.CRITICAL,
                "poison_batch",
                fence=batch.fence,
                rows=len(batch),
                attempts=failed.attempts,
                position=cp.position,
                policy=cfg.poison,
            )
            raise PoisonBatchError(
                cfg.key.poller, cfg.namespace, failed.attempts, len(batch)
            ) from exc
        raise HandlerError(cfg.key.poller, cfg.namespace, failed.attempts, len(batch)) from exc

    def _set_aside(
        self,
        batch: Batch,
        rows: Sequence[SourceRow],
        claim: Claim,
        due: _QuarantineDue,
        report: RunReport,
    ) -> None:
        """A poison batch under ``poison="quarantine"``: isolate its failing rows (``bisect``)
        or park it whole, so the poller goes on."""
        self._settle()
        if self.config.bisect and len(batch) > 1:
            self._log(
                logging.WARNING,
                "poison_isolating",
                fence=batch.fence,
                rows=len(batch),
                attempts=due.attempts,
                position=batch.position_before,
                note="splitting the batch to deliver its good rows and quarantine the bad ones",
            )
            self._isolate(batch.changes, rows, claim, report, due=due, left=[ISOLATE_MAX_RECORDS])
        else:
            self._quarantine(batch, claim, describe_error(due.error), due.attempts, report)

    def _isolate(
        self,
        changes: Sequence[Change],
        rows: Sequence[SourceRow],
        claim: Claim,
        report: RunReport,
        *,
        due: _QuarantineDue,
        left: list[int],
    ) -> None:
        """Deliver each half of ``changes`` on its own; split a failing half again, down to
        single rows, which are quarantined. Every part that succeeds is committed at once (in
        order), so a crash keeps what was delivered; ``left`` counts the single-row records
        this isolation may still write."""
        half = len(changes) // 2
        for part, part_rows in ((changes[:half], rows[:half]), (changes[half:], rows[half:])):
            began = self.clock.monotonic()
            sub = self._batch(claim.checkpoint, claim.fence, part)
            claim.keeper.ensure_held()
            error = self._try_handler(sub, claim, due)
            if error is None:
                self._delivered(sub, part_rows, claim, report, began)
                self._settle()  # the next part is read after this one's position
            elif len(part) > 1 and left[0] > 0:
                self._isolate(part, part_rows, claim, report, due=due, left=left)
            else:
                left[0] -= 1
                self._quarantine(sub, claim, describe_error(error), due.attempts, report)

    def _try_handler(self, batch: Batch, claim: Claim, due: _QuarantineDue) -> BaseException | None:
        """One handler call while isolating poison rows: the error it raised, or ``None``.

        A sink that is fenced, and Ctrl-C, end the run as they would any other call (the parts
        committed so far stay committed); so does a sink that is unavailable, unless the batch
        became poison by failing with that kind of error again and again (then it is a row's
        failure taken for a transient one, and this part's)."""
        try:
            self._invoke(batch, claim)
        except (SinkFencedError, KeyboardInterrupt, SystemExit):
            raise
        except TransientSinkError as exc:
            if isinstance(due.error, TransientSinkError):
                return self._part_failed(batch, exc)
            self._log(
                logging.WARNING, "sink_unavailable", fence=batch.fence, error=describe_error(exc)
            )
            raise
        except BaseException as exc:  # noqa: BLE001 - the row's failure, recorded with it
            return self._part_failed(batch, exc)
        return None

    def _part_failed(self, batch: Batch, exc: BaseException) -> BaseException:
        """Log and report a part of an isolation that failed; its error."""
        self._log(
            logging.WARNING,
            "isolate_part_failed",
            fence=batch.fence,
            rows=len(batch),
            position=batch.position_before,
            error=type(exc).__name__,
        )
        self.observer.handler_failed(batch, batch.attempt)
        return exc

    def _quarantine(
        self, batch: Batch, claim: Claim, error: str, attempts: int, report: RunReport
    ) -> None:
        """Park ``batch`` in a quarantine record, then move the checkpoint past it.

        The record is written (compare-and-set) before the checkpoint moves: a crash between
        the two leaves the batch quarantined but not passed, and the next run delivers it again
        (and finds its record by id). Never passed without a record."""
        cfg = self.config
        record = new_record(
            cfg.key, batch, error=error, attempts=attempts, by=self.owner, at=self.clock.now()
        )
        claim.keeper.ensure_held()
        self._retrying(self._store_record, record)
        claim.keeper.ensure_held()
        moved = claim.checkpoint.quarantined(
            batch.position_after,
            fence=claim.fence,
            at=self.clock.now(),
            rows=len(batch),
            read_after=batch.position_before,
        )
        try:
            claim.write(moved)
        except CheckpointConflictError:
            self._log(logging.WARNING, "commit_rejected", fence=batch.fence, rows=len(batch))
            self.observer.commit_rejected(batch)
            raise
        self._log(
            logging.ERROR,
            "batch_quarantined",
            fence=batch.fence,
            rows=len(batch),
            attempts=attempts,
            record=record.id,
            position=batch.position_after,
            error=error.split(":", 1)[0],
            note=f"replay with `afdb quarantine replay APP --poller {cfg.name} {record.id}`",
        )
        self.observer.batch_quarantined(batch, record.id)
        report.position = moved.position  # the checkpoint is past the parked rows now
        report.quarantined += len(batch)
        report.records.append(record.id)

    def _store_record(self, record: QuarantineRecord) -> None:
        """Write ``record``; if the same rows were quarantined before (a crash before the
        checkpoint moved, or a seek back), add to that record's history instead."""
        try:
            self.store.put_quarantined(record)
            return
        except RecordExistsError:
            stored = self.store.read_quarantined(record.key, record.id)
        if stored is None:  # gone in between (dropped by hand): write it again
            self.store.put_quarantined(record)
            return
        history = (*stored.record.history, *record.history)
        self.store.replace_quarantined(dataclasses.replace(record, history=history), stored.etag)

    # -- replay by command -------------------------------------------------------------------

    def replay(
        self,
        settings: Mapping[str, str],
        record_id: str,
        *,
        by: str,
        reason: str = "",
        again: bool = False,
        lossy_ok: bool = False,
    ) -> tuple[QuarantineRecord, BaseException | None]:
        """Call the handler with quarantined batch ``record_id`` under the poller's lease.

        The same handler the runs call (async, sink and all), with the rows as the handler saw
        them; the outcome goes into the record's history by compare-and-set (``replayed``, or
        ``replay_failed`` with the error, the record staying quarantined), then a success counts
        one delivered batch on the checkpoint. With a sink the batch commits in a sink
        transaction numbered like a run's next batch, after the claim caught the checkpoint up
        with the sink. Returns the record as written and the handler's error (``None``: it
        took the batch). Raises :class:`LeaseHeldError` while a run holds the lease and
        :class:`QuarantineStateError` for a record that is missing, replayed or dropped
        (``again`` allows a replayed one) or holds values kept only as text (``lossy_ok``).
        """
        cfg = self.config
        self._replayable(self._read_record(record_id).record, again=again, lossy_ok=lossy_ok)
        if self.sink is not None:
            self._retrying(self.source.open, settings)
            self._retrying(self.sink.open, settings)
        claimer = Claimer(
            self.store,
            cfg.key,
            owner=f"afdb-replay:{by}",
            duration=cfg.lease_duration,
            clock=self.clock,
            retrying=self._retrying,
            log=self._log,
        )
        with claimer.hold(None) as claim:
            if claim is None:
                raise LeaseHeldError(cfg.name, cfg.namespace, self.store.inspect(cfg.key).holder)
            self._catch_up_with_sink(claim)
            stored = self._read_record(record_id)  # again, under the lease
            record = stored.record
            self._replayable(record, again=again, lossy_ok=lossy_ok)
            batch = record.batch(
                fence=claim.fence, attempt=record.replays + 1, poller=cfg.changes_poller
            )
            error: BaseException | None = None
            try:
                self._invoke(batch, claim)
            except (SinkFencedError, KeyboardInterrupt, SystemExit):
                raise
            except BaseException as exc:  # noqa: BLE001 - recorded in the record's history
                error = exc
            detail = reason if error is None else describe_error(error)[:500]
            action: Action = "replayed" if error is None else "replay_failed"
            event = QuarantineEvent(action, self.clock.now(), by, claim.fence, detail)
            after = record.with_event(event, "replayed" if error is None else record.state)
            claim.keeper.ensure_held()
            self._retrying(self.store.replace_quarantined, after, stored.etag)
            if error is None:
                claim.write(claim.checkpoint.replayed(fence=claim.fence, rows=len(batch)))
        self._log(
            logging.WARNING if error is None else logging.ERROR,
            "quarantine_" + action,
            record=record_id,
            rows=len(batch),
            fence=claim.fence,
            by=by,
            reason=reason or None,
            error=type(error).__name__ if error is not None else None,
        )
        return after, error

    def _read_record(self, record_id: str) -> StoredQuarantine:
        cfg = self.config
        stored = self._retrying(self.store.read_quarantined, cfg.key, record_id)
        if stored is None:
            raise no_such_record(cfg.key, record_id, cfg.name)
        assert isinstance(stored, StoredQuarantine)
        return stored

    def _replayable(self, record: QuarantineRecord, *, again: bool, lossy_ok: bool) -> None:
        cfg, last = self.config, record.history[-1] if record.history else None
        when = f" at {last.at.isoformat()} by {last.by}" if last is not None else ""
        if record.state == "dropped":
            raise QuarantineStateError(
                cfg.name, cfg.namespace, record.id, f"it was dropped{when}; nothing to replay."
            )
        if record.state == "replayed" and not again:
            raise QuarantineStateError(
                cfg.name,
                cfg.namespace,
                record.id,
                f"it was replayed{when}. Pass `--again` to deliver it once more.",
            )
        if record.lossy and not lossy_ok:
            raise QuarantineStateError(
                cfg.name,
                cfg.namespace,
                record.id,
                f"column(s) {', '.join(record.lossy)} hold values of a type the record could "
                "keep only as text; the handler would get strings. Pass `--lossy-ok` to replay "
                "anyway, or replay from the table with `afdb seek`.",
            )
