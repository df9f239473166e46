"""Sources: the adapters of the :class:`~azure_functions_db.core.ports.Source` port."""

from azure_functions_db.sources._dialect_horizons import (
    MssqlRowversionHorizon,
    PgSnapshotHorizon,
    PgXactStartHorizon,
    SqliteClockHorizon,
)
from azure_functions_db.sources._mysql_horizon import MysqlTrxHorizon
from azure_functions_db.sources._target import HorizonTarget
from azure_functions_db.sources.outbox import OutboxSource
from azure_functions_db.sources.sqlalchemy import (
    AutoHorizon,
    HorizonStrategy,
    LagHorizon,
    NoHorizon,
    SqlSource,
)

__all__ = [
    "AutoHorizon",
    "HorizonStrategy",
    "HorizonTarget",
    "LagHorizon",
    "MssqlRowversionHorizon",
    "MysqlTrxHorizon",
    "NoHorizon",
    "OutboxSource",
    "PgSnapshotHorizon",
    "PgXactStartHorizon",
    "SqlSource",
    "SqliteClockHorizon",
]
