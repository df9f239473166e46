"""Mirror every changed order into a Delta Lake table, exactly once (DeltaSink).

Each batch becomes one Delta commit that also records the poller's position (an application
transaction): a batch delivered again is recognised and skipped.
"""

import azure.functions as func

import azure_functions_db as afdb

db = afdb.PollerBlueprint()


@db.poller(
    name="orders-lake",
    schedule="0 */5 * * * *",
    source=afdb.SqlSource(url="%ORDERS_DB_URL%", table="orders", cursor="updated_at", pk="id"),
    sink=afdb.DeltaSink("%ORDERS_LAKE_URI%", key=["id"]),
)
def to_lake(batch: afdb.Batch, sink: afdb.DeltaWriter) -> None:
    sink.upsert(batch)


app = func.FunctionApp()
app.register_functions(db)
