"""The sample Azure Functions app: one poller on an `orders` table.

This is not a native database trigger: it is a polling trigger built on Azure Functions timers;
delivery is at-least-once and handlers must be idempotent.

Every 30 seconds the timer function `poll_orders` reads the orders changed since the last
checkpoint and hands them to `on_orders` in batches. The handler records each delivered row
version in `order_audit`, keyed by `Change.event_id`, so a batch delivered twice leaves one row
per version: the visible, idempotent side effect. Settings (see local.settings.example.json and
infra/main.bicep):

- `ORDERS_DB_URL`: SQLAlchemy URL of the database holding `orders` (a Key Vault reference in
  Azure). Read when the timer first fires, not at import.
- `AzureWebJobsStorage` (or its identity-based `__accountName` form): where the poller keeps its
  lease and checkpoint, in the container `afdb-state`.
"""

from __future__ import annotations

import logging
import os
import threading

import azure.functions as func
import sqlalchemy as sa

import azure_functions_db as afdb

logger = logging.getLogger("function_app")

# Metrics and traces to Application Insights, when the app has its connection string (set by
# infra/main.bicep; not set under `func start` unless you add it). The resource takes only Entra
# sign-in (DisableLocalAuth), so the app's identity sends them. Configuring starts exporters; it
# opens no connection here.
if os.environ.get("APPLICATIONINSIGHTS_CONNECTION_STRING"):
    from azure.identity import ManagedIdentityCredential
    from azure.monitor.opentelemetry import configure_azure_monitor

    configure_azure_monitor(
        credential=ManagedIdentityCredential(
            client_id=os.environ.get("AzureWebJobsStorage__clientId")  # noqa: SIM112 - its name
        )
    )

db = afdb.PollerBlueprint()

# The audit table the handler writes. One row per delivered row version: the event_id is the
# idempotency key, the same on every redelivery of that version.
_metadata = sa.MetaData()
order_audit = sa.Table(
    "order_audit",
    _metadata,
    sa.Column("event_id", sa.String(32), primary_key=True),
    sa.Column("order_id", sa.BigInteger, nullable=False),
    sa.Column("status", sa.String(40)),
    sa.Column("updated_at", sa.DateTime(timezone=True)),
)

_engine: sa.Engine | None = None
_engine_lock = threading.Lock()


def audit_engine() -> sa.Engine:
    """The handler's own engine, made once per worker process from `ORDERS_DB_URL`."""
    global _engine  # noqa: PLW0603 - one engine (and pool) per process, made on first use
    with _engine_lock:
        if _engine is None:
            _engine = sa.create_engine(os.environ["ORDERS_DB_URL"], pool_pre_ping=True)
            _metadata.create_all(_engine, checkfirst=True)
        return _engine


@db.poller(
    name="orders",
    schedule="*/30 * * * * *",
    source=afdb.SqlSource(url="%ORDERS_DB_URL%", table="orders", cursor="updated_at", pk="id"),
    batch_size=1000,
)
def on_orders(batch: afdb.Batch) -> None:
    """Record every delivered order version once, whatever the number of deliveries."""
    rows = {
        change.event_id: {
            "event_id": change.event_id,
            "order_id": change.pk,
            "status": change.data.get("status"),
            "updated_at": change.cursor,
        }
        for change in batch
    }
    with audit_engine().begin() as conn:
        seen = set(
            conn.execute(
                sa.select(order_audit.c.event_id).where(order_audit.c.event_id.in_(list(rows)))
            ).scalars()
        )
        fresh = [row for event_id, row in rows.items() if event_id not in seen]
        if fresh:
            conn.execute(order_audit.insert(), fresh)
    logger.info(
        "orders batch: %d changes, %d new audit rows, attempt %d, fence %d",
        len(batch),
        len(fresh),
        batch.attempt,
        batch.fence,
    )


app = func.FunctionApp()
app.register_functions(db)
