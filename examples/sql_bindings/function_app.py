"""Write and read rows from HTTP functions (SqlOutput, SqlInput): no poller, no checkpoint.

Both share one SQLAlchemy engine per database URL per process; declaring them does no I/O.
"""

import json

import azure.functions as func

import azure_functions_db as afdb

app = func.FunctionApp()
orders_out = afdb.SqlOutput("%ORDERS_DB_URL%", "orders")
orders_in = afdb.SqlInput("%ORDERS_DB_URL%", "orders")


@app.route(route="orders", methods=["POST"], auth_level=func.AuthLevel.ANONYMOUS)
def create_order(req: func.HttpRequest) -> func.HttpResponse:
    orders_out.upsert([req.get_json()])  # a client's retry writes the same row again: harmless
    return func.HttpResponse(status_code=201)


@app.route(route="orders/{id}", methods=["GET"], auth_level=func.AuthLevel.ANONYMOUS)
def read_order(req: func.HttpRequest) -> func.HttpResponse:
    row = orders_in.get(id=int(req.route_params["id"]))
    if row is None:
        return func.HttpResponse(status_code=404)
    return func.HttpResponse(json.dumps(row, default=str), mimetype="application/json")
