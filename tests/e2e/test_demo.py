"""Smoke test of ``make demo``: the README's first command works and checks itself."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from azure_functions_db.cli import EXIT_OK, main

ROOT = Path(__file__).resolve().parents[2]


def test_demo_delivers_every_row_then_exactly_the_new_ones(tmp_path, capsys):
    assert main(["demo", "--dir", str(tmp_path / "demo")]) == EXIT_OK
    out = capsys.readouterr().out
    assert "run: caught_up, 3 batch(es), 10 row(s) delivered" in out
    assert "run: caught_up, 0 batch(es), 0 row(s) delivered" in out
    assert "run: caught_up, 1 batch(es), 3 row(s) delivered" in out
    assert "shipped" in out
    assert "demo OK" in out


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_demo(tmp_path):
    # Use the interpreter's own venv so the target does not build a second one.
    venv = Path(sys.prefix)
    result = subprocess.run(
        ["make", "-C", str(ROOT), "demo", f"VENV={venv}"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "demo OK" in result.stdout
