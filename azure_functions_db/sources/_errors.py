"""Driver errors translated at the source's edge: transient or not, with the password masked."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import exc as sa_exc

from azure_functions_db.errors import SourceError, TransientSourceError
from azure_functions_db.sources.transience import is_transient


def translate(
    exc: sa_exc.SQLAlchemyError,
    action: str,
    table: str,
    masked_url: str,
    scrub: Callable[[str], str],
) -> SourceError:
    """``TransientSourceError`` for what a retry may fix (a dropped connection, a timeout: see
    :func:`~azure_functions_db.sources.transience.is_transient`), ``SourceError`` otherwise (a
    wrong password too); the message names ``action``, ``table`` and ``masked_url``."""
    cause: BaseException = getattr(exc, "orig", None) or exc
    detail = scrub(str(cause).strip().splitlines()[0] if str(cause).strip() else "")
    kind = TransientSourceError if is_transient(exc) else SourceError
    return kind(
        f"Database {action} for table `{table}` at `{masked_url}` failed "
        f"({type(cause).__name__}): {detail[:500]}"
    )
