"""The checkpoint record of one poller: a versioned JSON document and its only-forward rule.

Schema 1 (``"schema": 1``)::

    {
      "schema": 1,
      "namespace": "live", "poller": "orders",
      "position": {"cursor": [...], "pk": [...]} | null,   # null: from the beginning
      "fence": 7,                                          # fence of the last writer
      "source": {"table": "orders", "cursor": ["updated_at"], "pk": ["id"], "where": null},
      "committed_at": {"t": "datetime_tz", "v": "..."} | null,
      "attempts": 0,              # consecutive failures at `position`
      "transient_failures": 0,    # of those, or before them, failures a retry may fix (a sink
                                  # connection lost): counted as attempts once they repeat
      "last_error": null | "...", # short description of the latest failure
      "stats": {"batches": 12, "rows": 11950, "quarantined": 1},
      "seek": null | {...},       # audit of the latest operator seek
      "health": null | {...}      # how the latest runs went (liveness; see RunHealth)
    }

``stats.quarantined`` counts rows the checkpoint moved past into quarantine records (they are
not in ``rows``, and their batches are not in ``batches``: a transactional sink numbers batches
by ``batches``). Keys added later are optional, so records written before them still decode.

Stores persist the bytes of :func:`encode_checkpoint` and hand back what
:func:`decode_checkpoint` makes of them; a record that does not decode is never overwritten.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from azure_functions_db.core.position import Position, decode_value, encode_value
from azure_functions_db.core.retirement import Retirement
from azure_functions_db.errors import CodecError, PositionNotForwardError, StaleFenceError

SCHEMA_VERSION = 1
RETIRED_SCHEMA = 2  # a record retired by ``afdb reshard`` (see encode_checkpoint)


@dataclass(frozen=True)
class PollerKey:
    """Identifies one poller's state: (namespace, poller name)."""

    namespace: str
    poller: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.poller}"


@dataclass(frozen=True)
class SourceDescription:
    """What the checkpoint's position refers to: table, cursor and key columns, filter.

    ``columns`` lists the columns read into each row (``None``: not recorded). A change of
    ``where`` or ``columns`` lets the poller continue; a change of table, cursor or pk does not.
    """

    table: str
    cursor: tuple[str, ...]
    pk: tuple[str, ...]
    where: str | None = None
    columns: tuple[str, ...] | None = None

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "table": self.table,
            "cursor": list(self.cursor),
            "pk": list(self.pk),
            "where": self.where,
        }
        if self.columns is not None:
            doc["columns"] = list(self.columns)
        return doc

    @classmethod
    def from_json(cls, data: Any) -> SourceDescription:
        if not isinstance(data, dict):
            raise CodecError(f"`source` must be an object, found `{data!r}`")
        return cls(
            table=str_field(data, "table"),
            cursor=tuple(_str_list(data, "cursor")),
            pk=tuple(_str_list(data, "pk")),
            where=data.get("where"),
            columns=tuple(_str_list(data, "columns")) if data.get("columns") is not None else None,
        )


@dataclass(frozen=True)
class SeekAudit:
    """Who moved a checkpoint by hand, from where to where, and when."""

    by: str
    at: dt.datetime
    from_position: Position | None
    to_position: Position | None
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {
            "by": self.by,
            "at": encode_value(self.at),
            "from": self.from_position.to_json() if self.from_position else None,
            "to": self.to_position.to_json() if self.to_position else None,
            "reason": self.reason,
        }

    @classmethod
    def from_json(cls, data: Any) -> SeekAudit:
        if not isinstance(data, dict):
            raise CodecError(f"`seek` must be an object, found `{data!r}`")
        at = decode_value(data.get("at"))
        if not isinstance(at, dt.datetime):
            raise CodecError("`seek.at` must be a datetime")
        return cls(
            by=str_field(data, "by"),
            at=at,
            from_position=_position_or_none(data.get("from")),
            to_position=_position_or_none(data.get("to")),
            reason=str_field(data, "reason"),
        )


@dataclass(frozen=True)
class CheckpointStats:
    batches: int = 0
    rows: int = 0
    quarantined: int = 0


Health = Literal["healthy", "stalled", "falling_behind"]
HEALTH_STATES: tuple[Health, ...] = ("healthy", "stalled", "falling_behind")


@dataclass(frozen=True)
class RunHealth:
    """How a poller's latest runs went, as the runs saw it (liveness, ``afdb status``).

    ``state`` is what the latest run decided: ``stalled`` when no run succeeded for
    ``stall_after`` seconds, ``falling_behind`` when the backlog grew over that many consecutive
    runs (``lag_grew``). ``lag_rows`` is capped (``None``: not measured), ``lag_seconds`` is the
    age of the oldest undelivered row (date-time cursors only).
    """

    last_run_at: dt.datetime
    last_status: str
    last_success_at: dt.datetime | None = None
    failing_since: dt.datetime | None = None
    lag_rows: int | None = None
    lag_seconds: float | None = None
    lag_grew: int = 0
    state: Health = "healthy"
    last_error: str | None = None  # what the latest run failed on (cleared by a success)
    manual: bool = False  # the latest run was started by hand, not by the schedule

    def to_json(self) -> dict[str, Any]:
        return {
            "last_run_at": encode_value(self.last_run_at),
            "last_status": self.last_status,
            "last_success_at": _time_or_none(self.last_success_at),
            "failing_since": _time_or_none(self.failing_since),
            "lag_rows": self.lag_rows,
            "lag_seconds": self.lag_seconds,
            "lag_grew": self.lag_grew,
            "state": self.state,
            "last_error": self.last_error,
            "manual": self.manual,
        }

    @classmethod
    def from_json(cls, data: Any) -> RunHealth:
        if not isinstance(data, dict) or data.get("state") not in HEALTH_STATES:
            raise CodecError(f"`health` must be an object with a known state, found `{data!r}`")
        lag_rows, lag_seconds = data.get("lag_rows"), data.get("lag_seconds")
        if lag_rows is not None and (not isinstance(lag_rows, int) or lag_rows < 0):
            raise CodecError(f"`health.lag_rows` must be a count, found `{lag_rows!r}`")
        if lag_seconds is not None and not isinstance(lag_seconds, int | float):
            raise CodecError(f"`health.lag_seconds` must be a number, found `{lag_seconds!r}`")
        last_run_at = _time_or_none_from(data.get("last_run_at"), "health.last_run_at")
        if last_run_at is None:
            raise CodecError("`health.last_run_at` is missing")
        return cls(
            last_run_at=last_run_at,
            last_status=str_field(data, "last_status"),
            last_success_at=_time_or_none_from(
                data.get("last_success_at"), "health.last_success_at"
            ),
            failing_since=_time_or_none_from(data.get("failing_since"), "health.failing_since"),
            lag_rows=lag_rows,
            lag_seconds=float(lag_seconds) if lag_seconds is not None else None,
            lag_grew=count_field(data, "lag_grew"),
            state=data["state"],
            last_error=_text_or_none(data.get("last_error"), "health.last_error"),
            manual=data.get("manual") is True,
        )


@dataclass(frozen=True)
class Checkpoint:
    """One poller's durable state. Immutable: every change makes a new record."""

    key: PollerKey
    position: Position | None = None
    fence: int = 0
    source: SourceDescription | None = None
    committed_at: dt.datetime | None = None
    attempts: int = 0
    last_error: str | None = None
    stats: CheckpointStats = field(default_factory=CheckpointStats)
    seek: SeekAudit | None = None
    health: RunHealth | None = None
    transient_failures: int = 0
    retired: Retirement | None = None  # by ``afdb reshard``: its runs then refuse

    def fenced(self, fence: int, source: SourceDescription | None = None) -> Checkpoint:
        """This record claimed by the owner holding ``fence`` (the write right after acquire).

        ``source``, when given, replaces the stored source description (the caller has checked
        that the position still means the same thing for it). A new grant's fence is strictly
        above every earlier one, so an equal or lower stored fence means the record was already
        claimed under this fence or a newer one (or the lease lost its counter): raises
        :class:`StaleFenceError`.
        """
        if fence <= self.fence:
            raise StaleFenceError(
                self.key.poller, self.key.namespace, stored=self.fence, mine=fence
            )
        return replace(self, fence=fence, source=source if source is not None else self.source)

    def advanced(
        self,
        position: Position,
        *,
        fence: int,
        at: dt.datetime,
        rows: int,
        source: SourceDescription | None,
        read_after: Position | None,
    ) -> Checkpoint:
        """The record after a successful batch ending at ``position``.

        Enforces the only-forward rule and the fence rule (the stored fence is not newer than
        ``fence``). Only forward, in the database's order: ``read_after`` is the position the
        batch was read strictly after (the database returned its rows for ``key > read_after``,
        so ``position`` is after it in the database's own collation and type order); it must
        be the stored position, and ``position`` must differ from it. No Python comparison of
        positions decides anything here, so the rule cannot disagree with the database.
        """
        if fence < self.fence:
            raise StaleFenceError(
                self.key.poller, self.key.namespace, stored=self.fence, mine=fence
            )
        if read_after != self.position or position == self.position:
            raise PositionNotForwardError(
                self.key.poller,
                self.key.namespace,
                stored=self.position,
                proposed=position,
                read_after=read_after,
            )
        return replace(
            self,
            position=position,
            fence=fence,
            source=source if source is not None else self.source,
            committed_at=at,
            attempts=0,
            transient_failures=0,
            last_error=None,
            stats=replace(self.stats, batches=self.stats.batches + 1, rows=self.stats.rows + rows),
        )

    def quarantined(
        self,
        position: Position,
        *,
        fence: int,
        at: dt.datetime,
        rows: int,
        read_after: Position | None,
    ) -> Checkpoint:
        """The record moved past ``rows`` rows ending at ``position`` that a quarantine record
        holds now (written first, by the caller): the rules of :meth:`advanced`, but counted
        as quarantined, not delivered (``batches`` and ``rows`` stay; a sink numbers its
        batches by ``batches``)."""
        moved = self.advanced(
            position, fence=fence, at=at, rows=0, source=None, read_after=read_after
        )
        stats = CheckpointStats(
            batches=self.stats.batches,
            rows=self.stats.rows,
            quarantined=self.stats.quarantined + rows,
        )
        return replace(moved, stats=stats)

    def replayed(self, *, fence: int, rows: int) -> Checkpoint:
        """The record after a quarantined batch of ``rows`` rows was replayed by an operator:
        one more delivered batch (a transactional sink numbered it), the position unchanged."""
        if fence < self.fence:
            raise StaleFenceError(
                self.key.poller, self.key.namespace, stored=self.fence, mine=fence
            )
        stats = replace(self.stats, batches=self.stats.batches + 1, rows=self.stats.rows + rows)
        return replace(self, fence=fence, stats=stats)

    def with_health(self, health: RunHealth) -> Checkpoint:
        """This record with ``health`` (written by a run as it ends; changes nothing else)."""
        return replace(self, health=health)

    def failed(
        self, *, fence: int, error: str, transient: bool = False, counted: bool = True
    ) -> Checkpoint:
        """The record after a failed attempt at the current position: ``attempts`` + 1 when
        ``counted``; a ``transient`` failure (one a retry may fix) adds one to
        ``transient_failures``, any other failure leaves it as it is."""
        if fence < self.fence:
            raise StaleFenceError(
                self.key.poller, self.key.namespace, stored=self.fence, mine=fence
            )
        return replace(
            self,
            fence=fence,
            attempts=self.attempts + (1 if counted else 0),
            transient_failures=self.transient_failures + (1 if transient else 0),
            last_error=error[:500],
        )

    def sought(
        self,
        position: Position | None,
        *,
        fence: int,
        by: str,
        at: dt.datetime,
        reason: str,
        source: SourceDescription | None = None,
    ) -> Checkpoint:
        """The record moved by an operator (the only way backwards), with its audit.

        ``source`` is the definition the new position belongs to: after a seek the poller
        continues under it, which is how an operator adopts a changed cursor or key.
        """
        if fence < self.fence:  # written under a claim that fenced the record first
            raise StaleFenceError(
                self.key.poller, self.key.namespace, stored=self.fence, mine=fence
            )
        audit = SeekAudit(
            by=by, at=at, from_position=self.position, to_position=position, reason=reason
        )
        return replace(
            self,
            position=position,
            fence=fence,
            attempts=0,
            transient_failures=0,
            last_error=None,
            seek=audit,
            source=source if source is not None else self.source,
            retired=None,  # a seek is how an operator brings a retired poller back
        )


def encode_checkpoint(cp: Checkpoint) -> bytes:
    """The stored form of a record: UTF-8 JSON with sorted keys."""
    doc = {
        # A retired record is schema 2, which versions before ``afdb reshard`` refuse to read
        # (a run then fails) rather than drop the mark they do not know and deliver on.
        "schema": SCHEMA_VERSION if cp.retired is None else RETIRED_SCHEMA,
        "namespace": cp.key.namespace,
        "poller": cp.key.poller,
        "position": cp.position.to_json() if cp.position else None,
        "fence": cp.fence,
        "source": cp.source.to_json() if cp.source else None,
        "committed_at": encode_value(cp.committed_at) if cp.committed_at else None,
        "attempts": cp.attempts,
        "transient_failures": cp.transient_failures,
        "last_error": cp.last_error,
        "stats": {
            "batches": cp.stats.batches,
            "rows": cp.stats.rows,
            "quarantined": cp.stats.quarantined,
        },
        "seek": cp.seek.to_json() if cp.seek else None,
        "health": cp.health.to_json() if cp.health else None,
        **({"retired": cp.retired.to_json()} if cp.retired else {}),
    }
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode("utf-8")


def decode_checkpoint(data: bytes) -> Checkpoint:
    """Inverse of :func:`encode_checkpoint`.

    Raises :class:`CodecError` (with a reason) for malformed JSON, an unknown schema number or
    any field that does not decode; callers turn that into ``CheckpointCorruptError``.
    """
    doc = json_object(data)
    schema = doc.get("schema")
    if schema not in (SCHEMA_VERSION, RETIRED_SCHEMA) or (schema == RETIRED_SCHEMA) != (
        doc.get("retired") is not None
    ):
        raise CodecError(
            f"unknown schema `{schema}` (this version reads schema {SCHEMA_VERSION}); was it "
            "written by a newer azure-functions-db"
        )
    committed = doc.get("committed_at")
    committed_at = decode_value(committed) if committed is not None else None
    if committed_at is not None and not isinstance(committed_at, dt.datetime):
        raise CodecError("`committed_at` must be a datetime")
    stats = doc.get("stats") or {}
    if not isinstance(stats, dict):
        raise CodecError("`stats` must be an object")
    source = doc.get("source")
    seek = doc.get("seek")
    health = doc.get("health")
    last_error = _text_or_none(doc.get("last_error"), "last_error")
    return Checkpoint(
        key=PollerKey(namespace=str_field(doc, "namespace"), poller=str_field(doc, "poller")),
        position=_position_or_none(doc.get("position")),
        fence=count_field(doc, "fence"),
        source=SourceDescription.from_json(source) if source is not None else None,
        committed_at=committed_at,
        attempts=count_field(doc, "attempts"),
        transient_failures=(
            count_field(doc, "transient_failures") if "transient_failures" in doc else 0
        ),
        last_error=last_error,
        stats=CheckpointStats(
            batches=count_field(stats, "batches"),
            rows=count_field(stats, "rows"),
            quarantined=count_field(stats, "quarantined") if "quarantined" in stats else 0,
        ),
        seek=SeekAudit.from_json(seek) if seek is not None else None,
        health=RunHealth.from_json(health) if health is not None else None,
        retired=Retirement.from_json(doc["retired"]) if schema == RETIRED_SCHEMA else None,
    )


def json_object(data: bytes) -> dict[str, Any]:
    """Stored bytes as a JSON object; :class:`CodecError` when they are not UTF-8 JSON or not an
    object (the first step of decoding every record)."""
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CodecError(f"not valid UTF-8 JSON ({exc})") from exc
    if not isinstance(doc, dict):
        raise CodecError("the record is not a JSON object")
    return doc


def _text_or_none(value: Any, name: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise CodecError(f"`{name}` must be a string")
    return value


def _time_or_none(value: dt.datetime | None) -> Any:
    return encode_value(value) if value is not None else None


def _time_or_none_from(data: Any, name: str) -> dt.datetime | None:
    if data is None:
        return None
    value = decode_value(data)
    if not isinstance(value, dt.datetime):
        raise CodecError(f"`{name}` must be a datetime")
    return value


def _position_or_none(data: Any) -> Position | None:
    return None if data is None else Position.from_json(data)


def str_field(doc: Mapping[str, Any], name: str) -> str:
    """``doc[name]``, which must be a string (else :class:`CodecError`)."""
    value = doc.get(name)
    if not isinstance(value, str):
        raise CodecError(f"`{name}` must be a string")
    return value


def count_field(doc: Mapping[str, Any], name: str) -> int:
    """``doc[name]``, which must be a non-negative integer (else :class:`CodecError`)."""
    value = doc.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise CodecError(f"`{name}` must be a non-negative integer, found `{value!r}`")
    return value


def _str_list(doc: dict[str, Any], name: str) -> list[str]:
    value = doc.get(name)
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise CodecError(f"`{name}` must be a non-empty list of strings, found `{value!r}`")
    return value
