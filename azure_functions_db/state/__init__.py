"""Adapters of the :class:`~azure_functions_db.core.ports.StateStore` port.

- :class:`MemoryStateStore`: in this process's memory (tests, experiments).
- :class:`LocalStateStore`: files under one directory, safe across processes on one machine
  (the local runner and the demo).
"""

from __future__ import annotations

from azure_functions_db.state.local import LocalStateStore
from azure_functions_db.state.memory import MemoryStateStore

__all__ = ["LocalStateStore", "MemoryStateStore"]
