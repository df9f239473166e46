"""Quarantine records: a batch the handler could not take, parked with everything needed to
replay it (the ``poison="quarantine"`` policy, ``afdb quarantine``).

A record is written by compare-and-set *before* the checkpoint moves past its rows, so a crash
between the two leaves the rows either quarantined and passed, or not passed (delivered again):
never passed without a record. Stores keep the bytes of :func:`encode_record`::

    {
      "schema": 1, "namespace": "live", "poller": "orders",
      "id": "q-3f9a...",                          # from the rows' positions: a retry finds it
      "state": "quarantined" | "replayed" | "dropped",
      "before": {position} | null, "after": {position},
      "rows": [{"position": {...}, "op": "upsert", "data": {"col": <value>, ...}}, ...],
      "error": "ValueError: ...", "attempts": 5, "fence": 7, "at": <datetime>,
      "history": [{"action": "quarantined", "at": ..., "by": ..., "fence": 7, "detail": ...}]
    }

Row values keep their types (the position codec's tags, plus ``null``, JSON documents and the
values a key may not hold: NaN, tz-aware times). A value of any other type is kept as its
``repr`` and the record says so (``lossy``): a replay then refuses it unless told otherwise.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any, Literal

from azure_functions_db.core.batch import Batch, Change
from azure_functions_db.core.checkpoint import PollerKey, count_field, json_object, str_field
from azure_functions_db.core.position import Position, decode_value, encode_value
from azure_functions_db.errors import CodecError, QuarantineStateError

QUARANTINE_SCHEMA = 1

State = Literal["quarantined", "replayed", "dropped"]
Action = Literal["quarantined", "replay_failed", "replayed", "dropped"]
STATES: tuple[State, ...] = ("quarantined", "replayed", "dropped")
_ACTIONS: tuple[Action, ...] = ("quarantined", "replay_failed", "replayed", "dropped")


@dataclass(frozen=True)
class QuarantineEvent:
    """One entry of a record's history: who did what to it, under which fence, and why."""

    action: Action
    at: dt.datetime
    by: str
    fence: int
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "at": encode_value(self.at),
            "by": self.by,
            "fence": self.fence,
            "detail": self.detail,
        }

    @classmethod
    def from_json(cls, doc: Any) -> QuarantineEvent:
        if not isinstance(doc, dict) or doc.get("action") not in _ACTIONS:
            raise CodecError(f"a history entry must name a known action, found `{doc!r}`")
        return cls(
            action=doc["action"],
            at=_datetime(doc.get("at"), "history.at"),
            by=str_field(doc, "by"),
            fence=count_field(doc, "fence"),
            detail=str_field(doc, "detail"),
        )


@dataclass(frozen=True)
class QuarantineRecord:
    """A quarantined batch: its rows as the handler saw them, the error, and its history.

    ``before``/``after``: the checkpoint position the rows were read after, and the last row's
    position (where the checkpoint moved when the record was written). ``lossy`` names the
    columns whose values were kept as ``repr`` only.
    """

    key: PollerKey
    id: str
    before: Position | None
    after: Position
    changes: tuple[Change, ...]
    error: str
    attempts: int
    fence: int
    at: dt.datetime
    state: State = "quarantined"
    history: tuple[QuarantineEvent, ...] = ()
    lossy: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(self.changes)

    def with_event(self, event: QuarantineEvent, state: State) -> QuarantineRecord:
        """This record in ``state``, with ``event`` appended to its history."""
        return replace(self, state=state, history=(*self.history, event))

    def batch(self, *, fence: int, attempt: int, poller: str | None = None) -> Batch:
        """The rows as one batch again, for a replay under the lease holding ``fence``;
        ``poller`` names the poller the changes carry (their ``event_id``), when it is not the
        record's key (a backfill chunk's or a shard's record)."""
        changes = self.changes
        if poller is not None and poller != self.key.poller:
            changes = tuple(Change(c.data, c.position, poller, c.op) for c in changes)
        return Batch(
            poller=self.key.poller,
            namespace=self.key.namespace,
            fence=fence,
            attempt=attempt,
            position_before=self.before,
            position_after=self.after,
            changes=changes,
        )

    @property
    def replays(self) -> int:
        """How many replays were tried (failed or not)."""
        return sum(1 for e in self.history if e.action in ("replayed", "replay_failed"))


def no_such_record(key: PollerKey, record_id: str, poller: str) -> QuarantineStateError:
    """The error for a record id that ``key`` does not hold (``poller``: its name in the app)."""
    return QuarantineStateError(
        key.poller,
        key.namespace,
        record_id,
        f"no such record; `afdb quarantine list APP --poller {poller} --all` shows the ids.",
    )


def record_id(key: PollerKey, first: Position, last: Position) -> str:
    """The id of the record of the rows from ``first`` to ``last``: the same rows give the same
    id, so a run that quarantines them again after a crash finds the record it wrote."""
    doc = [key.namespace, key.poller, first.to_json(), last.to_json()]
    digest = hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode())
    return "q-" + digest.hexdigest()[:24]


def new_record(
    key: PollerKey,
    batch: Batch,
    *,
    error: str,
    attempts: int,
    by: str,
    at: dt.datetime,
) -> QuarantineRecord:
    """The record of ``batch`` (non-empty), quarantined now under ``batch.fence``."""
    changes = tuple(batch.changes)  # built once, as the handler saw them
    first, last = changes[0].position, changes[-1].position
    event = QuarantineEvent("quarantined", at, by, batch.fence, error[:500])
    lossy = sorted({name for c in changes for name, v in c.data.items() if _lossy(v)})
    return QuarantineRecord(
        key=key,
        id=record_id(key, first, last),
        before=batch.position_before,
        after=last,
        changes=changes,
        error=error[:2000],
        attempts=attempts,
        fence=batch.fence,
        at=at,
        history=(event,),
        lossy=tuple(lossy),
    )


# -- codec -----------------------------------------------------------------------------------


def encode_record(record: QuarantineRecord) -> bytes:
    """The stored form of a record: UTF-8 JSON with sorted keys."""
    doc = {
        "schema": QUARANTINE_SCHEMA,
        "namespace": record.key.namespace,
        "poller": record.key.poller,
        "id": record.id,
        "state": record.state,
        "before": record.before.to_json() if record.before else None,
        "after": record.after.to_json(),
        "rows": [
            {
                "position": c.position.to_json(),
                "op": c.op,
                "data": {name: encode_data(v) for name, v in c.data.items()},
            }
            for c in record.changes
        ],
        "error": record.error,
        "attempts": record.attempts,
        "fence": record.fence,
        "at": encode_value(record.at),
        "history": [e.to_json() for e in record.history],
        "lossy": list(record.lossy),
    }
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode("utf-8")


def decode_record(data: bytes) -> QuarantineRecord:
    """Inverse of :func:`encode_record`; raises :class:`CodecError` naming what is wrong."""
    doc = json_object(data)
    if doc.get("schema") != QUARANTINE_SCHEMA:
        raise CodecError(
            f"unknown quarantine schema `{doc.get('schema')}` (this version reads schema "
            f"{QUARANTINE_SCHEMA}); was it written by a newer azure-functions-db"
        )
    key = PollerKey(str_field(doc, "namespace"), str_field(doc, "poller"))
    if doc.get("state") not in STATES:
        raise CodecError(f"unknown state `{doc.get('state')!r}`")
    rows = doc.get("rows")
    if not isinstance(rows, list) or not rows:
        raise CodecError("`rows` must be a non-empty list")
    changes = tuple(_change(key.poller, row) for row in rows)
    history = doc.get("history")
    if not isinstance(history, list):
        raise CodecError("`history` must be a list")
    lossy = doc.get("lossy", [])
    if not isinstance(lossy, list) or not all(isinstance(n, str) for n in lossy):
        raise CodecError("`lossy` must be a list of column names")
    before = doc.get("before")
    return QuarantineRecord(
        key=key,
        id=str_field(doc, "id"),
        before=Position.from_json(before) if before is not None else None,
        after=Position.from_json(doc.get("after")),
        changes=changes,
        error=str_field(doc, "error"),
        attempts=count_field(doc, "attempts"),
        fence=count_field(doc, "fence"),
        at=_datetime(doc.get("at"), "at"),
        state=doc["state"],
        history=tuple(QuarantineEvent.from_json(e) for e in history),
        lossy=tuple(lossy),
    )


def encode_data(value: Any) -> Any:  # noqa: PLR0911 - one arm per kind of value
    """One column value as JSON that :func:`decode_data` turns back into an equal value."""
    if value is None:
        return None
    if isinstance(value, float):  # NaN and infinities too (a key may not hold them; data may)
        return {"t": "float", "v": value.hex()}
    if isinstance(value, Decimal):
        return {"t": "decimal", "v": str(value)}
    if isinstance(value, dt.time) and value.tzinfo is not None:
        return {"t": "time_tz", "v": value.isoformat()}
    if isinstance(value, memoryview | bytearray):
        value = bytes(value)
    try:
        return encode_value(value)
    except CodecError:
        pass
    if isinstance(value, dict | list | tuple) and not _lossy(value):
        return {"t": "json", "v": json.dumps(value, sort_keys=True)}
    return {"t": "repr", "v": repr(value), "type": type(value).__name__}


def decode_data(encoded: Any) -> Any:
    """Inverse of :func:`encode_data` (a ``repr`` comes back as its text)."""
    if encoded is None:
        return None
    if isinstance(encoded, dict):
        tag, text = encoded.get("t"), encoded.get("v")
        if tag == "json" and isinstance(text, str):
            return json.loads(text)
        if tag == "time_tz" and isinstance(text, str):
            return dt.time.fromisoformat(text)
        if tag == "repr" and isinstance(text, str):
            return text
        if tag == "float" and isinstance(text, str):
            return float.fromhex(text)
    return decode_value(encoded)


def _lossy(value: Any) -> bool:
    """Whether ``value`` would be kept as its ``repr`` only."""
    if value is None or isinstance(
        value, str | int | float | Decimal | dt.date | dt.time | bytes | bytearray | memoryview
    ):
        return False
    if isinstance(value, dict):
        return any(not isinstance(k, str) or _lossy_json(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(_lossy_json(v) for v in value)
    try:
        encode_value(value)
    except CodecError:
        return True
    return False


def _lossy_json(value: Any) -> bool:
    """Whether ``value`` does not survive inside a JSON document."""
    if value is None or isinstance(value, str | bool | int):
        return False
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(not isinstance(k, str) or _lossy_json(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(_lossy_json(v) for v in value)
    return True


def _change(poller: str, row: Any) -> Change:
    if not isinstance(row, dict) or not isinstance(row.get("data"), dict):
        raise CodecError(f"a row must be an object with `data`, found `{row!r}`")
    op = row.get("op", "upsert")
    if op not in ("upsert", "delete"):
        raise CodecError(f"unknown row op `{op!r}`")
    data = {str(name): decode_data(v) for name, v in row["data"].items()}
    return Change(data, Position.from_json(row.get("position")), poller, op)


def _datetime(encoded: Any, name: str) -> dt.datetime:
    value = decode_value(encoded)
    if not isinstance(value, dt.datetime):
        raise CodecError(f"`{name}` must be a date-time")
    return value


def summary_json(record: QuarantineRecord) -> dict[str, Any]:
    """A record without its rows' data, JSON-ready (``afdb quarantine list --json``)."""
    return {
        "id": record.id,
        "poller": record.key.poller,
        "namespace": record.key.namespace,
        "state": record.state,
        "rows": len(record),
        "first": str(record.changes[0].position),
        "last": str(record.after),
        "error": record.error,
        "attempts": record.attempts,
        "fence": record.fence,
        "at": record.at.isoformat(),
        "replays": record.replays,
        "lossy": list(record.lossy),
    }


def full_json(record: QuarantineRecord) -> dict[str, Any]:
    """Everything in a record, JSON-ready (``afdb quarantine show --json``)."""
    doc = summary_json(record)
    doc["before"] = record.before.to_json() if record.before else None
    doc["after"] = record.after.to_json()
    doc["history"] = [{**e.to_json(), "at": e.at.isoformat()} for e in record.history]
    doc["changes"] = [
        {
            "event_id": c.event_id,
            "position": str(c.position),
            "op": c.op,
            "data": {k: _plain(v) for k, v in c.data.items()},
        }
        for c in record.changes
    ]
    return doc


def _plain(value: Any) -> Any:  # noqa: PLR0911 - one arm per kind of value
    """A value as plain JSON for people and scripts (``show``), not for decoding."""
    if value is None or isinstance(value, str | bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return str(value)


def in_order(records: Sequence[QuarantineRecord]) -> list[QuarantineRecord]:
    """Records in the order ``list`` shows them: oldest quarantine first, then by id."""
    return sorted(records, key=lambda r: (r.at, r.id))
