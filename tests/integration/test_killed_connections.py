"""A pooled connection the server killed costs one failed attempt, never a poller stuck on it.

PyMySQL sends ``SET autocommit`` when a transaction begins on an autocommit engine, outside
SQLAlchemy's disconnect handling: on a killed connection its own ``InterfaceError(0, '')`` came
out, the connection went back to the pool, and every later transaction failed the same way (the
MariaDB soak found a SqlSink failing 395 runs in a row after ``KILL CONNECTION``). Against the
real MariaDB: the first transaction after the kill fails as a transient error, the next works.
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from azure_functions_db.sources import engines
from azure_functions_db.sources.transience import is_transient
from devkit import dbservers

pytestmark = pytest.mark.mysql


def test_a_killed_pooled_connection_is_dropped_and_the_next_transaction_works(
    mysql_db: str,
) -> None:
    url = sa.make_url(dbservers.mysql_url(mysql_db))
    engine = engines.create(url, {}, "mysql://masked", lambda text: text)
    admin = sa.create_engine(dbservers.mysql_url(mysql_db), poolclass=sa.NullPool)
    try:
        with engines.transaction(engine) as conn:
            session = conn.exec_driver_sql("SELECT CONNECTION_ID()").scalar_one()
        with admin.connect() as other:
            other.exec_driver_sql(f"KILL CONNECTION {int(session)}")
        failures = []
        for _ in range(3):
            try:
                with engines.transaction(engine) as conn:
                    assert conn.exec_driver_sql("SELECT 1").scalar_one() == 1
            except sa.exc.SQLAlchemyError as exc:
                failures.append(exc)
        assert len(failures) <= 1, failures
        assert all(is_transient(exc) for exc in failures)
    finally:
        engine.dispose()
        admin.dispose()
