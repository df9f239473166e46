"""``PollerBlueprint``: the decorator users put on handlers in ``function_app.py``.

This package is the only code that imports ``azure.functions``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
from collections.abc import Callable
from typing import Any, Literal, TypeVar

import azure.functions as func

from azure_functions_db.core.arguments import known_arguments
from azure_functions_db.core.commits import check_coalescing
from azure_functions_db.core.engine import Handler, PollerConfig
from azure_functions_db.core.handler import check_handler
from azure_functions_db.core.logs import log_event
from azure_functions_db.core.ports import Source, StateStore, TransactionalSink
from azure_functions_db.errors import (
    ConfigurationError,
)
from azure_functions_db.functions.retry import FunctionsRetry
from azure_functions_db.runtime.knobs import knob_settings
from azure_functions_db.runtime.poller import PollerDefinition, ShardGroup, validate_schedule
from azure_functions_db.sources.shards import Shard, check_shards

logger = logging.getLogger(__name__)

H = TypeVar("H", bound=Handler)


def function_name_for(poller: str) -> str:
    """The Functions function name of a poller: ``poll_<name>`` with only ``[A-Za-z0-9_]``."""
    return "poll_" + re.sub(r"[^A-Za-z0-9_]", "_", poller)


class PollerBlueprint(func.Blueprint):
    """A ``func.Blueprint`` whose :meth:`poller` decorator turns a handler into a poller.

    This is not a native database trigger: it is a polling trigger built on Azure Functions
    timers. Delivery is at-least-once and handlers must be idempotent (use ``Change.event_id``).

    Register it like any blueprint: ``app.register_functions(db)``.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]
        self.pollers: dict[str, PollerDefinition] = {}
        self._function_names: dict[str, str] = {}

    @known_arguments("poller")
    def poller(
        self,
        *,
        name: str,
        schedule: str,
        source: Source,
        batch_size: int | str | None = None,
        state: StateStore | None = None,
        sink: TransactionalSink | None = None,
        namespace: str = "live",
        time_budget: float | str = 240.0,
        lease_duration: float = 30.0,
        max_attempts: int | str = 5,
        poison: Literal["halt", "quarantine"] = "halt",
        bisect: bool = True,
        stall_intervals: int = 5,
        pipeline: bool = True,
        checkpoint_every: int | None = None,
        checkpoint_seconds: float | None = None,
        poll_interval: float | str | None = None,
        start: Literal["beginning", "now"] = "beginning",
        run_on_startup: bool = False,
        use_monitor: bool | None = None,
        retry: FunctionsRetry | None = None,
        hold_warning: float = 300.0,
        shards: int | None = None,
        resharded_from: int | None = None,
    ) -> Callable[[H], H]:
        """Poll ``source`` on ``schedule`` and call the decorated handler with each batch.

        This is not a native database trigger: it is a polling trigger built on Azure Functions
        timers. Delivery is at-least-once; handlers must be idempotent.

        Args:
            name: Stable poller id. The checkpoint is keyed by it, never by the function name,
                so renaming the Python function does not restart from zero.
            schedule: NCRONTAB with six fields, seconds first (``"*/30 * * * * *"``), or
                ``"%SETTING%"``.
            source: Where the rows come from, e.g. ``afdb.SqlSource(...)``.
            batch_size: Rows per handler call (default 1000; a poller on MySQL without it reads
                Azure's MySQL trigger setting ``MySql_Trigger_MaxBatchSize`` if the app has
                it, and ``poll_interval`` likewise ``MySql_Trigger_PollingIntervalMs``, in
                milliseconds). ``batch_size``, ``time_budget``,
                ``max_attempts`` and ``poll_interval`` may also be ``"%NAME%"``: read from the app
                setting NAME when the poller's first run in a process starts (so an app setting
                change, which restarts the app, tunes it without a redeploy); a bad value fails
                that run with an error naming the setting and the allowed range.
            state: Where checkpoints and leases live. Default: a local file store
                (``$AFDB_STATE_DIR`` or ``./.afdb/state``) for ``afdb run``; on Azure pass a
                shared store.
            sink: A transactional sink, e.g. ``afdb.SqlSink(url="%TARGET_DB_URL%")``: the
                handler takes a second argument, the sink's writer, and what it writes
                commits together with the batch's position (effectively-once; see
                ``docs/sinks.md``).
            namespace: Checkpoint namespace (``live`` for polling).
            time_budget: Seconds after which a run starts no new batch; keep it well below the
                host's ``functionTimeout``.
            lease_duration: Seconds the lease lives without renewal (15-60 on Azure).
            max_attempts: Failures of one batch before it is reported as poison.
            poison: Poison policy: ``"halt"`` retries the batch on every run and alerts;
                ``"quarantine"`` parks it in a quarantine record in the state store (written
                before the checkpoint moves past it) and goes on; ``afdb quarantine`` lists,
                replays and drops the records (``docs/operations.md``).
            bisect: With ``"quarantine"``: split a poison batch until its failing rows are
                alone, so the good rows still reach the handler and only the bad ones are
                parked. ``False`` parks the whole batch.
            pipeline: Read and handle the next batch while the previous batch's checkpoint
                commit is in flight (at most one, strictly in order; a failed commit ends the
                run and nothing after it is acknowledged; the default). ``False`` commits each
                batch before reading the next.
            checkpoint_every: Coalesce checkpoint commits: one write per this many rows
                (several batches) instead of one per batch; a crash then delivers up to this
                many rows again, plus those read during the commit before (rows due while it is
                in flight go with the next commit). Not with ``sink``.
            checkpoint_seconds: Coalesce checkpoint commits: one write at least every this
                many seconds. With either, a run also commits at its end, before it counts a
                failure, and at least every ``lease_duration / 2`` seconds.
            poll_interval: Low-latency mode: a run that caught up waits this many seconds and
                reads again under the same lease until ``time_budget`` is spent, so rows reach
                the handler within about this long without a per-second timer. Schedule runs a
                little further apart than ``time_budget``.
            start: Where a new poller (no checkpoint yet) starts: ``"beginning"`` (the default)
                delivers every row already in the table; ``"now"`` makes the first run record
                the newest row as the checkpoint and deliver only what changes after it.
                Ignored once a checkpoint exists (``afdb seek`` moves it).
            stall_intervals: Schedule intervals without a successful run after which the
                poller counts as ``stalled`` (and runs in a row with a growing backlog after
                which it is ``falling_behind``): logged once per change of state, shown by
                ``afdb status``.
            run_on_startup: Passed to the timer trigger: also run when the host starts (and on
                every scale-out or restart). Harmless, since the lease keeps runs apart.
            use_monitor: Passed to the timer trigger (schedule monitoring, which lets the host
                fire a missed occurrence late as ``past_due``).
            retry: An optional host retry policy, ``afdb.FunctionsRetry(...)``, for failed
                runs; see :class:`~azure_functions_db.functions.retry.FunctionsRetry`.
            hold_warning: Seconds an open transaction may hold rows back behind the horizon
                before each run logs ``action=horizon_held`` as a WARNING (INFO before). The
                run's status is ``held_by_horizon`` either way.
            shards: Split the table over this many pollers (2-64), each its own timer
                function, lease, checkpoint and health record, named ``<name>.shard-<i>-of-<N>``
                (``afdb status`` lists them). A row goes to the shard of a stable hash of its
                primary key, so its versions stay in one shard, in order; ``Change.poller`` and
                ``event_id`` carry ``name`` in every shard. Needs a source that can shard
                (``SqlSource``) and, for an index range per shard, the index ``afdb validate``
                prints (``docs/scale.md``).
            resharded_from: The shard count the table was split over before (1: this poller
                unsharded) when ``shards`` changed: the new pollers wait (each run fails with
                ``ReshardError``) until ``afdb reshard APP --poller NAME`` drains the old ones to
                one position and starts the new ones there, with no gap and nothing delivered
                twice. Ignored by a poller that has a position.

        Decorating only records and validates the configuration: it does no I/O (no database,
        no storage, no network), so importing ``function_app.py`` under a Functions host can
        never fail or slow down because a database is missing or unreachable. A missing table
        or column is reported by that poller's runs, by ``afdb validate`` and when ``afdb run``
        starts.

        Raises:
            ConfigurationError: a bad schedule, batch size, name, handler or a duplicate poller
                name.
        """
        if (
            isinstance(stall_intervals, bool)
            or not isinstance(stall_intervals, int)
            or (stall_intervals < 1)
        ):
            raise ConfigurationError(
                f"`stall_intervals={stall_intervals!r}` must be a positive integer: schedule "
                "intervals without a successful run before the poller counts as stalled (e.g. "
                "`stall_intervals=5`)."
            )
        given = {
            "batch_size": batch_size,
            "time_budget": time_budget,
            "max_attempts": max_attempts,
            "poll_interval": poll_interval,
        }
        # Left out: the default, or Azure's MySQL trigger's setting (runtime.knobs.alias_knobs).
        defaults = frozenset(k for k in ("batch_size", "poll_interval") if given[k] is None)
        given = {k: v for k, v in given.items() if k not in defaults}
        knobs = knob_settings(given, name)
        # A knob read from a setting is checked when it is read; here it has its default.
        fixed: dict[str, Any] = {k: v for k, v in given.items() if k not in knobs}
        config = PollerConfig(
            name=name,
            namespace=namespace,
            lease_duration=lease_duration,
            **fixed,
            poison=poison,
            bisect=bisect,
            stall_runs=stall_intervals,
            pipeline=pipeline,
            checkpoint_every=checkpoint_every,
            checkpoint_seconds=checkpoint_seconds,
            hold_warning=hold_warning,
            start=start,
            resharded_from=resharded_from,
        )
        validate_schedule(schedule, name)
        if retry is not None and not isinstance(retry, FunctionsRetry):
            raise ConfigurationError(
                f"`retry={retry!r}` is not a host retry policy: pass e.g. "
                '`afdb.FunctionsRetry("fixed_delay", max_retry_count=2, '
                'delay_interval="00:00:30")`, or leave it unset.'
            )
        if not isinstance(source, Source):
            raise ConfigurationError(
                f"`source={source!r}` is not a source; pass e.g. "
                '`afdb.SqlSource(url="%ORDERS_DB_URL%", table="orders", cursor="updated_at", '
                'pk="id")`.'
            )

        if sink is not None and not isinstance(sink, TransactionalSink):
            raise ConfigurationError(
                f"`sink={sink!r}` is not a transactional sink; pass e.g. "
                '`afdb.SqlSink(url="%TARGET_DB_URL%")`, or leave it unset.'
            )
        check_coalescing(config, sink=sink is not None)
        parts = [(config, source)] if shards is None else _shards(config, source, shards)
        if resharded_from is not None and resharded_from == (shards or 1):
            raise ConfigurationError(
                f"`resharded_from={resharded_from}` (poller `{name}`) must differ from the shard "
                f"count now ({shards or 1}): it is the count before the reshard."
            )
        group = ShardGroup(name, source, shards or 1, resharded_from)
        for part, _ in parts:
            self._check_unique(part.name)

        def decorate(handler: H) -> H:
            check_handler(handler, name, sink=sink is not None)
            for part, part_source in parts:
                definition = PollerDefinition(
                    config=part,
                    schedule=schedule,
                    source=part_source,
                    handler=handler,
                    state=state,
                    sink=sink,
                    run_on_startup=run_on_startup,
                    use_monitor=use_monitor,
                    knobs=knobs,
                    defaults=defaults,
                    group=group,
                )
                self._register(definition, retry)
            return handler

        return decorate

    def _check_unique(self, name: str) -> None:
        fname = function_name_for(name)
        if name in self.pollers or fname in self._function_names:
            other = self._function_names.get(fname, name)
            raise ConfigurationError(
                f"Duplicate poller name `{name}` (clashes with `{other}`): each poller needs its "
                "own stable name, since the name keys its checkpoint."
            )

    def _register(self, definition: PollerDefinition, retry: FunctionsRetry | None) -> None:
        name, fname = definition.name, function_name_for(definition.name)
        schedule, run_on_startup = definition.schedule, definition.run_on_startup
        use_monitor = definition.use_monitor
        self.pollers[name] = definition
        self._function_names[fname] = name
        function: Any = self.timer_trigger(
            arg_name="timer",
            schedule=schedule,
            run_on_startup=run_on_startup,
            use_monitor=use_monitor,
        )(_timer_function(definition, fname))
        if retry is not None:
            function = self.retry(
                strategy=retry.strategy,
                max_retry_count=str(retry.max_retry_count),
                delay_interval=retry.delay_interval,
                minimum_interval=retry.minimum_interval,
                maximum_interval=retry.maximum_interval,
            )(function)
        self.function_name(name=fname)(function)


def _shards(config: PollerConfig, source: Source, count: int) -> list[tuple[PollerConfig, Source]]:
    """The ``count`` shard pollers of ``config``: each its own name, the source's shard."""
    count = check_shards(count, config.name)
    split = getattr(source, "shard", None)
    if not callable(split):
        raise ConfigurationError(
            f"`shards={count}` (poller `{config.name}`) needs a source that can shard, e.g. "
            f"`afdb.SqlSource(...)`; `{type(source).__name__}` cannot."
        )
    parts = []
    for index in range(count):
        shard = Shard(index, count)
        name = shard.poller_name(config.name)
        if len(name) > 63:
            raise ConfigurationError(
                f"Poller name `{config.name}` is too long for {count} shards: its shards are "
                f"named `{name}`, at most 63 characters; shorten `name=`."
            )
        parts.append(
            (dataclasses.replace(config, name=name, group=config.name), split(index, count))
        )
    return parts


def _timer_function(definition: PollerDefinition, fname: str) -> Callable[[func.TimerRequest], Any]:
    """The Functions entry point: exactly one parameter, the timer."""

    async def timer(timer: func.TimerRequest) -> None:
        if timer.past_due:
            log_event(logger, logging.INFO, "timer_past_due", poller=definition.name)
        # The run blocks on the database and storage; keep the worker's event loop free.
        await asyncio.to_thread(definition.run_once)

    timer.__name__ = fname
    timer.__qualname__ = fname
    return timer
