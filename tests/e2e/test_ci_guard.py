"""The CI guard in conftest.py: with CI=true a skipped test fails the run; locally it does not."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SKIPPING = """
import pytest

@pytest.mark.postgres
def test_needs_a_server():
    pytest.skip("server not running")

def test_cannot_apply():
    pytest.skip("not applicable: exact instants on a service clock")

def test_fine():
    pass
"""


@pytest.mark.parametrize(("ci", "code"), [("true", 1), ("", 0)])
def test_a_skip_fails_the_run_only_in_ci(tmp_path: Path, ci: str, code: int) -> None:
    shutil.copy(Path(__file__).resolve().parents[1] / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_skipping.py").write_text(SKIPPING)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    postgres: x\n")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        env={**os.environ, "CI": ci},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
    )
    assert result.returncode == code, result.stdout + result.stderr
    if ci:
        assert "every service tier must run" in result.stdout
        assert "test_needs_a_server" in result.stdout
        assert "test_cannot_apply" not in result.stdout
