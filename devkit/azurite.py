"""Start the real Azurite (the Azure Storage emulator, pinned in ``tools/azurite``) for tests.

One :class:`Azurite` is one Azurite process serving Blob and Table (and Queue, which Azurite
always starts and nobody uses) on free loopback ports, persisting to a directory so that a
:meth:`Azurite.restart` keeps the data. The process runs in its own process group and is killed
at interpreter exit (``atexit``) and, on Linux, when this process dies (``PR_SET_PDEATHSIG``), so
a crashed test run leaves no emulator behind.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

REPO = Path(__file__).resolve().parent.parent
AZURITE_DIR = REPO / "tools" / "azurite"
AZURITE_JS = AZURITE_DIR / "node_modules" / "azurite" / "dist" / "src" / "azurite.js"

HOST = "127.0.0.1"
# The emulator's single, well-known account (public, documented by Microsoft; not a secret).
ACCOUNT_NAME = "devstoreaccount1"
ACCOUNT_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
LOG_NAME = "azurite.log"


class AzuriteError(RuntimeError):
    """Azurite could not be started; the message carries the tail of its output."""


def pinned_version() -> str:
    """The exact ``azurite`` version that ``tools/azurite/package.json`` pins."""
    manifest = json.loads((AZURITE_DIR / "package.json").read_text())
    return str(manifest["dependencies"]["azurite"])


def installed_version() -> str | None:
    """The version in ``tools/azurite/node_modules``, or ``None`` when `make azurite` never ran."""
    manifest = AZURITE_DIR / "node_modules" / "azurite" / "package.json"
    if not AZURITE_JS.is_file() or not manifest.is_file():
        return None
    return str(json.loads(manifest.read_text())["version"])


def unavailable_reason() -> str | None:
    """Why the pinned Azurite cannot run here, or ``None`` when it can."""
    if shutil.which("node") is None:
        return "Azurite needs Node.js (`node` is not on PATH)"
    installed, pinned = installed_version(), pinned_version()
    if installed is None:
        return f"Azurite {pinned} is not installed in tools/azurite: run `make azurite`"
    if installed != pinned:
        return f"tools/azurite has Azurite {installed}, the pin is {pinned}: run `make azurite`"
    return None


def free_ports(count: int) -> list[int]:
    """``count`` distinct loopback ports that were free a moment ago."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind((HOST, 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=0.5):
            return True
    except OSError:
        return False


def _die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child get SIGKILL when this process dies (Linux only)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1

    def preexec() -> None:
        prctl(pr_set_pdeathsig, signal.SIGKILL)

    return preexec


_PREEXEC = _die_with_parent()
#: The ``preexec_fn`` for other helper processes (the soak's) that must not outlive this one.
DIE_WITH_PARENT = _PREEXEC
_LIVE: set[Azurite] = set()


@atexit.register
def _kill_all() -> None:
    for azurite in list(_LIVE):
        azurite.kill()


class Azurite:
    """One real Azurite process (Blob + Table) on free loopback ports, data kept in ``location``.

    ``start()`` returns once both endpoints accept connections. ``stop()`` shuts Azurite down
    gracefully (it saves its metadata); ``kill()`` sends SIGKILL, like a crashed host; both keep
    the data directory and the ports, so ``start()`` or ``restart()`` brings the same account back.
    ``pause()``/``resume()`` freeze and thaw the process (SIGSTOP/SIGCONT): requests hang
    meanwhile, as against an unreachable service. Azurite's output goes to ``location/azurite.log``.
    """

    def __init__(self, location: Path, *, start_timeout: float = 30.0) -> None:
        self.location = Path(location)
        self.start_timeout = start_timeout
        self.log_path = self.location / LOG_NAME
        self.blob_port, self.queue_port, self.table_port = free_ports(3)
        self._process: subprocess.Popen[bytes] | None = None
        self._paused = False
        self._started = False
        self._log_offset = 0

    # -- addresses ------------------------------------------------------------------------------

    @property
    def blob_endpoint(self) -> str:
        return f"http://{HOST}:{self.blob_port}/{ACCOUNT_NAME}"

    @property
    def table_endpoint(self) -> str:
        return f"http://{HOST}:{self.table_port}/{ACCOUNT_NAME}"

    @property
    def queue_endpoint(self) -> str:
        return f"http://{HOST}:{self.queue_port}/{ACCOUNT_NAME}"

    @property
    def connection_string(self) -> str:
        """An explicit connection string for this instance's Blob, Queue and Table endpoints."""
        return (
            f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT_NAME};AccountKey={ACCOUNT_KEY};"
            f"BlobEndpoint={self.blob_endpoint};QueueEndpoint={self.queue_endpoint};"
            f"TableEndpoint={self.table_endpoint};"
        )

    # -- lifecycle ------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def paused(self) -> bool:
        return self._paused

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def command(self) -> list[str]:
        return [
            shutil.which("node") or "node",
            str(AZURITE_JS),
            "--location",
            str(self.location),
            "--blobHost",
            HOST,
            "--blobPort",
            str(self.blob_port),
            "--queueHost",
            HOST,
            "--queuePort",
            str(self.queue_port),
            "--tableHost",
            HOST,
            "--tablePort",
            str(self.table_port),
            "--skipApiVersionCheck",  # current SDKs send API versions newer than Azurite knows
            "--loose",  # ignore headers Azurite does not implement instead of failing
            "--disableProductStyleUrl",  # the account is always the first path segment
            "--disableTelemetry",  # no network but loopback
        ]

    def start(self) -> Azurite:
        """Start Azurite and wait until Blob and Table accept connections; no-op when running.

        The first start picks other free ports if one was taken meanwhile; later starts keep the
        ports, so clients made before a restart still work.
        """
        if self.running:
            return self
        reason = unavailable_reason()
        if reason is not None:
            raise AzuriteError(reason)
        self.location.mkdir(parents=True, exist_ok=True)
        attempts = 1 if self._started else 3
        for attempt in range(1, attempts + 1):
            try:
                self._launch()
                break
            except AzuriteError:
                if attempt == attempts or "EADDRINUSE" not in self._output():
                    raise
                self.blob_port, self.queue_port, self.table_port = free_ports(3)
        self._started = True
        return self

    def _launch(self) -> None:
        with self.log_path.open("ab") as log:
            self._log_offset = log.tell()
            log.write(f"=== {time.strftime('%H:%M:%S')} {' '.join(self.command())}\n".encode())
            log.flush()
            self._process = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.location,
                start_new_session=True,  # own process group: signals reach node and its children
                preexec_fn=_PREEXEC,  # noqa: PLW1509  # only prctl(), resolved before the fork
            )
        self._paused = False
        _LIVE.add(self)
        self._wait_ready()

    def _wait_ready(self) -> None:
        """Both ports accept connections *and* Azurite said it listens on them (a port answered
        by some other process must not pass for Azurite)."""
        assert self._process is not None
        deadline = time.monotonic() + self.start_timeout
        announced = [
            f"Blob service is successfully listening at http://{HOST}:{self.blob_port}",
            f"Table service is successfully listening at http://{HOST}:{self.table_port}",
        ]
        while True:
            if self._process.poll() is not None:
                code = self._process.returncode
                self._reap()
                raise AzuriteError(self._failure(f"exited with code {code} while starting"))
            output = self._output()
            if all(line in output for line in announced) and all(
                _accepts(port) for port in (self.blob_port, self.table_port)
            ):
                return
            if time.monotonic() > deadline:
                self.kill()
                raise AzuriteError(
                    self._failure(
                        f"did not listen on {HOST}:{self.blob_port} (blob) and "
                        f"{HOST}:{self.table_port} (table) within {self.start_timeout:g} s"
                    )
                )
            time.sleep(0.05)

    def _output(self) -> str:
        """What Azurite printed since the last launch."""
        try:
            with self.log_path.open("rb") as log:
                log.seek(self._log_offset)
                return log.read().decode(errors="replace")
        except OSError as exc:
            return f"(cannot read {self.log_path}: {exc})"

    def _failure(self, what: str) -> str:
        return (
            f"Azurite {what} (blob port {self.blob_port}, table port {self.table_port}).\n"
            f"Its output ({self.log_path}):\n{self._output()[-4000:]}"
        )

    def _signal(self, sig: signal.Signals) -> None:
        assert self._process is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._process.pid, sig)

    def stop(self, timeout: float = 15.0) -> None:
        """Shut Azurite down gracefully (SIGTERM); SIGKILL if it has not exited in ``timeout``."""
        if self._process is None:
            return
        if self.running:
            self.resume()
            self._signal(signal.SIGTERM)
            try:
                self._process.wait(timeout)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
        self._reap()

    def kill(self) -> None:
        """SIGKILL the whole process group, like a crash; metadata not yet saved may be lost."""
        if self._process is None:
            return
        self._signal(signal.SIGKILL)
        self._reap()

    def _reap(self) -> None:
        if self._process is not None:
            self._process.wait()
            # Anything else left in the group (Azurite has no workers today) goes too.
            self._signal(signal.SIGKILL)
        self._process = None
        self._paused = False
        _LIVE.discard(self)

    def restart(self) -> Azurite:
        """Graceful stop, then start again on the same ports with the same data directory."""
        self.stop()
        return self.start()

    def pause(self) -> None:
        """Freeze the process (SIGSTOP): connections still open, requests hang until resume()."""
        if self.running and not self._paused:
            self._signal(signal.SIGSTOP)
            self._paused = True

    def resume(self) -> None:
        """Thaw a paused process (SIGCONT)."""
        if self._process is not None and self._paused:
            self._signal(signal.SIGCONT)
            self._paused = False

    def ensure_running(self) -> Azurite:
        """Undo what a test may have left: resume if paused, start if stopped or killed."""
        self.resume()
        return self.start()

    def __enter__(self) -> Azurite:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "paused" if self._paused else "running" if self.running else "stopped"
        return (
            f"Azurite(blob={self.blob_port}, table={self.table_port}, {state}, "
            f"location={str(self.location)!r})"
        )
