"""``afdb demo``: a sample poller on a local SQLite table and the local state store.

It shows the whole delivery cycle and checks it: the first run delivers every row in
``(updated_at, id)`` order although many rows share a timestamp across batch boundaries, an idle
run delivers nothing, and after new and updated rows the next run delivers exactly those.
"""

from __future__ import annotations

import datetime as dt
import shutil
from decimal import Decimal
from pathlib import Path

import sqlalchemy as sa
from rich.console import Console
from rich.table import Table

from azure_functions_db.core.batch import Batch
from azure_functions_db.functions.blueprint import PollerBlueprint
from azure_functions_db.ops.status import poller_status
from azure_functions_db.sources.sqlalchemy import SqlSource
from azure_functions_db.state.local import LocalStateStore

T0 = dt.datetime(2026, 11, 1, 9, 0, 0)


def _orders_table(metadata: sa.MetaData) -> sa.Table:
    table = sa.Table(
        "orders",
        metadata,
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("customer", sa.String(50), nullable=False),
        sa.Column("amount", sa.Numeric(10, 2), nullable=False),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("updated_at", sa.DateTime, nullable=False),
    )
    sa.Index("ix_orders_updated_at_id", table.c.updated_at, table.c.id)
    return table


def run_demo(directory: str | Path, console: Console) -> bool:
    """Run the demo in ``directory`` (recreated); return whether every check held."""
    root = Path(directory)
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    db_path = root / "orders.db"
    engine = sa.create_engine(f"sqlite:///{db_path}")
    metadata = sa.MetaData()
    orders = _orders_table(metadata)
    metadata.create_all(engine)
    customers = ["ada", "grace", "linus", "barbara", "ken"]
    with engine.begin() as conn:
        # 10 orders; ids 2-7 share one timestamp, so ties straddle the 4-row batches.
        conn.execute(
            orders.insert(),
            [
                {
                    "id": i,
                    "customer": customers[i % 5],
                    "amount": Decimal(f"{10 * i}.50"),
                    "status": "new",
                    "updated_at": T0 + dt.timedelta(seconds=0 if i < 2 else 1 if i < 8 else i),
                }
                for i in range(1, 11)
            ],
        )

    delivered: list[list[int]] = []
    db = PollerBlueprint()

    @db.poller(
        name="orders",
        schedule="*/30 * * * * *",
        source=SqlSource(url=f"sqlite:///{db_path}", table="orders", cursor="updated_at", pk="id"),
        state=LocalStateStore(root / "state"),
        batch_size=4,
    )
    def on_orders(batch: Batch) -> None:
        delivered.append([change.pk for change in batch])
        table = Table(title=f"batch (attempt {batch.attempt}, fence {batch.fence})")
        for column in ("id", "customer", "amount", "status", "updated_at", "event_id"):
            table.add_column(column)
        for change in batch:
            row = change.data
            table.add_row(
                str(row["id"]),
                row["customer"],
                str(row["amount"]),
                row["status"],
                row["updated_at"].isoformat(sep=" "),
                change.event_id[:12],
            )
        console.print(table)

    poller = db.pollers["orders"]
    settings: dict[str, str] = {}
    ok = True

    def step(title: str, expected: list[int]) -> None:
        nonlocal ok
        console.rule(title)
        delivered.clear()
        report = poller.run_once(settings)
        got = [pk for batch in delivered for pk in batch]
        console.print(
            f"run: {report.status}, {report.batches} batch(es), {report.rows} row(s) delivered"
        )
        if got != expected:
            ok = False
            console.print(f"expected ids {expected}, delivered {got}", style="red")

    console.print(f"SQLite table: {db_path}   state: {root / 'state'}")
    step("first run: every order, in (updated_at, id) order", [1, *range(2, 8), 8, 9, 10])
    step("second run: nothing new", [])

    with engine.begin() as conn:
        later = T0 + dt.timedelta(minutes=5)
        conn.execute(
            orders.insert(),
            [
                {
                    "id": 11,
                    "customer": "ada",
                    "amount": Decimal("99.00"),
                    "status": "new",
                    "updated_at": later,
                },
                {
                    "id": 12,
                    "customer": "ken",
                    "amount": Decimal("5.25"),
                    "status": "new",
                    "updated_at": later,
                },
            ],
        )
        conn.execute(
            orders.update()
            .where(orders.c.id == 3)
            .values(status="shipped", updated_at=later + dt.timedelta(seconds=1))
        )
    step("third run: two new orders and one update, exactly those", [11, 12, 3])
    engine.dispose()

    status = poller_status(poller, settings)
    console.rule("status")
    console.print(
        f"poller {status.poller} ({status.namespace}): position {status.position}, fence "
        f"{status.fence}, {status.batches} batch(es) / {status.rows} row(s) committed, "
        f"lease {status.lease_state}"
    )
    console.print("demo OK" if ok else "demo FAILED", style="green" if ok else "red")
    return ok
