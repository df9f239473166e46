"""An async handler with one client shared by every batch (psycopg's AsyncConnection).

The engine runs async handlers on one event loop per process, so a client made on first use is
reused by every later batch of every run in that process, as a Functions worker keeps it. The
write is idempotent: `event_id` is the key, so a batch delivered again inserts nothing twice.
"""

import asyncio
import os

import azure.functions as func
import psycopg

import azure_functions_db as afdb

db = afdb.PollerBlueprint()


class SharedClient:
    """One connection for every batch of the process, opened at the first (never at import)."""

    def __init__(self, setting: str) -> None:
        self.setting = setting
        self.connection: psycopg.AsyncConnection | None = None
        self._lock = asyncio.Lock()

    async def get(self) -> psycopg.AsyncConnection:
        async with self._lock:
            if self.connection is None or self.connection.closed:
                self.connection = await psycopg.AsyncConnection.connect(
                    os.environ[self.setting], autocommit=True
                )
            return self.connection


notify_db = SharedClient("NOTIFY_DB_URL")


@db.poller(
    name="orders-notify",
    schedule="*/30 * * * * *",
    source=afdb.SqlSource(url="%ORDERS_DB_URL%", table="orders", cursor="updated_at", pk="id"),
)
async def notify(batch: afdb.Batch) -> None:
    conn = await notify_db.get()
    async with conn.transaction():
        for change in batch:
            await conn.execute(
                "INSERT INTO notifications (event_id, order_id) VALUES (%s, %s) "
                "ON CONFLICT (event_id) DO NOTHING",
                (change.event_id, change.pk),
            )


app = func.FunctionApp()
app.register_functions(db)
