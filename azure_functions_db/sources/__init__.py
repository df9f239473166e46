"""Sources: the adapters of the :class:`~azure_functions_db.ports.Source` port."""

from azure_functions_db.sources.sqlalchemy import HorizonStrategy, LagHorizon, NoHorizon, SqlSource

__all__ = ["HorizonStrategy", "LagHorizon", "NoHorizon", "SqlSource"]
