"""The engine of a ``SqlSink``: connections that only ever run transactions, and the pool's
reset of a connection it takes back skipped after a commit that returned."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa


def transactional_options(url: sa.URL) -> dict[str, Any]:
    """Engine options for connections that only ever run transactions: the driver's default
    isolation instead of the sources' autocommit reads (``engine_options`` may override).

    Switching an autocommit connection into a transaction and back costs round trips per
    batch on some drivers (PyMySQL: ``SET autocommit`` twice and the isolation level). Not on
    SQLite, whose connections stay in autocommit for the sink's own ``BEGIN IMMEDIATE``.
    The pool's rollback of every connection it takes back is left to
    :func:`reset_unless_ended`."""
    if url.get_backend_name() == "sqlite":
        return {}
    return {
        "isolation_level": None,
        "skip_autocommit_rollback": False,
        "pool_reset_on_return": None,
    }


#: ``Connection.info`` key: the sink's transaction on this connection ended with its commit.
ENDED = "afdb_sink_transaction_ended"


def resets_on_return(url: sa.URL, engine_options: Mapping[str, Any]) -> bool:
    """Whether the sink's engine leaves the reset of returned connections to
    :func:`reset_unless_ended`: not on SQLite, nor when ``engine_options`` set
    ``pool_reset_on_return`` themselves."""
    return url.get_backend_name() != "sqlite" and "pool_reset_on_return" not in engine_options


def reset_unless_ended(engine: sa.Engine) -> None:
    """The pool's reset of a connection it takes back (a ``ROLLBACK``, as SQLAlchemy's default
    ``pool_reset_on_return="rollback"`` does), except after a sink transaction whose commit
    returned: nothing is open then, and PyMySQL (and pyodbc) would send the ``ROLLBACK`` to
    the server anyway, a round trip per batch. Every other way back to the pool (a failed
    commit, a handler's error, a read) is rolled back as before; a failed rollback makes the
    pool discard the connection."""

    @sa.event.listens_for(engine, "reset")
    def _reset(dbapi_connection: Any, record: Any, state: Any) -> None:
        if record.info.pop(ENDED, False) or state.transaction_was_reset:
            return
        engine.dialect.do_rollback(dbapi_connection)
