"""Reconcile (design: reconcile, sweep reconciles): ask the gateway what became of a PENDING intent.

The holder of an execution takes a stranded intent by compare-and-set and may, on a
proven ``NotSent()``, send it again — but only through the key-age compare-and-set
(design: R26): the database decides whether
``now - first_attempt_at + attempt_timeout < key_retention``. The sweep's side,
which never sends, is ``core/stranded.py``.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from celery_agboss.core import fault_points, sabotage
from celery_agboss.core.engine_settings import EngineSettings
from celery_agboss.core.history import HistoryEvent
from celery_agboss.core.log_events import (
    OUTBOUND_CALL_LOOKUP_FAILED,
    OUTBOUND_CALL_RECONCILED,
    OUTBOUND_CALL_RECONCILING,
    OUTBOUND_CALL_SUPERSEDED,
    OUTBOUND_CALL_UNRECONCILED,
    log_event,
)
from celery_agboss.core.lookup import (
    ask,
    completed_update,
    lookup_of,
    max_key_age_ms,
    take_for_lookup,
)
from celery_agboss.core.outbound import (
    CallContext,
    Completed,
    NotSent,
    Outcome,
    Unknown,
)
from celery_agboss.core.prepared import Holder, PreparedCall, Resend, holder_transition
from celery_agboss.core.protections import (
    CANCEL_CHECKED_APART_FROM_RESEND,
    FINGERPRINT_NOT_CHECKED,
    LIVE_OWNER_TAKEN_OVER,
    PENDING_RESENT_WITHOUT_RECONCILE,
    RECONCILE_READS_THIS_REQUEST,
    SUPERSEDED_SILENTLY_REPORTED,
)
from celery_agboss.core.settle import record_unknown
from celery_agboss.core.store_protocol import (
    INTENT_RECORD,
    UNSET,
    IntentGuard,
    IntentRecord,
    IntentStatus,
    IntentUpdate,
    LeaseRef,
)
from celery_agboss.core.transitions import (
    CallRef,
    cas,
    fault,
    masked_text,
    transition,
)
from celery_agboss.errors import (
    CancelRequestedError,
    ExecutionFencedError,
    IdempotencyKeyConflictError,
    LookupFailed,
    OutboundCallOutcomeUnknownError,
    OutboundCallResultNotStoredError,
    OutboundCallUnreconciledError,
)

# --- the holder's side ------------------------------------------------------------


def take_for_reconcile(
    holder: Holder, p: PreparedCall, record: IntentRecord
) -> IntentRecord | None:
    """``(PENDING, attempt, dead owner) → (PENDING, attempt, me)``; None when another won."""
    me = holder.lease_ref
    with holder.fenced() as tx:
        won = take_for_lookup(
            tx,
            holder.settings.pseudonym_key,
            record,
            me,
            owner_not_live=not sabotage.active(LIVE_OWNER_TAKEN_OVER),
            execution_id=holder.execution_id,
        )
    return replace(record, owner=me, owner_live=True) if won else None


def reconcile_pending(
    holder: Holder, p: PreparedCall, record: IntentRecord
) -> tuple[Any, Outcome] | Resend:
    """Reconcile an intent this holder owns; a ``Resend`` when a new attempt is authorised."""
    me = holder.lease_ref
    settings = holder.settings
    attempt = record.attempt
    if sabotage.active(PENDING_RESENT_WITHOUT_RECONCILE):
        return _resend_without_reconcile(holder, p, attempt)
    log_event(
        OUTBOUND_CALL_RECONCILING,
        logging.INFO,
        "asking reconcile before anything is sent",
        **p.ref.fields(attempt=attempt),
    )
    context = CallContext(p.idempotency_key, _request_asked_about(p, record), attempt, p.call.name)
    try:
        answer = ask(p.call, context, lookup_of(record), settings.attempt_timeout_ms)
    except LookupFailed as failed:
        raise _lookup_failed(holder, p, attempt, failed) from failed
    fault(
        fault_points.RECONCILE_AFTER_LOOKUP,
        me,
        p.ref,
        attempt=attempt,
        answer=type(answer).__name__,
    )
    if isinstance(answer, Completed):
        return _reconciled_completed(holder, p, record, answer.result)
    if isinstance(answer, NotSent):
        return _reconciled_not_sent(holder, p, record)
    raise _reconciled_unknown(holder, p, attempt, answer)


def _request_asked_about(p: PreparedCall, record: IntentRecord) -> Any:
    """What reconcile is asked about is the intent's own request
    (design: only the request's payment): this delivery's, unmasked, when it is the same
    request; the stored one when another request came under the key, so a reconcile
    that reads its ``CallContext`` never looks up another payment."""
    if record.fingerprint == p.fingerprint or sabotage.active(RECONCILE_READS_THIS_REQUEST):
        return p.request
    return record.request


def _resend_without_reconcile(holder: Holder, p: PreparedCall, attempt: int) -> Resend:
    """Sabotage only: a pending intent is sent again with no lookup before it."""
    with holder.fenced() as tx:
        if cas(
            tx,
            p.idempotency_key,
            IntentGuard(IntentStatus.PENDING, attempt, holder.lease_ref),
            IntentUpdate(attempt=attempt + 1, start_attempt=True, sent_by=holder.execution_id),
        ):
            return Resend(attempt + 1)
    raise ExecutionFencedError(**p.ref.fields(attempt=attempt))


def _lookup_failed(
    holder: Holder, p: PreparedCall, attempt: int, failed: LookupFailed
) -> OutboundCallOutcomeUnknownError:
    """The lookup could not be asked: noted on the intent, which stays pending."""
    record_unknown(holder, p, attempt, failed.detail)
    # Why the delivery waits: the lookup's own error (its type and HTTP status; the
    # masked text is in the intent's history, `agboss show KEY`).
    log_event(
        OUTBOUND_CALL_LOOKUP_FAILED,
        logging.WARNING,
        "reconcile could not be asked; the delivery retries and looks it up again",
        **p.ref.fields(
            attempt=attempt,
            by="holder",
            reason=failed.detail.get("reason"),
            error_type=failed.detail.get("error_type"),
            http_status=failed.detail.get("http_status"),
        ),
    )
    return OutboundCallOutcomeUnknownError(
        "reconcile could not be asked; the intent stays pending and will be reconciled again",
        **p.ref.fields(attempt=attempt),
    )


def _reconciled_unknown(
    holder: Holder, p: PreparedCall, attempt: int, answer: Unknown
) -> OutboundCallUnreconciledError:
    """The lookup could not tell: flagged for an operator, nothing sent."""
    _flag(
        holder.fenced(),
        holder.settings,
        p.ref,
        p.idempotency_key,
        attempt,
        holder.lease_ref,
        HistoryEvent.UNRECONCILED,
        {"reason": masked_text(p.call, answer.reason)},
        IntentUpdate(
            needs_operator=True,
            operator_reason=f"unknown: {masked_text(p.call, answer.reason)}"[:500],
        ),
    )
    log_event(
        OUTBOUND_CALL_UNRECONCILED,
        logging.WARNING,
        "reconcile could not tell; nothing sent, an operator decides",
        **p.ref.fields(attempt=attempt),
    )
    return OutboundCallUnreconciledError(
        "reconcile could not tell whether the call reached the gateway; an operator decides",
        **p.ref.fields(attempt=attempt, reason="unknown"),
    )


def _superseded(p: PreparedCall, attempt: int) -> ExecutionFencedError:
    log_event(
        OUTBOUND_CALL_SUPERSEDED,
        logging.WARNING,
        "the intent was taken by another holder during reconcile; nothing stored",
        **p.ref.fields(attempt=attempt),
    )
    return ExecutionFencedError(**p.ref.fields(attempt=attempt))


def _reconciled_completed(
    holder: Holder, p: PreparedCall, record: IntentRecord, result: Any
) -> tuple[Any, Outcome]:
    me = holder.lease_ref
    stored_ok, update, gateway_id = completed_update(p.call, result)
    # Reconciled by this delivery, its result handed to it: it relies on it from now on.
    shared = p.ref.handle is not None and stored_ok and record.fingerprint == p.fingerprint
    with holder.fenced() as tx:
        won = holder_transition(
            tx,
            holder,
            p,
            me,
            record.attempt,
            replace(update, rely=shared),
            HistoryEvent.RECONCILED_COMPLETED if stored_ok else HistoryEvent.RESULT_NOT_STORED,
            {"gateway_transaction_id": gateway_id, "by": "holder"},
            to_status=IntentStatus.COMPLETED,
        )
        if won and shared:
            tx.rely_on(INTENT_RECORD, p.idempotency_key, holder.execution_id, counted=True)
    if not won:
        if sabotage.active(SUPERSEDED_SILENTLY_REPORTED):
            return result, Outcome.RECONCILED
        raise _superseded(p, record.attempt)
    log_event(
        OUTBOUND_CALL_RECONCILED,
        logging.INFO,
        "found at the gateway; nothing sent",
        **p.ref.fields(attempt=record.attempt, gateway_transaction_id=gateway_id),
    )
    if record.fingerprint != p.fingerprint and not sabotage.active(FINGERPRINT_NOT_CHECKED):
        raise IdempotencyKeyConflictError(
            f"the intent of {p.call.name!r} under this key completed with another request; "
            "nothing was sent",
            **p.ref.fields(),
        )
    if not stored_ok:
        raise OutboundCallResultNotStoredError(
            "the call completed but its result could not be stored; an operator must supply it",
            **p.ref.fields(attempt=record.attempt),
        )
    return result, Outcome.RECONCILED


def _reconciled_not_sent(holder: Holder, p: PreparedCall, record: IntentRecord) -> Resend:
    attempt = record.attempt
    if record.fingerprint != p.fingerprint and not sabotage.active(FINGERPRINT_NOT_CHECKED):
        raise _another_request(holder, p, record)
    bound = max_key_age_ms(p.call, holder.settings.attempt_timeout_ms)
    apart = sabotage.active(CANCEL_CHECKED_APART_FROM_RESEND)
    try:
        if apart:
            with holder.fenced() as tx:
                holder.check_cancel(tx)
        fault(fault_points.RECONCILE_BEFORE_RESEND, holder.lease_ref, p.ref, attempt=attempt)
        won, too_old = _claim_resend(holder, p, attempt, bound, check_cancel=not apart)
    except CancelRequestedError:
        _hand_back_not_sent(holder, p, attempt)
        raise
    if won:
        return Resend(attempt + 1)
    if not too_old:
        raise _superseded(p, attempt)
    log_event(
        OUTBOUND_CALL_UNRECONCILED,
        logging.WARNING,
        "not sent, but the key may have expired at the gateway: nothing resent",
        **p.ref.fields(attempt=attempt, reason="key-too-old"),
    )
    raise OutboundCallUnreconciledError(
        "reconcile found nothing, but the idempotency key is too old to resend safely "
        "(key_age + attempt_timeout >= key_retention); an operator decides",
        **p.ref.fields(attempt=attempt, reason="key-too-old"),
    )


def _another_request(
    holder: Holder, p: PreparedCall, record: IntentRecord
) -> IdempotencyKeyConflictError:
    """The pending intent holds another request: the one this execution sent means its
    own body changed (a person decides); another execution's stays its own."""
    own = record.sent_by == holder.execution_id
    _flag(
        holder.fenced(),
        holder.settings,
        p.ref,
        p.idempotency_key,
        record.attempt,
        holder.lease_ref,
        HistoryEvent.FINGERPRINT_CONFLICT,
        {"not_sent": True, "own_execution": own},
        IntentUpdate(
            not_sent_confirmed=True,
            needs_operator=True if own else None,
            operator_reason="fingerprint-conflict" if own else UNSET,
        ),
    )
    return IdempotencyKeyConflictError(
        f"the pending intent of {p.call.name!r} under this key holds another request; "
        "nothing was sent",
        **p.ref.fields(),
    )


def _claim_resend(
    holder: Holder, p: PreparedCall, attempt: int, bound: int | None, *, check_cancel: bool
) -> tuple[bool, bool]:
    """``(won, too_old)``: the next attempt claimed while the key is young enough for the
    gateway to deduplicate it, else the intent flagged for an operator (key-too-old). A
    resend is a new send: the claim's own transaction reads the cancel request, so a
    cancel recorded before it commits is never followed by the send."""
    me = holder.lease_ref
    settings = holder.settings
    too_old = False
    with holder.fenced() as tx:
        if check_cancel:
            holder.check_cancel(tx)
        won = transition(
            tx,
            settings.pseudonym_key,
            p.idempotency_key,
            IntentGuard(IntentStatus.PENDING, attempt, me, max_key_age_ms=bound),
            IntentUpdate(
                attempt=attempt + 1,
                start_attempt=True,
                not_sent_confirmed=False,
                needs_operator=False,
                operator_reason=None,
                clear_next_lookup=True,
                sent_by=holder.execution_id,
            ),
            HistoryEvent.RECONCILED_NOT_SENT,
            from_status=IntentStatus.PENDING,
            to_status=IntentStatus.PENDING,
            attempt=attempt + 1,
            owner=me,
            detail={"previous_attempt": attempt, "resend": True, "key_age_bound_ms": bound},
            execution_id=holder.execution_id,
        )
        if not won:
            too_old = holder_transition(
                tx,
                holder,
                p,
                me,
                attempt,
                IntentUpdate(
                    needs_operator=True, operator_reason="key-too-old", not_sent_confirmed=True
                ),
                HistoryEvent.UNRECONCILED,
                {"reason": "key-too-old", "key_age_bound_ms": bound},
            )
    return won, too_old


def _hand_back_not_sent(holder: Holder, p: PreparedCall, attempt: int) -> None:
    """A cancel came before the resend: the lookup's ``NotSent`` is recorded and the intent
    handed back (no owner), for the cancel to settle without sending anything."""
    me = holder.lease_ref
    with holder.fenced() as tx:
        holder_transition(
            tx,
            holder,
            p,
            me,
            attempt,
            IntentUpdate(owner=None, not_sent_confirmed=True),
            HistoryEvent.RECONCILED_NOT_SENT,
            {"by": "holder", "resend": False, "why": "cancel requested"},
        )


def _flag(
    fenced: Any,
    settings: EngineSettings,
    ref: CallRef,
    key: str,
    attempt: int,
    owner: LeaseRef,
    event: HistoryEvent,
    detail: dict[str, Any],
    update: IntentUpdate,
) -> None:
    """Write a flag on an intent this owner holds, with its history row; miss → fenced."""
    with fenced as tx:
        won = transition(
            tx,
            settings.pseudonym_key,
            key,
            IntentGuard(IntentStatus.PENDING, attempt, owner),
            update,
            event,
            from_status=IntentStatus.PENDING,
            to_status=IntentStatus.PENDING,
            attempt=attempt,
            owner=owner,
            detail=detail,
            execution_id=ref.execution_id,
        )
    if not won:
        log_event(
            OUTBOUND_CALL_SUPERSEDED,
            logging.WARNING,
            "the intent was taken by another holder; nothing stored",
            **ref.fields(attempt=attempt),
        )
        raise ExecutionFencedError(**ref.fields(attempt=attempt))


__all__ = ["reconcile_pending", "take_for_reconcile"]
