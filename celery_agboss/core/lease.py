"""The holder's side of a lease: how long this delivery may still trust it, and renewals.

The store decides who holds a lease, on the database clock. The holder cannot ask
the database before every action, so it keeps its own deadline: the TTL counted
from when the last acquire, renewal or fenced extension was *sent* (not answered:
the database may have applied it at any point after sending), on both its
monotonic and its wall clock, minus a margin. Whichever clock passes first ends
the trust — a stepped wall clock or a frozen process cannot make the holder act on
a lease the database already gave away (design: PS13). A renewal that finds the lease lost
ends it for good.
"""

from __future__ import annotations

import logging
import os
import threading
import uuid
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

from celery_agboss.core import sabotage
from celery_agboss.core.fault_points import RENEWER_BEFORE_RENEW, fault_point
from celery_agboss.core.holder_clocks import SYSTEM_CLOCK, HolderClock
from celery_agboss.core.log_events import (
    LEASE_RENEWAL_FAILED,
    LEASE_RENEWER_ROUND_FAILED,
    log_event,
)
from celery_agboss.core.protections import HOLDER_TRUSTS_LEASE_FOREVER
from celery_agboss.core.store_protocol import LeaseGrant, LeaseRef, RenewOutcome, Store
from celery_agboss.errors import ExecutionFencedError, StoreError

SAFETY_MARGIN_SECONDS = 1.0
"""Subtracted from every deadline: the holder stops trusting its lease this much before
its own clocks say the TTL has run out (clock rate differences, scheduling delays)."""


@dataclass(frozen=True)
class SentAt:
    """When a request that extends the lease was sent, on the holder's two clocks."""

    monotonic: float
    wall: float

    @classmethod
    def now(cls, clock: HolderClock) -> SentAt:
        return cls(clock.monotonic(), clock.wall())


class LeaseHandle:
    """One delivery's lease, as its holder sees it. Thread-safe."""

    def __init__(
        self,
        ref: LeaseRef,
        ttl_ms: int,
        sent: SentAt,
        *,
        clock: HolderClock = SYSTEM_CLOCK,
        grant: LeaseGrant | None = None,
    ) -> None:
        if ttl_ms <= 0:
            raise ValueError(f"ttl_ms must be positive, not {ttl_ms}")
        self.ref = ref
        self.ttl_ms = ttl_ms
        self.clock = clock
        self.margin_seconds = SAFETY_MARGIN_SECONDS
        self.grant = grant
        self._lock = threading.Lock()
        self._sent = sent
        self._lost_reason: str | None = None

    # --- what the holder knows -----------------------------------------------------

    @property
    def took_over(self) -> bool:
        """The acquire took over an expired or released lease (counts toward the cap)."""
        return self.grant is not None and self.grant.took_over

    @property
    def lost_reason(self) -> str | None:
        with self._lock:
            return self._lost_reason

    def seconds_left(self) -> float:
        """Seconds until the earlier of the two deadlines (negative once passed)."""
        with self._lock:
            sent = self._sent
        trust = self.ttl_ms / 1000 - self.margin_seconds
        return min(
            sent.monotonic + trust - self.clock.monotonic(),
            sent.wall + trust - self.clock.wall(),
        )

    def is_trusted(self) -> bool:
        """True while neither clock has passed the deadline and no renewal found it lost."""
        if sabotage.active(HOLDER_TRUSTS_LEASE_FOREVER):
            return True
        if self.lost_reason is not None:
            return False
        return self.seconds_left() > 0

    def assert_held(self) -> None:
        """Raise ``ExecutionFencedError`` unless the lease can still be trusted.

        Called immediately before every send and write of this holder.
        """
        if self.is_trusted():
            return
        reason = self.lost_reason or "the lease's deadline passed on the holder's clocks"
        raise ExecutionFencedError(
            f"lease {self.ref.scope!r} (token {self.ref.token}) can no longer be trusted: {reason}",
            scope=self.ref.scope,
            holder=self.ref.holder,
            token=self.ref.token,
        )

    # --- what changes it ---------------------------------------------------------------

    def note_extended(self, sent_mono: float, sent_wall: float) -> None:
        """A renewal or fenced extension sent at these times was applied: move the deadline.

        Never moves it back (an older extension answered late changes nothing), and
        never revives a lease that was found lost.
        """
        with self._lock:
            if self._lost_reason is not None:
                return
            self._sent = SentAt(
                max(self._sent.monotonic, sent_mono), max(self._sent.wall, sent_wall)
            )

    def note_extended_at(self, sent: SentAt) -> None:
        self.note_extended(sent.monotonic, sent.wall)

    def mark_lost(self, reason: str = "a renewal found the lease lost") -> None:
        """The lease is gone (expired, taken over, released): every later write refuses."""
        with self._lock:
            if self._lost_reason is None:
                self._lost_reason = reason

    def __repr__(self) -> str:
        state = "lost" if self.lost_reason else f"{self.seconds_left():.1f}s left"
        return f"LeaseHandle({self.ref.scope!r}, token={self.ref.token}, {state})"


def new_holder() -> str:
    """A holder id: minted per delivery, never reused (design: trap 2)."""
    return str(uuid.uuid4())


def acquire(
    store: Store,
    scope: str,
    *,
    ttl_ms: int,
    clock: HolderClock = SYSTEM_CLOCK,
    holder: str | None = None,
) -> LeaseHandle | None:
    """Acquire ``scope`` for a new holder; None when a live lease is held (by anyone)."""
    sent = SentAt.now(clock)
    grant = store.acquire_lease(scope, holder or new_holder(), ttl_ms)
    if grant is None:
        return None
    return LeaseHandle(grant.lease, ttl_ms, sent, clock=clock, grant=grant)


def handle_for_grant(grant: LeaseGrant, ttl_ms: int, sent: SentAt) -> LeaseHandle:
    """The handle for a lease acquired inside a larger transaction (e.g. with RUNNING)."""
    return LeaseHandle(grant.lease, ttl_ms, sent, grant=grant)


# --- background renewal ------------------------------------------------------------------


class LeaseRenewer:
    """Renews every tracked lease of this process every TTL/3, in one statement per round.

    One daemon thread per renewer; use ``LeaseRenewer.for_store(store)`` for the one
    shared renewer of a store in this process. A forked child never inherits the
    parent's handles or thread: it starts empty, with its own thread.
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        self._clock = SYSTEM_CLOCK
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._handles: dict[LeaseRef, LeaseHandle] = {}
        self._due: dict[LeaseRef, float] = {}
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._pid = os.getpid()
        _live_renewers.add(self)

    # --- the one renewer per store per process -------------------------------------------

    @classmethod
    def for_store(cls, store: Store) -> LeaseRenewer:
        with _registry_lock:
            _forget_if_forked()
            renewer = _registry.get(id(store))
            if renewer is None or renewer.store is not store or renewer._stopping:
                renewer = cls(store)
                _registry[id(store)] = renewer
            return renewer

    # --- tracking -------------------------------------------------------------------------

    def track(self, handle: LeaseHandle) -> None:
        """Renew ``handle`` from now on (first renewal TTL/3 after its last extension)."""
        with self._lock:
            self._reset_if_forked()
            if self._stopping:
                raise RuntimeError("this LeaseRenewer was stopped")
            self._handles[handle.ref] = handle
            self._due[handle.ref] = self._clock.monotonic() + handle.ttl_ms / 3000
            self._ensure_thread()
            self._wake.notify_all()

    def untrack(self, handle: LeaseHandle) -> None:
        """Stop renewing ``handle`` (before releasing it, or when a send overran)."""
        with self._lock:
            self._handles.pop(handle.ref, None)
            self._due.pop(handle.ref, None)

    def tracked(self) -> list[LeaseHandle]:
        with self._lock:
            return list(self._handles.values())

    def stop(self, timeout: float | None = 5.0) -> None:
        """Stop the thread; tracked leases are no longer renewed (they will expire)."""
        with self._lock:
            self._stopping = True
            self._wake.notify_all()
            thread = self._thread
        with _registry_lock:
            # A stopped renewer is never handed out again: keeping it would keep its
            # closed store (engine, compiled statements) alive for the process's life.
            if _registry.get(id(self.store)) is self:
                del _registry[id(self.store)]
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    # --- renewing ---------------------------------------------------------------------------

    def renew_now(
        self, handles: Sequence[LeaseHandle] | None = None
    ) -> dict[LeaseRef, RenewOutcome]:
        """One renewal round, synchronously (tests; the thread calls it when leases are due).

        A store error leaves every deadline where it was: renewing stops counting, and
        the holder stops trusting its lease when its own deadline passes.
        """
        if handles is None:
            handles = self.tracked()
        by_ttl: dict[int, list[LeaseHandle]] = {}
        for handle in handles:
            if handle.lost_reason is None:
                by_ttl.setdefault(handle.ttl_ms, []).append(handle)
        outcomes: dict[LeaseRef, RenewOutcome] = {}
        for ttl_ms, group in by_ttl.items():
            refs = [handle.ref for handle in group]
            sent = {handle.ref: SentAt.now(handle.clock) for handle in group}
            fault_point(RENEWER_BEFORE_RENEW, holders=[ref.holder for ref in refs])
            try:
                result = self.store.renew_leases(refs, ttl_ms)
            except StoreError as exc:
                log_event(LEASE_RENEWAL_FAILED, logging.WARNING, leases=len(refs), error=str(exc))
                continue
            for handle in group:
                outcome = result.get(handle.ref, RenewOutcome.LOST)
                outcomes[handle.ref] = outcome
                if outcome is RenewOutcome.RENEWED:
                    handle.note_extended_at(sent[handle.ref])
                elif outcome is RenewOutcome.LOST:
                    handle.mark_lost("a renewal found the lease expired, released or taken over")
                    self.untrack(handle)
        return outcomes

    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(
                target=self._run, name="agboss-lease-renewer", daemon=True
            )
            self._thread.start()

    def _reset_if_forked(self) -> None:
        if self._pid != os.getpid():
            self._pid = os.getpid()
            self._handles.clear()
            self._due.clear()
            self._thread = None
            self._stopping = False

    def _run(self) -> None:
        while True:
            with self._lock:
                if self._stopping or self._pid != os.getpid():
                    return
                now = self._clock.monotonic()
                if not self._due:
                    self._wake.wait(timeout=5.0)
                    continue
                earliest = min(self._due.values())
                if earliest > now:
                    self._wake.wait(timeout=min(earliest - now, 5.0))
                    continue
                # Every round renews every tracked lease: one statement per TTL, and no
                # lease waits for its own turn while another is due.
                due = list(self._handles.values())
                for handle in due:
                    self._due[handle.ref] = now + handle.ttl_ms / 3000
            outcomes: dict[LeaseRef, RenewOutcome] = {}
            try:
                outcomes = self.renew_now(due)
            except (Exception, StoreError):  # the renewer must outlive any one bad round
                log_event(LEASE_RENEWER_ROUND_FAILED, logging.ERROR, exc_info=True)
            self._retry_soon(due, outcomes, now)

    def _retry_soon(
        self, handles: list[LeaseHandle], outcomes: dict[LeaseRef, RenewOutcome], sent: float
    ) -> None:
        """A BUSY lease (its fenced transaction will extend it, but only if it commits) or a
        failed round is tried again after TTL/12 instead of TTL/3: the extension it waits
        for may be the last one before the lease would run out."""
        with self._lock:
            for handle in handles:
                outcome = outcomes.get(handle.ref)
                if outcome is RenewOutcome.RENEWED or handle.ref not in self._due:
                    continue
                soon = sent + handle.ttl_ms / 12000
                self._due[handle.ref] = min(self._due[handle.ref], soon)


_registry: dict[int, LeaseRenewer] = {}
_registry_lock = threading.Lock()
_registry_pid = os.getpid()
_live_renewers: weakref.WeakSet[LeaseRenewer] = weakref.WeakSet()


def _forget_if_forked() -> None:
    global _registry_pid
    if _registry_pid != os.getpid():
        _registry_pid = os.getpid()
        _registry.clear()


def _after_fork_in_child() -> None:
    """A child process renews nothing of its parent's: empty every renewer."""
    global _registry_lock
    _registry_lock = threading.Lock()
    _forget_if_forked()
    for renewer in list(_live_renewers):
        renewer._lock = threading.Lock()
        renewer._wake = threading.Condition(renewer._lock)
        renewer._reset_if_forked()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
