"""``ExecutionContext``: one delivery of one execution, as the engine sees it — no Celery.

It owns the delivery's lease handle, counts the calls of each name for step keys,
remembers how the last outbound call got its result, and keeps the sends it started
so that the lease is never released while one of them may still reach the gateway
(R18, R23). A wait interrupted while its send is on the wire (``KeyboardInterrupt``, a
shutdown's ``SystemExit``, a soft time limit, a revoke's signal) ends the delivery's
trust in its lease but not the lease: it is renewed until that send ends or passes
``attempt_timeout``, then left to expire, never released, and the delivery writes
and sends nothing more (``send_interrupted``). The Celery layer makes one per
delivery (``PaymentTask``); tests and other frameworks can drive it directly::

    with ExecutionContext.start(store, task_id, settings) as ctx:
        receipt = ctx.outbound(charge, {"amount": 1000}, business_key="order:42")
        ctx.fenced_effect("mark-paid", lambda conn: mark_paid(conn, 42))
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Any, TypeVar

from celery_agboss.core import sabotage
from celery_agboss.core.engine_settings import EngineSettings
from celery_agboss.core.executions import execution_scope
from celery_agboss.core.fenced_effects import run_fenced_effect
from celery_agboss.core.holder_clocks import SYSTEM_CLOCK, HolderClock
from celery_agboss.core.inflight import BoundedRun
from celery_agboss.core.lease import LeaseHandle, LeaseRenewer, SentAt, acquire
from celery_agboss.core.log_events import (
    LEASE_RELEASE_FAILED,
    LEASE_RELEASE_REFUSED,
    OUTBOUND_CALL_POSITION_KEYS,
    log_event,
)
from celery_agboss.core.outbound import OutboundCall, Outcome
from celery_agboss.core.protections import (
    CANCEL_NOT_CHECKED_MID_BODY,
    CAUGHT_SIGNAL_DOES_NOT_STOP_DELIVERY,
    INTERRUPTED_SEND_STOPS_RENEWING,
    RECLAIM_BUMPS_TOKEN,
    RELEASE_WITH_UNSETTLED_ATTEMPT,
    STORE_FAILURE_CATCHABLE,
    STORED_ERROR_UNMASKED,
)
from celery_agboss.core.state_machine import prepare_call, run_outbound
from celery_agboss.core.store import (
    FencedTransaction,
    IntentGuard,
    IntentStatus,
    IntentUpdate,
    LeaseRef,
    Store,
)
from celery_agboss.core.transitions import NOT_STORED_TEXT, masked_text, policy_of
from celery_agboss.errors import (
    AGBossSignal,
    CancelRequestedError,
    ConfigurationError,
    ExecutionFencedError,
    LeaseNotHeldError,
    StoreError,
)

T = TypeVar("T")


_warned_position_keys: set[str] = set()


def _warn_position_keys(call_name: str) -> None:
    """Once per call name and process: a call made twice in one delivery without a business
    key is keyed by position (``name#1``, ``name#2``), which is only as stable as the
    body's loop; a loop whose length can change between deliveries (over "the
    installments not paid yet") would charge one installment twice and another never."""
    if call_name in _warned_position_keys:
        return
    _warned_position_keys.add(call_name)
    log_event(
        OUTBOUND_CALL_POSITION_KEYS,
        logging.WARNING,
        "called more than once in one delivery without a business key; its calls are keyed "
        "by position (#1, #2, …). If the body's loop can change between deliveries, give "
        "each call a business_key of its own (e.g. f'installment:{installment.id}')",
        call=call_name,
    )


class ExecutionContext:
    """One delivery's view of an execution: its lease, its calls, its effects."""

    def __init__(
        self,
        store: Store,
        lease: LeaseHandle,
        execution_id: str,
        settings: EngineSettings,
        *,
        renewer: LeaseRenewer | None = None,
        cancel_probe: Callable[[FencedTransaction], str | None] | None = None,
    ) -> None:
        self._store = store
        self._lease = lease
        self._execution_id = execution_id
        self._settings = settings
        self._renewer = renewer
        self._cancel_probe = cancel_probe
        self._lock = threading.Lock()
        self._occurrences: dict[tuple[str, str], int] = {}
        self._calls: dict[str, OutboundCall] = {}
        self._reached: set[str] = set()  # intents this delivery's body called
        self._failures: dict[str, int] = {}  # definite failures raised to the body: attempt
        self._in_effect = threading.local()  # depth of fenced effects running, per thread
        self._last_outcome: Outcome | None = None
        self._runs: list[BoundedRun] = []
        self._released = False
        self._ending = False  # left to expire (renewed only until its sends settled)
        self._stopped_by: AGBossSignal | None = None
        self._interrupted: str | None = None

    @classmethod
    def start(
        cls,
        store: Store,
        execution_id: str,
        settings: EngineSettings,
        *,
        clock: HolderClock = SYSTEM_CLOCK,
        renewer: LeaseRenewer | None = None,
    ) -> ExecutionContext:
        """Acquire the execution's lease for a new holder; ``LeaseNotHeldError`` when a live
        lease is held elsewhere (even by an earlier delivery of this process)."""
        handle = acquire(
            store, execution_scope(execution_id), ttl_ms=settings.lease_ttl_ms, clock=clock
        )
        if handle is None:
            raise LeaseNotHeldError(
                "a live lease on this execution is held by another delivery",
                execution_id=execution_id,
            )
        if renewer is not None:
            renewer.track(handle)
        return cls(store, handle, execution_id, settings, renewer=renewer)

    # --- what it is --------------------------------------------------------------------

    @property
    def store(self) -> Store:
        return self._store

    @property
    def settings(self) -> EngineSettings:
        return self._settings

    @property
    def execution_id(self) -> str:
        return self._execution_id

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

    @property
    def last_outcome(self) -> Outcome | None:
        """How the last outbound call of this delivery got its result (None if it raised)."""
        with self._lock:
            return self._last_outcome

    # --- the body's verbs ----------------------------------------------------------------

    def outbound(self, call: OutboundCall, request: Any, business_key: str | None = None) -> Any:
        """Send ``request`` through ``call`` exactly once (DESIGN §4); the gateway's result."""
        # First, as a PaymentTask's outbound() always did: a second call object under a
        # taken name is refused before this delivery counts anything.
        self._settings.register(call)
        self._refuse_after_signal()
        self._refuse_inside_an_effect("outbound()")
        occurrence = 1 if business_key is not None else self._next("call", call.name)
        with self._lock:
            self._last_outcome = None
            self._calls.setdefault(call.name, call)
        prepared = prepare_call(
            self._settings, self._execution_id, call, request, business_key, occurrence
        )
        with self._lock:
            self._reached.add(prepared.idempotency_key)
        self.pass_failures()  # this call goes on past the failures before it
        if occurrence == 2:
            _warn_position_keys(call.name)
        with self._stop_on_signal():
            result, outcome = run_outbound(self, prepared)
        with self._lock:
            self._last_outcome = outcome
        return result

    def fenced_effect(
        self,
        name: str,
        fn: Callable[[Any], T],
        business_key: str | None = None,
        request: Any = None,
    ) -> T:
        """Run ``fn(conn)`` once per key, inside the transaction that checks the lease."""
        self._refuse_after_signal()
        self._refuse_inside_an_effect("fenced_effect()")
        occurrence = 1 if business_key is not None else self._next("effect", name)
        self._in_effect.depth = getattr(self._in_effect, "depth", 0) + 1
        try:
            with self._stop_on_signal():
                result: T = run_fenced_effect(
                    self,
                    name,
                    fn,
                    business_key_text=business_key,
                    request=request,
                    occurrence=occurrence,
                )
        finally:
            self._in_effect.depth -= 1
        return result

    def _refuse_inside_an_effect(self, verb: str) -> None:
        """A fenced effect's ``fn`` runs inside the store's transaction: a call to the
        gateway there would hold the transaction (and on SQLite the write lock) open
        across the send, and the effect's record commits only after it."""
        if getattr(self._in_effect, "depth", 0):
            raise ConfigurationError(
                f"{verb} inside a fenced effect's fn is refused: fn runs inside the store's "
                "transaction, which must never stay open across a gateway call or another "
                "transaction. Call it before or after the fenced effect, in the body",
                execution_id=self._execution_id,
            )

    def mask_error_text(self, text: str) -> str:
        """An error text of this delivery as the store may keep it (the execution's stored
        failure): through the error masking of every call this delivery made, in turn — a
        decline quoting a card number is masked by the policy of the call that got it. A
        policy that fails stores a marker instead (fail closed)."""
        if sabotage.active(STORED_ERROR_UNMASKED):
            return text
        with self._lock:
            calls = [c for c in self._calls.values() if policy_of(c).masks_errors]
        masked = text
        for call in calls:
            masked = masked_text(call, masked)
            if masked == NOT_STORED_TEXT:
                break
        return masked

    def _refuse_after_signal(self) -> None:
        """A signal means "this delivery must stop". A body that caught one and went on
        would get new step keys for the same calls (``#2``): a second charge. So every
        later verb raises the same signal again."""
        stopped = self._stopped_by
        if stopped is not None and not sabotage.active(CAUGHT_SIGNAL_DOES_NOT_STOP_DELIVERY):
            raise type(stopped)(
                f"this delivery already stopped on {type(stopped).__name__}; a body must let "
                "celery_agboss signals propagate instead of calling on",
                **stopped.fields,
            )

    @contextmanager
    def _stop_on_signal(self) -> Iterator[None]:
        try:
            yield
        except AGBossSignal as signal:
            if isinstance(signal, StoreError) and sabotage.active(STORE_FAILURE_CATCHABLE):
                raise RuntimeError(f"sabotage: the store failed ({signal})") from signal
            with self._lock:
                if self._stopped_by is None:
                    self._stopped_by = signal
            raise

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

    def _next(self, kind: str, name: str) -> int:
        with self._lock:
            n = self._occurrences.get((kind, name), 0) + 1
            self._occurrences[(kind, name)] = n
            return n

    # --- what the engine calls back (engine.Holder) --------------------------------------

    @contextmanager
    def fenced(self) -> Iterator[FencedTransaction]:
        """A fenced transaction under this lease; a refusal ends the holder's trust in it."""
        self._refuse_if_interrupted()
        lease = self.lease
        lease.assert_held()
        sent = SentAt.now(lease.clock)
        try:
            with self._store.fenced(lease.ref, lease.ttl_ms) as tx:
                yield tx
        except ExecutionFencedError:
            lease.mark_lost("a fenced transaction found the lease lost")
            raise
        lease.note_extended_at(sent)

    def assert_can_send(self) -> None:
        self.assert_held()

    def next_publish(self, task_name: str) -> int:
        """The position of this publish of ``task_name`` from the body (1, 2, …): what a
        stable id of the published task is derived from."""
        return self._next("publish", task_name)

    def reached_keys(self) -> frozenset[str]:
        """The idempotency keys of every outbound call this delivery's body made: an intent
        an earlier delivery created that is not among them is a divergence (DESIGN §4)."""
        with self._lock:
            return frozenset(self._reached)

    def failure_raised(self, idempotency_key: str, attempt: int) -> None:
        with self._lock:
            self._failures[idempotency_key] = attempt

    def pass_failures(self) -> None:
        """The body went on past the definite failures raised to it (it made another
        outbound call, or paused): they are not what ends this delivery, so a retry it
        asks for later does not authorise sending them again."""
        with self._lock:
            self._failures.clear()

    def authorise_retries(self, tx: FencedTransaction) -> None:
        """In the verdict of a retry the body asked for (``self.retry()``,
        ``autoretry_for``): the definite failures that ended this delivery may be sent
        again by this execution's next delivery — each only if this execution's attempt
        failed and the failure was never handed to another execution (that hand-out
        revoked it for good, DESIGN §4 claim step 1)."""
        with self._lock:
            failures = dict(self._failures)
        for key, attempt in failures.items():
            tx.update_intent(
                key,
                IntentGuard(
                    IntentStatus.FAILED,
                    attempt,
                    None,
                    any_owner=True,
                    sent_by=self._execution_id,
                    failure_shared=False,
                ),
                IntentUpdate(retry_for=self._execution_id),
            )

    def check_cancel(self, tx: FencedTransaction) -> None:
        """``CancelRequestedError`` when a cancel of this execution was recorded: read in
        ``tx``, the transaction that would authorise the next send or write (DESIGN §2.2).
        ``cancel_probe`` (given by the layer that records executions) reads it; without
        one (an execution run without that layer) nothing can request a cancel."""
        if self._cancel_probe is None or sabotage.active(CANCEL_NOT_CHECKED_MID_BODY):
            return
        reason = self._cancel_probe(tx)
        if reason is not None:
            raise CancelRequestedError(
                f"a cancel was requested ({reason}); this delivery sends and writes nothing more",
                execution_id=self._execution_id,
                reason=reason,
            )

    def send_started(self, run: BoundedRun) -> None:
        """Register a send about to start, or refuse it once the lease was released.

        Checked under the same lock as ``release()`` and ``send_interrupted()``: a send
        that passed its lease check just before another thread released the lease (or was
        interrupted) must not go out after it (R18).
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
        runs, so no take-over (and no token bump) happens under a live send (R22, R23).
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
        payment up before it exists, then send it again (R18, R23). So: from now on this
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
        for run in runs:
            remaining = run.deadline - time.monotonic()
            if remaining > 0:
                run.done.wait(remaining)
        stuck = [run for run in runs if not run.done.is_set()]
        for run in stuck:
            self.send_overran(run)
        if not stuck:
            lease = self.lease
            lease.mark_lost(reason)
            if self._renewer is not None:
                self._renewer.untrack(lease)

    def _reclaim(self) -> None:
        """Sabotage only (R23): release and re-acquire as the same holder, token + 1."""
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
        for run in runs:
            remaining = run.deadline - time.monotonic()
            if remaining > 0:
                run.done.wait(remaining)
        stuck = [run for run in runs if not run.done.is_set()]
        if stuck:
            for run in stuck:
                self.send_overran(run)
            return False
        return True

    def running_sends(self) -> list[BoundedRun]:
        """This delivery's sends that may still reach the gateway."""
        with self._lock:
            return [run for run in self._runs if not run.done.is_set()]

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
            running = sum(1 for run in self._runs if not run.done.is_set())
            unsafe = running > 0 or lease.lost_reason is not None or self._interrupted is not None
            refused = unsafe and not sabotage.active(RELEASE_WITH_UNSETTLED_ATTEMPT)
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
            if self._released:
                return False
            running = any(not run.done.is_set() for run in self._runs)
            if running or lease.lost_reason is not None or self._interrupted is not None:
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

    def __enter__(self) -> ExecutionContext:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if isinstance(exc, ExecutionFencedError) or self.interrupted is not None:
            return  # superseded, or interrupted mid-send (renewals stop once it settled)
        if isinstance(exc, (KeyboardInterrupt, SystemExit)) and self.unsettled_sends():
            # Stopping now: never wait, never release under a send.
            self.stop_renewing_when_settled("the delivery stopped while a send was running")
            return
        try:
            self.settle_all_and_release()
        except (Exception, StoreError):
            log_event(
                LEASE_RELEASE_FAILED,
                logging.ERROR,
                exc_info=True,
                execution_id=self._execution_id,
            )

    def __repr__(self) -> str:
        return f"ExecutionContext({self._execution_id!r}, {self.lease!r})"


__all__ = ["ExecutionContext"]
