"""Public test kit: a fake clock, the in-memory store, and the contract suites of the ports.

Use them in your own tests::

    from azure_functions_db.testing import FakeClock, MemoryStateStore

    clock = FakeClock()
    state = MemoryStateStore(clock=clock)   # lease expiry follows `clock.advance(...)`

Adapters of a port prove they keep its contract by subclassing its suite
(:class:`StateStoreContract`); see :mod:`azure_functions_db.testing.state_contract`.
Importing this package needs ``pytest`` (a test dependency, not a runtime one).
"""

from __future__ import annotations

from azure_functions_db.state.memory import MemoryStateStore
from azure_functions_db.testing._harness import GARBAGE
from azure_functions_db.testing.clock import FakeClock
from azure_functions_db.testing.state_contract import StateStoreContract

__all__ = ["GARBAGE", "FakeClock", "MemoryStateStore", "StateStoreContract"]
