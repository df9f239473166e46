"""Spark: the backfill of a 1M-row PostgreSQL table against the database's own limit (raw
keyset scans in parallel processes) and ``spark.read.jdbc``, same session.

One ``local[2]`` Spark session (one JVM) with Debian's PostgreSQL JDBC jar, one ``orders`` table
(``benchmarks/pg_fixture.py``: N = 1,000,000 rows, 100,000 with ``--quick``) and the same number
of partitions P for every scan (2: one per task slot, SPEC §9's "N partitions on ``local[N]``").
Per repetition, interleaved, in this order, each after an untimed 1-s pause:

- ``count``: ``spark.read.jdbc(..., column="id", lowerBound=1, upperBound=N + 1,
  numPartitions=P).count()``. Spark prunes every column (``SELECT 1 FROM ...``): a lower bound
  on the cost of reading the table, not a fair baseline;
- ``noop``: the same DataFrame written to Spark's ``noop`` sink: every column of every row read
  into the JVM's rows, nothing in Python;
- ``python``: the same DataFrame's rows consumed in the Python workers (``df.rdd``, a no-op per
  row, counted): every column of every row pickled by the JVM and unpickled into a ``Row`` in a
  Python worker. The backfill delivers every column to a Python handler, so this is the SPEC §9
  baseline;
- ``backfill``: ``azure_functions_db.spark.backfill()`` of a ``function_app.py`` whose poller
  reads the table with a no-op handler, ``partitions=P``, a fresh run id every time, the local
  state store in a temporary directory. Its planning on the driver (``prepare_run``: H0, the row
  count, the key-quantile walk, the chunk records) and the Spark job are timed separately;
- ``raw_parallel``: **the database's limit** (SPEC §9, issue 31): P raw psycopg keyset scans
  over the backfill's own P chunk ranges, one per process, all at once
  (``benchmarks/raw_parallel.py``; the processes are started and warmed beforehand);
- ``command``: the whole ``afdb backfill APP --poller orders --partitions P --master local[2]
  --json`` command in a new process (Python's start-up, the app's import, a new Spark session
  and its JVM, planning, the job, stopping Spark), a fresh run id every time;
- ``spark_floor``: what such a command pays whatever the table: a new process that imports the
  package, starts the local session the command would start (``session_for``: its quick JVM
  options, no web UI), runs one empty job of 2 tasks (cold Python workers) and stops it. The
  raw scans' time over it is the most the command's ratio could reach while it starts Spark.

The JDBC reads use ``fetchsize`` = the batch size (1,000): without it the PostgreSQL driver reads
a whole partition into memory, which the backfill's batches never do. One untimed ``noop`` scan
first warms the JVM and PostgreSQL's caches; the first backfill (cold Python workers: the app is
imported and the source reflected in each) is reported apart. Afterwards, one chunk of a planned
run is drained by the same engine in this process, without Spark, for the engine's own rate.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import textwrap
import time
import zipfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from benchmarks import pg_fixture as pg
from benchmarks.harness import (
    Benchmark,
    BenchmarkResult,
    BenchmarkSkipped,
    Context,
    Scalar,
    Timing,
    best_of,
    timed,
)
from benchmarks.raw_parallel import RawParallel

#: Task slots (cores) of the local master.
SLOTS = 2
MASTER = f"local[{SLOTS}]"
#: One partition per task slot, for every scan (SPEC §9: N partitions on ``local[N]``).
PARTITIONS = SLOTS
JAR_ENV = "AFDB_BENCH_PG_JDBC_JAR"
DEFAULT_JAR = "/usr/share/java/postgresql.jar"
SPEC_TARGET = "SPEC §9: >= 0.80"
RAW_TARGET = "SPEC §9, issue 31: >= 0.7"
#: Untimed pause before each timed piece.
SETTLE_SECONDS = 1.0
COMMAND_TARGET = "issue 31: >= 0.5 on 1M rows"
URL_SETTING = "AFDB_BENCH_SPARK_PG"

_APP = '''
"""The benchmark's app: one poller over the orders table, a no-op handler."""

import azure_functions_db as afdb

db = afdb.PollerBlueprint()


@db.poller(
    name="orders",
    schedule="0 0 * * * *",
    source=afdb.SqlSource(
        url="%{url_setting}%",
        table={table!r},
        schema={schema!r},
        cursor="updated_at",
        pk="id",
    ),
    batch_size={batch},
    time_budget=3600,
    lease_duration=60,
)
def on_orders(batch: afdb.Batch) -> None:
    """Receive the batch, do nothing (no event id is computed)."""
'''


def _detail(timing: Timing) -> str:
    runs = ", ".join(f"{s:.3f}" for s in timing.all_seconds)
    return f"best of {timing.repeats}: {timing.seconds:.3f} s (runs {runs})"


def jar_path() -> Path:
    """The PostgreSQL JDBC jar (``AFDB_BENCH_PG_JDBC_JAR`` or Debian's); skips without one."""
    jar = Path(os.environ.get(JAR_ENV, DEFAULT_JAR))
    if not jar.is_file():
        raise BenchmarkSkipped(
            f"needs the PostgreSQL JDBC jar at {jar} (Debian: `apt-get install "
            f"libpostgresql-jdbc-java`) or {JAR_ENV} naming one"
        )
    return jar


def jar_version(jar: Path) -> str:
    """``Implementation-Version`` of the jar's manifest (``?`` if it has none)."""
    try:
        with zipfile.ZipFile(jar) as archive:
            manifest = archive.read("META-INF/MANIFEST.MF").decode("utf-8", "replace")
    except (OSError, KeyError, zipfile.BadZipFile):
        return "?"
    for line in manifest.splitlines():
        if line.startswith("Implementation-Version:"):
            return line.split(":", 1)[1].strip()
    return "?"


def check_spark() -> None:
    """Skip unless pyspark imports and a ``java`` is on the path (or under ``JAVA_HOME``)."""
    try:
        import pyspark  # noqa: F401
    except ImportError as exc:
        raise BenchmarkSkipped(f"needs pyspark (the `spark` extra): {exc}") from exc
    java_home = os.environ.get("JAVA_HOME")
    if shutil.which("java") is None and not (
        java_home and (Path(java_home) / "bin" / "java").exists()
    ):
        raise BenchmarkSkipped("needs Java 17 for Spark (no `java` on PATH, no JAVA_HOME)")


@contextlib.contextmanager
def spark_session(jar: Path) -> Iterator[Any]:
    """A ``local[2]`` session with the JDBC jar, stopped afterwards."""
    from pyspark.sql import SparkSession

    # Local executors run this interpreter (with the package) and bind the loopback address.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    session = (
        SparkSession.builder.master(MASTER)
        .appName("afdb-bench-backfill")
        .config("spark.jars", str(jar))
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()


def jdbc_url(server: pg.Server) -> tuple[str, dict[str, str]]:
    """The server as a JDBC URL and ``spark.read.jdbc`` properties."""
    url = sa.make_url(server.url)
    jdbc = f"jdbc:postgresql://{url.host or 'localhost'}:{url.port or 5432}/{url.database or ''}"
    props = {"driver": "org.postgresql.Driver", "user": url.username or ""}
    if url.password:
        props["password"] = str(url.password)
    return jdbc, props


# --------------------------------------------------------------------------------------------
# CPU time by process role, from /proc (Linux)
# --------------------------------------------------------------------------------------------

#: The roles CPU time is split into: this process, the Spark JVM, the Python workers (PySpark's
#: daemon and its workers), the PostgreSQL server (every ``postgres`` process on the machine).
ROLES = ("driver", "jvm", "python_workers", "postgres")


def _stat(pid: str) -> tuple[int, str, float] | None:
    """``(ppid, comm, cpu)`` of a process, ``cpu`` including the children it has reaped."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # gone meanwhile
        return None
    comm = text[text.index("(") + 1 : text.rindex(")")]
    fields = text[text.rindex(")") + 2 :].split()
    ticks = sum(int(f) for f in fields[11:15])  # utime, stime, cutime, cstime
    return int(fields[1]), comm, ticks / os.sysconf("SC_CLK_TCK")


def cpu_by_role(local_server: bool) -> dict[str, float] | None:
    """Seconds of CPU each role has used so far (``None`` without ``/proc``).

    A process's reaped children count in its own total, so a Python worker that exits between
    two readings is not lost: its time moves to the daemon that waited for it.
    """
    if not Path("/proc/self/stat").exists():
        return None
    table: dict[int, tuple[int, str, float]] = {}
    for entry in os.scandir("/proc"):
        stat = _stat(entry.name) if entry.name.isdigit() else None
        if stat is not None:
            table[int(entry.name)] = stat
    me = os.getpid()
    totals = dict.fromkeys(ROLES, 0.0)
    times = os.times()
    totals["driver"] = times.user + times.system  # this process's threads only
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    todo = list(children.get(me, []))
    while todo:
        pid = todo.pop()
        todo.extend(children.get(pid, []))
        _, comm, cpu = table[pid]
        if comm == "java":
            totals["jvm"] += cpu
        elif comm.startswith("python"):
            totals["python_workers"] += cpu
    if local_server:
        totals["postgres"] = sum(cpu for _, comm, cpu in table.values() if comm == "postgres")
    return totals


# --------------------------------------------------------------------------------------------
# The baseline: spark.read.jdbc
# --------------------------------------------------------------------------------------------


def _package_dir(_: object) -> str:
    """Where a Python worker imports the package from."""
    import azure_functions_db

    return str(Path(azure_functions_db.__file__).parent)


def _count_rows(rows: Iterable[Any]) -> Iterator[int]:
    """A partition's rows consumed one by one in the Python worker (a no-op each), counted."""
    n = 0
    for _ in rows:
        n += 1
    yield n


@dataclass(frozen=True)
class JdbcScans:
    """The three ``spark.read.jdbc`` scans of one table."""

    session: Any
    db: pg.OrdersTable
    partitions: int
    fetch_size: int

    def frame(self) -> Any:
        url, props = jdbc_url(self.db.server)
        return self.session.read.jdbc(
            url,
            self.db.qualified,
            column="id",
            lowerBound=1,
            upperBound=self.db.rows + 1,
            numPartitions=self.partitions,
            properties={**props, "fetchsize": str(self.fetch_size)},
        )

    def count(self) -> int:
        return int(self.frame().count())

    def noop(self) -> int:
        self.frame().write.format("noop").mode("overwrite").save()
        return self.db.rows  # checked by `count` and `python` in the same repetition

    def python(self) -> int:
        return int(self.frame().rdd.mapPartitions(_count_rows).sum())


# --------------------------------------------------------------------------------------------
# The backfill
# --------------------------------------------------------------------------------------------


@dataclass
class Stopwatch:
    """Wall time of calls to wrapped functions, by name (the last call of each)."""

    seconds: dict[str, float] = field(default_factory=dict)
    returned: dict[str, Any] = field(default_factory=dict)

    def wrap(self, name: str, func: Callable[..., Any]) -> Callable[..., Any]:
        def timed_call(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                self.returned[name] = func(*args, **kwargs)
                return self.returned[name]
            finally:
                self.seconds[name] = time.perf_counter() - started

        return timed_call


@contextlib.contextmanager
def watched(watch: Stopwatch) -> Iterator[None]:
    """Time the backfill driver's planning and its Spark job (module attributes, restored)."""
    from azure_functions_db.spark import job

    saved: dict[str, Callable[..., Any]] = {
        name: getattr(job, name) for name in ("prepare_run", "_run_tasks")
    }
    for name, func in saved.items():
        setattr(job, name, watch.wrap(name, func))
    try:
        yield
    finally:
        for name, func in saved.items():
            setattr(job, name, func)


@dataclass
class Backfills:
    """Repeated backfills of one app, each with a fresh run id, and their stage times."""

    session: Any
    app: Path
    settings: dict[str, str]
    partitions: int
    rows: int
    planning: list[float] = field(default_factory=list)
    job: list[float] = field(default_factory=list)
    total: list[float] = field(default_factory=list)
    #: Per run: the seconds each chunk task took (``ChunkResult.seconds``), by chunk index.
    tasks: list[list[float]] = field(default_factory=list)
    chunks: int = 0
    batches: int = 0
    runs: int = 0
    #: The chunk ranges of the last run (from its chunk records).
    ranges: list[Any] = field(default_factory=list)

    def __call__(self) -> int:
        from azure_functions_db.spark import backfill

        self.runs += 1
        watch = Stopwatch()
        started = time.perf_counter()
        with watched(watch):
            report = backfill(
                self.app,
                "orders",
                partitions=self.partitions,
                spark=self.session,
                run_id=f"bench{self.runs}",
                settings=self.settings,
            )
        self.total.append(time.perf_counter() - started)
        self.planning.append(watch.seconds["prepare_run"])
        self.job.append(watch.seconds["_run_tasks"])
        done = sorted(watch.returned["_run_tasks"], key=lambda r: r.index)
        self.tasks.append([r.seconds for r in done])
        if report.rows != self.rows or report.chunks_skipped:
            raise RuntimeError(
                f"backfill run `{report.run_id}` delivered {report.rows} rows of {self.rows} "
                f"({report.chunks_run} chunks run, {report.chunks_skipped} skipped)"
            )
        self.chunks, self.batches = report.chunks, report.batches
        self.ranges = chunk_ranges(self.app, self.settings, report.run_id, report.chunks)
        return report.rows


def chunk_ranges(app: Path, settings: dict[str, str], run_id: str, chunks: int) -> list[Any]:
    """The key ranges of a planned run's chunks, as its chunk records hold them."""
    from azure_functions_db.runtime.loader import load_pollers
    from azure_functions_db.spark.records import chunk_key, chunk_range

    store = load_pollers(str(app))["orders"].store(settings)
    ranges = []
    for index in range(chunks):
        stored = store.read(chunk_key("backfill", "orders", run_id, index))
        found = chunk_range(stored.checkpoint) if stored is not None else None
        if found is None:
            raise RuntimeError(f"chunk {index} of run `{run_id}` has no planned range")
        ranges.append(found)
    return ranges


@dataclass
class Command:
    """The whole ``afdb backfill`` command in a new process (a callable: the rows it delivered)."""

    app: Path
    settings: dict[str, str]
    partitions: int
    rows: int
    runs: int = 0

    def __call__(self) -> int:
        import json
        import subprocess

        self.runs += 1
        argv = [
            sys.executable,
            "-m",
            "azure_functions_db",
            "backfill",
            str(self.app),
            "--poller",
            "orders",
            "--partitions",
            str(self.partitions),
            "--master",
            MASTER,
            "--run-id",
            f"command{self.runs}",
            "--json",
        ]
        env = {**os.environ, **self.settings}
        done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"`afdb backfill` exited {done.returncode}: {done.stderr[-2000:]}")
        report = json.loads(done.stdout)
        if report["rows"] != self.rows:
            raise RuntimeError(f"`afdb backfill` delivered {report['rows']} of {self.rows} rows")
        return int(report["rows"])


#: What ``spark_floor`` runs in a new process: the local session ``afdb backfill`` would start
#: (its own settings), one empty job of 2 tasks (cold Python workers, as the command's first
#: job), and stop; it prints the seconds of each.
_FLOOR = """
import json, sys, time
began = time.perf_counter()
from azure_functions_db.spark._session import session_for
imported = time.perf_counter()
session, _ = session_for(None, sys.argv[1])
started = time.perf_counter()
session.sparkContext.parallelize(range(2), 2).map(abs).collect()
ran = time.perf_counter()
session.stop()
stopped = time.perf_counter()
print(json.dumps({"import": imported - began, "start": started - imported,
                  "first_job": ran - started, "stop": stopped - ran}))
"""


@dataclass
class SparkFloor:
    """The least a command that starts Spark pays, whatever the table: a new Python process
    that starts the backfill's own local session, runs one empty 2-task job and stops it (a
    callable: the table's rows, so that its rate is the command's ceiling)."""

    rows: int
    phases: list[dict[str, float]] = field(default_factory=list)

    def __call__(self) -> int:
        import json
        import subprocess

        done = subprocess.run(
            [sys.executable, "-c", _FLOOR, MASTER], capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(f"the empty Spark session failed: {done.stderr[-2000:]}")
        self.phases.append(json.loads(done.stdout.strip().splitlines()[-1]))
        return self.rows


def write_app(directory: Path, db: pg.OrdersTable, batch_size: int) -> Path:
    """The ``function_app.py`` the backfill replays; executors import it by its path."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "function_app.py"
    path.write_text(
        textwrap.dedent(_APP).format(
            url_setting=URL_SETTING, table=db.name, schema=db.server.schema, batch=batch_size
        )
    )
    return path


@dataclass(frozen=True)
class InProcess:
    """One chunk drained by the engine in this process, without Spark."""

    rows: int
    seconds: float
    cpu_seconds: float
    planning_seconds: float


def plan_ranges(app: Path, settings: dict[str, str], partitions: int) -> list[Any]:
    """Plan a run here (as the backfill's driver does) and return its chunk ranges."""
    import datetime as dt

    from azure_functions_db.runtime.loader import load_pollers
    from azure_functions_db.spark.plan import prepare_run

    definition = load_pollers(str(app))["orders"]
    store = definition.store(settings)
    definition.source.open(settings)
    try:
        _, chunks = prepare_run(
            definition,
            store,
            namespace="backfill",
            run_id="ranges",
            start=None,
            end=None,
            partitions=partitions,
            by="bench",
            now=dt.datetime.now(dt.UTC),
        )
    finally:
        definition.source.close()
    return list(chunks)


def chunk_in_process(app: Path, settings: dict[str, str], partitions: int) -> InProcess:
    """Plan a run (timed), then drain its first chunk here with ``run_chunk`` (timed)."""
    import datetime as dt

    from azure_functions_db.runtime.loader import load_pollers
    from azure_functions_db.spark.chunk import run_chunk
    from azure_functions_db.spark.plan import prepare_run

    definition = load_pollers(str(app))["orders"]
    store = definition.store(settings)
    source = definition.source
    source.open(settings)
    try:
        started = time.perf_counter()
        _, chunks = prepare_run(
            definition,
            store,
            namespace="backfill",
            run_id="inproc",
            start=None,
            end=None,
            partitions=partitions,
            by="bench",
            now=dt.datetime.now(dt.UTC),
        )
        planning = time.perf_counter() - started
        cpu = time.process_time()
        started = time.perf_counter()
        done = run_chunk(
            definition, store, settings, namespace="backfill", run_id="inproc", index=0
        )
        seconds = time.perf_counter() - started
        cpu = time.process_time() - cpu
    finally:
        source.close()
    if not chunks or done.rows == 0:
        raise RuntimeError("the in-process chunk delivered no rows")
    return InProcess(rows=done.rows, seconds=seconds, cpu_seconds=cpu, planning_seconds=planning)


# --------------------------------------------------------------------------------------------
# The benchmark
# --------------------------------------------------------------------------------------------


def run(ctx: Context) -> BenchmarkResult:  # noqa: PLR0915 - one linear report
    result = BenchmarkResult(name=BENCHMARK.name, title=BENCHMARK.title, tier=BENCHMARK.tier)
    check_spark()
    jar = jar_path()
    rows = pg.table_rows(ctx)
    batch = ctx.batch_size
    with pg.scratch_schema() as server:
        ctx.progress(f"building PostgreSQL table orders_{rows} ({rows:,} rows)")
        db = pg.build_orders(server, rows)
        app = write_app(ctx.workdir / "spark_app", db, batch)
        local = sa.make_url(server.url).host in ("127.0.0.1", "localhost", "::1", None)
        state = ctx.workdir / "spark_state"
        shutil.rmtree(state, ignore_errors=True)
        settings = {URL_SETTING: server.url, "AFDB_STATE_DIR": str(state)}
        ctx.progress(f"starting Spark ({MASTER}, JDBC jar {jar})")
        with spark_session(jar) as session:
            import pyspark

            spark_version = pyspark.__version__
            workers = set(session.sparkContext.parallelize([0, 1], 2).map(_package_dir).collect())
            scans = JdbcScans(session=session, db=db, partitions=PARTITIONS, fetch_size=batch)
            backfills = Backfills(
                session=session, app=app, settings=settings, partitions=PARTITIONS, rows=rows
            )
            ctx.progress("warming up: one untimed spark.read.jdbc noop scan")
            scans.noop()
            raw = RawParallel(
                conninfo=server.conninfo,
                table=db.qualified,
                ranges=plan_ranges(app, settings, PARTITIONS),
                batch_size=batch,
            )
            ctx.progress(f"starting {len(raw.ranges)} raw scan processes (one untimed scan)")
            raw.start()
            command = Command(app=app, settings=settings, partitions=PARTITIONS, rows=rows)
            floor = SparkFloor(rows=rows)
            work: dict[str, Callable[[], int]] = {
                "count": scans.count,
                "noop": scans.noop,
                "python": scans.python,
                "backfill": backfills,
                "raw_parallel": raw,
                "command": command,
                "spark_floor": floor,
            }
            samples: dict[str, list[tuple[int, float]]] = {name: [] for name in work}
            cpu: dict[str, list[dict[str, float]]] = {name: [] for name in work}
            loads: list[float] = []
            try:
                for i in range(ctx.repeats):
                    ctx.progress(
                        "jdbc count, noop, python, the backfill, raw scans in parallel and the "
                        f"whole command ({i + 1}/{ctx.repeats})"
                    )
                    for name, scan in work.items():
                        # The JVM's collector and the exiting workers of the piece before (the
                        # `python` scan leaves a large heap) would otherwise slow the next one.
                        time.sleep(SETTLE_SECONDS)
                        loads.append(os.getloadavg()[0])
                        before = cpu_by_role(local)
                        samples[name].append(timed(scan))
                        after = cpu_by_role(local)
                        if before is not None and after is not None:
                            cpu[name].append({r: after[r] - before[r] for r in ROLES})
                    if backfills.ranges != list(raw.ranges):
                        raise RuntimeError(
                            "the raw scans' key ranges are not the backfill's chunks: "
                            f"{raw.ranges} vs {backfills.ranges}"
                        )
            finally:
                raw.close()
            ctx.progress("planning a run and draining one chunk in this process (no Spark)")
            alone = chunk_in_process(app, settings, PARTITIONS)

    timings = {name: best_of(s) for name, s in samples.items()}
    result.metric(
        "rows",
        "table rows (N)",
        rows,
        "rows",
        f"{db.distinct_cursors:,} distinct updated_at, largest tie {db.largest_tie:,}",
    )
    result.metric(
        "partitions",
        "partitions of every scan (backfill chunks)",
        backfills.chunks,
        "count",
        f"asked {PARTITIONS}; {MASTER}; {backfills.batches:,} batches of {batch}",
    )
    labels = {
        "count": "spark.read.jdbc count() (columns pruned)",
        "noop": "spark.read.jdbc, noop write (every column, JVM only)",
        "python": "spark.read.jdbc, rows consumed in Python workers (SPEC baseline)",
        "backfill": "backfill, no-op handler, local state",
        "raw_parallel": f"raw psycopg keyset scans of the {PARTITIONS} chunk ranges, in parallel",
        "command": "whole `afdb backfill` command (new process, new Spark session)",
        "spark_floor": "N rows / (new process: the command's local session, empty job, stop)",
    }
    for name, label in labels.items():
        result.metric(
            f"{name}_rps",
            label,
            timings[name].rows_per_second,
            "rows/s",
            _detail(timings[name]),
        )
    first = backfills.total[0]
    result.metric(
        "backfill_first_rps",
        "backfill, first repetition (cold Python workers)",
        rows / first,
        "rows/s",
        f"{first:.3f} s",
    )
    best = backfills.total.index(min(backfills.total))
    result.metric(
        "backfill_job_rps",
        "backfill, Spark job only (best run, planning excluded)",
        rows / backfills.job[best],
        "rows/s",
        f"{backfills.job[best]:.3f} s",
    )
    result.metric(
        "backfill_planning_s",
        "backfill planning on the driver (prepare_run)",
        backfills.planning[best],
        "s",
        "best run; all: " + ", ".join(f"{s:.3f}" for s in backfills.planning),
    )
    tasks = backfills.tasks[best]
    result.metric(
        "backfill_slots_busy",
        "chunk task time / (task slots x job time)",
        sum(tasks) / (SLOTS * backfills.job[best]),
        "ratio",
        "best run; tasks " + ", ".join(f"{s:.2f}" for s in tasks) + " s",
    )
    other = backfills.total[best] - backfills.planning[best] - backfills.job[best]
    result.metric(
        "backfill_driver_other_s",
        "backfill driver, rest (load app, open/check source, finish)",
        other,
        "s",
        "best run",
    )
    result.metric(
        "chunk_inproc_rps",
        "engine over one chunk in this process, no Spark",
        alone.rows / alone.seconds,
        "rows/s",
        f"{alone.rows:,} rows in {alone.seconds:.3f} s",
    )
    result.metric(
        "chunk_inproc_cpu",
        "client CPU time of that chunk",
        alone.cpu_seconds / alone.rows * 1e6,
        "µs/row",
        "this process only (the server's work is not in it)",
    )
    result.metric(
        "inproc_planning_s",
        "planning alone, in this process",
        alone.planning_seconds,
        "s",
        "prepare_run: H0, count, key walk, chunk records",
    )
    if all(cpu.values()):
        grid_rows: list[tuple[str, tuple[Scalar, ...]]] = []
        cpus = os.cpu_count() or 1
        for name in work:
            if name in ("command", "spark_floor"):  # not this process's children when measured
                continue
            # The CPU of the repetition with the best wall time.
            times = [t for _, t in samples[name]]
            used = cpu[name][times.index(min(times))]
            per_row = [used[r] / rows * 1e6 for r in ROLES]
            wall = timings[name].seconds / rows * 1e6
            grid_rows.append(
                (
                    name,
                    (
                        round(wall, 2),
                        *(round(v, 2) for v in per_row),
                        round(sum(per_row), 2),
                        round(sum(per_row) / (cpus * wall), 2),
                    ),
                )
            )
        result.grid(
            "cpu",
            "CPU time per row by process, best run (µs/row)",
            ("wall", "driver", "JVM", "Python workers", "PostgreSQL", "CPU total", "CPUs busy"),
            grid_rows,
        )
        if not local:
            result.note("The database server is not on this machine: its CPU time is not seen.")
    result.ratio(
        "backfill_vs_raw_parallel",
        "backfill warm / raw keyset scans of its chunk ranges in parallel processes",
        "backfill_rps",
        "raw_parallel_rps",
        RAW_TARGET,
    )
    result.ratio(
        "command_vs_raw_parallel",
        "whole `afdb backfill` command / raw keyset scans in parallel processes",
        "command_rps",
        "raw_parallel_rps",
        COMMAND_TARGET,
    )
    floor_best = floor.phases[samples["spark_floor"].index(min(samples["spark_floor"]))]
    result.metric(
        "spark_floor_s",
        "Spark alone in a new process: package import, session start, empty job, stop",
        timings["spark_floor"].seconds,
        "s",
        "best run: " + ", ".join(f"{k} {v:.2f}" for k, v in floor_best.items()) + " s",
    )
    result.ratio(
        "spark_floor_vs_raw_parallel",
        "the command's ceiling while it starts Spark: raw scans' time / Spark alone",
        "spark_floor_rps",
        "raw_parallel_rps",
        f"{COMMAND_TARGET} is out of reach below this",
    )
    result.ratio(
        "backfill_vs_python",
        "backfill / spark.read.jdbc into Python",
        "backfill_rps",
        "python_rps",
        SPEC_TARGET,
    )
    result.ratio(
        "backfill_vs_noop",
        "backfill / spark.read.jdbc noop (JVM only)",
        "backfill_rps",
        "noop_rps",
        "the JVM-only reading of the target",
    )
    result.ratio(
        "job_vs_python",
        "backfill Spark job alone / spark.read.jdbc into Python",
        "backfill_job_rps",
        "python_rps",
        "planning excluded",
    )
    result.ratio("python_vs_noop", "jdbc into Python / jdbc noop", "python_rps", "noop_rps")
    result.ratio(
        "backfill_vs_inproc",
        "backfill / one in-process chunk drain",
        "backfill_rps",
        "chunk_inproc_rps",
        f"up to ~2 with {MASTER} if the two cores were free",
    )
    windows = ", ".join(f"{w:.3f}" for w in raw.windows)
    result.note(
        f"raw_parallel: {len(raw.ranges)} processes (spawned and warmed beforehand), one "
        f"autocommit psycopg connection each; first scan start to last scan end, as the "
        f"processes measured it: {windows} s. 1-minute load average before each timed piece: "
        f"{min(loads):.2f}-{max(loads):.2f}."
    )
    result.note(
        f"pyspark {spark_version}, PostgreSQL JDBC {jar_version(jar)} ({jar}); one Spark "
        f"session ({MASTER}, one JVM) for every scan; the database server shares the 2 cores."
    )
    import azure_functions_db

    result.note(
        f"azure_functions_db imported from {Path(azure_functions_db.__file__).parent} (driver) "
        f"and {', '.join(sorted(workers))} (Python workers)."
    )
    result.note(
        f"spark.read.jdbc partitions on `id` (lowerBound=1, upperBound=N+1, numPartitions="
        f"{PARTITIONS}), fetchsize {batch}; the backfill walks the (updated_at, id) index in "
        "key-quantile chunks, so it visits the heap in index order, the baseline in id order."
    )
    result.note(
        "The backfill time is the whole backfill() call: loading the app, opening and checking "
        "the source, planning (H0, row count, key walk, chunk records), the Spark job (one "
        "task per chunk: the engine with lease, fence, fetch read ahead, Batch, no-op handler "
        "and an fsync'd local checkpoint at least every second) and marking the run finished. "
        "The whole command adds Python's start-up, a new Spark session (its JVM, with the "
        "quick-start options of a local session) and its Python workers, and stopping Spark."
    )
    return result


BENCHMARK = Benchmark(
    name="spark_backfill",
    title="Spark: backfill vs spark.read.jdbc, 1M-row PostgreSQL table, same session",
    tier="spark",
    run=run,
)
