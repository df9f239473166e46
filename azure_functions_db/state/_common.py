"""Rules shared by the stores that keep their own lease records (memory, local file).

The Azure stores get lease expiry from the service; these two decide it with their injected
clock, and both must decide it the same way: a lease is live while ``now < expires_at`` and free
exactly at ``expires_at``. Every function here is pure: the caller holds its lock, passes in the
current record and the current time, and stores what comes back.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import uuid
from dataclasses import dataclass

from azure_functions_db.core.checkpoint import Checkpoint, PollerKey, decode_checkpoint
from azure_functions_db.core.logs import log_event
from azure_functions_db.core.ports import LeaseGrant, LeaseInfo
from azure_functions_db.core.quarantine import QuarantineRecord
from azure_functions_db.core.quarantine import decode_record as decode_q
from azure_functions_db.errors import (
    CheckpointConflictError,
    CheckpointCorruptError,
    CodecError,
    ConfigurationError,
    LeaseLostError,
    QuarantineConflictError,
    QuarantineCorruptError,
    QuarantineExistsError,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LeaseRecord:
    """The stored state of one poller's lease. ``lease_id is None`` means released (free).

    ``fence`` is the fence of the latest grant and survives release and expiry, so the next
    grant's fence is always higher.
    """

    fence: int = 0
    lease_id: str | None = None
    owner: str | None = None
    expires_at: dt.datetime | None = None

    def is_live(self, now: dt.datetime) -> bool:
        """Whether some grant holds this lease at ``now`` (exactly at expiry it does not)."""
        return self.lease_id is not None and self.expires_at is not None and now < self.expires_at


def new_etag() -> str:
    """A fresh etag: unique per write, so it rotates even when the content does not change."""
    return uuid.uuid4().hex


def check_duration(duration: float) -> None:
    """Reject lease durations that cannot work (zero, negative, infinite, NaN)."""
    if not (isinstance(duration, int | float) and math.isfinite(duration) and duration > 0):
        raise ConfigurationError(
            f"Lease duration `{duration!r}` must be a positive number of seconds "
            "(for example 30; the Azure stores accept 15 to 60)."
        )


def acquire(
    record: LeaseRecord, key: PollerKey, owner: str, duration: float, now: dt.datetime
) -> tuple[LeaseRecord, LeaseGrant] | None:
    """The record and grant after taking a free or expired lease, or ``None`` if it is live."""
    check_duration(duration)
    if record.is_live(now):
        log_event(
            logger,
            logging.DEBUG,
            "lease_busy",
            poller=key.poller,
            namespace=key.namespace,
            fence=record.fence,
            holder=record.owner,
        )
        return None
    fence = record.fence + 1
    lease_id = uuid.uuid4().hex
    new = LeaseRecord(
        fence=fence,
        lease_id=lease_id,
        owner=owner,
        expires_at=now + dt.timedelta(seconds=duration),
    )
    grant = LeaseGrant(key=key, lease_id=lease_id, owner=owner, fence=fence, duration=duration)
    log_event(
        logger,
        logging.DEBUG,
        "lease_acquired",
        poller=key.poller,
        namespace=key.namespace,
        fence=fence,
        owner=owner,
    )
    return new, grant


def renew(record: LeaseRecord, grant: LeaseGrant, now: dt.datetime) -> LeaseRecord:
    """The record after extending ``grant`` by its duration from ``now``.

    Raises :class:`LeaseLostError` when another grant was made since (the fence moved on) or
    ``grant`` was released. An expired lease that nobody took is renewed with its fence.
    """
    key = grant.key
    if record.fence != grant.fence:
        detail = f"another owner acquired it (fence {record.fence} > {grant.fence})"
    elif record.lease_id != grant.lease_id:
        detail = "it was released"
    else:
        return LeaseRecord(
            fence=record.fence,
            lease_id=record.lease_id,
            owner=record.owner,
            expires_at=now + dt.timedelta(seconds=grant.duration),
        )
    log_event(
        logger,
        logging.DEBUG,
        "lease_renew_refused",
        poller=key.poller,
        namespace=key.namespace,
        fence=grant.fence,
        detail=detail,
    )
    raise LeaseLostError(key.poller, key.namespace, grant.fence, detail)


def release(record: LeaseRecord, grant: LeaseGrant) -> LeaseRecord | None:
    """The record after freeing ``grant``, or ``None`` when there is nothing to change.

    Nothing changes when the lease was already released or another grant was made since.
    """
    if record.fence != grant.fence or record.lease_id != grant.lease_id:
        return None
    log_event(
        logger,
        logging.DEBUG,
        "lease_released",
        poller=grant.key.poller,
        namespace=grant.key.namespace,
        fence=grant.fence,
    )
    return LeaseRecord(fence=record.fence)


def info(record: LeaseRecord, key: PollerKey, now: dt.datetime) -> LeaseInfo:
    """What :meth:`inspect` shows of ``record`` at ``now``."""
    if record.is_live(now):
        return LeaseInfo(
            key=key,
            state="held",
            holder=record.owner,
            fence=record.fence,
            expires_at=record.expires_at,
        )
    return LeaseInfo(key=key, state="free", holder=None, fence=record.fence)


def decode_record(key: PollerKey, data: bytes) -> Checkpoint:
    """Decode stored bytes for ``key``; raises :class:`CheckpointCorruptError`, never ``None``.

    A record that decodes but names another poller is corrupt too (a misplaced copy).
    """
    try:
        checkpoint = decode_checkpoint(data)
    except CodecError as exc:
        raise CheckpointCorruptError(key.poller, key.namespace, str(exc)) from exc
    if checkpoint.key != key:
        raise CheckpointCorruptError(
            key.poller,
            key.namespace,
            f"the record belongs to poller `{checkpoint.key}`, not `{key}`",
        )
    return checkpoint


def conflict(
    checkpoint: Checkpoint,
    expected_etag: str,
    found_etag: str | None,
    found_data: bytes | None,
    *,
    reason: str | None = None,
) -> CheckpointConflictError:
    """The error for a rejected ``replace``, with the stored fence when the record decodes."""
    found_fence: int | None = None
    if found_data is not None:
        try:
            found_fence = decode_checkpoint(found_data).fence
        except CodecError:
            reason = reason or "the stored record is corrupt; inspect it with `afdb status`"
    key = checkpoint.key
    log_event(
        logger,
        logging.DEBUG,
        "checkpoint_cas_rejected",
        poller=key.poller,
        namespace=key.namespace,
        fence=checkpoint.fence,
        found_fence=found_fence,
    )
    return CheckpointConflictError(
        key.poller,
        key.namespace,
        expected_etag=expected_etag,
        found_etag=found_etag,
        fence=checkpoint.fence,
        found_fence=found_fence,
        reason=reason,
    )


def decode_quarantined(key: PollerKey, record_id: str, data: bytes) -> QuarantineRecord:
    """Decode a stored quarantine record of ``key``; raises :class:`QuarantineCorruptError`
    when it does not decode or names another poller or id (a misplaced copy)."""
    try:
        record = decode_q(data)
    except (CodecError, ValueError) as exc:
        raise QuarantineCorruptError(key.poller, key.namespace, record_id, str(exc)) from exc
    if record.key != key or record.id != record_id:
        raise QuarantineCorruptError(
            key.poller,
            key.namespace,
            record_id,
            f"the record is `{record.id}` of poller `{record.key}`",
        )
    return record


def quarantine_exists(record: QuarantineRecord) -> QuarantineExistsError:
    return QuarantineExistsError(record.key.poller, record.key.namespace, record.id)


def quarantine_conflict(
    record: QuarantineRecord, etag: str, found: str | None
) -> QuarantineConflictError:
    key = record.key
    return QuarantineConflictError(
        key.poller, key.namespace, record.id, expected_etag=etag, found=found
    )
