"""Forward every changed order to an Azure Storage queue, at least once (QueueSink).

A queue has no transaction to carry the poller's position: a batch whose commit did not land is
sent again. Every message carries the change's `event_id`, the same on every delivery of a row
version, so the consumer (a queue-triggered function) deduplicates on it.
"""

import azure.functions as func

import azure_functions_db as afdb

db = afdb.PollerBlueprint()
orders_out = afdb.QueueSink("orders-out")  # on AzureWebJobsStorage; created on first use


@db.poller(
    name="orders-forward",
    schedule="*/30 * * * * *",
    source=afdb.SqlSource(url="%ORDERS_DB_URL%", table="orders", cursor="updated_at", pk="id"),
)
def forward(batch: afdb.Batch) -> None:
    orders_out.send(batch)


app = func.FunctionApp()
app.register_functions(db)
