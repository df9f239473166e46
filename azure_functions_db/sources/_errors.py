"""Driver errors translated at the source's edge: transient or not, with the password masked."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import exc as sa_exc

from azure_functions_db.errors import SourceError, TransientSourceError

# OperationalError is how sqlite3 and some MySQL drivers report mistakes that retrying cannot fix.
_PERMANENT = ("no such table", "no such column", "syntax error", "unknown column", "doesn't exist")


def translate(
    exc: sa_exc.SQLAlchemyError,
    action: str,
    table: str,
    masked_url: str,
    scrub: Callable[[str], str],
) -> SourceError:
    """``TransientSourceError`` for what a retry may fix (a dropped connection, a timeout),
    ``SourceError`` otherwise; the message names ``action``, ``table`` and ``masked_url``."""
    cause: BaseException = getattr(exc, "orig", None) or exc
    detail = scrub(str(cause).strip().splitlines()[0] if str(cause).strip() else "")
    transient = isinstance(
        exc, sa_exc.OperationalError | sa_exc.DisconnectionError | sa_exc.TimeoutError
    ) or (isinstance(exc, sa_exc.DBAPIError) and exc.connection_invalidated)
    if transient and any(marker in detail.lower() for marker in _PERMANENT):
        transient = False
    kind = TransientSourceError if transient else SourceError
    return kind(
        f"Database {action} for table `{table}` at `{masked_url}` failed "
        f"({type(cause).__name__}): {detail[:500]}"
    )
