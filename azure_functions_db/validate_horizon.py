"""How ``afdb validate`` describes a source's horizon: the method in effect, the privileges it
needs, and what a fallback means for late-committing rows (SPEC §5.3). Pure: it reads only the
:class:`~azure_functions_db.ports.Horizon` the source returned and a few facts about the source.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from typing import Literal

from azure_functions_db.ports import Horizon
from azure_functions_db.sources import (
    MssqlRowversionHorizon,
    MysqlTrxHorizon,
    PgSnapshotHorizon,
    PgXactStartHorizon,
)

__all__ = ["HorizonFinding", "Level", "describe_horizon"]

Level = Literal["ok", "warning", "error"]

# What each commit-safe method does, the privileges it needs (as GRANT names them), and in words.
_SAFE_METHODS: dict[str, tuple[str, tuple[str, ...], str]] = {
    PgSnapshotHorizon.name: (
        "every row below the snapshot xmin (`pg_snapshot_xmin(pg_current_snapshot())`) has "
        "committed",
        (),
        "needs no privilege",
    ),
    PgXactStartHorizon.name: (
        "rows wait until every transaction that started before them has ended (oldest "
        "`xact_start` in pg_stat_activity)",
        ("pg_read_all_stats",),
        "needs membership in `pg_read_all_stats` (or superuser), which {user} has",
    ),
    MysqlTrxHorizon.name: (
        "rows wait until every InnoDB transaction that started before them has ended (oldest "
        "`trx_started` in information_schema.innodb_trx)",
        ("PROCESS",),
        "needs the `PROCESS` privilege, which {user} has",
    ),
    MssqlRowversionHorizon.name: (
        "every row below `MIN_ACTIVE_ROWVERSION()` has committed",
        (),
        "needs no privilege",
    ),
}
# The dialect horizons end their reasons with "fix: `GRANT ...`"; the statement becomes `fix`.
_GRANT = re.compile(r"fix: `(GRANT [^`]+)`")


@dataclass(frozen=True)
class HorizonFinding:
    """The level and message of the horizon check, the privileges of the method in effect, and
    the ``GRANT`` that restores the commit-safe method after a fallback (if that is the fix)."""

    level: Level
    message: str
    privileges: tuple[str, ...]
    fix: str | None


def describe_horizon(
    horizon: Horizon, *, dialect: str | None, lag: dt.timedelta | None, user: str | None
) -> HorizonFinding:
    """Describe ``horizon`` (from ``source.horizon()`` after ``open``) for a validation report.

    ``dialect``, ``lag`` and ``user`` (the database user) are ``None`` when the source does not
    say. A non-empty ``horizon.detail`` means ``auto`` fell back from the commit-safe method.
    """
    safe = _SAFE_METHODS.get(horizon.method)
    lag_text = f"lag={lag.total_seconds():g}s" if lag else "lag=0"
    grant = _GRANT.search(horizon.detail) if horizon.detail else None
    fix = grant.group(1) if grant else None
    if safe is not None:
        what, privileges, needs = safe
        granted = needs.format(user=f"`{user}`" if user else "the connection")
        margin = f"; `{lag_text}` is added as a margin" if lag else ""
        message = f"Horizon `{horizon.method}` (commit-safe): {what}; {granted}{margin}."
        return HorizonFinding("ok", message, privileges, fix)
    if horizon.detail:
        return HorizonFinding("warning", _fallback_message(horizon), (), fix)
    if dialect == "sqlite":
        message = (
            f"Horizon `{horizon.method}` ({lag_text}): SQLite runs one writer at a time, so no "
            "row can commit below one already read; needs no privilege."
        )
        return HorizonFinding("ok", message, (), None)
    level, message = _unsafe_finding(horizon.method, lag_text)
    return HorizonFinding(level, message, (), None)


def _fallback_message(horizon: Horizon) -> str:
    """``auto`` could not use the commit-safe method; ``detail`` says why and how to fix it."""
    if horizon.method == "none":
        return (
            f"Horizon `none`: {horizon.detail}. With lag=0 and no commit-safe method, rows of "
            "transactions that commit late (after rows with later cursors were read) can be "
            "missed: apply that fix, or set `lag=` longer than your longest write "
            "transaction."
        )
    return (
        f"Horizon `{horizon.method}`: {horizon.detail}. Rows of a transaction that stays open "
        "longer than the lag can be missed until the commit-safe method works."
    )


def _unsafe_finding(method: str, lag: str) -> tuple[Level, str]:
    """A method chosen on purpose (``horizon="lag"``, ``"none"``, a custom strategy)."""
    if method == "none":
        return "warning", (
            "Horizon `none`: the source reads without an upper bound, so rows of transactions "
            "that commit late (after rows with later cursors were read) can be missed. Use "
            '`horizon="auto"` (the default), or set `lag=` longer than your longest write '
            "transaction."
        )
    if method == "lag":
        return "ok", (
            f"Horizon `lag` ({lag}): rows wait that long before they are read; needs no "
            "privilege. Rows of a transaction open longer than the lag can be missed; "
            '`horizon="auto"` uses a commit-safe method where the database has one.'
        )
    return "ok", f"Horizon `{method}` (a custom strategy)."
