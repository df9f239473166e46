"""Fan-out: the poller forwards each changed order to a queue, and a queue-triggered function
does the per-row work, spread over as many instances as the platform gives it.

The poller stays light (one message per change, 8 in flight), so one lease keeps up with a busy
table; the slow part (an HTTP call, a write per row) runs in `do_work`, which the Functions
host scales out on the queue's length. Delivery is at-least-once on both legs: the poller sends
a batch again when its commit did not land, and the host retries a message whose function
failed. So `do_work` deduplicates on the change's `event_id` (the same on every delivery of a row
version), with a unique key in the same transaction as the work: a duplicate finds the key and
does nothing, a crash before the commit leaves neither. A message that keeps failing goes to the
`orders-work-poison` queue after `maxDequeueCount` attempts (host.json). See docs/scale.md.

Settings: ORDERS_DB_URL (the table polled), WORK_DB_URL (the consumer's database, holding
`processed(event_id PRIMARY KEY, order_id)` and `shipments(order_id, note)`), AzureWebJobsStorage.
"""

import functools
import json
import os

import azure.functions as func
import sqlalchemy as sa

import azure_functions_db as afdb

db = afdb.PollerBlueprint()
work_queue = afdb.QueueSink("orders-work")  # on AzureWebJobsStorage; created on first use


@db.poller(
    name="orders-fanout",
    schedule="*/10 * * * * *",
    source=afdb.SqlSource(url="%ORDERS_DB_URL%", table="orders", cursor="updated_at", pk="id"),
)
def forward(batch: afdb.Batch) -> None:
    work_queue.send(batch)


app = func.FunctionApp()
app.register_functions(db)


@functools.cache
def work_db() -> sa.Engine:
    """One engine per worker process, made by the first message (no I/O at import)."""
    return sa.create_engine(os.environ["WORK_DB_URL"], pool_pre_ping=True)


@app.queue_trigger(arg_name="msg", queue_name="orders-work", connection="AzureWebJobsStorage")
def do_work(msg: func.QueueMessage) -> None:
    change = json.loads(msg.get_body())
    order = change["data"]
    with work_db().begin() as conn:
        claimed = conn.execute(
            sa.text(
                "INSERT INTO processed (event_id, order_id) VALUES (:event_id, :order_id) "
                "ON CONFLICT (event_id) DO NOTHING"
            ),
            {"event_id": change["event_id"], "order_id": order["id"]},
        ).rowcount
        if not claimed:
            return  # this row version was done already: a duplicate delivery
        # The per-row work, in the transaction that claimed the event_id.
        conn.execute(
            sa.text("INSERT INTO shipments (order_id, note) VALUES (:order_id, :note)"),
            {"order_id": order["id"], "note": order["note"]},
        )
