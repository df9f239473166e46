"""``afdb quarantine``: list, show, replay and drop a poller's quarantine records, as data.

Replay runs the poller's own handler under its lease (:meth:`Engine.replay`); replay and drop
are recorded in the record's history (who, when, under which fence, why) and logged, like a
seek.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass

from azure_functions_db.core.logs import log_event
from azure_functions_db.core.quarantine import (
    QuarantineEvent,
    QuarantineRecord,
    full_json,
    in_order,
    no_such_record,
)
from azure_functions_db.errors import QuarantineCorruptError, QuarantineStateError
from azure_functions_db.ops.seek import operator_identity
from azure_functions_db.runtime.poller import PollerDefinition

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Listed:
    """One entry of ``afdb quarantine list``: a record, or the error that keeps it unreadable."""

    record_id: str
    record: QuarantineRecord | None
    error: str | None = None


def list_records(
    definition: PollerDefinition, settings: Mapping[str, str], *, every: bool = False
) -> list[Listed]:
    """The poller's records, oldest first; only the quarantined ones unless ``every``.
    A record that does not decode is listed with its error, never skipped."""
    store = definition.store(settings)
    key = definition.config.key
    found: list[QuarantineRecord] = []
    broken: list[Listed] = []
    for record_id in store.list_quarantined(key):
        try:
            stored = store.read_quarantined(key, record_id)
        except QuarantineCorruptError as exc:
            broken.append(Listed(record_id, None, str(exc)))
            continue
        if stored is not None and (every or stored.record.state == "quarantined"):
            found.append(stored.record)
    return [Listed(r.id, r) for r in in_order(found)] + broken


def show_record(
    definition: PollerDefinition, settings: Mapping[str, str], record_id: str
) -> QuarantineRecord:
    """One record, rows and history included."""
    cfg = definition.config
    stored = definition.store(settings).read_quarantined(cfg.key, record_id)
    if stored is None:
        raise no_such_record(cfg.key, record_id, cfg.name)
    return stored.record


def replay_record(
    definition: PollerDefinition,
    settings: Mapping[str, str],
    record_id: str,
    *,
    reason: str = "",
    again: bool = False,
    lossy_ok: bool = False,
    by: str | None = None,
) -> tuple[QuarantineRecord, BaseException | None]:
    """Deliver a quarantined batch to the poller's handler again, under its lease (see
    :meth:`~azure_functions_db.core.engine.Engine.replay`)."""
    env = dict(settings)
    return definition.engine(env).replay(
        env,
        record_id,
        by=by or operator_identity(),
        reason=reason,
        again=again,
        lossy_ok=lossy_ok,
    )


def drop_record(
    definition: PollerDefinition,
    settings: Mapping[str, str],
    record_id: str,
    *,
    reason: str = "",
    by: str | None = None,
) -> QuarantineRecord:
    """Mark a record dropped (its rows are not delivered; the record and its history stay),
    by compare-and-set, audited."""
    by = by or operator_identity()
    cfg = definition.config
    store = definition.store(settings)
    stored = store.read_quarantined(cfg.key, record_id)
    if stored is None:
        raise no_such_record(cfg.key, record_id, cfg.name)
    if stored.record.state != "quarantined":
        raise QuarantineStateError(
            cfg.name,
            cfg.namespace,
            record_id,
            f"it was {stored.record.state} already; only a quarantined record can be dropped.",
        )
    fence = store.inspect(cfg.key).fence
    event = QuarantineEvent("dropped", definition.clock.now(), by, fence, reason)
    dropped = stored.record.with_event(event, "dropped")
    store.replace_quarantined(dropped, stored.etag)
    log_event(
        logger,
        logging.WARNING,
        "quarantine_dropped",
        poller=cfg.name,
        namespace=cfg.namespace,
        record=record_id,
        rows=len(dropped),
        by=by,
        reason=reason or None,
    )
    return dropped


LIST_COLUMNS = ("id", "state", "rows", "first .. last", "quarantined at", "error", "replays")


def list_row(entry: Listed) -> tuple[str, ...]:
    """One row of the ``afdb quarantine list`` table (``LIST_COLUMNS``)."""
    r = entry.record
    if r is None:
        return (entry.record_id, "UNREADABLE", "-", "-", "-", entry.error or "", "-")
    return (
        r.id,
        r.state,
        str(len(r)),
        f"{r.changes[0].position} .. {r.after}",
        r.at.isoformat(timespec="seconds"),
        r.error[:80],
        str(r.replays),
    )


def describe(record: QuarantineRecord) -> list[str]:
    """``afdb quarantine show``: the record as lines of text (history, then rows)."""
    lines = [
        f"{record.id} ({record.key}): {record.state}, {len(record)} row(s)",
        f"  error: {record.error}",
        f"  after {record.before or '(beginning)'} up to {record.after}",
    ]
    if record.lossy:
        lines.append(f"  kept as text only: {', '.join(record.lossy)}")
    for event in record.history:
        detail = f": {event.detail}" if event.detail else ""
        lines.append(
            f"  {event.at.isoformat(timespec='seconds')} {event.action} by {event.by} "
            f"(fence {event.fence}){detail}"
        )
    for doc in full_json(record)["changes"]:
        lines.append(f"  {doc['op']} {doc['position']}: {json.dumps(doc['data'], default=str)}")
    return lines
