"""``ExecutionContext``: one delivery of one execution, as the engine sees it — no Celery.

It is the one home of a step's identity: it counts the calls and effects of each name
and makes each step's key (``step_identity``), which the intent, the effect's record,
the outbox and the undo declarations all read. It remembers how the last outbound call
got its result, and holds the lease through ``DeliveryLease`` (the sends under it and
the lease's end). The Celery layer makes one per delivery (``PaymentTask``); tests and
other frameworks can drive it directly::

    with ExecutionContext.start(store, task_id, settings) as ctx:
        receipt = ctx.outbound(charge, {"amount": 1000}, business_key="order:42")
        ctx.fenced_effect("mark-paid", lambda conn: mark_paid(conn, 42))
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Any, TypeVar

from celery_agboss.core import sabotage
from celery_agboss.core.delivery_lease import DeliveryLease
from celery_agboss.core.engine_settings import EngineSettings
from celery_agboss.core.executions import execution_scope
from celery_agboss.core.fenced_effects import run_fenced_effect
from celery_agboss.core.holder_clocks import SYSTEM_CLOCK, HolderClock
from celery_agboss.core.lease import LeaseHandle, LeaseRenewer, acquire
from celery_agboss.core.log_events import LEASE_RELEASE_FAILED, log_event
from celery_agboss.core.outbound import OutboundCall, Outcome
from celery_agboss.core.protections import (
    BODY_CALLS_AFTER_COMPENSATION_START,
    CALLS_OF_ONE_KEY_CONCURRENT,
    CANCEL_NOT_CHECKED_MID_BODY,
    CAUGHT_SIGNAL_DOES_NOT_STOP_DELIVERY,
    STORE_FAILURE_CATCHABLE,
    STORED_ERROR_UNMASKED,
)
from celery_agboss.core.state_machine import prepare_call, run_outbound
from celery_agboss.core.step_identity import Step, step_of, warn_position_keys
from celery_agboss.core.store_protocol import (
    EFFECT_RECORD,
    INTENT_RECORD,
    FencedTransaction,
    HistoryRow,
    IntentGuard,
    IntentStatus,
    IntentUpdate,
    NewIntent,
    OneStatementClaim,
    Store,
)
from celery_agboss.core.tracing import traced_effect, traced_outbound
from celery_agboss.core.transitions import (
    fields_masked_by_calls,
    mark_failed,
    masked_by_calls,
)
from celery_agboss.errors import (
    AGBossSignal,
    CancelRequestedError,
    ConfigurationError,
    ExecutionFencedError,
    LeaseNotHeldError,
    PauseRequested,
    StoreError,
)

T = TypeVar("T")
Stop = TypeVar("Stop", AGBossSignal, PauseRequested)


class ExecutionContext(DeliveryLease):
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
        super().__init__(store, lease, execution_id, renewer=renewer)
        self._settings = settings
        self._cancel_probe = cancel_probe
        self._occurrences: dict[tuple[str, str], int] = {}
        self._calls: dict[str, OutboundCall] = {}
        self._reached: set[str] = set()  # intents this delivery's body called
        self._failures: dict[str, int] = {}  # definite failures raised to the body: attempt
        self._in_effect = threading.local()  # depth of fenced effects running, per thread
        self._last_outcome: Outcome | None = None
        self._last_step: Step | None = None  # the step of the body that returned last
        self._stopped_by: AGBossSignal | PauseRequested | None = None
        self._body_ended = False  # its compensation started: the body sends nothing more
        self._key_locks: dict[str, threading.Lock] = {}  # one call of a key at a time

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
    def last_step(self) -> Step | None:
        """The outbound call or fenced effect of this delivery that returned last: the step
        an undo declared now belongs to (``core.compensation.declare_undo``)."""
        with self._lock:
            return self._last_step

    @property
    def running_effect(self) -> Step | None:
        """The fenced effect whose ``fn`` runs on this thread, or None: what the outbox
        derives the ids of the rows ``fn`` writes from."""
        step: Step | None = getattr(self._in_effect, "step", None)
        return step

    @property
    def last_outcome(self) -> Outcome | None:
        """How the last outbound call of this delivery got its result (None if it raised)."""
        with self._lock:
            return self._last_outcome

    # --- the body's verbs ----------------------------------------------------------------

    def outbound(self, call: OutboundCall, request: Any, business_key: str | None = None) -> Any:
        """Send ``request`` through ``call`` exactly once (design: claim); the gateway's result."""
        business_key = self.business_key_for(business_key)
        # First, as a PaymentTask's outbound() always did: a second call object under a
        # taken name is refused before this delivery counts anything.
        self._settings.register(call)
        self.raise_if_stopped()
        self._refuse_after_the_body_ended("outbound()")
        self._refuse_inside_an_effect("outbound()")
        step = self._open_step(INTENT_RECORD, call.name, business_key, call.max_key_length)
        with self._lock:
            self._last_outcome = None
            self._calls.setdefault(call.name, call)
        prepared = prepare_call(self._settings, self._execution_id, call, request, step)
        with self._lock:
            self._reached.add(prepared.idempotency_key)
        self.pass_failures()  # this call goes on past the failures before it
        if step.occurrence == 2:
            warn_position_keys(call.name)
        with self.stop_on_signal(), self._one_call_of(prepared.idempotency_key):
            result, outcome = traced_outbound(
                call.name, self._execution_id, lambda: run_outbound(self, prepared)
            )
        with self._lock:
            self._last_outcome = outcome
            self._last_step = step
        return result

    def step_moves_money(self, step: Step) -> bool:
        """False only for a step this delivery made with a call that said it moves no
        money (``OutboundCall.moves_money``); a fenced effect's step, or one not made here,
        is taken as moving money."""
        with self._lock:
            call = self._calls.get(step.name) if step.kind == INTENT_RECORD else None
        return True if call is None else call.moves_money

    def fenced_effect(
        self,
        name: str,
        fn: Callable[[Any], T],
        business_key: str | None = None,
        request: Any = None,
    ) -> T:
        """Run ``fn(conn)`` once per key, inside the transaction that checks the lease."""
        business_key = self.business_key_for(business_key)
        self.raise_if_stopped()
        self._refuse_after_the_body_ended("fenced_effect()")
        self._refuse_inside_an_effect("fenced_effect()")
        step = self._open_step(EFFECT_RECORD, name, business_key)
        self._in_effect.depth = getattr(self._in_effect, "depth", 0) + 1
        self._in_effect.step = step
        try:
            with self.stop_on_signal():
                result: T = traced_effect(
                    name,
                    self._execution_id,
                    lambda: run_fenced_effect(self, step, fn, request=request),
                )
        finally:
            self._in_effect.depth -= 1
            self._in_effect.step = None
        with self._lock:
            self._last_step = step
        return result

    def business_key_for(self, given: str | None) -> str | None:
        """The business key as the body gave it. A step given none is keyed when it is
        opened (``_open_step``): by its position, or by the default an undo's context
        gives (``default_business_key``)."""
        return given

    def default_business_key(self, kind: str, name: str) -> str | None:
        """The business key of a step given none, asked as the step is opened: none here
        (it is keyed by its position); an undo's context keys its calls by its own."""
        return None

    def _open_step(
        self, kind: str, name: str, business_key: str | None, max_key_length: int | None = None
    ) -> Step:
        """The one place a step of this delivery is counted and keyed: by its business key
        (given, or the context's default), or by its position among the steps of its name
        (counted on every call, replayed or not, so every delivery of the body names each
        step the same)."""
        if business_key is None:
            business_key = self.default_business_key(kind, name)
        occurrence = 1 if business_key is not None else self._next(kind, name)
        return step_of(
            kind,
            self._settings.tenant,
            self._execution_id,
            name,
            business_key,
            occurrence,
            max_key_length=max_key_length,
        )

    def end_body(self) -> None:
        """The execution's compensation starts: every step the body made is settled and
        kept in the start mark, and what the execution makes after it is its undos'. A
        call from the body after this (a thread it started, still running) is refused: it
        would charge while its undos refund, counted as an undo's refund."""
        with self._lock:
            self._body_ended = True

    def _refuse_after_the_body_ended(self, verb: str) -> None:
        """The delivery's own check; a thread past it when the compensation starts is
        refused by its claim, which reads the start mark (``_refuse_cancelled``)."""
        if self._body_ended and not sabotage.active(BODY_CALLS_AFTER_COMPENSATION_START):
            raise self._body_ended_error(verb)

    def _body_ended_error(self, verb: str) -> ConfigurationError:
        return ConfigurationError(
            f"{verb} from the body after its compensation started is refused: the body "
            "failed (or was cancelled) and its undos run; a thread it started must end "
            "with it",
            execution_id=self._execution_id,
        )

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
        """An error text of this delivery as the store may keep it (``masked_by_calls``)."""
        return masked_by_calls(self._calls_made() or [], text)

    def mask_error_fields(self, value: Any) -> Any:
        """A value this delivery's error carries, through the field paths of every call the
        process knows: one that runs only the undos made none of the body's calls."""
        made, known = self._calls_made(), self._settings.registry
        if made is None:
            return value
        return fields_masked_by_calls([*made, *(known[name] for name in known)], value)

    def _calls_made(self) -> list[OutboundCall] | None:
        """The calls this delivery made (None: stored errors unmasked, sabotage)."""
        if sabotage.active(STORED_ERROR_UNMASKED):
            return None
        with self._lock:
            return list(self._calls.values())

    def raise_if_stopped(self) -> None:
        """A signal (or a pause) means "this delivery must stop". A body that caught one and
        called on would get new step keys for the same calls (``#2``): a second charge; one
        that returned would end COMPLETED past a cancel or an unanswered pause. So every
        later verb, and the body's return (``Delivery``), raises it again."""
        stopped = self._stopped_by
        if stopped is None or sabotage.active(CAUGHT_SIGNAL_DOES_NOT_STOP_DELIVERY):
            return
        if isinstance(stopped, PauseRequested):
            raise PauseRequested(stopped.name)
        raise type(stopped)(
            f"this delivery already stopped on {type(stopped).__name__}; a body must let "
            "celery_agboss signals propagate instead of calling on",
            **stopped.fields,
        )

    def pause_name(self, name: str) -> str:
        """The name a ``pause(name)`` is kept under: the body's own (an undo's: its own)."""
        return name

    def stop(self, signal: Stop) -> Stop:
        """``signal`` ends this delivery (the first one to): ``raise_if_stopped`` repeats it."""
        with self._lock:
            if self._stopped_by is None:
                self._stopped_by = signal
        return signal

    @contextmanager
    def _one_call_of(self, idempotency_key: str) -> Iterator[None]:
        """Threads of one delivery calling one key (a business key) take turns. Between a
        claim's commit and the send's registration as in flight, another thread of the
        same holder would read the intent as its own earlier attempt, find no send
        running, reconcile ``NotSent`` and send again under the key (design: R16). The
        second thread waits, then replays what the first settled."""
        if sabotage.active(CALLS_OF_ONE_KEY_CONCURRENT):
            yield
            return
        with self._lock:
            turn = self._key_locks.setdefault(idempotency_key, threading.Lock())
        with turn:
            self.raise_if_stopped()  # the call it waited for may have stopped the delivery
            yield

    @contextmanager
    def stop_on_signal(self) -> Iterator[None]:
        """A signal raised inside (a store failure, a lost lease, a cancel) ends this
        delivery: a body that swallows it is stopped at its next verb and at its return."""
        try:
            yield
        except AGBossSignal as signal:
            if isinstance(signal, StoreError) and sabotage.active(STORE_FAILURE_CATCHABLE):
                raise RuntimeError(f"sabotage: the store failed ({signal})") from signal
            self.stop(signal)
            raise

    def _next(self, kind: str, name: str) -> int:
        with self._lock:
            n = self._occurrences.get((kind, name), 0) + 1
            self._occurrences[(kind, name)] = n
            return n

    # --- what the engine calls back (engine.Holder) --------------------------------------

    def next_publish(self, task_name: str) -> int:
        """The position of this publish of ``task_name`` from the body (1, 2, …): what a
        stable id of the published task is derived from."""
        return self._next("publish", task_name)

    def give_back_publish(self, task_name: str, position: int) -> bool:
        """Hand back ``position``, taken by a publish of ``task_name`` whose send raised,
        so the body's retry of it gets the same stable id: one execution, not one more
        beside it (design: publishes from a body). Only the last position taken is given
        back; False when a later publish of the name took one meanwhile (another thread)."""
        with self._lock:
            if self._occurrences.get(("publish", task_name)) != position:
                return False
            self._occurrences[("publish", task_name)] = position - 1
            return True

    def reached_keys(self) -> frozenset[str]:
        """The idempotency keys of every outbound call this delivery's body made: an intent
        an earlier delivery created that is not among them is a divergence (design: divergence)."""
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
        failed and the failure was never handed to another execution: that hand-out
        revoked it for good (design: retry authorisation)."""
        with self._lock:
            failures = dict(self._failures)
        for key, attempt in failures.items():
            mark_failed(
                tx,
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
        ``tx``, the transaction that would authorise the next send or write
        (design: cancel request).
        ``cancel_probe`` (given by the layer that records executions) reads it; without
        one (an execution run without that layer) nothing can request a cancel."""
        probe = self._cancel_probe
        if probe is not None and self._checks_cancel():
            self._refuse_cancelled(probe(tx))

    def claim_unless_cancelled(
        self, intent: NewIntent, row: HistoryRow
    ) -> OneStatementClaim | None:
        """The claim as one statement (``claim_in_one``), reading the execution's cancel
        request in it as ``check_cancel`` does in a fenced transaction: the layer that
        gives a ``cancel_probe`` records executions in the store, whose cancel request the
        statement reads. None: use a fenced transaction."""
        cancel_of = self._execution_id if self._checks_cancel() else None
        done = self.claim_in_one(intent, row, cancel_of=cancel_of)
        if done is not None:
            self._refuse_cancelled(done.cancel_reason)
        return done

    def _checks_cancel(self) -> bool:
        return self._cancel_probe is not None and not sabotage.active(CANCEL_NOT_CHECKED_MID_BODY)

    def _refuse_cancelled(self, reason: str | None) -> None:
        """A claim or write the store refused: a cancel request, or (once ``end_body`` ran,
        before the start mark) the compensation that started meanwhile."""
        if reason is None:
            return
        with self._lock:
            ended = self._body_ended
        if ended:
            raise self._body_ended_error("a call or write")
        raise CancelRequestedError(
            f"a cancel was requested ({reason}); this delivery sends and writes nothing more",
            execution_id=self._execution_id,
            reason=reason,
        )

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
