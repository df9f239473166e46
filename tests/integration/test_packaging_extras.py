"""What a Function App installs: the package runs a poller without the command line's ``rich``
(the ``cli`` extra), and ``afdb`` without it says what to install."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NO_RICH = "import sys\nsys.modules['rich'] = None  # as if the `cli` extra were not installed\n"


def _python(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-c", NO_RICH + code],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_poller_runs_without_the_cli_extra(tmp_path):
    code = textwrap.dedent(
        """
        import sqlite3
        con = sqlite3.connect("orders.db")
        con.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, at TIMESTAMP)")
        con.execute("INSERT INTO orders VALUES (1, '2020-01-01 00:00:00')")
        con.commit()
        import azure_functions_db as afdb
        db = afdb.PollerBlueprint()
        seen = []

        @db.poller(
            name="orders", schedule="0 * * * * *",
            source=afdb.SqlSource(url="sqlite:///orders.db", table="orders", cursor="at"),
            state=afdb.LocalStateStore("state"),
        )
        def handle(batch):
            seen.extend(c.pk for c in batch)

        report = db.pollers["orders"].run_once({})
        assert seen == [1], seen
        assert "rich" not in {m.split(".")[0] for m in sys.modules if sys.modules[m]}
        print("ran", report.status)
        """
    )
    out = _python(code, tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ran caught_up"


def test_the_cli_without_its_extra_says_what_to_install(tmp_path):
    out = _python(
        "from azure_functions_db.cli import main\nraise SystemExit(main(['--help']))", tmp_path
    )
    assert out.returncode == 2
    assert "pip install 'afdb[cli]'" in out.stderr


def test_the_extras_are_declared_as_the_docs_say():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert not any(d.startswith("rich") for d in project["dependencies"])
    extras = project["optional-dependencies"]
    assert extras["cli"] == ["rich>=13"]
    assert extras["spark"] == ["pyspark>=3.5,<3.6"]
    assert any("cli" in d for d in extras["dev"])
