"""Backfill on Spark: replay a poller's history through its own handler, then hand off to live.

``backfill()`` plans chunks on the driver and runs each as a Spark task with the normal engine
under its own fenced checkpoint in the backfill namespace (see ``docs/backfill.md``). Importing
this package does not import pyspark; only running a backfill does.
"""

from azure_functions_db.errors import BackfillError
from azure_functions_db.spark.job import BackfillProgress, BackfillReport, backfill

__all__ = ["BackfillError", "BackfillProgress", "BackfillReport", "backfill"]
