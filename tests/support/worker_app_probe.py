"""Import a ``function_app.py`` afresh and print, as one JSON document, what the host would index.

Run as ``python -P tests/support/worker_app_probe.py PATH/function_app.py`` (any Python the package
supports; ``tests/e2e/test_worker_load.py`` uses the dev venv's 3.11). It loads the app through
``azure_functions_db.runtime.loader.load_pollers`` (a fresh process, so ``app.get_functions()``,
which a ``FunctionApp`` allows only once, runs on a fresh app object) and prints each function's
name, bindings, Python parameters and retry setting, and each poller's ``PollerConfig`` and
schedule.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import sys
from pathlib import Path
from typing import Any

import azure.functions as func

from azure_functions_db.runtime.loader import load_pollers


def main(argv: list[str]) -> int:
    path = Path(argv[0]).resolve()
    pollers = load_pollers(str(path))
    module = sys.modules[path.stem]
    apps = [v for v in vars(module).values() if isinstance(v, func.FunctionRegister)]
    if len(apps) != 1:
        raise SystemExit(f"{path}: expected one top-level function app, found {len(apps)}")
    functions: list[dict[str, Any]] = []
    for function in apps[0].get_functions():
        user = function.get_user_function()
        functions.append(
            {
                "name": function.get_function_name(),
                "bindings": [json.loads(raw) for raw in function.get_raw_bindings()],
                "parameters": list(inspect.signature(user).parameters),
                "is_async": inspect.iscoroutinefunction(user),
                "retry": function.get_settings_dict("retry"),
            }
        )
    report = {
        "functions": functions,
        "pollers": {
            name: {"config": dataclasses.asdict(definition.config), "schedule": definition.schedule}
            for name, definition in pollers.items()
        },
    }
    sys.stdout.write(json.dumps(report, sort_keys=True, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
