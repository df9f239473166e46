"""The state-store contract over the in-memory and the local file stores, plus what only the
local store has (files, layout, several store objects on one directory)."""

from __future__ import annotations

import datetime as dt
import errno
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from azure_functions_db.core.checkpoint import Checkpoint, PollerKey
from azure_functions_db.core.clock import SystemClock
from azure_functions_db.core.ports import StateStore
from azure_functions_db.errors import (
    CheckpointConflictError,
    CheckpointCorruptError,
    RecordExistsError,
    StateStoreError,
    TransientStoreError,
)
from azure_functions_db.state import LocalStateStore, MemoryStateStore
from azure_functions_db.testing import GARBAGE, FakeClock, StateStoreContract


class TestMemoryStateStore(StateStoreContract):
    def make_store(self, clock: FakeClock, tmp_path: Path) -> StateStore:
        return MemoryStateStore(clock=clock)

    def corrupt(self, store: StateStore, key: PollerKey, data: bytes = GARBAGE) -> None:
        assert isinstance(store, MemoryStateStore)
        store.write_raw(key, data)

    def corrupt_quarantined(
        self, store: StateStore, key: PollerKey, record_id: str, data: bytes = GARBAGE
    ) -> None:
        assert isinstance(store, MemoryStateStore)
        store.write_quarantined_raw(key, record_id, data)

    def test_default_clock_is_the_system_clock(self) -> None:
        store = MemoryStateStore()
        key = PollerKey("live", "orders")
        assert store.acquire(key, "a", 30) is not None
        expires_at = store.inspect(key).expires_at
        assert expires_at is not None
        remaining = (expires_at - dt.datetime.now(dt.UTC)).total_seconds()
        assert 25 < remaining <= 30


class TestLocalStateStore(StateStoreContract):
    def make_store(self, clock: FakeClock, tmp_path: Path) -> StateStore:
        return LocalStateStore(tmp_path / "state", clock=clock)

    def corrupt(self, store: StateStore, key: PollerKey, data: bytes = GARBAGE) -> None:
        assert isinstance(store, LocalStateStore)
        store.write_raw(key, data)

    def corrupt_quarantined(
        self, store: StateStore, key: PollerKey, record_id: str, data: bytes = GARBAGE
    ) -> None:
        assert isinstance(store, LocalStateStore)
        store.write_quarantined_raw(key, record_id, data)

    def reopen(self, store: StateStore) -> StateStore:
        assert isinstance(store, LocalStateStore)
        return LocalStateStore(store.root)

    def test_layout_is_namespace_directory_with_checkpoint_lease_and_lock_files(
        self, tmp_path: Path, clock: FakeClock
    ) -> None:
        store = LocalStateStore(tmp_path / "a" / "b", clock=clock)
        key = PollerKey("live", "orders")
        assert store.read(key) is None
        assert not (tmp_path / "a").exists()  # reads create nothing
        etag = store.create(Checkpoint(key=key))
        grant = store.acquire(key, "host-1", 30)
        assert grant is not None
        directory = tmp_path / "a" / "b" / "live"
        assert sorted(os.listdir(directory)) == [
            "orders.checkpoint",
            "orders.lease",
            "orders.lock",
        ]
        header = f"afdb-checkpoint etag={etag}\n".encode()
        assert (directory / "orders.checkpoint").read_bytes().startswith(header)
        lease = json.loads((directory / "orders.lease").read_text())
        # Expiry on the monotonic clock (seconds since an arbitrary origin), with the boot id.
        boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        origin = dt.datetime(2000, 1, 1, tzinfo=dt.UTC).timestamp()
        assert lease == {
            "lease_id": grant.lease_id,
            "owner": "host-1",
            "expires_at": origin + clock.monotonic() + 30,
            "fence": 1,
            "clock": "monotonic",
            "boot_id": boot_id,
            "pid": os.getpid(),  # the owner's process and its start time: a dead owner frees it
            "pid_start": int(
                Path(f"/proc/{os.getpid()}/stat").read_text().rpartition(")")[2].split()[19]
            ),
            "pid_ns": os.readlink("/proc/self/ns/pid"),
        }
        # Shown as wall-clock time all the same.
        assert store.inspect(key).expires_at == clock.now() + dt.timedelta(seconds=30)
        assert store.describe() == f"local:{tmp_path / 'a' / 'b'}"

    def test_two_store_objects_on_one_directory_share_records_and_leases(
        self, tmp_path: Path, clock: FakeClock
    ) -> None:
        first = LocalStateStore(tmp_path, clock=clock)
        second = LocalStateStore(str(tmp_path), clock=clock)
        key = PollerKey("live", "orders")
        etag = first.create(Checkpoint(key=key))
        with pytest.raises(RecordExistsError):
            second.create(Checkpoint(key=key))
        assert second.replace(Checkpoint(key=key, fence=1), etag) != etag
        with pytest.raises(CheckpointConflictError):
            first.replace(Checkpoint(key=key, fence=1), etag)
        assert first.acquire(key, "a", 30) is not None
        assert second.acquire(key, "b", 30) is None

    @pytest.mark.parametrize("content", [b"", b"garbage", b"afdb-checkpoint etag=zz\n{}"])
    def test_file_without_a_valid_header_is_corrupt_and_never_overwritten(
        self, tmp_path: Path, content: bytes
    ) -> None:
        store = LocalStateStore(tmp_path)
        key = PollerKey("live", "orders")
        path = store.checkpoint_path(key)
        path.parent.mkdir(parents=True)
        path.write_bytes(content)
        with pytest.raises(CheckpointCorruptError):
            store.read(key)
        with pytest.raises(RecordExistsError):
            store.create(Checkpoint(key=key))
        with pytest.raises(CheckpointConflictError) as info:
            store.replace(Checkpoint(key=key), "0" * 32)
        assert "corrupt" in info.value.reason
        assert path.read_bytes() == content

    def test_corrupt_lease_file_is_an_error_not_a_free_lease(self, tmp_path: Path) -> None:
        store = LocalStateStore(tmp_path)
        key = PollerKey("live", "orders")
        assert store.acquire(key, "a", 30) is not None
        store.lease_path(key).write_text('{"fence": "seven"}')
        with pytest.raises(StateStoreError, match="corrupt"):
            store.acquire(key, "b", 30)
        with pytest.raises(StateStoreError, match="corrupt"):
            store.inspect(key)

    @pytest.mark.parametrize("name", ["a/b", "..", ".hidden", "x.lease", "ü 100%", "a\\b"])
    def test_any_poller_name_maps_to_one_file_in_its_namespace(
        self, tmp_path: Path, name: str
    ) -> None:
        store = LocalStateStore(tmp_path)
        key = PollerKey(name, name)
        store.create(Checkpoint(key=key))
        assert store.list_keys() == [key]
        path = store.checkpoint_path(key)
        assert path.parent.parent == tmp_path
        assert path.is_file()
        assert not path.name.startswith(".")

    def test_list_keys_ignores_foreign_and_temporary_files(self, tmp_path: Path) -> None:
        store = LocalStateStore(tmp_path)
        key = PollerKey("live", "orders")
        store.create(Checkpoint(key=key))
        for name in (".orders.checkpoint.1234.tmp", "notes.txt", "a b.checkpoint"):
            (tmp_path / "live" / name).write_text("x")
        (tmp_path / "README").write_text("x")
        assert store.list_keys() == [key]
        assert store.list_keys("missing") == []

    def test_os_errors_become_state_store_errors_with_the_cause(self, tmp_path: Path) -> None:
        blocker = tmp_path / "file"
        blocker.write_text("not a directory")
        store = LocalStateStore(blocker)
        with pytest.raises(StateStoreError, match="Local state store could not") as info:
            store.create(Checkpoint(key=PollerKey("live", "orders")))
        assert isinstance(info.value.__cause__, OSError)

    @pytest.mark.parametrize(
        ("code", "error"),
        [
            pytest.param(errno.ENOSPC, StateStoreError, id="ENOSPC-is-permanent"),
            pytest.param(errno.EAGAIN, TransientStoreError, id="EAGAIN-is-transient"),
        ],
    )
    def test_failed_write_is_translated_and_leaves_no_temp_file(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, error: type[Exception]
    ) -> None:
        store = LocalStateStore(tmp_path)
        key = PollerKey("live", "orders")
        etag = store.create(Checkpoint(key=key))

        def failing_replace(src: object, dst: object) -> None:
            raise OSError(code, os.strerror(code))

        monkeypatch.setattr(os, "replace", failing_replace)
        with pytest.raises(error) as info:
            store.replace(Checkpoint(key=key, fence=1), etag)
        assert isinstance(info.value.__cause__, OSError)
        monkeypatch.undo()
        assert sorted(os.listdir(tmp_path / "live")) == ["orders.checkpoint", "orders.lock"]
        stored = store.read(key)
        assert stored is not None
        assert stored.etag == etag


def test_system_clock_reads_utc_wall_time_and_the_monotonic_clock() -> None:
    clock = SystemClock()
    before = dt.datetime.now(dt.UTC)
    now = clock.now()
    assert now.utcoffset() == dt.timedelta(0)
    assert before <= now <= dt.datetime.now(dt.UTC)
    first = clock.monotonic()
    clock.sleep(0.01)
    assert clock.monotonic() - first >= 0.01


LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1")


class SteppedClock(SystemClock):
    """The system clock with its wall time stepped ``ahead`` seconds (NTP, an operator)."""

    def __init__(self, ahead: float) -> None:
        self.ahead = dt.timedelta(seconds=ahead)

    def now(self) -> dt.datetime:
        return super().now() + self.ahead


def test_a_wall_clock_step_cannot_free_a_live_local_lease(tmp_path: Path) -> None:
    """Expiry is decided on the monotonic clock: a process whose wall clock jumped ten minutes
    ahead does not take a lease another process holds (two handlers would run at once)."""
    key = PollerKey("live", "orders")
    holder = LocalStateStore(tmp_path, clock=SystemClock())
    assert holder.acquire(key, "holder", 30) is not None
    stepped = LocalStateStore(tmp_path, clock=SteppedClock(600))
    assert stepped.acquire(key, "stepped", 30) is None
    assert stepped.inspect(key).holder == "holder"


@pytest.mark.slow
@pytest.mark.skipif(not LIBFAKETIME.is_file(), reason="needs Debian's faketime (.ci/run)")
def test_a_process_with_its_wall_clock_ten_minutes_ahead_cannot_take_the_lease(
    tmp_path: Path,
) -> None:
    key = PollerKey("live", "orders")
    assert LocalStateStore(tmp_path).acquire(key, "holder", 30) is not None
    script = (
        "import sys; from azure_functions_db.state.local import LocalStateStore; "
        "from azure_functions_db.core.checkpoint import PollerKey; "
        f"g = LocalStateStore({str(tmp_path)!r}).acquire(PollerKey('live', 'orders'), 'x', 30); "
        "print('took' if g else 'refused')"
    )
    env = {  # a wall clock stepped 10 minutes ahead; the monotonic clock untouched
        **os.environ,
        "LD_PRELOAD": str(LIBFAKETIME),
        "FAKETIME": "+10m",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            script + "; import time; assert time.time() > " + str(time.time() + 500),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "refused"
