"""Storage requests of the Blob and Table state stores, counted per HTTP request on Azurite.

The benchmark starts its own Azurite (``devkit/azurite.py``, the emulator pinned in
``tools/azurite``, data on disk) and runs the engine on a SQLite ``orders`` table (the SQLite
tier's table, copied per store) with ``BlobStateStore`` and with ``TableStateStore`` (whose
leases go through an inner ``BlobStateStore``). Every HTTP request either store sends goes
through :class:`RequestCounter`, an azure-core ``SansIOHTTPPolicy``, and is counted by service,
operation, object (lease blob, checkpoint blob, table entity, container, table) and, when it is
not a success, by status and error code.

How the policy is attached: through ``client_options`` (keyword arguments of the SDK client),
as ``raw_request_hook`` / ``raw_response_hook``. Both SDKs put those hooks after their retry
policy (so every attempt, including retries, is seen) and hand them to the container and table
clients they derive. ``per_call_policies`` / ``per_retry_policies``, azure-core's usual way to
add a policy, do not work for these stores: azure-storage-blob builds its own pipeline and drops
them, and azure-data-tables adds them only to the service client's pipeline, not to the
``TableClient`` that ``get_table_client`` makes (verified against these SDK versions).

Scenarios, per store, in this order:

- ``first run``: the very first run of a poller, in a fresh container/table, on an empty table
  (so only the one-time creation shows; against a full table the per-batch cost adds to it);
- ``drain``: a new engine drains the N-row table in batches (``--batch-size``, 1,000);
  ``per batch`` is (drain - idle) / batches, per operation;
- ``idle``: the next run of that engine (nothing new), then more idle runs, timed;
- ``lease held``: a run while another owner holds the lease (a clean no-op);
- ``slow handler``: one new row whose handler sleeps 1 s with the heartbeat every 0.3 s (the
  default heartbeat is ``lease_duration / 3``, 20 s for the 60 s lease used here), to show one
  renewal request per heartbeat.

Times are wall times on Azurite on this machine (one sample for the drain, the median of the
idle runs, the median of the drain's checkpoint commits), not Azure's.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import shutil
import sqlite3
import statistics
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Generic, TypeVar
from urllib.parse import parse_qs, unquote, urlparse

from azure_functions_db.core.batch import Batch
from azure_functions_db.core.checkpoint import Checkpoint
from azure_functions_db.core.clock import SystemClock
from azure_functions_db.core.engine import Engine, RunReport
from azure_functions_db.core.liveness import HEALTH_SUFFIX
from azure_functions_db.core.ports import StateStore
from benchmarks import engine_runs as runs
from benchmarks import sqlite_fixture as fx
from benchmarks.harness import Benchmark, BenchmarkResult, BenchmarkSkipped, Context, Scalar

#: Idle runs timed per store after the counted one.
IDLE_RUNS = 20
#: The slow handler's sleep and the heartbeat interval of that scenario, in seconds.
SLOW_HANDLER = 1.0
HEARTBEAT = 0.3

SCENARIOS = ("first run", "drain", "per batch", "idle", "lease held", "slow handler")

try:  # the SDKs are the `azure` extra; without them the benchmark is skipped, not broken
    from azure.core.pipeline import PipelineRequest, PipelineResponse
    from azure.core.pipeline.policies import SansIOHTTPPolicy
except ImportError:  # pragma: no cover - the dev extra installs them
    _Rq = TypeVar("_Rq")
    _Rs = TypeVar("_Rs")

    class SansIOHTTPPolicy(Generic[_Rq, _Rs]):  # type: ignore[no-redef]
        """Stand-in so that the registry imports without the SDKs."""


# --------------------------------------------------------------------------------------------
# Counting requests
# --------------------------------------------------------------------------------------------


def _blob_operation(method: str, path: str, query: dict[str, list[str]], headers: Any) -> str:
    """``<operation> (<object>)`` of one Blob request."""
    comp = query.get("comp", [""])[0]
    if query.get("restype", [""])[0] == "container":
        kind = {"": "container", "list": "list blobs", "lease": "container lease"}.get(comp, comp)
        return f"{method} {kind}"
    name = unquote(path.split("/", 3)[-1]) if path.count("/") >= 3 else path
    target = (
        "lease blob"
        if name.endswith(".lease")
        else "checkpoint blob"
        if name.endswith(".checkpoint.json")
        else "blob"
    )
    if comp == "lease":
        operation = f"lease {headers.get('x-ms-lease-action', '?')}"
    elif comp == "metadata":
        operation = "set metadata"
    elif method == "HEAD":
        operation = "get properties"
    elif method == "GET":
        operation = "download"
    elif method == "PUT" and not comp:
        operation = "put blob"
    else:
        operation = f"{method} comp={comp}"
    conditions = [
        f"{header}: {'*' if headers[header] == '*' else 'etag'}"
        for header in ("If-Match", "If-None-Match")
        if header in headers
    ]
    if "x-ms-lease-id" in headers and comp != "lease":
        conditions.append("lease id")
    suffix = f", {' + '.join(conditions)}" if conditions else ""
    return f"{operation}{suffix} ({target})"


def _table_operation(method: str, path: str, headers: Any) -> str:
    """``<operation> (<object>)`` of one Table request."""
    resource = path.rstrip("/").rsplit("/", 1)[-1]
    if resource.startswith("Tables"):
        return {"POST": "create table", "DELETE": "delete table"}.get(method, f"{method} Tables")
    if "(PartitionKey=" not in resource:
        return {"POST": "insert entity", "GET": "query entities"}.get(method, f"{method} table")
    condition = ", If-Match: etag" if headers.get("If-Match", "*") != "*" else ""
    operation = {
        "GET": "get entity",
        "PUT": "update entity (replace)" if condition else "upsert entity (replace)",
        "MERGE": "merge entity",
        "PATCH": "merge entity",
        "DELETE": "delete entity",
    }.get(method, method)
    return f"{operation}{condition}"


def describe_request(service: str, method: str, url: str, headers: Any) -> str:
    """A readable, stable label of one storage request: service, operation, object."""
    parsed = urlparse(url)
    if service == "table":
        return f"table: {_table_operation(method, parsed.path, headers)}"
    return f"blob: {_blob_operation(method, parsed.path, parse_qs(parsed.query), headers)}"


class RequestCounter(SansIOHTTPPolicy[Any, Any]):
    """Counts every HTTP request of the clients it is attached to, by operation and outcome.

    An azure-core ``SansIOHTTPPolicy``; :meth:`client_options` attaches it to a Blob or Table
    client through the hooks both SDKs run after their retry policy. Thread-safe: the lease
    heartbeat renews from its own thread.
    """

    _SERVICE = "afdb_bench_service"
    _STARTED = "afdb_bench_started"

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self.sent = 0
        self.counts: Counter[str] = Counter()
        self.latency: dict[str, list[float]] = {}

    def client_options(self, service: str) -> dict[str, Any]:
        """``client_options`` for a store whose client talks to ``service`` (blob or table)."""

        def on_request(request: PipelineRequest[Any]) -> None:
            request.context[self._SERVICE] = service
            self.on_request(request)

        def on_response(response: PipelineResponse[Any, Any]) -> None:
            self.on_response(PipelineRequest(response.http_request, response.context), response)

        return {"raw_request_hook": on_request, "raw_response_hook": on_response}

    def on_request(self, request: PipelineRequest[Any]) -> None:
        request.context[self._STARTED] = time.perf_counter()
        with self._lock:
            self.sent += 1

    def on_response(
        self, request: PipelineRequest[Any], response: PipelineResponse[Any, Any]
    ) -> None:
        elapsed = time.perf_counter() - request.context.get(self._STARTED, time.perf_counter())
        http = request.http_request
        label = describe_request(
            request.context.get(self._SERVICE, "blob"), http.method, http.url, http.headers
        )
        status = response.http_response.status_code
        if status >= 300:
            code = response.http_response.headers.get("x-ms-error-code")
            label += f" -> {status}{f' {code}' if code else ''}"
        with self._lock:
            self.counts[label] += 1
            self.latency.setdefault(label, []).append(elapsed)

    def latencies(self) -> dict[str, list[float]]:
        """Every round trip seen so far (seconds), by label; never cleared by :meth:`take`."""
        with self._lock:
            return {label: list(times) for label, times in self.latency.items()}

    def take(self) -> Counter[str]:
        """The counts since the last ``take``/``reset``; checks every request got a response."""
        with self._lock:
            counts, sent = Counter(self.counts), self.sent
            self.counts.clear()
            self.sent = 0
        answered = sum(counts.values())
        if answered != sent:
            counts["(sent, no response)"] = sent - answered
        return counts


class TimedStore(fx.CountingStore):
    """The counting proxy of the SQLite tier that also times each ``replace`` (a commit).

    The run's write of its health record (``<poller>~health``, after the release) is counted
    but not timed: it is not a checkpoint commit.
    """

    def __init__(self, inner: StateStore) -> None:
        super().__init__(inner)
        self.replace_seconds: list[float] = []

    def replace(self, checkpoint: Checkpoint, etag: str) -> str:
        if checkpoint.key.poller.endswith(HEALTH_SUFFIX):
            return super().replace(checkpoint, etag)
        started = time.perf_counter()
        try:
            return super().replace(checkpoint, etag)
        finally:
            self.replace_seconds.append(time.perf_counter() - started)


# --------------------------------------------------------------------------------------------
# Azurite and the stores
# --------------------------------------------------------------------------------------------


@contextmanager
def azurite(ctx: Context) -> Iterator[str]:
    """A private Azurite for this benchmark; yields its connection string."""
    try:
        import azure.data.tables  # the `azure` extra
        import azure.storage.blob  # noqa: F401

        from devkit.azurite import Azurite, AzuriteError, unavailable_reason
    except ImportError as exc:
        raise BenchmarkSkipped(
            f"needs the `azure` extra and the repository's devkit/azurite.py ({exc}); run from "
            "the repository root after `make azurite`"
        ) from exc
    reason = unavailable_reason()
    if reason is not None:
        raise BenchmarkSkipped(reason)
    ctx.progress("starting Azurite")
    emulator = Azurite(ctx.workdir / "azurite")
    try:
        emulator.start()
    except AzuriteError as exc:
        raise BenchmarkSkipped(f"Azurite did not start: {exc}") from exc
    try:
        yield emulator.connection_string
    finally:
        emulator.stop()


def make_store(kind: str, connection_string: str, counter: RequestCounter) -> StateStore:
    """A Blob or Table state store in fresh, not yet existing containers/tables."""
    from azure_functions_db.state.blob import BlobStateStore
    from azure_functions_db.state.table import TableStateStore

    settings = {"AzureWebJobsStorage": connection_string}
    suffix = uuid.uuid4().hex[:10]
    if kind == "blob":
        return BlobStateStore(
            settings=settings,
            container=f"bench-{suffix}",
            client_options=counter.client_options("blob"),
        )
    leases = BlobStateStore(
        settings=settings,
        container=f"bench-leases-{suffix}",
        client_options=counter.client_options("blob"),
    )
    return TableStateStore(
        settings=settings,
        table=f"bench{suffix}",
        leases=leases,
        client_options=counter.client_options("table"),
    )


# --------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class StoreRun:
    """What the scenarios of one store counted and timed."""

    kind: str
    counts: dict[str, Counter[str]] = dataclasses.field(default_factory=dict)
    batches: int = 0
    drain_seconds: float = 0.0
    commit_seconds: list[float] = dataclasses.field(default_factory=list)
    idle_seconds: list[float] = dataclasses.field(default_factory=list)
    idle_varied: list[int] = dataclasses.field(default_factory=list)
    latency: dict[str, list[float]] = dataclasses.field(default_factory=dict)
    store_calls: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)


def _checked(report: RunReport, scenario: str, status: str, rows: int) -> None:
    if report.status != status or report.rows != rows:
        raise RuntimeError(
            f"{scenario}: expected a `{status}` run of {rows} row(s), got `{report.status}` "
            f"with {report.rows}"
        )


def _slow(batch: Batch) -> None:
    del batch
    time.sleep(SLOW_HANDLER)


def _add_row(db: fx.OrdersTable) -> None:
    """One row with a cursor after every other row (a new change for the slow handler), and in
    the past: the SQLite horizon holds back a cursor above its own clock less the settle time."""
    stamp = dt.datetime.now(dt.UTC).replace(tzinfo=None) - dt.timedelta(seconds=10)
    with sqlite3.connect(db.path) as conn:
        conn.execute(
            "INSERT INTO orders (id, note, updated_at) VALUES (?, ?, ?)",
            (db.rows + 1, "late order", stamp.strftime("%Y-%m-%d %H:%M:%S.%f")),
        )
    conn.close()


def run_store(
    ctx: Context, kind: str, connection_string: str, empty: fx.OrdersTable, full: fx.OrdersTable
) -> StoreRun:
    counter = RequestCounter()
    store = TimedStore(make_store(kind, connection_string, counter))
    out = StoreRun(kind=kind)

    def scenario(
        name: str, engine: Engine, status: str, rows: int
    ) -> tuple[RunReport, Counter[str]]:
        counter.take()
        store.reset()
        report = engine.run({})
        _checked(report, f"{kind} {name}", status, rows)
        counts = counter.take()
        out.counts[name] = counts
        out.store_calls[name] = {m: n for m, n in store.snapshot().items() if n}
        return report, counts

    ctx.progress(f"{kind}: first run in a fresh {'container' if kind == 'blob' else 'table'}")
    engine, source = runs.make_engine(empty, store, ctx.batch_size)
    try:
        scenario("first run", engine, "caught_up", 0)
    finally:
        source.close()

    ctx.progress(f"{kind}: drain of {full.rows:,} rows, then {IDLE_RUNS} idle runs")
    engine, source = runs.make_engine(full, store, ctx.batch_size)
    try:
        store.replace_seconds.clear()
        started = time.perf_counter()
        report, _ = scenario("drain", engine, "caught_up", full.rows)
        out.drain_seconds = time.perf_counter() - started
        out.batches = report.batches
        out.commit_seconds = list(store.replace_seconds[1:])  # [0] is the fence write
        _, idle = scenario("idle", engine, "caught_up", 0)
        for _ in range(IDLE_RUNS):
            started = time.perf_counter()
            _checked(engine.run({}), f"{kind} idle", "caught_up", 0)
            out.idle_seconds.append(time.perf_counter() - started)
            again = counter.take()
            if again != idle:
                out.idle_varied.append(sum(again.values()))

        other = store.acquire(engine.config.key, "another-instance", 60)
        if other is None:
            raise RuntimeError(f"{kind}: could not take the lease for the lease-held scenario")
        try:
            scenario("lease held", engine, "lease_held", 0)
        finally:
            store.release(other)

        _add_row(full)
        slow = Engine(
            engine.config,
            source,
            store,
            _slow,
            SystemClock(),
            owner=runs.OWNER,
            heartbeat_interval=HEARTBEAT,
        )
        scenario("slow handler", slow, "caught_up", 1)
    finally:
        source.close()
    out.latency = counter.latencies()
    return out


def _per_batch(run: StoreRun, label: str) -> float:
    extra = run.counts["drain"][label] - run.counts["idle"][label]
    return round(extra / run.batches, 3) if run.batches else float("nan")


def _grid_rows(run: StoreRun) -> list[tuple[str, tuple[Scalar, ...]]]:
    labels = sorted({label for counts in run.counts.values() for label in counts})
    rows: list[tuple[str, tuple[Scalar, ...]]] = []
    for label in labels:
        values: list[Scalar] = []
        for column in SCENARIOS:
            if column == "per batch":
                values.append(_per_batch(run, label))
            else:
                values.append(run.counts[column][label])
        rows.append((label, tuple(values)))
    totals: list[Scalar] = []
    for column in SCENARIOS:
        if column == "per batch":
            drain, idle = sum(run.counts["drain"].values()), sum(run.counts["idle"].values())
            totals.append(round((drain - idle) / run.batches, 3) if run.batches else None)
        else:
            totals.append(sum(run.counts[column].values()))
    rows.append(("total requests", tuple(totals)))
    return rows


def _ms(seconds: list[float]) -> float:
    return round(statistics.median(seconds) * 1000, 2) if seconds else float("nan")


def _record(result: BenchmarkResult, run: StoreRun, rows: int) -> None:
    kind = run.kind
    total = {name: sum(counts.values()) for name, counts in run.counts.items()}
    calls = run.store_calls

    def detail(name: str) -> str:
        return "store calls: " + " ".join(f"{m}={n}" for m, n in calls[name].items())

    result.metric(
        f"{kind}.first_run.requests",
        f"{kind}: first run ever",
        total["first run"],
        "count",
        detail("first run"),
    )
    result.metric(
        f"{kind}.idle.requests", f"{kind}: idle run", total["idle"], "count", detail("idle")
    )
    per_batch = (total["drain"] - total["idle"]) / run.batches if run.batches else float("nan")
    result.metric(
        f"{kind}.per_batch.requests",
        f"{kind}: per batch of a drain",
        per_batch,
        "count",
        f"{run.batches} batches, {total['drain']} requests in the drain",
    )
    result.metric(
        f"{kind}.lease_held.requests",
        f"{kind}: run while another owner holds the lease",
        total["lease held"],
        "count",
        detail("lease held"),
    )
    renewals = sum(n for label, n in run.counts["slow handler"].items() if "lease renew" in label)
    result.metric(
        f"{kind}.slow_handler.renewals",
        f"{kind}: lease renewals, {SLOW_HANDLER:g} s handler, heartbeat {HEARTBEAT:g} s",
        renewals,
        "count",
        f"{total['slow handler']} requests in that run",
    )
    result.metric(
        f"{kind}.idle.ms",
        f"{kind}: idle run, wall time",
        _ms(run.idle_seconds),
        "ms",
        f"median of {len(run.idle_seconds)}, min {min(run.idle_seconds) * 1000:.1f}",
    )
    result.metric(
        f"{kind}.commit.ms",
        f"{kind}: checkpoint commit (store.replace), wall time",
        _ms(run.commit_seconds),
        "ms",
        f"median of the drain's {len(run.commit_seconds)} commits",
    )
    result.metric(
        f"{kind}.drain.rows_per_s",
        f"{kind}: drain of {rows:,} rows, engine",
        rows / run.drain_seconds if run.drain_seconds else float("nan"),
        "rows/s",
        f"{run.drain_seconds:.2f} s, one sample",
    )
    if run.idle_varied:
        result.note(
            f"{kind}: {len(run.idle_varied)} of {IDLE_RUNS} later idle runs sent a different "
            f"number of requests ({sorted(set(run.idle_varied))}) than the counted one."
        )


def run(ctx: Context) -> BenchmarkResult:
    result = BenchmarkResult(name=BENCHMARK.name, title=BENCHMARK.title, tier=BENCHMARK.tier)
    with azurite(ctx) as connection_string:
        base = fx.orders(ctx, ctx.rows)
        empty = fx.build_orders(ctx.workdir / "azurite_empty.db", 0)
        runs: list[StoreRun] = []
        for kind in ("blob", "table"):
            # Each store gets its own copy: the slow-handler scenario adds a row.
            copy = ctx.workdir / f"azurite_{kind}.db"
            shutil.copyfile(base.path, copy)
            full = dataclasses.replace(base, path=copy)
            runs.append(run_store(ctx, kind, connection_string, empty, full))
    for store_run in runs:
        _record(result, store_run, base.rows)
    for store_run in runs:
        result.grid(
            f"{store_run.kind}.requests",
            f"{store_run.kind.capitalize()}StateStore: HTTP requests per run, by operation",
            SCENARIOS,
            _grid_rows(store_run),
        )
    latency: dict[str, list[float]] = {}
    for store_run in runs:
        for label, times in store_run.latency.items():
            latency.setdefault(f"{store_run.kind} store, {label}", []).extend(times)
    result.grid(
        "latency",
        "HTTP round trip per operation on Azurite (all scenarios)",
        ("requests", "median ms"),
        [(label, (len(times), _ms(times))) for label, times in sorted(latency.items())],
    )
    result.note(
        "Counted by an azure-core SansIOHTTPPolicy attached through client_options "
        "(raw_request_hook/raw_response_hook run it after the SDK's retry policy, so retries "
        "would count too); `per_call_policies` is not honoured by these stores' clients."
    )
    result.note(
        "`per batch` = (drain - idle) / batches. The idle, lease-held and slow-handler runs "
        "reuse the drain's engine and source (steady state); the first run is on an empty table."
    )
    return result


BENCHMARK = Benchmark(
    name="azurite_requests",
    title="Azurite: storage requests of the Blob and Table state stores (counted)",
    tier="azurite",
    run=run,
)
