"""A poller definition: what the decorator records and what every runner executes.

Runners (the Functions timer, ``afdb run``, backfill) share this one object, so a poller behaves
the same wherever it runs. Settings (``%NAME%``) are resolved at run time from the environment.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import itertools
import logging
import os
import socket
import threading
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from croniter import croniter

from azure_functions_db.core.clock import Clock, SystemClock
from azure_functions_db.core.engine import Engine, Handler, PollerConfig, RunReport
from azure_functions_db.core.logs import log_event
from azure_functions_db.core.ports import Source, StateStore, TransactionalSink
from azure_functions_db.core.settings import setting_name, setting_value
from azure_functions_db.errors import ConfigurationError
from azure_functions_db.observers.telemetry import metrics_observer
from azure_functions_db.observers.tracing import observers, traces_observer
from azure_functions_db.runtime.knobs import alias_knobs, resolve_knobs
from azure_functions_db.runtime.settings import AppSettings

logger = logging.getLogger(__name__)


def resolve_schedule(schedule: str, settings: Mapping[str, str], poller: str) -> str:
    """The NCRONTAB expression of ``schedule``, reading ``%NAME%`` from ``settings``."""
    name = setting_name(schedule)
    if name is None:
        return schedule
    resolved = setting_value(settings, name, f"the schedule of poller `{poller}`")
    try:
        validate_schedule(resolved, poller)
    except ConfigurationError as exc:
        raise ConfigurationError(
            f"{exc} (The schedule was read from app setting `{name}`.)"
        ) from None
    return resolved


def validate_schedule(schedule: str, poller: str) -> None:
    """Check an NCRONTAB expression: six fields, seconds first (``*/30 * * * * *``)."""
    if setting_name(schedule) is not None:
        return
    fields = schedule.split()
    if len(fields) != 6 or not croniter.is_valid(schedule, second_at_beginning=True):
        raise ConfigurationError(
            f"Invalid schedule `{schedule}` for poller `{poller}`: Azure Functions timers use "
            "NCRONTAB with six fields, seconds first: `{second} {minute} {hour} {day} {month} "
            '{day-of-week}`, e.g. `"0 */5 * * * *"` (every 5 minutes) or `"*/30 * * * * *"` '
            "(every 30 seconds). Use `%SETTING%` to read it from an app setting."
        )


def schedule_interval(schedule: str, now: dt.datetime) -> float:
    """The longest gap between the next few fires of an NCRONTAB ``schedule`` after ``now``
    (seconds): what "one interval" means for liveness, even on an irregular schedule."""
    fires = croniter(schedule, now, second_at_beginning=True)
    times = [fires.get_next(dt.datetime) for _ in range(9)]
    return max((b - a).total_seconds() for a, b in itertools.pairwise(times))


def default_owner() -> str:
    """A readable, unique lease owner: instance (or host), pid and a random suffix."""
    instance = os.environ.get("WEBSITE_INSTANCE_ID", "")[:12] or socket.gethostname()
    return f"{instance}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


#: Environment variables that only a Functions host (in Azure, or `func start`) sets for its worker:
#: the App Service instance and site name, the host's script root, and the worker runtime (an app
#: setting on most plans; Flex Consumption sets it itself). Not `CONTAINER_NAME`: Linux Consumption
#: sets it, but so do unrelated container platforms (our CI machines among them).
HOST_MARKERS = (
    "WEBSITE_INSTANCE_ID",
    "WEBSITE_SITE_NAME",
    "AzureWebJobsScriptRoot",
    "FUNCTIONS_WORKER_RUNTIME",
)


def under_functions_host(settings: Mapping[str, str]) -> bool:
    """Whether this process runs under an Azure Functions host (in Azure or ``func start``)."""
    return any(settings.get(name) for name in HOST_MARKERS)


def default_state_store(settings: Mapping[str, str]) -> StateStore:
    """The state store used when a poller has no ``state=``.

    Under a Functions host (deployed, or ``func start`` with Azurite): a
    :class:`~azure_functions_db.state.blob.BlobStateStore` on the ``AzureWebJobsStorage``
    account, shared by every instance. Elsewhere (``afdb run``, ``afdb demo``, tests): a
    :class:`~azure_functions_db.state.local.LocalStateStore` in ``$AFDB_STATE_DIR`` or
    ``./.afdb/state``. The setting ``AFDB_STATE`` (``local`` or ``azure``; ``afdb --state``)
    chooses instead.
    """
    chosen = AppSettings.read(settings).state
    if chosen == "azure" or (chosen is None and under_functions_host(settings)):
        try:
            from azure_functions_db.state.blob import BlobStateStore
        except ImportError as exc:
            raise ConfigurationError(
                "Pollers under a Functions host keep their state in Azure Blob Storage by "
                "default, which needs the `azure` extra: add `afdb[azure]` to "
                "requirements.txt (or pass another shared store as `state=`)."
            ) from exc
        store: StateStore = BlobStateStore(settings=settings)
    else:
        from azure_functions_db.state.local import LocalStateStore

        store = LocalStateStore(AppSettings.read(settings).state_dir)
    log_event(logger, logging.INFO, "state_store_default", store=store.describe())
    return store


@dataclass(frozen=True, eq=False)
class ShardGroup:
    """The pollers one decorator defines over one table (``shards=``, ``resharded_from=``):
    ``source`` unsharded, ``count`` shards (1: not sharded), ``resharded_from`` the count before
    a reshard (``None``: none pending)."""

    name: str
    source: Source
    count: int
    resharded_from: int | None = None


def with_shards(definitions: Mapping[str, PollerDefinition], names: Iterable[str]) -> list[str]:
    """``names``, a sharded poller's name standing for its shards (unless a poller is so named)."""
    shards: dict[str, list[str]] = {}
    for name, definition in definitions.items():
        if definition.group is not None and definition.group.name != name:
            shards.setdefault(definition.group.name, []).append(name)
    return [
        n for name in names for n in ([name] if name in definitions else shards.get(name, [name]))
    ]


@dataclass(eq=False)
class PollerDefinition:
    """Everything one decorated poller needs to run."""

    config: PollerConfig
    schedule: str
    source: Source
    handler: Handler
    state: StateStore | None = None
    sink: TransactionalSink | None = None
    run_on_startup: bool = False
    use_monitor: bool | None = None
    clock: Clock = field(default_factory=SystemClock)
    knobs: Mapping[str, str] = field(default_factory=dict)  # knob -> setting name
    defaults: frozenset[str] = frozenset()  # knobs the decorator left at their defaults
    group: ShardGroup | None = None  # the pollers of one decorator, for ``afdb reshard``
    _engine: Engine | None = field(default=None, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    @property
    def name(self) -> str:
        return self.config.name

    def store(self, settings: Mapping[str, str] | None = None) -> StateStore:
        """The state store this poller uses (``state=``, or the default for this machine)."""
        if self.state is None:
            self.state = default_state_store(os.environ if settings is None else settings)
        return self.state

    def engine(self, settings: Mapping[str, str] | None = None) -> Engine:
        """The engine for this poller, made once per process.

        It records OpenTelemetry metrics when ``opentelemetry-api`` is installed, unless the
        setting ``AFDB_OTEL_METRICS`` is ``false`` (see
        :mod:`azure_functions_db.observers.telemetry`).
        """
        with self._lock:
            if self._engine is None:
                env = os.environ if settings is None else settings
                config = dataclasses.replace(
                    self.config_for(env), stall_after=self.stall_after(env)
                )
                self._engine = Engine(
                    config,
                    self.source,
                    self.store(settings),
                    self.handler,
                    self.clock,
                    owner=default_owner(),
                    observer=observers(
                        metrics_observer(self.source, env, clock=self.clock),
                        traces_observer(env, clock=self.clock),
                    ),
                    sink=self.sink,
                )
            return self._engine

    def config_for(self, settings: Mapping[str, str]) -> PollerConfig:
        """The configuration with its knobs read from ``settings`` (``batch_size="%NAME%"``
        and the like; see :mod:`azure_functions_db.runtime.knobs`)."""
        values = resolve_knobs(self.knobs, settings, self.name)
        read_from = dict(self.knobs)
        if self.defaults and _reads_mysql(self.source, settings):
            for knob, (value, name) in alias_knobs(self.defaults, settings, self.name).items():
                values[knob], read_from[knob] = value, name
        if not values:
            return self.config
        try:
            return dataclasses.replace(self.config, **values)
        except ConfigurationError as exc:  # a range that depends on another knob
            names = ", ".join(f"`{read_from[k]}`" for k in values)
            raise ConfigurationError(f"{exc} (read from the app setting(s) {names})") from None

    def stall_after(self, settings: Mapping[str, str]) -> float | None:
        """Seconds without a successful run after which this poller counts as stalled:
        ``stall_intervals`` schedule intervals (``None`` when the schedule's setting is not
        set here)."""
        try:
            schedule = resolve_schedule(self.schedule, settings, self.name)
        except ConfigurationError:
            return None
        return self.config.stall_runs * schedule_interval(schedule, self.clock.now())

    def run_once(
        self, settings: Mapping[str, str] | None = None, *, manual: bool = False
    ) -> RunReport:
        """One run with settings from ``settings`` (default: the environment, read now);
        ``manual`` for a run started by hand (``afdb run --once``)."""
        env = dict(os.environ) if settings is None else settings
        log_event(logger, logging.DEBUG, "run_start", poller=self.name)
        return self.engine(env).run(env, manual=manual)


def _reads_mysql(source: Source, settings: Mapping[str, str]) -> bool:
    """Whether ``source`` is a SQL source on MySQL/MariaDB (its URL as ``settings`` give it),
    without connecting."""
    from azure_functions_db.sources import urls
    from azure_functions_db.sources.sqlalchemy import SqlSource

    if not isinstance(source, SqlSource):
        return False
    try:
        url = urls.resolve_url(source.url_template, settings, "SqlSource")
    except ConfigurationError:
        return False  # the URL's setting is missing: opening the source says so
    return url.get_backend_name() in ("mysql", "mariadb")
