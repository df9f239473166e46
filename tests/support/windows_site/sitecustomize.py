"""Make this interpreter look like Windows to the local state store: no ``fcntl``, an
``msvcrt`` module (emulated). Loaded at start-up from ``PYTHONPATH`` by every Python process of
``tests/unit/test_windows_locks.py`` (and their children) when ``AFDB_TEST_NO_FCNTL=1``.

The emulated ``msvcrt.locking`` has the Windows semantics the store relies on: an exclusive,
non-blocking lock per open file that fails with ``EACCES`` while another file holds it, released
by ``LK_UNLCK`` or when the process dies. It is built on the real ``flock``, taken before
``fcntl`` is hidden: the store's own code must not see ``fcntl``, the test still needs a lock.
"""

from __future__ import annotations

import errno
import os
import sys
import types

if os.environ.get("AFDB_TEST_NO_FCNTL") == "1":
    # These decide "am I on Windows?" by importing msvcrt: let them see Linux first.
    import asyncio  # noqa: F401
    import fcntl as _real
    import subprocess  # noqa: F401

    def _locking(fd: int, mode: int, nbytes: int) -> None:
        if nbytes != 1:
            raise ValueError("the emulation locks one byte, as the store does")
        if mode == 0:  # LK_UNLCK
            _real.flock(fd, _real.LOCK_UN)
        elif mode == 2:  # LK_NBLCK
            try:
                _real.flock(fd, _real.LOCK_EX | _real.LOCK_NB)
            except BlockingIOError:
                raise OSError(errno.EACCES, "Permission denied") from None
        else:
            raise NotImplementedError(f"msvcrt.locking mode {mode} is not emulated")

    msvcrt = types.ModuleType("msvcrt")
    msvcrt.LK_UNLCK, msvcrt.LK_LOCK, msvcrt.LK_NBLCK = 0, 1, 2  # type: ignore[attr-defined]
    msvcrt.locking = _locking  # type: ignore[attr-defined]
    sys.modules["msvcrt"] = msvcrt
    sys.modules["fcntl"] = None  # type: ignore[assignment]  # `import fcntl` raises ImportError
