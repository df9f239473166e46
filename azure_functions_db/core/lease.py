"""Keeping a lease alive while a run works: the heartbeat and the lease-lost mark."""

from __future__ import annotations

import logging
import threading

from azure_functions_db.core.clock import Clock
from azure_functions_db.core.logs import log_event
from azure_functions_db.core.ports import LeaseGrant, LeaseManager
from azure_functions_db.errors import AfdbError, LeaseLostError

logger = logging.getLogger(__name__)

#: Renewals per lease duration: every 12 s on the default 30 s lease (an idle low-latency minute
#: then costs 5 renewals, no more than one timer run's requests). The lease counts as lost a
#: full duration after the last renewal; a renewal that failed is tried again halfway to then.
HEARTBEATS_PER_LEASE = 2.5


class LeaseKeeper:
    """Renews a lease in a background thread (every duration/2.5) and knows when it is lost.

    The lease counts as lost when a renewal is refused, or when the last successful renewal was
    sent a full lease duration ago (the store may already have expired it). The second rule
    uses only this process's own monotonic clock, so it holds even if the process was frozen
    and the heartbeat thread never ran; no two machines' clocks are ever compared.
    """

    def __init__(
        self,
        leases: LeaseManager,
        grant: LeaseGrant,
        clock: Clock,
        *,
        interval: float | None = None,
        acquired_at: float,
    ) -> None:
        self._leases = leases
        self.grant = grant
        self._clock = clock
        self._interval = interval if interval is not None else grant.duration / HEARTBEATS_PER_LEASE
        self._renewed_at = acquired_at
        self._lost_reason: str | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the heartbeat thread (a daemon: a dying process does not wait for it)."""
        self._thread = threading.Thread(
            target=self._beat, name=f"afdb-heartbeat-{self.grant.key}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop the heartbeat and wait for it (at most one renewal in flight)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _beat(self) -> None:
        # Beats are timed from when each renewal was sent (a renewal that took long, its store's
        # own retries included, does not push the next one back; never sooner than a quarter
        # interval apart). After one that failed, the next goes halfway to the lease's end.
        wait = self._interval
        while not self._stop.wait(wait):
            if self.lost_reason() is not None:
                return
            sent = self._clock.monotonic()
            renewed = self.renew_now()
            late = self._clock.monotonic() - sent
            wait = max(self._interval / 4, self._interval - late)
            if not renewed:
                with self._lock:
                    left = self.grant.duration - (self._clock.monotonic() - self._renewed_at)
                wait = min(wait, max(0.5, left / 2))

    def renew_now(self) -> bool:
        """Renew once; on refusal mark the lease lost. Transient failures only log. Whether
        the lease was renewed."""
        sent_at = self._clock.monotonic()
        try:
            self._leases.renew(self.grant)
        except LeaseLostError as exc:
            self.mark_lost(exc.detail or "renewal refused")
            return False
        except AfdbError as exc:
            log_event(
                logger,
                logging.WARNING,
                "lease_renew_failed",
                poller=self.grant.key.poller,
                namespace=self.grant.key.namespace,
                fence=self.grant.fence,
                error=type(exc).__name__,
            )
            return False
        with self._lock:
            self._renewed_at = max(self._renewed_at, sent_at)
        return True

    def mark_lost(self, reason: str) -> None:
        """Record that the lease is lost (the first reason wins) and log it once."""
        with self._lock:
            if self._lost_reason is not None:
                return
            self._lost_reason = reason
        log_event(
            logger,
            logging.WARNING,
            "lease_lost",
            poller=self.grant.key.poller,
            namespace=self.grant.key.namespace,
            fence=self.grant.fence,
            reason=reason,
        )

    def lost_reason(self) -> str | None:
        """Why the lease is lost, or ``None`` while it is still safely held."""
        with self._lock:
            reason = self._lost_reason
            age = self._clock.monotonic() - self._renewed_at
        if reason is None and age >= self.grant.duration:
            self.mark_lost(f"not renewed for {age:.1f}s (lease {self.grant.duration:g}s)")
            with self._lock:
                reason = self._lost_reason
        return reason

    def ensure_held(self) -> None:
        """Raise :class:`LeaseLostError` if the lease is lost."""
        reason = self.lost_reason()
        if reason is not None:
            key = self.grant.key
            raise LeaseLostError(key.poller, key.namespace, self.grant.fence, reason)
