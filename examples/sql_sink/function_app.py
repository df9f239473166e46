"""Copy every changed order into a warehouse table, effectively once (SqlSink).

The handler's writes and the poller's position commit in one database transaction: a batch
delivered again (a crash between the two commits, a retry) writes nothing twice.
"""

import azure.functions as func

import azure_functions_db as afdb

db = afdb.PollerBlueprint()


@db.poller(
    name="orders-copy",
    schedule="*/30 * * * * *",
    source=afdb.SqlSource(url="%ORDERS_DB_URL%", table="orders", cursor="updated_at", pk="id"),
    sink=afdb.SqlSink(url="%WAREHOUSE_DB_URL%"),
)
def copy_orders(batch: afdb.Batch, sink: afdb.SqlWriter) -> None:
    sink.apply("orders_copy", batch)  # upsert each change (delete the soft-deleted ones)


app = func.FunctionApp()
app.register_functions(db)
