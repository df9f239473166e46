"""Time zones belong to the database: naive cursors stamped in its default zone, instants in UTC.

A naive ``timestamp`` cursor stamped with ``now()`` holds the wall-clock time of the database's
default zone; a horizon computed in another zone protects nothing. ``timestamptz`` values read
in different session zones are one instant and must hash to one ``event_id``.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from azure_functions_db.core.batch import event_id
from azure_functions_db.core.position import Position
from azure_functions_db.errors import SourceDefinitionError
from azure_functions_db.sources.sqlalchemy import SqlSource
from devkit import dbservers


def test_event_id_is_one_per_instant_whatever_the_offset():
    utc = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)
    paris = utc.astimezone(dt.timezone(dt.timedelta(hours=1)))
    assert paris.isoformat() != utc.isoformat()
    assert event_id("orders", Position((paris,), (1,))) == event_id(
        "orders", Position((utc,), (1,))
    )
    naive = dt.datetime(2026, 1, 1, 12, 0)
    assert event_id("orders", Position((naive,), (1,))) != event_id(
        "orders", Position((utc,), (1,))
    )


@pytest.fixture
def ny_role(pg_schema: str) -> Iterator[str]:
    """A PostgreSQL login role whose sessions default to America/New_York, owning a table
    ``orders(id, updated_at timestamp)`` stamped by ``now()`` in that zone."""
    role = f"afdb_ny_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(dbservers.pg_url(), poolclass=sa.NullPool)
    with admin.begin() as conn:
        conn.exec_driver_sql(f"CREATE ROLE {role} LOGIN")
        conn.exec_driver_sql(f"ALTER ROLE {role} SET timezone = 'America/New_York'")
        conn.exec_driver_sql(f'GRANT USAGE, CREATE ON SCHEMA "{pg_schema}" TO {role}')
    url = dbservers.pg_url().replace("postgres@", f"{role}@", 1)
    assert role in url
    writer = sa.create_engine(url, poolclass=sa.NullPool)
    with writer.begin() as conn:
        conn.exec_driver_sql(
            f'CREATE TABLE "{pg_schema}".orders (id int PRIMARY KEY, updated_at timestamp '
            "NOT NULL DEFAULT now())"
        )
        conn.exec_driver_sql(f'INSERT INTO "{pg_schema}".orders (id) VALUES (1)')
    writer.dispose()
    try:
        yield url
    finally:
        with admin.begin() as conn:
            conn.exec_driver_sql(f'DROP TABLE IF EXISTS "{pg_schema}".orders')
            conn.exec_driver_sql(f'REVOKE ALL ON SCHEMA "{pg_schema}" FROM {role}')
            conn.exec_driver_sql(f"DROP ROLE {role}")
        admin.dispose()


@pytest.mark.postgres
def test_naive_cursor_in_a_non_utc_database_zone_is_refused(ny_role, pg_schema):
    source = SqlSource(ny_role, "orders", "updated_at", "id", schema=pg_schema)
    with pytest.raises(SourceDefinitionError) as err:
        source.open({})
    message = str(err.value)
    assert "America/New_York" in message
    assert 'cursor_timezone="America/New_York"' in message
    source.close()
    matching = SqlSource(
        ny_role, "orders", "updated_at", "id", schema=pg_schema, cursor_timezone="America/New_York"
    )
    try:
        matching.open({})
        # The poller's own session is pinned to UTC; the rows' wall-clock time is New York's.
        with matching.engine.connect() as conn:
            assert conn.exec_driver_sql("SHOW TimeZone").scalar() == "UTC"
    finally:
        matching.close()


@pytest.mark.mysql
def test_naive_cursor_under_a_non_utc_mariadb_default_is_refused(mysql_db):
    url = dbservers.mysql_url(mysql_db)
    admin = sa.create_engine(url, poolclass=sa.NullPool)
    with admin.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE orders (id int PRIMARY KEY, updated_at datetime(6))")
        previous = conn.exec_driver_sql("SELECT @@global.time_zone").scalar()
        conn.exec_driver_sql("SET GLOBAL time_zone = '-05:00'")
    try:
        source = SqlSource(url, "orders", "updated_at", "id")
        with pytest.raises(SourceDefinitionError, match=r"`-05:00` \(UTC-5 h now\)"):
            source.open({})
        source.close()
        fixed = SqlSource(url, "orders", "updated_at", "id", cursor_timezone="Etc/GMT+5")
        fixed.open({})
        fixed.close()
    finally:
        with admin.begin() as conn:
            conn.exec_driver_sql(f"SET GLOBAL time_zone = '{previous}'")
        admin.dispose()


@pytest.mark.postgres
def test_timestamptz_event_ids_do_not_depend_on_the_session_zone(pg_schema, tmp_path):
    """Two processes with different PGTZ read the same rows: one event_id per row version."""
    engine = sa.create_engine(dbservers.pg_url(), poolclass=sa.NullPool)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            f'CREATE TABLE "{pg_schema}".orders (id int PRIMARY KEY, updated_at timestamptz)'
        )
        conn.exec_driver_sql(
            f"INSERT INTO \"{pg_schema}\".orders VALUES (1, '2026-01-01 12:00:00+00'), "
            "(2, '2026-06-01 12:00:00.123456+00')"
        )
    engine.dispose()
    script = textwrap.dedent(
        f"""
        from azure_functions_db.core.ports import Horizon
        from azure_functions_db.sources.sqlalchemy import SqlSource
        from azure_functions_db.core.batch import Change
        s = SqlSource({dbservers.pg_url()!r}, "orders", "updated_at", "id",
                      schema={pg_schema!r}, horizon="none")
        s.open({{}})
        rows = s.fetch(None, 10, Horizon(bound=None, method="none"))
        print(" ".join(Change(r.data, r.position, "orders").event_id for r in rows))
        s.close()
        """
    )
    outputs = []
    for zone in ("UTC", "Asia/Tokyo", "America/Los_Angeles"):
        proc = subprocess.run(
            [sys.executable, "-c", script],
            env={**os.environ, "PGTZ": zone},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
        outputs.append(proc.stdout.split())
    assert outputs[0] == outputs[1] == outputs[2]
    assert len(set(outputs[0])) == 2
