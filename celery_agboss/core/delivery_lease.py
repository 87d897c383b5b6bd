"""``DeliveryLease``: what one delivery does with its execution's lease — no Celery.

It keeps the sends started under the lease so that the lease is never released while
one of them may still reach the gateway (design: R18, R23). A wait interrupted while its
send is on the wire (``KeyboardInterrupt``, a shutdown's ``SystemExit``, a soft time
limit, a revoke's signal) ends the delivery's trust in its lease but not the lease: it
is renewed until that send ends or passes ``attempt_timeout``, then left to expire,
never released, and the delivery writes and sends nothing more
(``send_interrupted``). ``ExecutionContext`` adds the body's verbs on top.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from celery_agboss.core import sabotage
from celery_agboss.core.executions import ExecutionRecord
from celery_agboss.core.inflight import BoundedRun
from celery_agboss.core.lease import LeaseHandle, LeaseRenewer, SentAt, acquire
from celery_agboss.core.log_events import LEASE_RELEASE_REFUSED, log_event
from celery_agboss.core.protections import (
    INTERRUPTED_SEND_STOPS_RENEWING,
    RECLAIM_BUMPS_TOKEN,
    RELEASE_WITH_UNSETTLED_ATTEMPT,
    ROLLED_BACK_SETTLE_MOVES_HOLDER_DEADLINE,
)
from celery_agboss.core.store_protocol import (
    FencedTransaction,
    HistoryRow,
    IntentTransition,
    LeaseRef,
    NewIntent,
    OneStatementClaim,
    OneStatementTransition,
    Store,
)
from celery_agboss.errors import ExecutionFencedError

T = TypeVar("T")
D = TypeVar("D", OneStatementClaim, OneStatementTransition, ExecutionRecord)


class DeliveryLease:
    """One delivery's hold on its execution's lease: its sends, its trust, its end."""

    def __init__(
        self,
        store: Store,
        lease: LeaseHandle,
        execution_id: str,
        *,
        renewer: LeaseRenewer | None = None,
    ) -> None:
        self._store = store
        self._lease = lease
        self._execution_id = execution_id
        self._renewer = renewer
        self._lock = threading.Lock()
        self._runs: list[BoundedRun] = []
        self._released = False
        self._ending = False  # left to expire (renewed only until its sends settled)
        self._interrupted: str | None = None

    # --- its state -----------------------------------------------------------------------

    @property
    def lease(self) -> LeaseHandle:
        with self._lock:
            return self._lease

    @property
    def lease_ref(self) -> LeaseRef:
        return self.lease.ref

    @property
    def interrupted(self) -> str | None:
        """Why this delivery stopped trusting its lease after an interrupted send, or None."""
        with self._lock:
            return self._interrupted

    # --- trust in the lease ---------------------------------------------------------------

    def assert_held(self) -> None:
        """Raise ``ExecutionFencedError`` unless this delivery may still trust its lease."""
        self._refuse_if_interrupted()
        self.lease.assert_held()

    def _refuse_if_interrupted(self) -> None:
        reason = self.interrupted
        if reason is not None:
            ref = self.lease_ref
            raise ExecutionFencedError(
                f"lease {ref.scope!r} (token {ref.token}) is no longer trusted by this "
                f"delivery: {reason}",
                scope=ref.scope,
                holder=ref.holder,
                token=ref.token,
            )

    def _trusted(self) -> LeaseHandle:
        """The lease, before a fenced write: refused once it is not trusted or held."""
        self._refuse_if_interrupted()
        lease = self.lease
        lease.assert_held()
        return lease

    @contextmanager
    def fenced(
        self, *, engine_only: bool = False, users_writes: bool = False
    ) -> Iterator[FencedTransaction]:
        """A fenced transaction under this lease; a refusal ends the holder's trust in it.
        ``engine_only``: the engine's own writes, no user code; ``users_writes``: a fenced
        effect's (``Store.fenced``)."""
        lease = self._trusted()
        sent = SentAt.now(lease.clock)
        try:
            with self._store.fenced(
                lease.ref, lease.ttl_ms, engine_only=engine_only, users_writes=users_writes
            ) as tx:
                yield tx
        except ExecutionFencedError:
            lease.mark_lost("a fenced transaction found the lease lost")
            raise
        lease.note_extended_at(sent)

    def claim_in_one(
        self, intent: NewIntent, row: HistoryRow, *, cancel_of: str | None = None
    ) -> OneStatementClaim | None:
        """``Store.claim_in_one`` under this lease, with ``fenced()``'s bookkeeping."""
        return self._in_one(
            lambda lease: self._store.claim_in_one(
                lease.ref, lease.ttl_ms, intent, row, cancel_of=cancel_of
            )
        )

    def transition_in_one(
        self, change: IntentTransition, *, relied_by: str | None = None
    ) -> OneStatementTransition | None:
        """``Store.transition_in_one`` under this lease, with ``fenced()``'s bookkeeping."""
        return self._in_one(
            lambda lease: self._store.transition_in_one(
                lease.ref, lease.ttl_ms, change, relied_by=relied_by
            )
        )

    def ended_in_one(
        self, write: Callable[[LeaseRef, int], ExecutionRecord | None]
    ) -> ExecutionRecord | None:
        """A verdict and the lease's release as one statement (``write``, given the lease
        and its TTL), once ``reserve_release()`` took the release. None: nothing was
        written; use ``fenced()`` with ``release_at_commit()``."""
        return self._in_one(lambda lease: write(lease.ref, lease.ttl_ms))

    def _in_one(self, write: Callable[[LeaseHandle], D | None]) -> D | None:
        """A one-statement fenced write: refused once the lease is not trusted, the lease
        lost when the statement finds it lost, extended when the database kept the
        statement's extension. None: the store has no such statement; use ``fenced()``
        instead."""
        lease = self._trusted()
        sent = SentAt.now(lease.clock)
        try:
            done = write(lease)
        except ExecutionFencedError:
            lease.mark_lost("a fenced transaction found the lease lost")
            raise
        if done is not None and (
            _extension_kept(done) or sabotage.active(ROLLED_BACK_SETTLE_MOVES_HOLDER_DEADLINE)
        ):
            lease.note_extended_at(sent)
        return done

    def assert_can_send(self) -> None:
        self.assert_held()

    # --- the sends under it ------------------------------------------------------------

    def send_started(self, run: BoundedRun) -> None:
        """Register a send about to start, or refuse it once the lease was released.

        Checked under the same lock as ``release()`` and ``send_interrupted()``: a send
        that passed its lease check just before another thread released the lease (or was
        interrupted) must not go out after it (design: R18).
        """
        with self._lock:
            if self._released and not sabotage.active(RELEASE_WITH_UNSETTLED_ATTEMPT):
                raise ExecutionFencedError(
                    "the lease was released before this send started; nothing sent",
                    execution_id=self._execution_id,
                )
            if self._interrupted is not None:
                raise ExecutionFencedError(
                    f"{self._interrupted}; nothing more is sent by this delivery",
                    execution_id=self._execution_id,
                )
            self._runs = [r for r in self._runs if not r.done.is_set()] + [run]

    def send_overran(self, run: BoundedRun) -> None:
        """A send is still running past its bound: stop trusting and renewing the lease.

        It expires on its own; the next holder reconciles. Never released while the send
        runs, so no take-over (and no token bump) happens under a live send (design: R22, R23).
        """
        if sabotage.active(RECLAIM_BUMPS_TOKEN):
            self._reclaim()
            return
        lease = self.lease
        lease.mark_lost("a send overran attempt_timeout; the lease is left to expire")
        if self._renewer is not None:
            self._renewer.untrack(lease)

    def send_interrupted(self, run: BoundedRun) -> None:
        """The wait for ``run`` was interrupted while it may still be sending.

        The send goes on in its thread and may reach the gateway until its bound. Had
        renewals stopped now, the lease could expire under it and a take-over look the
        payment up before it exists, then send it again (design: R18, R23). So: from now on this
        delivery writes and sends nothing (its attempt stays PENDING for a later holder
        to reconcile); its lease is renewed until every send under it ended or passed
        ``attempt_timeout``, then left to expire; it is never released.
        """
        if sabotage.active(INTERRUPTED_SEND_STOPS_RENEWING):
            self.send_overran(run)
            return
        with self._lock:
            if self._interrupted is None:
                self._interrupted = f"the wait for {run.name} was interrupted while it was sending"
            reason = self._interrupted
        self.stop_renewing_when_settled(reason)

    def end_if_open(self, reason: str) -> None:
        """The delivery is over whatever happened (its own end-of-run code raised, say):
        a lease neither released nor already left to expire is left to expire now, once
        no send under it can still be running. Every way out of a delivery ends here."""
        with self._lock:
            concluded = self._released or self._ending
        if not concluded:
            self.stop_renewing_when_settled(reason)

    def stop_renewing_when_settled(self, reason: str) -> None:
        """The delivery ends without releasing: its lease is left to expire, but renewed
        until the sends under it ended or passed their bound (a send past its bound stops
        renewals as an overrun does). Returns at once; a daemon thread does the waiting."""
        with self._lock:
            self._ending = True
        running = self.running_sends()
        if not running or all(time.monotonic() >= run.deadline for run in running):
            self._stop_renewing_after(running, reason)
            return
        threading.Thread(
            target=self._stop_renewing_after,
            args=(running, reason),
            name="agboss-send-watch",
            daemon=True,
        ).start()

    def _stop_renewing_after(self, runs: list[BoundedRun], reason: str) -> None:
        if self._settle(runs):
            lease = self.lease
            lease.mark_lost(reason)
            if self._renewer is not None:
                self._renewer.untrack(lease)

    def _reclaim(self) -> None:
        """Sabotage only (design: R23): release and re-acquire as the same holder, token + 1."""
        old = self.lease
        self._store.release_lease(old.ref)
        fresh = acquire(
            self._store, old.ref.scope, ttl_ms=old.ttl_ms, clock=old.clock, holder=old.ref.holder
        )
        if fresh is None:
            old.mark_lost("reclaim failed")
            return
        with self._lock:
            self._lease = fresh
        if self._renewer is not None:
            self._renewer.untrack(old)
            self._renewer.track(fresh)

    # --- the end of the delivery ---------------------------------------------------------

    def unsettled_sends(self) -> int:
        """Sends of this delivery still running (each may still reach the gateway)."""
        with self._lock:
            return sum(1 for run in self._runs if not run.done.is_set())

    def settle_all(self) -> bool:
        """Wait for running sends, each up to its own ``attempt_timeout`` deadline.

        True when none is left running: the lease may be released. False otherwise,
        and the lease is no longer trusted or renewed: it will expire, and the next
        holder reconciles.
        """
        with self._lock:
            runs = list(self._runs)
        return self._settle(runs)

    def _settle(self, runs: list[BoundedRun]) -> bool:
        """Wait for each of ``runs`` up to its own deadline; one still running then is an
        overrun (``send_overran``). True when none is left running."""
        for run in runs:
            remaining = run.deadline - time.monotonic()
            if remaining > 0:
                run.done.wait(remaining)
        stuck = [run for run in runs if not run.done.is_set()]
        for run in stuck:
            self.send_overran(run)
        return not stuck

    def running_sends(self) -> list[BoundedRun]:
        """This delivery's sends that may still reach the gateway."""
        with self._lock:
            return [run for run in self._runs if not run.done.is_set()]

    def _releasable(self, lease: LeaseHandle) -> tuple[bool, int]:
        """Whether the lease may be released now, and how many sends under it still run;
        call it under the lock. Never while a send under it may still reach the gateway,
        once it was lost, or after an interrupted send (design: release, R18, R23)."""
        running = sum(1 for run in self._runs if not run.done.is_set())
        return running == 0 and lease.lost_reason is None and self._interrupted is None, running

    def release(self, releaser: Callable[[LeaseRef], T] | None = None) -> bool:
        """Release the lease unless a send under it may still be running; True if released.

        ``releaser`` replaces the plain ``store.release_lease`` (the Celery layer releases
        and reads ``wake_requested`` in one transaction); it is called at most once.
        """
        lease = self.lease
        with self._lock:
            # The check and the mark are one step under the lock ``send_started`` takes:
            # no send can register between "none running" and "released".
            if self._released:
                return False
            releasable, running = self._releasable(lease)
            refused = not releasable and not sabotage.active(RELEASE_WITH_UNSETTLED_ATTEMPT)
            if not refused:
                self._released = True
        if refused:
            log_event(
                LEASE_RELEASE_REFUSED,
                logging.WARNING,
                "a send under this lease may still be running",
                execution_id=self._execution_id,
                unsettled=running,
            )
            return False
        if self._renewer is not None:
            self._renewer.untrack(lease)
        if releaser is not None:
            outcome = releaser(lease.ref)
            released = bool(getattr(outcome, "released", outcome))
        else:
            released = self._store.release_lease(lease.ref)
        lease.mark_lost("released")
        return released

    def reserve_release(self) -> bool:
        """Take the release for a fenced transaction that ends the lease
        (``release_at_commit``): True when no send under it can still be running. From
        then on no send starts and the renewer lets the lease go; if that transaction
        fails, the lease is left to expire, never released under a send."""
        lease = self.lease
        with self._lock:
            if self._released or not self._releasable(lease)[0]:
                return False
            self._released = True
        if self._renewer is not None:
            self._renewer.untrack(lease)
        return True

    def released_at_commit(self) -> None:
        """The transaction that took ``reserve_release()`` committed: the lease is gone."""
        self.lease.mark_lost("released")

    def settle_all_and_release(self) -> bool:
        """``settle_all()``, then ``release()`` if it may; True when the lease was released."""
        if not self.settle_all() and not sabotage.active(RELEASE_WITH_UNSETTLED_ATTEMPT):
            return False
        return self.release()


def _extension_kept(done: OneStatementClaim | OneStatementTransition | ExecutionRecord) -> bool:
    """Whether a one-statement write's lease extension was committed, so the holder may
    count from it (design: holder deadline). A claim or transition reports the new expiry
    only when its fence row came back from a statement that committed; one that failed
    whole (its history row's ``(key, seq)`` taken meanwhile) reports none: its extension
    rolled back with it. A verdict's record comes back only from a statement that wrote."""
    if isinstance(done, (OneStatementClaim, OneStatementTransition)):
        return done.expires_at_ms is not None
    return True


__all__ = ["DeliveryLease"]
