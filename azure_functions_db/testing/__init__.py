"""Public test kit: a fake clock, the in-memory store, and the contract suites of the ports.

Use them in your own tests::

    from azure_functions_db.testing import FakeClock, MemoryStateStore

    clock = FakeClock()
    state = MemoryStateStore(clock=clock)   # lease expiry follows `clock.advance(...)`

Adapters of a port prove they keep its contract by subclassing its suite
(:class:`StateStoreContract`, :class:`SourceContract`; :class:`SqlSourceContract` runs the
source suite over any SQLAlchemy URL); see :mod:`azure_functions_db.testing.state_contract` and
:mod:`azure_functions_db.testing.source_contract`. :class:`MemorySource` is an in-memory source
that keeps the source contract.
Importing this package needs ``pytest`` (a test dependency, not a runtime one).
"""

from __future__ import annotations

from azure_functions_db.sources.memory import MemorySource
from azure_functions_db.state.memory import MemoryStateStore
from azure_functions_db.testing._harness import GARBAGE
from azure_functions_db.testing.clock import FakeClock
from azure_functions_db.testing.source_contract import (
    Literal,
    Scratch,
    SourceContract,
    SqlSourceContract,
    TypeCase,
)
from azure_functions_db.testing.state_contract import StateStoreContract

__all__ = [
    "GARBAGE",
    "FakeClock",
    "Literal",
    "MemorySource",
    "MemoryStateStore",
    "Scratch",
    "SourceContract",
    "SqlSourceContract",
    "StateStoreContract",
    "TypeCase",
]
