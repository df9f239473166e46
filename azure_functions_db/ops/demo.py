"""``afdb demo``: a sample poller on a local SQLite table and the local state store.

It shows the whole delivery cycle and checks it: the first run delivers every row in
``(updated_at, id)`` order although many rows share a timestamp across batch boundaries, an idle
run delivers nothing, and after new and updated rows the next run delivers exactly those.
:func:`run_demo` returns data and hands each step to a callback as it happens; ``afdb demo``
prints them.
"""

from __future__ import annotations

import datetime as dt
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

import sqlalchemy as sa

from azure_functions_db.core.batch import Batch
from azure_functions_db.functions.blueprint import PollerBlueprint
from azure_functions_db.ops.status import PollerStatus, poller_status
from azure_functions_db.sources.sqlalchemy import SqlSource
from azure_functions_db.state.local import LocalStateStore

T0 = dt.datetime(2026, 11, 1, 9, 0, 0)
BATCH_COLUMNS = ("id", "customer", "amount", "status", "updated_at", "event_id")


@dataclass(frozen=True)
class DemoStarted:
    """Where the demo's table and state are."""

    database: Path
    state: Path


@dataclass(frozen=True)
class DemoStep:
    """A run is about to start; ``title`` says what it should deliver."""

    title: str


@dataclass(frozen=True)
class DemoBatch:
    """One batch as the handler got it: one text cell per column of ``BATCH_COLUMNS``."""

    attempt: int
    fence: int
    rows: tuple[tuple[str, ...], ...]


@dataclass(frozen=True)
class DemoRun:
    """A finished run: its report, and the ids it should have delivered and did."""

    status: str
    batches: int
    rows: int
    expected: list[int]
    delivered: list[int]

    @property
    def ok(self) -> bool:
        return self.delivered == self.expected


@dataclass
class DemoResult:
    """Every run, the poller's status at the end, and whether every check held."""

    runs: list[DemoRun] = field(default_factory=list)
    status: PollerStatus | None = None

    @property
    def ok(self) -> bool:
        return all(run.ok for run in self.runs)


DemoEvent = DemoStarted | DemoStep | DemoBatch | DemoRun


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


def run_demo(
    directory: str | Path, on_event: Callable[[DemoEvent], None] = lambda _: None
) -> DemoResult:
    """Run the demo in ``directory`` (recreated), telling ``on_event`` each step as it happens."""
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
        rows = tuple(
            (
                str(change.data["id"]),
                change.data["customer"],
                str(change.data["amount"]),
                change.data["status"],
                change.data["updated_at"].isoformat(sep=" "),
                change.event_id[:12],
            )
            for change in batch
        )
        on_event(DemoBatch(batch.attempt, batch.fence, rows))

    poller = db.pollers["orders"]
    settings: dict[str, str] = {}
    result = DemoResult()

    def step(title: str, expected: list[int]) -> None:
        on_event(DemoStep(title))
        delivered.clear()
        report = poller.run_once(settings)
        got = [pk for batch in delivered for pk in batch]
        run = DemoRun(report.status, report.batches, report.rows, expected, got)
        result.runs.append(run)
        on_event(run)

    on_event(DemoStarted(db_path, root / "state"))
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
    result.status = poller_status(poller, settings)
    return result
