"""SQLite gets a commit-safe bound too: its own clock less the settle time.

Serial writers do not make keys arrive in order: with a coarse cursor (whole seconds, as
``CURRENT_TIMESTAMP`` writes), a row of a lower pk stamped in the same tick as the checkpoint
commits after it. Without a bound the poller has already moved past that tick and never sees
the row; reading only below ``now - settle`` waits for the tick to finish.
"""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path

import sqlalchemy as sa

from azure_functions_db.core.ports import Horizon
from azure_functions_db.sources import AutoHorizon, NoHorizon, SqliteClockHorizon
from azure_functions_db.sources.sqlalchemy import SqlSource

SETTLE = dt.timedelta(milliseconds=400)


def _scenario(tmp_path: Path, horizon: object) -> tuple[list[int], str]:
    """The sequence below until rows 5 and 2 fell in one tick (a loaded machine can take the
    second's last 0.7 s between them): at most three tries."""
    for attempt in range(3):
        found = _attempt(tmp_path / f"try-{attempt}.db", horizon)
        if found is not None:
            return found
    raise AssertionError("rows 5 and 2 never fell in one tick in three tries")


def _attempt(path: Path, horizon: object) -> tuple[list[int], str] | None:
    url = f"sqlite:///{path}"
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "CREATE TABLE t (id INTEGER PRIMARY KEY, updated_at DATETIME NOT NULL "
            "DEFAULT CURRENT_TIMESTAMP)"
        )
        conn.exec_driver_sql("INSERT INTO t (id, updated_at) VALUES (1, '2026-01-01 00:00:00')")
    source = SqlSource(url, "t", "updated_at", "id", horizon=horizon)  # type: ignore[arg-type]
    delivered: list[int] = []
    after = None

    def poll() -> None:
        nonlocal after
        while True:
            rows = source.fetch(after, 10, source.horizon())
            delivered.extend(row.position.pk[0] for row in rows)
            if rows:
                after = rows[-1].position
            if len(rows) < 10:
                return

    try:
        source.open({})
        poll()
        # Wait for the start of a second, so both writes below fall in one tick.
        while time.time() % 1 > 0.3:
            time.sleep(0.02)
        with engine.begin() as conn:
            conn.exec_driver_sql("INSERT INTO t (id) VALUES (5)")  # stamped this second
        poll()  # without a bound: delivers 5 and moves the checkpoint to (tick, 5)
        with engine.begin() as conn:  # a lower pk, the same tick, committed after the poll
            conn.exec_driver_sql("INSERT INTO t (id) VALUES (2)")
            ticks = conn.exec_driver_sql(
                "SELECT COUNT(DISTINCT updated_at) FROM t WHERE id IN (2, 5)"
            ).scalar_one()
        if ticks != 1:
            return None
        time.sleep(1.5)
        poll()
        return delivered, source.horizon().method
    finally:
        source.close()
        engine.dispose()


def test_auto_on_sqlite_delivers_the_row_stamped_in_the_checkpoints_tick(tmp_path):
    auto = AutoHorizon(settle=SETTLE)
    delivered, method = _scenario(tmp_path, auto)
    assert method == "sqlite_clock"
    assert isinstance(auto.chosen, SqliteClockHorizon)
    assert sorted(delivered) == [1, 2, 5]


def test_without_a_bound_the_same_sequence_loses_the_row(tmp_path):
    delivered, _ = _scenario(tmp_path, NoHorizon())
    assert sorted(delivered) == [1, 5], "the scenario must be able to lose the row"


def test_sqlite_integer_cursor_keeps_no_bound(tmp_path):
    url = f"sqlite:///{tmp_path / 'n.db'}"
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE t (id INTEGER PRIMARY KEY, version INTEGER NOT NULL)")
    engine.dispose()
    source = SqlSource(url, "t", "version", "id")
    try:
        source.open({})
        assert source.horizon() == Horizon(bound=None, method="none")
    finally:
        source.close()


def test_sqlite_clock_bound_of_a_date_cursor_is_a_date(tmp_path):
    url = f"sqlite:///{tmp_path / 'f.db'}"
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE t (id INTEGER PRIMARY KEY, c DATE)")
        conn.exec_driver_sql("INSERT INTO t VALUES (1, CURRENT_DATE)")
    engine.dispose()
    source = SqlSource(url, "t", "c", "id")
    try:
        source.open({})
        horizon = source.horizon()
        assert horizon.method == "sqlite_clock"
        assert type(horizon.bound) is dt.date
    finally:
        source.close()
