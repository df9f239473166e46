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
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--wheel-dir",
         str(app / "dist"), str(REPO)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert build.returncode == 0, build.stderr
    # No deprecation warnings from the build backend (the old `license` table gave 39 lines).
    assert "Deprecat" not in build.stdout + build.stderr
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


def test_every_deployed_requirement_is_bounded():
    """A Functions deploy runs pip on requirements.txt: an unbounded line lets a new major
    version in unannounced (a Functions linter flags it)."""
    lines = [
        line.strip()
        for line in (REPO / "requirements.txt").read_text().splitlines()
        if line.strip() and not line.startswith(("#", "-"))
    ]
    assert lines
    unbounded = [line for line in lines if "==" not in line and "<" not in line]
    assert unbounded == []


def test_all_brings_every_extra():
    extras = PYPROJECT["project"]["optional-dependencies"]
    (everything,) = extras["all"]
    named = set(everything.split("[", 1)[1].rstrip("]").split(","))
    assert named == set(extras) - {"all", "dev"}


@pytest.mark.slow
def test_a_users_type_checker_finds_the_installed_package(tmp_path):
    """The editable install `make demo` and the quickstart make (setuptools' strict mode: links
    on a path entry, not an import hook) lets mypy, run for a user's project, find
    `azure_functions_db` and its py.typed."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--no-deps",
         "--config-settings", "editable_mode=strict", "-e", str(REPO)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert install.returncode == 0, install.stderr
    assert "Deprecat" not in install.stdout + install.stderr
    user = tmp_path / "user_app.py"
    user.write_text(
        "import azure_functions_db as afdb\n\n"
        "batch_size: int = afdb.PollerBlueprint\n"  # a type error mypy can only see with types
    )
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--python-executable", str(python),
         "--no-incremental", str(user)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert "import-not-found" not in done.stdout, done.stdout
    assert "missing library stubs or py.typed" not in done.stdout, done.stdout
    assert "Incompatible types in assignment" in done.stdout, done.stdout
