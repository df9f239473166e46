"""Log lines with stable keys.

Every line starts with ``action=<verb>`` followed by ``key=value`` pairs in a fixed order, and the
same pairs travel in ``extra`` so Application Insights shows them as custom dimensions. Formatting
is lazy (``%s``); the library configures no handlers.
"""

from __future__ import annotations

import logging
from typing import Any

# Types log exporters (OpenTelemetry, hence Application Insights) accept as attribute values.
_PLAIN = (str, bool, int, float)


def log_event(logger: logging.Logger, level: int, action: str, **fields: Any) -> None:
    """Log ``action`` with ``fields`` as ``key=value`` pairs (None values omitted).

    In ``extra`` every value that is not a string, bool or number (a position, say) travels as
    its text, so an exporter never drops it or warns about it. The record names the caller of
    this function as its source location.
    """
    if not logger.isEnabledFor(level):
        return
    items = [(k, v) for k, v in fields.items() if v is not None]
    template = " ".join(["action=%s", *(f"{k}=%s" for k, _ in items)])
    extra = {
        "afdb_action": action,
        **{f"afdb_{k}": v if isinstance(v, _PLAIN) else str(v) for k, v in items},
    }
    logger.log(level, template, action, *(v for _, v in items), extra=extra, stacklevel=2)
