"""``Checkpoint.retired``: the mark ``afdb reshard`` leaves on a poller whose rows other pollers
took over (see :mod:`azure_functions_db.core.reshard`)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from azure_functions_db.core.position import Position, decode_value, encode_value
from azure_functions_db.errors import CodecError


@dataclass(frozen=True)
class Retirement:
    """Retired into ``shards`` shard(s) of the poller ``group``, which start after ``at`` (the
    position every retired poller is drained to; ``None``: the table's beginning), by whom and
    when."""

    group: str
    shards: int
    at: Position | None
    by: str
    when: dt.datetime

    def __str__(self) -> str:
        where = f"after {self.at}" if self.at is not None else "at the beginning"
        return (
            f"into {self.shards} shard(s) of `{self.group}` {where}, by {self.by} at "
            f"{self.when.isoformat(timespec='seconds')}"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "shards": self.shards,
            "at": self.at.to_json() if self.at is not None else None,
            "by": self.by,
            "when": encode_value(self.when),
        }

    @classmethod
    def from_json(cls, data: Any) -> Retirement:
        if not isinstance(data, dict):
            raise CodecError(f"`retired` must be an object, found `{data!r}`")
        when = decode_value(data.get("when"))
        group, shards, by = data.get("group"), data.get("shards"), data.get("by")
        if (
            not isinstance(when, dt.datetime)
            or not isinstance(group, str)
            or not isinstance(by, str)
        ):
            raise CodecError("`retired` needs `group`, `by` and `when`")
        if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:
            raise CodecError("`retired.shards` must be a positive whole number")
        at = data.get("at")
        return cls(group, shards, None if at is None else Position.from_json(at), by, when)
