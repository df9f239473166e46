"""The distribution users install: its name, its extras, and the sample's requirements.txt.

PyPI's `azure-functions-db` is an unrelated project with the same import name, so ours is
`afdb`. A deploy tool runs pip from a directory of its own choosing; the repository's
requirements.txt must resolve our wheel (with its extras) from any working directory.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
DISTRIBUTION = "afdb"


def test_the_distribution_has_its_own_name_and_every_instruction_uses_it():
    project = PYPROJECT["project"]
    assert project["name"] == DISTRIBUTION
    names = {
        re.split(r"[\[<>=!; ]", dep)[0]
        for deps in project["optional-dependencies"].values()
        for dep in deps
    }
    assert "azure-functions-db" not in names
    assert DISTRIBUTION in names  # `all` and `dev` name their extras through our own name
    # No install instruction names the other project's distribution.
    stale = re.compile(r"azure-functions-db\[|pip install ['\"]?azure-functions-db\b")
    texts = [REPO / "README.md", REPO / "requirements.txt", *sorted((REPO / "docs").glob("*.md"))]
    texts += sorted((REPO / "azure_functions_db").rglob("*.py"))
    offenders = [str(p.relative_to(REPO)) for p in texts if stale.search(p.read_text())]
    assert offenders == []


def test_requirements_pin_the_version_of_this_checkout():
    text = (REPO / "requirements.txt").read_text()
    (pin,) = re.findall(rf"^{DISTRIBUTION}\[[a-z,]+\]==(\S+)$", text, re.MULTILINE)
    assert pin == PYPROJECT["project"]["version"]
    assert re.search(r"^--find-links dist$", text, re.MULTILINE)
    assert "dist" not in (REPO / ".funcignore").read_text().split()


@pytest.mark.slow
def test_requirements_resolve_the_local_wheel_with_its_extras_from_any_directory(tmp_path):
    """Build the wheel as `make wheel` does, lay out an app folder like a deploy tool's copy,
    and let pip resolve its requirements.txt from another working directory."""
    app = tmp_path / "deployed-app"
    shutil.copy(REPO / "requirements.txt", app.mkdir() or app / "requirements.txt")
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir",
         str(app / "dist"), str(REPO)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert build.returncode == 0, build.stderr
    (wheel,) = (app / "dist").glob("afdb-*.whl")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    report = tmp_path / "report.json"
    resolve = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--ignore-installed",
         "--report", str(report), "-r", str(app / "requirements.txt")],
        cwd=elsewhere, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert resolve.returncode == 0, resolve.stderr
    assert "does not provide the extra" not in resolve.stderr
    installs = {
        item["metadata"]["name"].lower(): item for item in json.loads(report.read_text())["install"]
    }
    ours = installs[DISTRIBUTION]
    assert ours["download_info"]["url"] == wheel.as_uri()
    # The extras came with it: the Azure stores and the PostgreSQL driver.
    assert {"azure-storage-blob", "azure-data-tables", "psycopg", "azure-functions"} <= set(
        installs
    )
