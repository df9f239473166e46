"""A small SQLite ``orders`` table for engine and crash tests (a real database, not a fake)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import sqlalchemy as sa

T0 = dt.datetime(2026, 1, 1, 12, 0, 0)


class Orders:
    """An ``orders(id, note, updated_at)`` table in a SQLite file, indexed on (updated_at, id)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.url = f"sqlite:///{path}"
        self.engine = sa.create_engine(self.url)
        md = sa.MetaData()
        self.table = sa.Table(
            "orders",
            md,
            sa.Column("id", sa.Integer, primary_key=True),
            sa.Column("note", sa.String(50), nullable=False),
            sa.Column("updated_at", sa.DateTime, nullable=True),
        )
        sa.Index("ix_orders_updated_at_id", self.table.c.updated_at, self.table.c.id)
        md.create_all(self.engine)

    def insert(self, ids: range | list[int], *, tie_every: int = 3, base: dt.datetime = T0) -> None:
        """Insert rows; every ``tie_every`` consecutive ids share one timestamp (cursor ties)."""
        with self.engine.begin() as conn:
            conn.execute(
                self.table.insert(),
                [
                    {
                        "id": i,
                        "note": f"n{i}",
                        "updated_at": base + dt.timedelta(seconds=i // tie_every),
                    }
                    for i in ids
                ],
            )

    def touch(self, ids: list[int], at: dt.datetime) -> None:
        """Update rows (a new version with a later cursor)."""
        with self.engine.begin() as conn:
            conn.execute(
                self.table.update()
                .where(self.table.c.id.in_(ids))
                .values(updated_at=at, note="upd")
            )

    def close(self) -> None:
        self.engine.dispose()
