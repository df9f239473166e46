"""The soak's orchestrator: setup, writers, pollers, the seeded fault driver, the monitor, the
drain and the checker (``python -m soak``; ``make soak``).

The fault schedule (when, which kind, how long) is drawn from the seed alone, so a seed replays
it; which poller a fault hits is decided when it fires (the lease holder if there is one, since
that is where a fault does harm) and recorded in ``faults.jsonl``. Kinds:

``kill_poller``          SIGKILL a poller, start a replacement at once
``stop_poller``          SIGSTOP a poller for longer than its lease (16-21 s), then SIGCONT
``restart_azurite``      stop Azurite gracefully, start it on the same ports and data
``pause_azurite_short``  SIGSTOP Azurite for 1-4 s (shorter than the storage timeouts)
``pause_azurite_long``   SIGSTOP Azurite for 16-22 s (longer than the 15 s read timeout and
                         the lease)
``terminate_pollers``    ``pg_terminate_backend`` of every session of the pollers
``terminate_writer``     ``pg_terminate_backend`` of one writer's session (its COMMIT may be
                         cut off: an unknown outcome, resolved from the history table)
``skew_poller``          replace a poller with one whose wall clock is 30 s ahead or behind
                         (libfaketime; its monotonic clock, which the evidence uses, is not
                         moved) for 10-30 s, then with a normal one again
``slow_storage``         the pollers' storage answers 50-500 ms late per request for 5-20 s
                         (the fault proxy in front of Azurite's Blob and Queue services)
``drop_storage``         for 2-6 s the proxy drops every storage connection when the answer
                         arrives: the request landed, the poller never hears so
``refuse_db``            for 3-8 s the database refuses the pollers' new connections (the
                         proxy in front of it resets them; half the time it cuts the open ones
                         first, so the pollers must reconnect into the refusal)
``overrun_handler``      the lease holder's next handler call sleeps past its ``time_budget``
                         and its lease (48 s) before it writes anything

Besides the faults, a **burst** (``--burst``, default 200,000 rows, fewer in a short soak: 100 a
second of soak) is written by one more writer from 40% of the run on, in transactions of 500
rows, so writers outpace the pollers while faults go on.

Pollers (:class:`Poller`): on PostgreSQL three of one app on the writers' table, each with its
own processes competing for its lease: ``soak`` through a ``SqlSink`` (PostgreSQL's
``postgres`` database), ``soak_delta`` through a ``DeltaSink`` (read back with ``deltalake``)
and ``soak_queue`` through a ``QueueSink`` onto Azurite's queue (emptied by a consumer while the
soak runs, :mod:`soak.readback`), reading one row in ``queue_every`` (``where=``; the checker
owes it those rows' versions); ``--no-delta`` / ``--no-queue`` leave them out. The pollers
reach Azurite and the database through the fault proxies (:mod:`soak.proxy`); the driver's own
reads do not.

Evidence folder (kept; its path is printed): ``meta.json``, ``faults.jsonl``, ``writers/``
(the writers' evidence and output), ``history.json`` (the history table), ``pollers/`` (process
output), ``azurite/`` (its data and log), ``report.json``, and one folder per poller:
``events/`` (its handlers' and engines' events), ``samples.jsonl`` (the monitor's reads of its
checkpoint and lease every half second), ``sink.json`` (what its SqlSink or DeltaSink holds) or
``queue.jsonl`` (the messages its queue carried), ``quarantine.json`` and its ``meta.json``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import psycopg
import sqlalchemy as sa
from azure.storage.blob import ExponentialRetry
from psycopg import sql
from sqlalchemy.dialects import postgresql

import azure_functions_db as afdb
from azure_functions_db.sources.shards import Shard, expression_text
from devkit.azurite import DIE_WITH_PARENT, Azurite
from devkit.evidence import EvidenceLog
from soak.check import Report, check
from soak.handling import LEASE_SECONDS
from soak.proxy import FaultProxies
from soak.readback import QueueConsumer, delta_rows

REPO = Path(__file__).resolve().parent.parent
DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/test"
CONTAINER = "soak-state"
LEASE = LEASE_SECONDS  # the pollers' lease (soak.handling)
SAMPLE_EVERY = 0.5

#: Fault kinds and their weights in the schedule.
KINDS: dict[str, float] = {
    "kill_poller": 0.20,
    "stop_poller": 0.12,
    "restart_azurite": 0.07,
    "pause_azurite_short": 0.08,
    "pause_azurite_long": 0.05,
    "terminate_pollers": 0.12,
    "terminate_writer": 0.09,
    "skew_poller": 0.07,
    "slow_storage": 0.07,
    "drop_storage": 0.05,
    "refuse_db": 0.05,
    "overrun_handler": 0.04,
}
#: What ``skew_poller`` preloads (Debian's ``faketime``, installed by ``make debian-packages``),
#: and by how many seconds it moves the wall clock.
LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1")
SKEW_SECONDS = 30
SKEWED = Path(__file__).resolve().parent / "skewed"
#: ``overrun_handler``: past the time budget (30 s) and the lease, by 3 s.
OVERRUN_SECONDS = 30 + LEASE + 3
#: The drain's limit, however steady its progress.
DRAIN_LIMIT = 1800.0
#: The burst: its default size (100 rows a second of soak, at most 200,000), when it starts.
BURST_PER_SECOND, BURST_MAX, BURST_AT = 100, 200_000, 0.4


def default_burst(seconds: float) -> int:
    return min(BURST_MAX, round(BURST_PER_SECOND * seconds))


def sample(store: afdb.BlobStateStore, key: afdb.PollerKey, log: EvidenceLog) -> dict[str, Any]:
    """One monitor sample of ``key``: its checkpoint, then its lease, written to ``log``; the
    position and the lease holder (empty when the read failed)."""
    try:
        stored = store.read(key)
        lease = store.inspect(key)
    except Exception as exc:  # noqa: BLE001 - a failed read is a sample too
        log.write("sample", error=type(exc).__name__)
        return {}
    cp = stored.checkpoint if stored is not None else None
    position = None
    if cp is not None and cp.position is not None:
        position = [*cp.position.cursor, *cp.position.pk]
    log.write(
        "sample",
        cp_fence=None if cp is None else cp.fence,
        position=position,
        lease_fence=lease.fence,
        lease_state=lease.state,
        holder=lease.holder,
    )
    return {"position": position, "holder": lease.holder}


@dataclass(frozen=True)
class Options:
    seconds: float = 90.0
    seed: int = 1
    out: Path | None = None
    control: bool = False
    calm: bool = False  # no faults, and a handler that never fails, freezes or dawdles
    pollers: int = 2  # processes per poller, competing for its lease
    writers: int = 4
    fault_every: float = 4.0
    drain_timeout: float = 150.0  # the drain fails after this long without progress
    pg: str = DEFAULT_PG
    sink: bool = True  # False: no SqlSink, so the next handler runs while a commit is in flight
    checkpoint_every: int | None = None  # without a sink: coalesced commits
    poll_interval: float | None = None  # the low-latency mode: a run polls until its budget ends
    delta: bool = True  # the DeltaSink poller (PostgreSQL)
    queue: bool = True  # the QueueSink poller (PostgreSQL)
    queue_every: int = 4  # it forwards the rows whose id is a multiple of this (where=)
    shards: int = 1  # the SqlSink poller split over this many shards (shards=), each a poller
    burst: int | None = None  # rows; None: default_burst(seconds); 0: none
    without: frozenset[str] = frozenset()  # fault kinds left out

    @property
    def burst_rows(self) -> int:
        return default_burst(self.seconds) if self.burst is None else self.burst


@dataclass(frozen=True)
class Poller:
    name: str
    table: str
    mode: str  # "low" (low-latency) or "timer"
    sink: str  # "sql", "delta", "queue" or "none"
    every: int = 1  # it reads the rows whose id is a multiple of this (1: every row)
    group: str = ""  # one shard's poller: the name of the sharded poller (``shards=``)
    shard: int = 0  # its shard, from 0 ...
    shards: int = 1  # ... of this many

    @property
    def key(self) -> afdb.PollerKey:
        return afdb.PollerKey(namespace="live", poller=self.name)

    @property
    def spec(self) -> str:
        """How :mod:`soak.app` defines it: a sharded poller once, for all its shards."""
        name = self.group or self.name
        return f"{name}:{self.table}:{self.mode}:{self.sink}:{self.every}:{self.shards}"


def sharded(poller: Poller, count: int) -> list[Poller]:
    """``poller`` split over ``count`` shards: one poller each, named as the product names
    them (``soak.shard-0-of-3``); ``[poller]`` for one."""
    if count <= 1:
        return [poller]
    return [
        dataclasses.replace(
            poller,
            name=Shard(i, count).poller_name(poller.name),
            group=poller.name,
            shard=i,
            shards=count,
        )
        for i in range(count)
    ]


@dataclass(frozen=True)
class Fault:
    at: float  # seconds after the soak started
    kind: str
    draw: float  # decides duration (and the target when no poller holds the lease)

    @property
    def duration(self) -> float:
        other = (self.draw * 7919) % 1  # a second draw from the same number
        return {
            "stop_poller": LEASE + 1 + 5 * self.draw,
            "pause_azurite_short": 1 + 3 * self.draw,
            "pause_azurite_long": LEASE + 1 + 6 * self.draw,
            "skew_poller": 10 + 20 * self.draw,
            "slow_storage": 5 + 15 * other,
            "drop_storage": 2 + 4 * self.draw,
            "refuse_db": 3 + 5 * self.draw,
            "overrun_handler": OVERRUN_SECONDS,
        }.get(self.kind, 0.0)

    @property
    def skew(self) -> int:
        """``skew_poller``: the seconds the wall clock moves, ahead or behind by the draw."""
        return SKEW_SECONDS if int(self.draw * 1000) % 2 == 0 else -SKEW_SECONDS

    @property
    def latency(self) -> float:
        """``slow_storage``: seconds added to each request's round trip (50-500 ms)."""
        return round(0.05 + 0.45 * self.draw, 3)


def schedule(
    seed: int, seconds: float, every: float, without: frozenset[str] = frozenset()
) -> list[Fault]:
    """The faults of a soak: one every ``every`` seconds on average, none in the first 3 s or
    the last 3 s, drawn from ``seed`` alone (``without``: kinds left out). The first round has
    one fault of every kind, in a seeded order, closer together when the soak is too short for
    a round at ``every`` (CI's 45 s on each database still meets every kind)."""
    rng = random.Random(seed)  # noqa: S311 - a replayable schedule, not crypto
    kinds = [k for k in KINDS if k not in without]
    weights = [KINDS[k] for k in kinds]
    # Azurite's faults where none falls inside another's pause (it would be skipped): the
    # restart and the short pause first, the long pause last, the others between, shuffled.
    azurite = ("restart_azurite", "pause_azurite_short", "pause_azurite_long")
    others = [k for k in kinds if k not in azurite]
    order = [
        *(k for k in azurite[:2] if k in kinds),
        *rng.sample(others, len(others)),
        *(k for k in azurite[2:] if k in kinds),
    ]
    slot = min(every, (seconds - 6) / max(1, len(order)))
    faults = [
        Fault(round(3.0 + i * slot + rng.uniform(0, 0.5 * slot), 3), kind, rng.random())
        for i, kind in enumerate(order)
        if slot > 0
    ]
    at = 3.0 + len(order) * slot + rng.uniform(0.5 * every, 1.5 * every)
    while kinds and at < seconds - 3:
        faults.append(Fault(round(at, 3), rng.choices(kinds, weights)[0], rng.random()))
        at += rng.uniform(0.5 * every, 1.5 * every)
    return faults


@dataclass
class Slot:
    """One poller process's place: the poller it runs, the process in it now, and whether the
    driver froze it."""

    index: int
    poller: Poller
    process: subprocess.Popen[bytes] | None = None
    stopped_until: float | None = None
    generation: int = 0
    outputs: list[IO[bytes]] = field(default_factory=list)


class Soak:
    #: The module of a writer process.
    WRITER = "soak.writer"
    DB = "pg"

    def __init__(self, options: Options) -> None:
        self.o = options
        stamp = time.strftime("%Y%m%d-%H%M%S")
        self.out = options.out or REPO / ".afdb" / "soak" / f"{stamp}-seed{options.seed}"
        self.out.mkdir(parents=True, exist_ok=True)
        self.tag = uuid.uuid4().hex[:10]
        self.table = f"soak_{self.tag}"
        self.pollers = self.make_pollers()
        self.faults = EvidenceLog(self.out / "faults.jsonl")
        self.azurite = Azurite(self.out / "azurite")
        self.proxies: FaultProxies | None = None
        self.consumers: dict[str, QueueConsumer] = {}
        per = max(1, options.pollers)
        self.slots = [
            Slot(i, self.pollers[i % len(self.pollers)]) for i in range(per * len(self.pollers))
        ]
        self.samples_by = {
            p.name: EvidenceLog(self.out / p.name / "samples.jsonl") for p in self.pollers
        }
        self.latest_by: dict[str, dict[str, Any]] = {}
        self.writers: list[subprocess.Popen[bytes]] = []
        self.stop_monitor = threading.Event()
        self.harness: list[str] = []
        self.poller_exits = 0
        self.follow_ups: list[tuple[float, str, Callable[[], None]]] = []
        self.t0 = time.monotonic()
        self.writers_stopped: float | None = None
        self.burst_started = False

    def make_pollers(self) -> list[Poller]:
        """PostgreSQL: three pollers of the writers' table, one per sink (the first split over
        ``shards``)."""
        mode = "low" if self.o.poll_interval else "timer"
        first = Poller("soak", self.table, mode, "sql" if self.o.sink else "none")
        pollers = sharded(first, self.o.shards)
        if self.o.delta:
            pollers.append(Poller("soak_delta", self.table, mode, "delta"))
        if self.o.queue:
            pollers.append(Poller("soak_queue", self.table, mode, "queue", self.o.queue_every))
        return pollers

    @property
    def queue_name(self) -> str:
        return f"soak-{self.tag}"

    # -- setup ------------------------------------------------------------------------------

    def admin(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.o.pg, autocommit=True, application_name="soak-driver")

    @property
    def sink_pg(self) -> str:
        """The sink's database: ``postgres`` on the same server, so a handler's open sink
        transaction never holds the source's horizon (it counts only its own database)."""
        parts = urllib.parse.urlsplit(self.o.pg)
        return urllib.parse.urlunsplit(parts._replace(path="/postgres"))

    def sink_admin(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.sink_pg, autocommit=True, application_name="soak-driver")

    def create_tables(self) -> None:
        with self.admin() as conn:
            conn.execute(
                sql.SQL(
                    "CREATE TABLE {t} (id bigint PRIMARY KEY, version bigint NOT NULL, "
                    "writer int NOT NULL, updated_at timestamptz NOT NULL)"
                ).format(t=sql.Identifier(self.table))
            )
            conn.execute(
                sql.SQL("CREATE INDEX ON {t} (updated_at, id)").format(t=sql.Identifier(self.table))
            )
            history = sql.Identifier(f"{self.table}_history")
            slow = sql.Identifier(f"{self.table}_slow_commit")
            conn.execute(
                sql.SQL(
                    "CREATE TABLE {h} (id bigint, version bigint, slow boolean NOT NULL, "
                    "PRIMARY KEY (id, version))"
                ).format(h=history)
            )
            # A writer marks some transactions slow: their COMMIT then sleeps in this deferred
            # trigger, so a terminated session can lose COMMIT's answer (an unknown outcome).
            conn.execute(
                sql.SQL(
                    "CREATE FUNCTION {f}() RETURNS trigger LANGUAGE plpgsql AS "
                    "$$ BEGIN PERFORM pg_sleep(0.4); RETURN NULL; END $$"
                ).format(f=slow)
            )
            conn.execute(
                sql.SQL(
                    "CREATE CONSTRAINT TRIGGER {f} AFTER INSERT ON {h} DEFERRABLE INITIALLY "
                    "DEFERRED FOR EACH ROW WHEN (NEW.slow) EXECUTE FUNCTION {f}()"
                ).format(f=slow, h=history)
            )
        # What the handler writes through the SqlSink: one row per delivered version, no
        # unique key, so a batch applied twice shows as duplicates and a lost one as missing.
        with self.sink_admin() as conn:
            conn.execute(
                sql.SQL(
                    "CREATE TABLE {a} (n bigserial PRIMARY KEY, id bigint NOT NULL, "
                    "version bigint NOT NULL, fence bigint NOT NULL, pid int NOT NULL)"
                ).format(a=sql.Identifier(f"{self.table}_applied"))
            )

    def drop_tables(self) -> None:
        with self.sink_admin() as conn:
            for name in (f"{self.table}_applied", f"{self.table}_positions"):
                conn.execute(sql.SQL("DROP TABLE IF EXISTS {t}").format(t=sql.Identifier(name)))
        with self.admin() as conn:
            for name in (self.table, f"{self.table}_history"):
                conn.execute(sql.SQL("DROP TABLE IF EXISTS {t}").format(t=sql.Identifier(name)))
            conn.execute(
                sql.SQL("DROP FUNCTION IF EXISTS {f}()").format(
                    f=sql.Identifier(f"{self.table}_slow_commit")
                )
            )

    def db_address(self) -> tuple[str, int]:
        """The database server the fault proxy stands in front of."""
        url = urllib.parse.urlsplit(self.o.pg)
        return url.hostname or "127.0.0.1", url.port or 5432

    def proxied(self, url: str) -> str:
        """``url`` with the database's host and port replaced by its fault proxy's."""
        if self.proxies is None:
            return url
        parts = urllib.parse.urlsplit(url)
        userinfo, at, _ = parts.netloc.rpartition("@")
        netloc = f"{userinfo}{at}127.0.0.1:{self.proxies.ports['db']}"
        return urllib.parse.urlunsplit(parts._replace(netloc=netloc))

    def storage(self) -> str:
        """The pollers' storage connection string: Blob and Queue through the fault proxy."""
        text = self.azurite.connection_string
        if self.proxies is None:
            return text
        for name, endpoint in (
            ("blob", self.azurite.blob_endpoint),
            ("queue", self.azurite.queue_endpoint),
        ):
            parts = urllib.parse.urlsplit(endpoint)
            moved = parts._replace(netloc=f"127.0.0.1:{self.proxies.ports[name]}")
            text = text.replace(endpoint, urllib.parse.urlunsplit(moved))
        return text

    def env(self) -> dict[str, str]:
        poller_url = self.proxied(self.o.pg).replace("postgresql://", "postgresql+psycopg://", 1)
        sink_url = self.proxied(self.sink_pg).replace("postgresql://", "postgresql+psycopg://", 1)
        name = f"application_name={self.table}-poller"
        return {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
            "AzureWebJobsStorage": self.storage(),
            "SOAK_DB_URL": f"{poller_url}{'&' if '?' in poller_url else '?'}{name}",
            # The pollers' sink sessions share their application name: terminate_pollers cuts
            # them too, sometimes between a sink COMMIT and its answer.
            "SOAK_SINK_URL": f"{sink_url}{'&' if '?' in sink_url else '?'}{name}",
            "SOAK_PG": self.o.pg,
            "SOAK_TABLE": self.table,
            "SOAK_POLLERS": ",".join(dict.fromkeys(p.spec for p in self.pollers)),
            "SOAK_CONTAINER": CONTAINER,
            "SOAK_DELTA": str(self.out / "delta"),
            "SOAK_QUEUE": self.queue_name,
            "SOAK_OVERRUN": str(self.out / "overrun"),
            "SOAK_EVIDENCE": str(self.out / "writers"),
            "SOAK_DRAIN": str(self.out / "drain.flag"),
            "SOAK_STOP": str(self.out / "stop-writers.flag"),
            "SOAK_SEED": str(self.o.seed),
            "SOAK_WRITERS": str(self.o.writers),
            "SOAK_CONTROL": "1" if self.o.control else "0",
            "SOAK_CALM": "1" if self.o.calm else "0",
            "SOAK_CHECKPOINT_EVERY": str(self.o.checkpoint_every or ""),
            "SOAK_POLL_INTERVAL": str(self.o.poll_interval or ""),
        }

    def spawn(
        self, args: list[str], log: Path, extra: dict[str, str] | None = None
    ) -> tuple[subprocess.Popen[bytes], IO[bytes]]:
        log.parent.mkdir(parents=True, exist_ok=True)
        output = log.open("ab")
        process = subprocess.Popen(
            [sys.executable, *args],
            cwd=REPO,
            env={**self.env(), **(extra or {})},
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            preexec_fn=DIE_WITH_PARENT,  # noqa: PLW1509 - prctl only
        )
        return process, output

    def start_poller(self, slot: Slot, extra: dict[str, str] | None = None) -> None:
        poller = slot.poller
        slot.generation += 1
        process, output = self.spawn(
            ["-m", "azure_functions_db", "run", "soak.app", "--poller", poller.name],
            self.out / "pollers" / f"{poller.name}-slot{slot.index}-{slot.generation}.log",
            {"SOAK_EVENTS": str(self.out / poller.name / "events"), **(extra or {})},
        )
        slot.process, slot.stopped_until = process, None
        slot.outputs.append(output)

    def start_writer(self, index: int, *args: str) -> None:
        process, _ = self.spawn(
            ["-m", self.WRITER, str(index), *args], self.out / "writers" / f"writer-{index}.log"
        )
        self.writers.append(process)

    def start_proxies(self) -> None:
        """The fault proxies in front of Azurite's Blob and Queue services and the database."""
        blob = urllib.parse.urlsplit(self.azurite.blob_endpoint)
        queue = urllib.parse.urlsplit(self.azurite.queue_endpoint)
        self.proxies = FaultProxies(
            {
                "blob": (blob.hostname or "127.0.0.1", blob.port or 0),
                "queue": (queue.hostname or "127.0.0.1", queue.port or 0),
                "db": self.db_address(),
            },
            self.out / "proxy.log",
        )

    def start_consumers(self) -> None:
        for p in self.pollers:
            if p.sink == "queue":
                consumer = QueueConsumer(
                    self.azurite.connection_string,
                    self.queue_name,
                    self.out / p.name / "queue.jsonl",
                )
                consumer.start()
                self.consumers[p.name] = consumer

    # -- the monitor ------------------------------------------------------------------------

    def monitor_store(self) -> afdb.BlobStateStore:
        """The monitor's own view of the state: no retries, short timeouts."""
        return afdb.BlobStateStore(
            container=CONTAINER,
            settings={"AzureWebJobsStorage": self.azurite.connection_string},
            client_options={
                "connection_timeout": 2,
                "read_timeout": 3,
                "retry_policy": ExponentialRetry(retry_total=0),
            },
        )

    def monitor(self) -> None:
        """Every half second, each poller's checkpoint, then its lease (the lease's fence can
        only be higher than the checkpoint's read before it)."""
        store = self.monitor_store()
        while not self.stop_monitor.wait(SAMPLE_EVERY):
            for p in self.pollers:
                seen = sample(store, p.key, self.samples_by[p.name])
                self.latest_by[p.name] = seen or self.latest_by.get(p.name, {})

    # -- faults -----------------------------------------------------------------------------

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def record(self, kind: str, **fields: Any) -> None:
        self.faults.write("fault", kind=kind, at=round(self.elapsed(), 3), **fields)

    def later(self, seconds: float, what: str, action: Callable[[], None]) -> None:
        self.follow_ups.append((self.elapsed() + seconds, what, action))

    def target(self, draw: float) -> Slot:
        """A process of the poller ``draw`` picks: the one holding its lease if a live one
        does (that is where a fault does harm), else one picked by ``draw``."""
        poller = self.pollers[min(len(self.pollers) - 1, int(draw * len(self.pollers)))]
        mine = [s for s in self.slots if s.poller == poller]
        live = [s for s in mine if s.stopped_until is None and s.process is not None]
        holder = self.latest_by.get(poller.name, {}).get("holder") or ""
        pid = holder.split(":")[1] if holder.count(":") >= 2 else ""
        for slot in live:
            if slot.process is not None and str(slot.process.pid) == pid:
                return slot
        pool = live or mine
        within = (draw * len(self.pollers)) % 1
        return pool[min(len(pool) - 1, int(within * len(pool)))]

    def inject(self, fault: Fault) -> None:
        kind = fault.kind
        if kind in ("kill_poller", "stop_poller"):
            slot = self.target(fault.draw)
            if slot.process is None:
                self.start_poller(slot)
            assert slot.process is not None
            pid = slot.process.pid
            if kind == "kill_poller":
                self.kill(slot)
                self.start_poller(slot)
                self.record(kind, pid=pid, replacement=slot.process.pid)
            else:
                os.kill(pid, signal.SIGSTOP)
                slot.stopped_until = self.elapsed() + fault.duration
                self.record(kind, pid=pid, seconds=round(fault.duration, 2))
                self.later(fault.duration, "resume_poller", lambda: self.resume(slot, pid))
        elif kind.startswith(("restart_azurite", "pause_azurite")):
            if self.azurite.paused:
                self.record(kind, skipped="azurite already paused")
            elif kind == "restart_azurite":
                began = time.monotonic()
                self.azurite.restart()
                self.record(kind, seconds=round(time.monotonic() - began, 2))
            else:
                self.azurite.pause()
                self.record(kind, seconds=round(fault.duration, 2))
                self.later(fault.duration, "resume_azurite", self.azurite.resume)
        elif kind == "terminate_pollers":
            self.record(kind, sessions=self.terminate(f"{self.table}-poller"))
        elif kind == "terminate_writer":
            name = f"{self.table}-writer-{int(fault.draw * self.o.writers)}"
            self.record(kind, application=name, sessions=self.terminate(name))
        else:
            {"skew_poller": self.skew, "overrun_handler": self.overrun}.get(
                kind, self.switch_proxy
            )(fault)

    def switch_proxy(self, fault: Fault) -> None:
        """``slow_storage``, ``drop_storage``, ``refuse_db``: switch the fault proxy's fault on
        for the fault's duration."""
        proxies = self.proxies
        if proxies is None:
            self.record(fault.kind, skipped="no fault proxy")
            return
        seconds = round(fault.duration, 2)
        names = ("db",) if fault.kind == "refuse_db" else ("blob", "queue")
        command, on, off = {
            "slow_storage": ("delay", str(fault.latency / 2), "0"),
            "drop_storage": ("drop", "1", "0"),
            "refuse_db": ("refuse", "1", "0"),
        }[fault.kind]
        cut = fault.kind == "refuse_db" and fault.draw < 0.5
        for name in names:
            proxies.send(name, command, on)
            if cut:
                proxies.send(name, "abort")
        extra = {"latency": fault.latency} if fault.kind == "slow_storage" else {}
        self.record(fault.kind, seconds=seconds, cut_open_connections=cut, **extra)

        def undo() -> None:
            for name in names:
                proxies.send(name, command, off)
            self.faults.write("proxy_restored", kind=fault.kind)

        self.later(fault.duration, f"undo_{fault.kind}", undo)

    def overrun(self, fault: Fault) -> None:
        """Order the next handler call of the poller ``fault.draw`` picks to sleep past its
        budget and its lease (whichever of its processes makes that call)."""
        poller = self.target(fault.draw).poller
        folder = self.out / "overrun"
        folder.mkdir(exist_ok=True)
        order = folder / poller.name
        order.with_suffix(".tmp").write_text(str(OVERRUN_SECONDS))
        order.with_suffix(".tmp").replace(order)
        self.record(fault.kind, poller=poller.name, seconds=OVERRUN_SECONDS)

    def skew(self, fault: Fault) -> None:
        """Replace the target poller with one whose wall clock is ``fault.skew`` seconds off,
        and that one with a normal poller ``fault.duration`` seconds later (unless another
        fault replaced it first)."""
        if not LIBFAKETIME.is_file():
            self.record(fault.kind, skipped=f"{LIBFAKETIME} missing: make debian-packages")
            return
        slot = self.target(fault.draw)
        pid = slot.process.pid if slot.process is not None else None
        self.kill(slot)
        self.start_poller(
            slot,
            {
                "LD_PRELOAD": str(LIBFAKETIME),
                "FAKETIME": f"{fault.skew:+d}s",
                "FAKETIME_DONT_FAKE_MONOTONIC": "1",
                # soak/skewed/sitecustomize.py: time.sleep that works under libfaketime
                "PYTHONPATH": os.pathsep.join([str(SKEWED), self.env()["PYTHONPATH"]]),
            },
        )
        assert slot.process is not None
        generation = slot.generation
        self.record(
            fault.kind,
            pid=pid,
            replacement=slot.process.pid,
            poller=slot.poller.name,
            skew_seconds=fault.skew,
            seconds=round(fault.duration, 2),
        )

        def unskew() -> None:
            if slot.generation != generation or slot.process is None:
                return  # replaced meanwhile, by a poller with the right clock
            skewed = slot.process.pid
            self.kill(slot)
            self.start_poller(slot)
            assert slot.process is not None
            self.faults.write("unskewed", pid=skewed, replacement=slot.process.pid)

        self.later(fault.duration, "unskew_poller", unskew)

    def terminate(self, application: str) -> int:
        with self.admin() as conn:
            rows = conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = %s",
                (application,),
            ).fetchall()
        return len(rows)

    def resume(self, slot: Slot, pid: int) -> None:
        if slot.process is not None and slot.process.pid == pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
            slot.stopped_until = None
            self.faults.write("resumed", pid=pid)

    def kill(self, slot: Slot) -> None:
        if slot.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(slot.process.pid, signal.SIGKILL)
        slot.process.wait()
        slot.process = None

    def run_follow_ups(self, everything: bool = False) -> None:
        due = [f for f in self.follow_ups if everything or f[0] <= self.elapsed()]
        for item in due:
            self.follow_ups.remove(item)
            item[2]()

    def watch_pollers(self) -> None:
        """A poller that exited on its own is a finding (``afdb run`` must not exit); restart
        it so the soak goes on."""
        for slot in self.slots:
            if slot.process is not None and slot.process.poll() is not None:
                self.poller_exits += 1
                self.faults.write(
                    "poller_exited", pid=slot.process.pid, code=slot.process.returncode
                )
                self.start_poller(slot)

    # -- the run ----------------------------------------------------------------------------

    def run(self) -> Report:
        o = self.o
        print(f"soak: seed {o.seed}, {o.seconds:.0f}s, evidence in {self.out}", flush=True)
        self.azurite.start()
        self.create_tables()
        monitor = threading.Thread(target=self.monitor, name="soak-monitor", daemon=True)
        try:
            self.start_proxies()
            self.start_consumers()
            self.t0 = time.monotonic()
            for i in range(o.writers):
                self.start_writer(i)
            for slot in self.slots:
                self.start_poller(slot)
            monitor.start()
            self.drive([] if o.calm else schedule(o.seed, o.seconds, o.fault_every, o.without))
            self.drain()
        finally:
            self.stop_monitor.set()
            for slot in self.slots:
                self.kill(slot)
            for writer in self.writers:
                writer.kill()
                writer.wait()
            monitor.join(timeout=10)
            for consumer in self.consumers.values():
                consumer.stop()
            if self.proxies is not None:
                self.proxies.close()
            self.dump_history()
            self.dump_shards()
            self.dump_sinks()
            self.dump_quarantine()
            self.write_meta()
            self.drop_tables()
            self.azurite.stop()
        report = check(self.out)
        (self.out / "report.json").write_text(json.dumps(report.to_json(), indent=2, default=str))
        return report

    def drive(self, faults: list[Fault]) -> None:
        pending = list(faults)
        last_note = 0.0
        while self.elapsed() < self.o.seconds:
            self.run_follow_ups()
            while pending and pending[0].at <= self.elapsed():
                self.inject(pending.pop(0))
            self.watch_pollers()
            if not self.burst_started and self.elapsed() >= BURST_AT * self.o.seconds:
                self.burst_started = True
                if self.o.burst_rows > 0:
                    self.start_writer(self.o.writers, "--burst", str(self.o.burst_rows))
                    self.faults.write("burst", rows=self.o.burst_rows, at=round(self.elapsed(), 3))
            if self.elapsed() - last_note >= 15:
                last_note = self.elapsed()
                print(
                    f"soak: {last_note:.0f}s of {self.o.seconds:.0f}s, "
                    f"{len(faults) - len(pending)} fault(s) so far, backlog {self.backlog()}",
                    flush=True,
                )
            time.sleep(0.05)

    def drain(self) -> None:
        """Stop the writers, undo every fault, and wait until every poller's checkpoint stands
        at its table's last row (the database decides: no row after it is left) and every
        queue is empty: for as long as the rows left keep going down (a burst under faults
        can leave a long backlog), failing after ``drain_timeout`` seconds without progress or
        :data:`DRAIN_LIMIT` in all."""
        self.run_follow_ups(everything=True)
        self.azurite.ensure_running()
        (self.out / "stop-writers.flag").touch()
        for writer in self.writers:
            try:
                writer.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.harness.append(f"writer {writer.pid} did not stop within 15 s (killed)")
                writer.kill()
                writer.wait()
        self.writers_stopped = self.elapsed()
        (self.out / "drain.flag").touch()
        print("soak: writers stopped; draining", flush=True)
        began = time.monotonic()
        best, last_progress, last_note = self.left(), began, began
        while True:
            self.watch_pollers()
            left = self.left()
            if left == 0 and all(c.drained() for c in self.consumers.values()):
                self.faults.write("drained", at=round(self.elapsed(), 3))
                return
            now = time.monotonic()
            if left < best:
                best, last_progress = left, now
            if now - last_note >= 15:
                last_note = now
                print(f"soak: draining, {left} row(s) or message(s) left", flush=True)
            stuck = now - last_progress > self.o.drain_timeout
            if stuck or now - began > DRAIN_LIMIT:
                break
            time.sleep(0.5)
        why = (
            f"no progress for {self.o.drain_timeout:.0f} s"
            if stuck
            else f"not done within {DRAIN_LIMIT / 60:.0f} minutes"
        )
        self.harness.append(
            f"the drain did not reach the table's last row ({why}; {self.backlog()} row(s) after "
            f"the checkpoints, queue drained: {all(c.drained() for c in self.consumers.values())})"
        )

    def left(self) -> int:
        """What the drain waits for: rows after the checkpoints, and messages on the queues."""
        return self.backlog() + sum(c.pending() for c in self.consumers.values())

    def backlog(self) -> int:
        """Rows after each poller's checkpoint (the monitor's last sample), added up."""
        return sum(
            self.rows_after(p, self.latest_by.get(p.name, {}).get("position")) for p in self.pollers
        )

    def rows_after(self, poller: Poller, position: list[Any] | None) -> int:
        """How many rows the database orders after ``position`` (all rows if ``None``)."""
        table = sql.Identifier(poller.table)
        # The poller's own rows (a poller with `every` reads a share of them, a shard its own).
        mine = sql.SQL("id %% {n} = 0").format(n=sql.Literal(poller.every))
        if poller.shards > 1:
            term = sql.SQL(self.shard_expression(poller).replace("%", "%%"))
            mine = sql.SQL("{mine} AND {term} = {i}").format(
                mine=mine, term=term, i=sql.Literal(poller.shard)
            )
        with self.admin() as conn:
            if position is None:
                every = sql.SQL("SELECT count(*) FROM {t} WHERE {mine}")
                row = conn.execute(every.format(t=table, mine=mine), ()).fetchone()
            else:
                after = sql.SQL(
                    "SELECT count(*) FROM {t} WHERE (updated_at, id) > (%s, %s) AND {mine}"
                )
                cursor = dt.datetime.fromisoformat(str(position[0]))
                statement = after.format(t=table, mine=mine)
                row = conn.execute(statement, (cursor, int(position[1]))).fetchone()
        return int(row[0]) if row else 0

    def shard_expression(self, poller: Poller) -> str:
        """The product's shard expression of ``poller``'s table (PostgreSQL, a bigint id)."""
        key = sa.Column("id", sa.BigInteger())
        dialect = postgresql.dialect()  # type: ignore[no-untyped-call]
        return expression_text(dialect, [key], poller.shards)

    def dump_shards(self) -> None:
        """Which shard the database puts each row of a sharded poller's table in, for the
        checker (``shards-<poller>.json``: ``[id, shard]`` pairs)."""
        for p in {p.group: p for p in self.pollers if p.shards > 1}.values():
            rows = self.shard_rows(p)
            if rows is not None:  # (MariaDB's MOD answers a DECIMAL)
                pairs = [[row, None if shard is None else int(shard)] for row, shard in rows]
                (self.out / f"shards-{p.group}.json").write_text(json.dumps(pairs))

    def shard_rows(self, poller: Poller) -> list[list[Any]] | None:
        """``[id, shard]`` of every row of ``poller``'s table, by the shard expression; ``None``
        (and a harness line) when it cannot be read."""
        query = sql.SQL("SELECT id, {e} FROM {t}").format(
            e=sql.SQL(self.shard_expression(poller)), t=sql.Identifier(poller.table)
        )
        try:
            with self.admin() as conn:
                return [list(r) for r in conn.execute(query).fetchall()]
        except psycopg.Error as exc:
            self.harness.append(f"{poller.name}: cannot read its table's shards: {exc}")
            return None

    def dump_history(self) -> None:
        """The history table, shared by the pollers of one table (the checker reads the
        folder's own ``history.json`` and ``writers/`` first, then the shared ones)."""
        rows = self.read_rows(self.admin, "SELECT id, version FROM {t}", "history")
        (self.out / "history.json").write_text(json.dumps(rows or []))

    def dump_sinks(self) -> None:
        """What each poller's sink holds, for the checker: ``sink.json`` of the SqlSink's
        table or the Delta table (no file when it cannot be read: the harness line fails the
        run); the queue's consumer wrote ``queue.jsonl`` as it went."""
        for p in self.pollers:
            if p.sink == "sql":
                self.dump_sql_sink(p)
            elif p.sink == "delta":
                try:
                    rows = delta_rows(str(self.out / "delta" / p.table))
                except Exception as exc:  # noqa: BLE001 - reported as a harness failure
                    self.harness.append(f"{p.name}: cannot read the Delta table: {exc!r}")
                    continue
                (self.out / p.name / "sink.json").write_text(json.dumps(rows))

    def dump_sql_sink(self, poller: Poller) -> None:
        rows = self.read_rows(
            self.sink_admin, "SELECT id, version, fence FROM {t} ORDER BY n", "applied"
        )
        if rows is not None:
            (self.out / poller.name / "sink.json").write_text(json.dumps(rows))

    def dump_quarantine(self) -> None:
        """Each poller's quarantine records for the checker's (g)."""
        for p in self.pollers:
            self.write_quarantine(p.key, self.out / p.name / "quarantine.json")

    def write_quarantine(self, key: afdb.PollerKey, path: Path) -> None:
        """``key``'s quarantine records, as (id, version) of the rows each holds, into ``path``
        (no file when the store cannot be read: the harness line fails the run)."""
        from azure_functions_db.state.blob import BlobStateStore

        try:
            self.azurite.ensure_running()
            store = BlobStateStore(
                settings={"AzureWebJobsStorage": self.azurite.connection_string},
                container=CONTAINER,
            )
            records = []
            for record_id in store.list_quarantined(key):
                stored = store.read_quarantined(key, record_id)
                if stored is not None:
                    record = stored.record
                    rows = [[c.pk, c.data["version"]] for c in record.changes]
                    records.append(
                        {
                            "id": record_id,
                            "state": record.state,
                            "rows": rows,
                            "error": record.error,
                        }
                    )
        except Exception as exc:  # noqa: BLE001 - reported as a harness failure
            self.harness.append(f"{key.poller}: cannot read the quarantine records: {exc!r}")
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(records))

    def read_rows(
        self, connect: Callable[[], psycopg.Connection[Any]], query: str, suffix: str
    ) -> list[list[Any]] | None:
        """The rows of ``query`` on the run's ``<table>_<suffix>``; ``None`` (and a harness
        line) when it cannot be read."""
        try:
            with connect() as conn:
                statement = sql.SQL(query).format(t=sql.Identifier(f"{self.table}_{suffix}"))
                return [list(r) for r in conn.execute(statement).fetchall()]
        except psycopg.Error as exc:
            self.harness.append(f"cannot read the table {self.table}_{suffix}: {exc}")
            return None

    def write_meta(self) -> None:
        """The run's ``meta.json`` (naming its pollers) and each poller's own."""
        meta = {
            "db": self.DB,
            "seed": self.o.seed,
            "seconds": self.o.seconds,
            "control": self.o.control,
            "calm": self.o.calm,
            "pollers": self.o.pollers,
            "writers": self.o.writers,
            "fault_every": self.o.fault_every,
            "sink": self.o.sink,
            "delta": self.o.delta,
            "queue": self.o.queue,
            "shards": self.o.shards,
            "burst": self.o.burst_rows,
            "without": sorted(self.o.without),
            "checkpoint_every": self.o.checkpoint_every,
            "poll_interval": self.o.poll_interval,
            "table": self.table,
            "writers_stopped": self.writers_stopped,
            "poller_exits": self.poller_exits,
            "consumer_errors": {n: c.errors for n, c in self.consumers.items()},
            "harness": self.harness,
        }
        for p in self.pollers:
            own = {
                **meta,
                "table": p.table,
                "mode": p.mode,
                "sink": p.sink,
                "rows_every": p.every,
                "harness": [],
            }
            if p.shards > 1:  # the checker owes it the rows the database puts in its shard
                own["shard"] = {"index": p.shard, "count": p.shards, "of": p.group}
                own["shard_map"] = f"shards-{p.group}.json"
            (self.out / p.name).mkdir(parents=True, exist_ok=True)
            (self.out / p.name / "meta.json").write_text(json.dumps(own, indent=2))
        meta["poller_names"] = [p.name for p in self.pollers]
        (self.out / "meta.json").write_text(json.dumps(meta, indent=2))
