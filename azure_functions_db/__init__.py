"""azure-functions-db: a polling database trigger for Azure Functions.

This is not a native database trigger: it is a polling trigger built on Azure Functions timers.
Delivery is at-least-once and handlers must be idempotent (``Change.event_id`` is a stable
idempotency key).

    import azure.functions as func
    import azure_functions_db as afdb

    db = afdb.PollerBlueprint()

    @db.poller(name="orders", schedule="*/30 * * * * *",
               source=afdb.SqlSource(url="%ORDERS_DB_URL%", table="orders",
                                     cursor="updated_at", pk="id"))
    def on_orders(batch: afdb.Batch) -> None:
        for change in batch:
            ...

    app = func.FunctionApp()
    app.register_functions(db)
"""

import importlib
from typing import TYPE_CHECKING, Any

from azure_functions_db.core.batch import Batch, Change
from azure_functions_db.core.checkpoint import Checkpoint, PollerKey
from azure_functions_db.core.engine import PollerConfig, RunReport
from azure_functions_db.core.position import Position
from azure_functions_db.errors import (
    AfdbError,
    CheckpointConflictError,
    CheckpointCorruptError,
    ConfigurationError,
    HandlerContractError,
    HandlerError,
    LeaseHeldError,
    LeaseLostError,
    NullCursorError,
    PoisonBatchError,
    PositionRegressionError,
    QuarantineConflictError,
    QuarantineCorruptError,
    QuarantineExistsError,
    QuarantineStateError,
    RecordExistsError,
    ReshardError,
    SettingNotFoundError,
    SinkError,
    SinkFencedError,
    SourceDefinitionError,
    SourceError,
    StateStoreError,
    TransientSinkError,
    TransientSourceError,
    TransientStoreError,
)
from azure_functions_db.functions.blueprint import PollerBlueprint
from azure_functions_db.functions.retry import FunctionsRetry
from azure_functions_db.sinks.bindings import SqlInput, SqlOutput
from azure_functions_db.sinks.sql import SqlSink
from azure_functions_db.sinks.writes import SqlWriter
from azure_functions_db.sources.outbox import OutboxSource
from azure_functions_db.sources.sqlalchemy import SqlSource
from azure_functions_db.state.local import LocalStateStore
from azure_functions_db.state.memory import MemoryStateStore

if TYPE_CHECKING:
    from azure_functions_db.sinks.delta import DeltaSink, DeltaWriter
    from azure_functions_db.sinks.queue import QueueSink
    from azure_functions_db.state.blob import BlobStateStore
    from azure_functions_db.state.table import TableStateStore

# The Azure stores and the Delta and queue sinks need extras (`azure`, `delta`); import them
# only when asked for.
_LAZY = {
    "BlobStateStore": "azure_functions_db.state.blob",
    "TableStateStore": "azure_functions_db.state.table",
    "DeltaSink": "azure_functions_db.sinks.delta",
    "DeltaWriter": "azure_functions_db.sinks.delta",
    "QueueSink": "azure_functions_db.sinks.queue",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AfdbError",
    "Batch",
    "BlobStateStore",
    "Change",
    "Checkpoint",
    "CheckpointConflictError",
    "CheckpointCorruptError",
    "ConfigurationError",
    "DeltaSink",
    "DeltaWriter",
    "FunctionsRetry",
    "HandlerContractError",
    "HandlerError",
    "LeaseHeldError",
    "LeaseLostError",
    "LocalStateStore",
    "MemoryStateStore",
    "NullCursorError",
    "OutboxSource",
    "PoisonBatchError",
    "PollerBlueprint",
    "PollerConfig",
    "PollerKey",
    "Position",
    "PositionRegressionError",
    "QuarantineConflictError",
    "QuarantineCorruptError",
    "QuarantineExistsError",
    "QuarantineStateError",
    "QueueSink",
    "RecordExistsError",
    "ReshardError",
    "RunReport",
    "SettingNotFoundError",
    "SinkError",
    "SinkFencedError",
    "SourceDefinitionError",
    "SourceError",
    "SqlInput",
    "SqlOutput",
    "SqlSink",
    "SqlSource",
    "SqlWriter",
    "StateStoreError",
    "TableStateStore",
    "TransientSinkError",
    "TransientSourceError",
    "TransientStoreError",
]
