"""Drive the real Python worker library, ``azure-functions-runtime``, through one Functions app.

Run it with the Python 3.13 of the worker venv (``tests/e2e/test_worker_load.py`` builds it)::

    python -P tests/support/worker_driver.py APP_DIR [--invoke FUNCTION] [--times N]
        [--past-due-from K]

It plays the Functions host and the worker's gRPC proxy, sending the library, through its own
public entry points, what the host sends over gRPC: ``worker_init_request`` (the library imports
``APP_DIR/function_app.py`` and indexes it: ``index_function_app``,
``process_indexed_function``, ``Registry.add_indexed_function``, where a bad signature raises
``FunctionLoadError``), ``functions_metadata_request``, one ``function_load_request`` per indexed
function, then ``--times`` invocation requests (``invocation_request``) of the timer function
``--invoke``, each with the timer payload and trigger metadata the host sends. The app settings
come from the caller's environment.

Stood in: the gRPC transport and the proxy around the library (messages are passed as Python
objects; before the first request the app directory is put on ``sys.path``, the cwd and
``AzureWebJobsScriptRoot`` as the proxy and the host do), and the protobuf message classes
(``tests/support/worker_protos.py``). Everything else, indexing, binding checks, the timer converter
of ``azure.functions``, the invocation, is the worker library's own code.

Prints exactly one JSON document on stdout (everything else, app and worker logs included, goes to
stderr): the responses, with statuses as labels (``Success``/``Failure``), each function's
metadata with its raw bindings decoded, and per invocation the ``azure_functions_db`` log events
(``action`` and its fields) and the app's own log lines.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import importlib.util
import json
import logging
import os
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

HOST_VERSION = "4.1041.200"  # what a host of the v4 line reports; the library only logs it
SCRIPT_ROOT = "AzureWebJobsScriptRoot"  # the app directory, set by the host


@dataclass
class WorkerRequest:
    """What the proxy worker hands the library: the gRPC message and, on init, its properties."""

    name: str
    request: Any
    properties: dict[str, Any] | None = None


class Collector(logging.Handler):
    """Keeps the records of ``azure_functions_db`` and of the app for the JSON report."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.events: list[dict[str, Any]] = []
        self.app_lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.name.startswith("azure_functions_db"):
            action = getattr(record, "afdb_action", None)
            if action is None:
                return
            event: dict[str, Any] = {"action": action, "level": record.levelname}
            for key, value in vars(record).items():
                if key.startswith("afdb_") and key != "afdb_action":
                    event[key.removeprefix("afdb_")] = _json_safe(value)
            self.events.append(event)
        elif record.name == "function_app":
            self.app_lines.append(record.getMessage())

    def take(self) -> tuple[list[dict[str, Any]], list[str]]:
        events, lines = self.events, self.app_lines
        self.events, self.app_lines = [], []
        return events, lines


def _json_safe(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


def load_protos() -> ModuleType:
    path = Path(__file__).resolve().parent / "worker_protos.py"
    spec = importlib.util.spec_from_file_location("worker_protos", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["worker_protos"] = module
    spec.loader.exec_module(module)
    return module


def status_label(protos: ModuleType, result: Any) -> str:
    return str(protos.StatusResult.Status.Name(result.status))


def exception_of(result: Any) -> dict[str, str] | None:
    if not result.HasField("exception"):
        return None
    return {"message": result.exception.message, "stack_trace": result.exception.stack_trace}


def describe_function(protos: ModuleType, fn: Any) -> dict[str, Any]:
    bindings = {
        name: {
            "type": info.type,
            "direction": protos.BindingInfo.Direction.Name(info.direction),
            "data_type": protos.BindingInfo.DataType.Name(info.data_type),
        }
        for name, info in fn.bindings.items()
    }
    return {
        "name": fn.name,
        "function_id": fn.function_id,
        "directory": fn.directory,
        "script_file": fn.script_file,
        "entry_point": fn.entry_point,
        "language": fn.language,
        "is_proxy": fn.is_proxy,
        "properties": dict(fn.properties),
        "bindings": bindings,
        "raw_bindings": [json.loads(raw) for raw in fn.raw_bindings],
        "retry_options": fn.retry_options.to_dict() if fn.HasField("retry_options") else None,
    }


def timer_payload(past_due: bool, now: dt.datetime) -> str:
    """The timer trigger's data as the host serializes ``TimerInfo`` (Newtonsoft, PascalCase)."""
    return json.dumps(
        {
            "Schedule": {"AdjustForDST": True},
            "ScheduleStatus": {
                "Last": (now - dt.timedelta(seconds=30)).isoformat(),
                "Next": (now + dt.timedelta(seconds=30)).isoformat(),
                "LastUpdated": (now - dt.timedelta(seconds=30)).isoformat(),
            },
            "IsPastDue": past_due,
        }
    )


def invocation_message(
    protos: ModuleType, function: Any, timer_binding: str, past_due: bool
) -> tuple[str, Any]:
    now = dt.datetime.now(dt.UTC).replace(microsecond=0)
    payload = timer_payload(past_due, now)
    invocation_id = str(uuid.uuid4())
    sys_metadata = {
        "MethodName": function.name,
        "UtcNow": now.isoformat(),
        "RandGuid": str(uuid.uuid4()),
    }
    request = protos.InvocationRequest(
        invocation_id=invocation_id,
        function_id=function.function_id,
        input_data=[
            protos.ParameterBinding(name=timer_binding, data=protos.TypedData(json=payload))
        ],
        trigger_metadata={
            timer_binding: protos.TypedData(json=payload),
            "sys": protos.TypedData(json=json.dumps(sys_metadata)),
        },
        trace_context=protos.RpcTraceContext(
            trace_parent=f"00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-01",
            trace_state="",
            attributes={"OperationName": function.name},
        ),
        retry_context=protos.RetryContext(retry_count=0, max_retry_count=0),
    )
    return invocation_id, protos.StreamingMessage(
        request_id=str(uuid.uuid4()), invocation_request=request
    )


async def drive(
    runtime: ModuleType, protos: ModuleType, app_dir: str, args: argparse.Namespace, logs: Collector
) -> dict[str, Any]:
    report: dict[str, Any] = {
        "worker": {"library": "azure-functions-runtime", "python": sys.version.split()[0]},
        "app_dir": app_dir,
    }
    init_message = protos.StreamingMessage(
        request_id=str(uuid.uuid4()),
        worker_init_request=protos.WorkerInitRequest(
            host_version=HOST_VERSION,
            capabilities={},
            worker_directory=str(Path(runtime.__file__ or ".").parent),
            function_app_directory=app_dir,
        ),
    )
    init = await runtime.worker_init_request(
        WorkerRequest("WorkerInitRequest", init_message, {"protos": protos, "host": "127.0.0.1"})
    )
    report["worker"]["version"] = init.worker_metadata.worker_version
    report["init"] = {
        "status": status_label(protos, init.result),
        "exception": exception_of(init.result),
        "capabilities": dict(init.capabilities),
        "worker_metadata": init.worker_metadata.to_dict(),
    }
    if report["init"]["status"] != "Success":
        return report

    metadata = await runtime.functions_metadata_request(
        WorkerRequest(
            "WorkerMetadataRequest",
            protos.StreamingMessage(
                request_id=str(uuid.uuid4()),
                functions_metadata_request=protos.FunctionsMetadataRequest(
                    function_app_directory=app_dir
                ),
            ),
        )
    )
    functions = list(metadata.function_metadata_results)
    report["metadata"] = {
        "status": status_label(protos, metadata.result),
        "use_default_metadata_indexing": metadata.use_default_metadata_indexing,
        "functions": [describe_function(protos, fn) for fn in functions],
    }

    report["load"] = {}
    for fn in functions:
        loaded = await runtime.function_load_request(
            WorkerRequest(
                "FunctionLoadRequest",
                protos.StreamingMessage(
                    request_id=str(uuid.uuid4()),
                    function_load_request=protos.FunctionLoadRequest(
                        function_id=fn.function_id, metadata=fn
                    ),
                ),
            )
        )
        report["load"][fn.name] = {
            "function_id": loaded.function_id,
            "status": status_label(protos, loaded.result),
        }

    report["invocations"] = []
    if args.invoke is None:
        return report
    by_name = {fn.name: fn for fn in functions}
    if args.invoke not in by_name:
        raise SystemExit(f"no function {args.invoke!r} was indexed: {sorted(by_name)}")
    function = by_name[args.invoke]
    timer_binding = next(
        name for name, info in function.bindings.items() if info.type == "timerTrigger"
    )
    logs.take()
    for number in range(1, args.times + 1):
        past_due = args.past_due_from is not None and number >= args.past_due_from
        invocation_id, message = invocation_message(protos, function, timer_binding, past_due)
        started = time.monotonic()
        response = await runtime.invocation_request(
            WorkerRequest("FunctionInvocationRequest", message)
        )
        events, app_lines = logs.take()
        report["invocations"].append(
            {
                "number": number,
                "invocation_id": invocation_id,
                "response_invocation_id": response.invocation_id,
                "past_due": past_due,
                "status": status_label(protos, response.result),
                "exception": exception_of(response.result),
                "has_return_value": response.HasField("return_value"),
                "output_data": len(response.output_data),
                "seconds": round(time.monotonic() - started, 3),
                "events": events,
                "app_log": app_lines,
            }
        )
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("app_dir", help="the function app directory (holds function_app.py)")
    parser.add_argument("--invoke", help="name of the timer function to invoke")
    parser.add_argument("--times", type=int, default=1, help="invocations of --invoke")
    parser.add_argument(
        "--past-due-from", type=int, help="invocations from this number on are past due"
    )
    args = parser.parse_args(argv)

    # stdout carries the one JSON document; the worker flushes stdout after each invocation
    # and apps may print, so everything else goes to stderr.
    out = sys.stdout
    sys.stdout = sys.stderr
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logs = Collector()
    logging.getLogger().addHandler(logs)

    # What the host and the proxy worker do before the first request reaches the library:
    # the host starts the worker in the app directory with AzureWebJobsScriptRoot set, and the
    # proxy puts that directory on sys.path (DependencyManager.prioritize_customer_dependencies).
    app_dir = str(Path(args.app_dir).resolve())
    os.environ[SCRIPT_ROOT] = app_dir
    os.chdir(app_dir)
    if app_dir not in sys.path:
        sys.path.append(app_dir)

    protos = load_protos()
    import azure_functions_runtime as runtime

    runtime.start_threadpool_executor()
    try:
        report = asyncio.run(drive(runtime, protos, app_dir, args, logs))
    finally:
        runtime.stop_threadpool_executor()
    out.write(json.dumps(report, sort_keys=True) + "\n")
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
