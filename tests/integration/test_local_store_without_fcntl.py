"""The package on a machine without ``fcntl`` (Windows): it imports, and the local state store
locks with ``msvcrt`` instead. Windows itself is not available here: the interpreters of these
tests hide ``fcntl`` and emulate ``msvcrt.locking`` (``tests/support/windows_site``), and run the
local store's whole contract and its multi-process tests that way."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from azure_functions_db.core.checkpoint import PollerKey
from azure_functions_db.errors import StateStoreError
from azure_functions_db.state import LocalStateStore, _files

REPO = Path(__file__).resolve().parents[2]
SITE = REPO / "tests" / "support" / "windows_site"


def _windows_like() -> dict[str, str]:
    path = os.pathsep.join([str(SITE), str(REPO), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "AFDB_TEST_NO_FCNTL": "1", "PYTHONPATH": path}


def test_without_fcntl_the_package_imports_and_the_store_locks_with_msvcrt() -> None:
    probe = (
        "import azure_functions_db\n"
        "from azure_functions_db.state import _files\n"
        "try:\n    import fcntl\nexcept ImportError:\n    print('no-fcntl')\n"
        "print(_files.LOCKS)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe],
        env=_windows_like(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["no-fcntl", "msvcrt"]


def test_the_local_store_contract_and_process_races_hold_with_msvcrt_locks() -> None:
    tests = [
        "tests/contract/test_state_contract.py",
        "-k",
        "Local or local or racing or cas or killed or live_owner",
        "tests/e2e/test_local_store_processes.py",
    ]
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
        cwd=REPO,
        env=_windows_like(),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert " passed" in out.stdout, out.stdout[-2000:]


def test_without_any_file_lock_the_store_says_what_to_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_files, "_fcntl", None)
    monkeypatch.setattr(_files, "_msvcrt", None)
    with pytest.raises(StateStoreError, match=r"needs file locks.*BlobStateStore"):
        LocalStateStore(tmp_path).acquire(PollerKey("live", "orders"), "me", 30)


def test_without_directory_fsync_or_cloexec_the_writes_still_land(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Windows has neither ``O_DIRECTORY`` nor ``O_CLOEXEC``."""
    monkeypatch.delattr(os, "O_DIRECTORY")
    monkeypatch.delattr(os, "O_CLOEXEC")
    store = LocalStateStore(tmp_path)
    key = PollerKey("live", "orders")
    assert store.acquire(key, "me", 30) is not None
    assert store.read(key) is None
