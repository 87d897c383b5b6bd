"""What one ``outbound()`` call is before the store is touched, and what the state
machine needs from the delivery running it.

Shared by the claim (``state_machine``), the send and settle (``settle``) and the holder's
reconcile (``reconcile``), which import it rather than each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from celery_agboss.core import sabotage
from celery_agboss.core.engine_settings import EngineSettings
from celery_agboss.core.fenced_effects import EffectHolder
from celery_agboss.core.history import HistoryEvent
from celery_agboss.core.inflight import BoundedRun
from celery_agboss.core.keys import business_key_handle, fingerprint
from celery_agboss.core.outbound import OutboundCall
from celery_agboss.core.protections import REQUEST_STORED_UNMASKED
from celery_agboss.core.step_identity import Step
from celery_agboss.core.store_protocol import (
    JSON,
    HistoryRow,
    IntentGuard,
    IntentStatus,
    IntentTransition,
    IntentUpdate,
    LeaseRef,
    NewIntent,
    OneStatementClaim,
    OneStatementTransition,
    StoreTransaction,
)
from celery_agboss.core.transitions import CallRef, HistoryTail, history_row, policy_of, transition


class Holder(EffectHolder, Protocol):
    """What the state machine needs from the delivery that runs it (``ExecutionContext``):
    what a fenced effect needs, and the send's bookkeeping."""

    def assert_can_send(self) -> None:
        """Raise ``ExecutionFencedError`` unless the lease is held on the holder's clocks."""

    def failure_raised(self, idempotency_key: str, attempt: int) -> None:
        """A definite failure of this attempt is being raised to the body: a retry the
        body asks for before it goes on to another call authorises sending it again."""

    def send_started(self, run: BoundedRun) -> None:
        """Remember a running send: the lease is never released under it."""

    def send_overran(self, run: BoundedRun) -> None:
        """The send passed ``attempt_timeout``: stop trusting and renewing the lease."""

    def claim_unless_cancelled(
        self, intent: NewIntent, row: HistoryRow
    ) -> OneStatementClaim | None:
        """The claim as one statement, refused (``CancelRequestedError``) when a cancel of
        the execution was requested; None: use a fenced transaction."""

    def transition_in_one(
        self, change: IntentTransition, *, relied_by: str | None = None
    ) -> OneStatementTransition | None:
        """``Store.transition_in_one`` under the holder's lease (``DeliveryLease``)."""

    def send_interrupted(self, run: BoundedRun) -> None:
        """The wait for a running send was interrupted (a signal, a soft time limit): write
        and send nothing more, keep the lease renewed until the send ends or passes its
        bound, then let it expire; never release it."""


class FailureToBody:
    """The definite failure one call raises to its body on purpose (recorded ``FAILED``,
    or replayed): the one ordinary exception ``run_outbound`` lets through as it is."""

    __slots__ = ("error",)

    def __init__(self) -> None:
        self.error: BaseException | None = None


@dataclass(frozen=True)
class PreparedCall:
    """Everything fixed for one ``outbound()`` before the store is touched."""

    call: OutboundCall
    idempotency_key: str
    request: Any  # as given: what send and the holder's reconcile get
    stored_request: JSON  # masked: what the store keeps and the sweep's reconcile gets
    fingerprint: str
    ref: CallRef
    # The history row this call wrote last: its next transition chains to it unread.
    tail: HistoryTail = field(default_factory=HistoryTail, compare=False, repr=False)
    to_body: FailureToBody = field(default_factory=FailureToBody, compare=False, repr=False)


def prepare_call(
    settings: EngineSettings,
    execution_id: str,
    call: OutboundCall,
    request: Any,
    step: Step,
) -> PreparedCall:
    """Fingerprint and masked request of ``step`` (its key decided by the delivery,
    ``core.step_identity``); refuses bad input before anything is written.

    The masking policy fails closed here (``MaskingPolicyError``): nothing is claimed,
    nothing is sent.
    """
    handle: str | None = None
    if step.business_key_text is not None:
        handle = business_key_handle(settings.pseudonym_key, step.business_key_text)
    key = step.key
    stored = policy_of(call).mask_request(request)
    if sabotage.active(REQUEST_STORED_UNMASKED):
        stored = request
    return PreparedCall(
        call=call,
        idempotency_key=key,
        request=request,
        stored_request=stored,
        fingerprint=fingerprint(settings.pseudonym_key, request),
        ref=CallRef(call.name, execution_id, key, handle),
    )


def failure_to_body(
    holder: Holder, p: PreparedCall, attempt: int, failure: BaseException
) -> BaseException:
    """``failure``, a definite failure of ``attempt``, about to be raised to the body on
    purpose: noted for a retry the body may ask for (``failure_raised``) and for
    ``run_outbound``, which must not take it for an error of unknown outcome."""
    holder.failure_raised(p.idempotency_key, attempt)
    p.to_body.error = failure
    return failure


def holder_transition(
    tx: StoreTransaction,
    holder: Holder,
    p: PreparedCall,
    me: LeaseRef,
    attempt: int,
    update: IntentUpdate,
    event: HistoryEvent,
    detail: JSON,
    *,
    to_status: IntentStatus = IntentStatus.PENDING,
) -> bool:
    """``transition()`` of the PENDING intent this holder owns (as ``me``) at ``attempt``:
    the guard, the history row's owner and its execution are the holder's."""
    return transition(
        tx,
        holder.settings.pseudonym_key,
        p.idempotency_key,
        IntentGuard(IntentStatus.PENDING, attempt, me),
        update,
        event,
        **_holders_row(holder, me, attempt, detail, to_status),
        tail=p.tail,
    )


def _holders_row(
    holder: Holder, me: LeaseRef, attempt: int, detail: JSON, to_status: IntentStatus
) -> dict[str, Any]:
    """The history row's fields of a transition by the holder of a PENDING intent."""
    return {
        "from_status": IntentStatus.PENDING,
        "to_status": to_status,
        "attempt": attempt,
        "owner": me,
        "detail": detail,
        "execution_id": holder.execution_id,
    }


def holder_transition_in_one(
    holder: Holder,
    p: PreparedCall,
    me: LeaseRef,
    attempt: int,
    update: IntentUpdate,
    event: HistoryEvent,
    detail: JSON,
    *,
    to_status: IntentStatus,
    relied: bool = False,
) -> bool:
    """``holder_transition`` (with, when ``relied``, the record use marked relied) as one
    statement, where the store has one and the call knows the last history row it
    wrote: True when the intent changed. False when nothing was written (no such
    statement, no known row, or the intent moved on): run ``holder_transition`` in a
    fenced transaction, which reads what it needs and decides."""
    known = p.tail.take(p.idempotency_key)
    if known is None:
        return False
    fields = _holders_row(holder, me, attempt, detail, to_status)
    row = history_row(
        holder.settings.pseudonym_key, known, p.idempotency_key, event, at_ms=0, **fields
    )
    change = IntentTransition(
        p.idempotency_key, IntentGuard(IntentStatus.PENDING, attempt, me), update, row
    )
    done = holder.transition_in_one(change, relied_by=holder.execution_id if relied else None)
    if done is None:
        p.tail.keep(known)  # the transaction chains to it instead
        return False
    if not done.won or done.now_ms is None:
        return False
    p.tail.keep(replace(row, at_ms=done.now_ms))
    return True


@dataclass(frozen=True)
class Resend:
    """Reconcile proved the attempt absent and authorised ``attempt`` under the same key."""

    attempt: int


__all__ = [
    "Holder",
    "PreparedCall",
    "Resend",
    "failure_to_body",
    "holder_transition_in_one",
    "prepare_call",
]
