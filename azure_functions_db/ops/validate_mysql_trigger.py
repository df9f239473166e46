"""``afdb validate`` on a table Azure's MySQL trigger watched: its column, its state, the switch.

The trigger asks for a column ``az_func_updated_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP ON
UPDATE CURRENT_TIMESTAMP`` and keeps its position in ``az_func_mysql.GlobalState``
(:mod:`.migrate_mysql`). When the poller's table has that column, validate says what the poller
makes of it, and, when the trigger's state names the table, how to take over where it stopped.
"""

from __future__ import annotations

from typing import Any, Literal

import sqlalchemy as sa

from azure_functions_db.ops.mysql_trigger_state import (
    DENIED,
    STATE_DATABASE,
    UPDATED_AT,
    code,
    user_table_id,
)
from azure_functions_db.sources.sqlalchemy import SqlSource

#: (level, message, fix) of one finding (``check="mysql_trigger"``).
TriggerFinding = tuple[Literal["ok", "warning"], str, str | None]


def mysql_trigger_findings(source: Any, app: str, poller: str) -> list[TriggerFinding]:
    """What validate reports of the MySQL trigger's column and state (the source is open)."""
    if not isinstance(source, SqlSource) or source.engine.dialect.name not in ("mysql", "mariadb"):
        return []
    table = source.cursor_columns[0].table
    if UPDATED_AT not in {c.name.lower() for c in table.columns}:
        return []
    cursor = [c.name for c in source.cursor_columns]
    found: list[TriggerFinding] = []
    if [c.lower() for c in cursor] == [UPDATED_AT]:
        found.append(
            (
                "ok",
                f"`{table.name}` has Azure's MySQL trigger's column `{UPDATED_AT}` and the poller "
                "reads it as its cursor, ordered by it and the key: rows stamped in the same "
                "second are neither skipped nor read twice, and a transaction still open is "
                "waited for (the horizon), where the trigger passes late commits over. No schema "
                "change is needed.",
                None,
            )
        )
    else:
        found.append(
            (
                "ok",
                f"`{table.name}` has Azure's MySQL trigger's column `{UPDATED_AT}`; the poller's "
                f"cursor is ({', '.join(cursor)}). To take over from the trigger where it "
                f'stopped, declare `cursor="{UPDATED_AT}"`.',
                None,
            )
        )
        return found
    with source.engine.connect() as conn:
        database = table.schema or str(conn.execute(sa.text("SELECT DATABASE()")).scalar_one())
        try:
            functions = conn.execute(
                sa.text(
                    f"SELECT UserFunctionID FROM {STATE_DATABASE}.GlobalState "
                    "WHERE UserTableID = :t ORDER BY UserFunctionID"
                ),
                {"t": user_table_id(database, table.name)},
            ).all()
        except sa.exc.SQLAlchemyError as exc:
            if code(exc) in DENIED:
                user = source.engine.url.username or "<user>"
                found.append(
                    (
                        "warning",
                        f"The poller's user `{user}` may not read {STATE_DATABASE}, where Azure's "
                        "MySQL trigger keeps its state: if the trigger ran on this table, grant "
                        "the read and validate again, to take over where it stopped.",
                        f"GRANT SELECT ON {STATE_DATABASE}.* TO '{user}'@'%'",
                    )
                )
            return found  # else no trigger state here: nothing to take over from
    if functions:
        ids = ", ".join(f"`{row[0]}`" for row in functions)
        command = f"afdb migrate mysql-trigger {app} --poller {poller} --function NAME --site APP"
        found.append(
            (
                "warning",
                f"Azure's MySQL trigger has state for `{table.name}` in {STATE_DATABASE} "
                f"(function id(s) {ids}). Disable the trigger's function, then create this "
                "poller's checkpoint where it stopped, before the poller's first run (which "
                "would otherwise deliver the whole table again); see "
                "docs/migrate-from-mysql-trigger.md.",
                f"{command} --dry-run",
            )
        )
    return found
