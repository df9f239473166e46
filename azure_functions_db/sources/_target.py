"""What a horizon strategy is given of its source: the narrow seam between the two."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa


@dataclass(frozen=True)
class HorizonTarget:
    """The facts a horizon strategy may use, and nothing else of the source.

    Attributes:
        engine: Where to ask the database (snapshot, oldest transaction, its clock).
        cursor: The reflected leading cursor column: its type decides the method and the form
            of the bound.
        zone: The zone a naive date-time cursor holds wall-clock time in.
        lag: The margin every bound keeps below the database's own (zero: none).
        table: The table's qualified name, for messages.
    """

    engine: sa.Engine
    cursor: sa.Column[Any]
    zone: dt.tzinfo
    lag: dt.timedelta
    table: str
