"""docs/quickstart.md works as written: its files and commands, run in a fresh folder."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "quickstart.md"
TITLED = re.compile(r'```python title="([^"]+)"\n(.*?)```', re.DOTALL)
HEREDOC = re.compile(r"python - <<'EOF'\n(.*?)\nEOF\n", re.DOTALL)
TEXT = re.compile(r"```text\n(.*?)```", re.DOTALL)

pytestmark = pytest.mark.slow


def run(args: list[str], cwd: Path, stdin: str | None = None) -> str:
    env = {**os.environ, "ORDERS_DB_URL": "sqlite:///orders.db", "AFDB_STATE_DIR": ".afdb/state"}
    result = subprocess.run(
        args,
        cwd=cwd,
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def afdb(*args: str) -> list[str]:
    return [sys.executable, "-m", "azure_functions_db", *args]


def test_quickstart_runs_as_written(tmp_path):
    text = DOC.read_text()
    files = dict(TITLED.findall(text))
    assert set(files) == {"create_orders.py", "function_app.py"}
    for name, body in files.items():
        (tmp_path / name).write_text(body)
    expected = TEXT.findall(text)

    created = run([sys.executable, "create_orders.py"], tmp_path)
    assert created.strip() == expected[0].strip()  # "orders.db: 3 orders"

    first = run(afdb("run", "function_app.py", "--once"), tmp_path)
    shown = [line for line in expected[1].splitlines() if line.strip()]
    assert [line.split(" (event")[0] for line in first.splitlines()] == [
        line.split(" (event")[0] for line in shown
    ]

    again = run(afdb("run", "function_app.py", "--once"), tmp_path)
    assert "0 row(s)" in again
    assert "order " not in again

    (change,) = HEREDOC.findall(text)
    run([sys.executable, "-"], tmp_path, stdin=change)
    third = run(afdb("run", "function_app.py", "--once"), tmp_path)
    assert [line.split(":")[0] for line in third.splitlines() if line.startswith("order ")] == [
        "order 2",
        "order 4",
    ]

    status = run(afdb("status", "function_app.py", "--json"), tmp_path)
    assert '"rows": 5' in status
