"""One poller run: lease -> fence -> load -> (horizon -> fetch -> handler -> commit)* -> release.

The engine owns the delivery contract. It acknowledges a batch only by a successful
compare-and-set commit of the checkpoint, made under a lease it still holds, with the fence that
lease granted. Anything else ends the run with the batch unacknowledged, so the next run (here
or on another instance) delivers it again: at-least-once, never a silent skip.
"""

from __future__ import annotations

import datetime as dt
import inspect
import logging
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from azure_functions_db.core import reshard
from azure_functions_db.core.batch import Batch, Change, RowChanges
from azure_functions_db.core.checkpoint import Checkpoint
from azure_functions_db.core.claim import Claim, Claimer, start_now
from azure_functions_db.core.clock import Clock
from azure_functions_db.core.commits import (
    GROUP_BATCHES,
    PACE_BATCHES,
    CommitPipe,
    check_coalescing,
)
from azure_functions_db.core.config import PollerConfig as PollerConfig  # noqa: PLC0414 - re-export
from azure_functions_db.core.engine_health import HealthRuns
from azure_functions_db.core.engine_poison import PoisonRuns, _QuarantineDue, describe_error
from azure_functions_db.core.handler import HANDLER_LOOP, check_handler, check_result
from azure_functions_db.core.logs import log_event
from azure_functions_db.core.observe import BatchTiming, RunObserver, guarded
from azure_functions_db.core.observe import RunReport as RunReport  # noqa: PLC0414 - re-export
from azure_functions_db.core.ports import (
    AcknowledgingSource,
    BacklogSource,
    Horizon,
    LeaseGrant,
    Source,
    SourceRow,
    StateStore,
    TransactionalSink,
    ZonedSource,
)
from azure_functions_db.core.position import Position
from azure_functions_db.core.reader import BatchReader
from azure_functions_db.core.retry import Retrying
from azure_functions_db.core.sink_catch_up import catch_up_with_sink
from azure_functions_db.core.source_change import check_source_change
from azure_functions_db.errors import (
    PositionNotForwardError,
    PositionRegressionError,
    SinkFencedError,
    TransientSinkError,
)

logger = logging.getLogger(__name__)


class _CommitBefore(Exception):
    """The checkpoint commit of the batch before failed while a sink batch waited for it: its
    error, carried out of the sink transaction (rolled back) past the handler's failure path."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(repr(error))
        self.error = error


Handler = (
    Callable[[Batch], None]
    | Callable[[Batch], Awaitable[None]]
    | Callable[[Batch, Any], None]
    | Callable[[Batch, Any], Awaitable[None]]
)


class Engine(PoisonRuns, HealthRuns):
    """Runs one poller: a source, a state store and a handler, under a lease.

    One engine per poller per process; :meth:`run` is one timer invocation. Not re-entrant:
    the timer host never overlaps invocations of one function on an instance, and the lease
    keeps instances apart.
    """

    def __init__(
        self,
        config: PollerConfig,
        source: Source,
        store: StateStore,
        handler: Handler,
        clock: Clock,
        *,
        owner: str,
        heartbeat_interval: float | None = None,
        rng: random.Random | None = None,
        observer: RunObserver | None = None,
        sink: TransactionalSink | None = None,
    ) -> None:
        check_handler(handler, config.name, sink=sink is not None)
        check_coalescing(config, sink=sink is not None)
        self.config = config
        self.source = source
        self.store = store
        self.handler = handler
        self.sink = sink
        self.clock = clock
        self.owner = owner
        self._heartbeat_interval = heartbeat_interval
        self._retrying = Retrying(
            retries=config.infra_retries,
            delay=config.retry_delay,
            clock=clock,
            log=self._log,
            rng=rng,
        )
        self._last_health: float | None = None
        self.observer = guarded(observer)
        # A runtime-checkable Protocol costs two attribute scans per isinstance: decide once.
        self._acknowledger = source if isinstance(source, AcknowledgingSource) else None
        self._reader = BatchReader(config, source, self._retrying, self._log)
        self._backlog = source if isinstance(source, BacklogSource) else None
        self._pipe: CommitPipe | None = None  # the commits of the run in progress
        self._zone = source.cursor_timezone if isinstance(source, ZonedSource) else dt.UTC

    # -- the run ------------------------------------------------------------------------------

    def run(self, settings: Mapping[str, str], *, manual: bool = False) -> RunReport:
        """Do one run; return its report, or raise the error that ended it.

        ``manual``: a run started by hand (``afdb run --once``), not by the poller's schedule:
        its health record says so, and ``afdb status`` does not judge it stalled for missing
        the runs its schedule would have made.

        Raises ``HandlerError``/``PoisonBatchError`` (handler failed; batch unacknowledged),
        ``LeaseLostError``/``CheckpointConflictError`` (another owner took over),
        ``SourceError``/``StateStoreError`` (infrastructure, after bounded retries), and
        ``CheckpointCorruptError`` (operator must decide). Every one of them leaves the
        current batch unacknowledged.
        """
        report = RunReport(poller=self.config.name, namespace=self.config.namespace)
        began = self.clock.monotonic()
        try:
            self._run(settings, report)
        except BaseException as exc:
            self._record_health(report, exc, manual=manual)
            self.observer.run_finished(report, self.clock.monotonic() - began, exc)
            raise
        self._record_health(report, None, manual=manual)
        self.observer.run_finished(report, self.clock.monotonic() - began, None)
        return report

    def _run(self, settings: Mapping[str, str], report: RunReport) -> None:
        cfg = self.config
        self._retrying(self.source.open, settings)
        if self.sink is not None:
            self._retrying(self.sink.open, settings)
        started = self.clock.monotonic()
        claimer = Claimer(
            self.store,
            cfg.key,
            owner=self.owner,
            duration=cfg.lease_duration,
            clock=self.clock,
            heartbeat_interval=self._heartbeat_interval,
            retrying=self._retrying,
            log=self._log,
        )

        def acquired(grant: LeaseGrant) -> None:
            report.fence = grant.fence
            self._log(logging.INFO, "lease_acquired", fence=grant.fence)
            self.observer.lease_acquired(cfg.name, cfg.namespace, grant.fence)

        desc = self.source.description
        with claimer.hold(
            desc,
            check_source=lambda old: check_source_change(old, desc, cfg.key, self._log),
            on_acquired=acquired,
            initial=None
            if cfg.start != "now" or cfg.resharded_from is not None
            else reshard.checked_start(
                cfg,
                self.store,
                lambda: start_now(self.source, cfg.key, self.clock, self._retrying, self._log),
            ),
        ) as claim:
            if claim is None:
                info = self.store.inspect(cfg.key)
                report.status, report.holder, report.fence = "lease_held", info.holder, info.fence
                self._log(logging.INFO, "lease_held", holder=info.holder, lease_fence=info.fence)
                return
            if (refused := reshard.refusal(claim.checkpoint, cfg, self.store)) is not None:
                raise refused
            self._health_check(report)
            self._catch_up_with_sink(claim)
            self._loop(claim, started, report)
        self._log(
            logging.INFO,
            "run_done",
            fence=claim.fence,
            status=report.status,
            batches=report.batches,
            rows=report.rows,
            position=report.position,
        )

    def _loop(self, claim: Claim, started: float, report: RunReport) -> None:
        cfg = self.config
        self._pipe = CommitPipe(
            claim,
            pipelined=cfg.pipeline,
            log=self._log,
            rejected=self.observer.commit_rejected,
            every_rows=cfg.checkpoint_every,
            every_seconds=cfg.coalesce_seconds,
            latest_seconds=cfg.lease_duration / 2,
            monotonic=self.clock.monotonic,
            # The batch in the handler is not handed over yet: nine batches waiting or in flight
            # plus it make the ten a crash can deliver again.
            group_rows=(GROUP_BATCHES - 1) * cfg.batch_size,
            # No pace with a sink: its next transaction waits for the commit before anyway, so
            # a commit held back would only start then, with nothing left to overlap it.
            pace_rows=0 if self.sink is not None else PACE_BATCHES * cfg.batch_size,
        )
        failing = True
        try:
            self._batches(claim, started, report)
            failing = False
        finally:
            self._reader.close()
            self._pipe.close(failing=failing)
            self._pipe = None

    def _batches(self, claim: Claim, started: float, report: RunReport) -> None:
        cfg = self.config
        pipe = self._pipe
        assert pipe is not None
        report.position, report.looped = claim.checkpoint.position, True
        # The horizon is kept while batches come back full (one query per catch-up, not per
        # batch). A bound taken earlier is lower than a fresh one, so still safe, and it is fixed
        # before each read; but a short batch under it only means "nothing more below this old
        # bound": the run is caught up when a batch under a fresh (or no) bound comes back short.
        horizon: Horizon | None = None
        fresh = False
        while True:
            if (batch_start := self.clock.monotonic()) - started >= cfg.time_budget:
                pipe.settle()
                report.status = "budget_spent"
                return
            pipe.ensure_held()
            if horizon is None:
                horizon, fresh = self._retrying(self.source.horizon), True
            # Read after the position the commit in flight (if any) moves the record to.
            changes, rows = self._reader.read(pipe.checkpoint.position, horizon)
            final = fresh or horizon.bound is None
            if not changes:
                if final and self._at_the_end(claim, report, horizon, started):
                    return
                horizon = None
                continue
            batch = self._batch(pipe.checkpoint, claim.fence, changes)
            pipe.ensure_held()
            called = self.clock.monotonic()
            try:
                self._call_handler(batch, claim)
            except _QuarantineDue as due:
                self._set_aside(batch, rows, claim, due, report)
            else:
                handled = (called, self.clock.monotonic())
                self._delivered(batch, rows, claim, report, batch_start, handled=handled)
            if len(changes) < cfg.batch_size:
                if final and self._at_the_end(claim, report, horizon, started):
                    return
                horizon = None
            else:
                fresh = False

    def _batch(self, cp: Checkpoint, fence: int, changes: Sequence[Change]) -> Batch:
        return Batch(
            poller=self.config.name,
            namespace=self.config.namespace,
            fence=fence,
            attempt=cp.attempts + 1,
            position_before=cp.position,
            position_after=changes[-1].position,
            changes=changes if isinstance(changes, RowChanges) else tuple(changes),
            chunk=self.config.chunk,
        )

    # -- lease, fence, load ------------------------------------------------------------------

    def _health_check(self, report: RunReport) -> None:
        now = self.clock.monotonic()
        if self._last_health is not None and now - self._last_health < self.config.health_interval:
            return
        health = self._retrying(self.source.check)
        self._last_health = now
        report.null_cursor_rows = health.null_cursor_rows
        report.warnings.extend(health.warnings)

    # -- handler and commit ------------------------------------------------------------------

    def _call_handler(self, batch: Batch, claim: Claim) -> None:
        cfg = self.config
        self._log(
            logging.DEBUG, "batch_start", fence=batch.fence, rows=len(batch), attempt=batch.attempt
        )
        try:
            self._invoke(batch, claim)
        except _CommitBefore as before:
            raise before.error from before.error.__cause__  # the commit's, not the handler's
        except SinkFencedError:
            raise  # another owner claimed the poller: its attempt, not a failure of this batch
        except TransientSinkError as exc:
            # The sink's connection or commit failed (the batch was rolled back, or its commit
            # landed unanswered, which the next run's catch-up finds): infrastructure, not the
            # batch, so it does not count toward poison, until it has failed so at this position
            # `max_attempts` times in a row (an error no retry fixes, taken for a transient one):
            # from then on each one counts, so it cannot stall the poller unreported for ever.
            if claim.checkpoint.transient_failures < cfg.max_attempts:
                self._settle()
                cp = claim.checkpoint
                claim.try_write(
                    cp.failed(
                        fence=batch.fence, error=describe_error(exc), transient=True, counted=False
                    )
                )
                self._log(
                    logging.WARNING,
                    "sink_unavailable",
                    fence=batch.fence,
                    rows=len(batch),
                    transient_failures=cp.transient_failures + 1,
                    error=describe_error(exc),
                )
                raise
            self._log(
                logging.ERROR,
                "sink_error_repeats",
                fence=batch.fence,
                rows=len(batch),
                transient_failures=claim.checkpoint.transient_failures + 1,
                note="the_same_transient_error_at_this_position_counts_as_a_failed_attempt_now",
            )
            self._failed_attempt(batch, claim, exc, transient=True)
        except BaseException as exc:  # noqa: BLE001 - every way out but a return is a failure
            self._failed_attempt(batch, claim, exc)

    def _delivered(
        self,
        batch: Batch,
        rows: Sequence[SourceRow],
        claim: Claim,
        report: RunReport,
        began: float,
        *,
        handled: tuple[float, float] | None = None,
    ) -> None:
        """The handler took ``batch`` (during ``handled``): commit it (in flight while the next
        batch is read and handled); once it landed, tell the observer and source, count it."""
        pipe = self._pipe
        assert pipe is not None, "a batch is delivered only inside a run's loop"
        new = self._advanced(
            pipe.checkpoint,
            claim.fence,
            batch.position_after,
            len(batch),
            read_after=batch.position_before,
        )

        committing = self.clock.monotonic()

        def done(landed: float) -> None:
            self.observer.batch_committed(batch, landed - began)
            if handled is not None:
                self.observer.batch_timed(batch, BatchTiming(began, *handled, committing, landed))
            self._acknowledge(rows, batch)
            report.batches += 1
            report.rows += len(batch)
            report.position = new.position

        pipe.add(batch, new, done)

    def _invoke(self, batch: Batch, claim: Claim) -> None:
        """Call the handler; with a sink, inside the sink transaction that also stores the
        batch's mark (committed when the handler returned, rolled back when it raised)."""
        if self.sink is None:
            self._call(batch)
            return
        pipe = self._pipe
        # The batch's number: the record's once every batch handed to the commits has landed.
        sequence = (pipe.checkpoint if pipe is not None else claim.checkpoint).stats.batches + 1
        with self.sink.transaction(self.config.key, batch, sequence) as writer:
            if writer is None:
                self._log(
                    logging.WARNING,
                    "batch_already_in_sink",
                    fence=batch.fence,
                    rows=len(batch),
                    sequence=sequence,
                    note="the sink committed this batch before; only the checkpoint moves",
                )
                return
            self._call(batch, writer)
            # A sink may hold one batch the checkpoint does not (the catch-up's rule), never
            # two: the checkpoint commit of the batch before (in flight while this handler ran)
            # lands before this batch's sink transaction commits; if it failed, this one rolls
            # back with its error.
            try:
                self._settle()
            except BaseException as exc:
                raise _CommitBefore(exc) from exc

    def _settle(self) -> None:
        """Wait for the commit in flight (if any) and report it, or raise its error."""
        if self._pipe is not None:
            self._pipe.settle()

    def _call(self, batch: Batch, *sink: Any) -> None:
        result = self.handler(batch, *sink)
        if inspect.isawaitable(result):
            check_result(HANDLER_LOOP.run(result), self.handler, awaited=True)
        else:
            check_result(result, self.handler, awaited=False)

    def _catch_up_with_sink(self, claim: Claim) -> None:
        if self.sink is None:
            return
        catch_up_with_sink(
            self.sink,
            claim,
            self.config.key,
            retrying=self._retrying,
            advanced=lambda position, rows, before: self._advanced(
                claim.checkpoint, claim.fence, position, rows, read_after=before
            ),
            log=self._log,
        )

    def _advanced(
        self,
        base: Checkpoint,
        fence: int,
        position: Position,
        rows: int,
        *,
        read_after: Position | None,
    ) -> Checkpoint:
        """``base`` moved to ``position`` by a batch of ``rows`` read after ``read_after``
        under ``fence`` (the only-forward and fence rules of :meth:`Checkpoint.advanced`)."""
        cfg = self.config
        try:
            return base.advanced(
                position,
                fence=fence,
                at=self.clock.now(),
                rows=rows,
                source=self.source.description,
                read_after=read_after,
            )
        except PositionNotForwardError as exc:
            raise PositionRegressionError(
                cfg.key.poller, str(exc.stored), str(exc.proposed), cfg.namespace
            ) from exc

    def _acknowledge(self, rows: Sequence[SourceRow], batch: Batch) -> None:
        """After the commit: let a source act on the acknowledged rows (an outbox deletes them).

        Best effort. The batch is acknowledged already; rows the source fails to act on stay in
        the table, below the checkpoint, where the source reports them.
        """
        if self._acknowledger is None:
            return
        try:
            self._retrying(self._acknowledger.acknowledge, rows, batch.position_after)
        except Exception as exc:  # noqa: BLE001 - acknowledged already; keep the run going
            self._log(
                logging.WARNING,
                "acknowledge_failed",
                fence=batch.fence,
                rows=len(rows),
                error=f"{type(exc).__name__}: {exc}",
            )

    # -- helpers -----------------------------------------------------------------------------

    def _log(self, level: int, action: str, **fields: object) -> None:
        if self.config.chunk is not None:
            fields["chunk"] = self.config.chunk
        log_event(
            logger,
            level,
            action,
            poller=self.config.name,
            namespace=self.config.namespace,
            **fields,
        )
