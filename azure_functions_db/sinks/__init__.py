"""Sinks: targets whose writes commit together with the poller's position.

- :class:`~azure_functions_db.sinks.sql.SqlSink`: effectively-once into PostgreSQL,
  MariaDB/MySQL (InnoDB), SQLite and SQL Server.
- :class:`~azure_functions_db.sinks.delta.DeltaSink`: exactly-once into one Delta Lake table
  (the ``delta`` extra).
- :class:`~azure_functions_db.sinks.queue.QueueSink`: at-least-once into an Azure Storage
  queue, ``event_id`` as the dedup key (the ``azure`` extra).
- :class:`~azure_functions_db.sinks.bindings.SqlOutput` and ``SqlInput``: write and read rows
  from any function (at-least-once outside a poller).
- :class:`~azure_functions_db.sinks.memory.MemorySink`: the in-memory fake, for tests.

Per-sink guarantees, mechanisms and proofs: ``docs/guarantees.md``.
"""
