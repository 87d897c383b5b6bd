"""What reconcile is told and how it is asked, for both of its callers (the holder's
``core/reconcile.py`` and the sweep's ``core/stranded.py``).

``take_for_lookup`` first takes a pending intent from its dead owner; ``lookup_of``
hands reconcile the stored (masked) request and the attempt's times on the database
clock; ``ask`` runs the user's ``reconcile`` bounded like a send; a lookup that raises
or hangs is ``LookupFailed`` — no answer, never a ``NotSent``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from celery_agboss.core import sabotage
from celery_agboss.core.history import HistoryEvent
from celery_agboss.core.inflight import RunState, run_bounded
from celery_agboss.core.outbound import (
    CallContext,
    Completed,
    Lookup,
    NotSent,
    OutboundCall,
    Unknown,
)
from celery_agboss.core.protections import NO_KEY_AGE_CHECK
from celery_agboss.core.store_protocol import (
    IntentGuard,
    IntentRecord,
    IntentStatus,
    IntentUpdate,
    LeaseRef,
    StoreTransaction,
)
from celery_agboss.core.transitions import error_detail, mask_result, transaction_id_of, transition
from celery_agboss.errors import LookupFailed


def lookup_of(record: IntentRecord) -> Lookup:
    """What reconcile is told: the stored request and the times, all on the database clock."""
    key_age = None
    if record.first_attempt_at_ms is not None:
        key_age = timedelta(milliseconds=max(record.read_at_ms - record.first_attempt_at_ms, 0))
    started = None
    if record.attempt_started_at_ms is not None:
        started = record.attempt_started_at_ms / 1000
    return Lookup(
        idempotency_key=record.idempotency_key,
        request=record.request,
        attempt=record.attempt,
        attempt_started_at=started,
        key_age=key_age,
    )


def max_key_age_ms(call: OutboundCall, attempt_timeout_ms: int) -> int | None:
    """The key-age bound of a resend: ``key_retention - attempt_timeout``, or None when the
    lookup proves absence (any age may be resent)."""
    if call.lookup_proves_absence or sabotage.active(NO_KEY_AGE_CHECK):
        return None
    assert call.key_retention_ms is not None  # OutboundCall refuses the other case
    return call.key_retention_ms - attempt_timeout_ms


def not_sent_proven(call: OutboundCall | None) -> bool | None:
    """Whether a ``NotSent`` from ``call``'s lookup proves the gateway never processed the
    request: only a call declaring ``lookup_proves_absence`` says so (design: key age);
    None when the call is unknown here. What is recorded, counted and shown of a
    ``NotSent`` is decided here."""
    return None if call is None else call.lookup_proves_absence


def ask(
    call: OutboundCall, context: CallContext, lookup: Lookup, timeout_ms: int
) -> Completed[Any] | NotSent | Unknown:
    """Run ``call.reconcile`` bounded by ``timeout_ms``; anything but an answer is LookupFailed."""
    run = run_bounded(
        f"reconcile:{call.name}",
        lambda ctx: call.reconcile(ctx, lookup),
        context,
        timeout_ms / 1000,
    )
    state = run.wait()
    if state is RunState.TIMED_OUT:
        raise LookupFailed({"reason": "reconcile-timeout"})
    if state is RunState.RAISED:
        assert run.error is not None
        if not isinstance(run.error, Exception):
            raise run.error
        raise LookupFailed(
            {
                "reason": "reconcile-raised",
                **error_detail(call, run.error),
                **http_status_of(run.error),
            }
        )
    answer = run.result
    if isinstance(answer, (Completed, NotSent, Unknown)):
        return answer
    return Unknown(f"reconcile returned {type(answer).__name__}, not Completed/NotSent/Unknown")


def http_status_of(error: BaseException) -> dict[str, int]:
    """``{"http_status": N}`` when the error says which HTTP status the gateway answered
    (an SDK's ``http_status``/``status_code``/``status``, or its ``response``'s): the one
    fact about a failed lookup a log line may carry besides its type (its text can hold
    the idempotency key, which holds the business key)."""
    for holder in (error, getattr(error, "response", None)):
        for name in ("http_status", "status_code", "status"):
            value = getattr(holder, name, None)
            if isinstance(value, int) and not isinstance(value, bool) and 100 <= value <= 599:
                return {"http_status": value}
    return {}


def completed_update(
    call: OutboundCall, result: Any, *, found_by_lookup: bool = True
) -> tuple[bool, IntentUpdate, str | None]:
    """``(stored_ok, update, gateway id)``: the update that settles an intent COMPLETED with
    ``result`` (masked); one a lookup found also clears what the lookups marked."""
    stored_ok, stored = mask_result(call, result)
    gateway_id = transaction_id_of(call, result)
    update = IntentUpdate(
        status=IntentStatus.COMPLETED,
        complete=True,
        result=stored,
        result_stored=stored_ok,
        gateway_transaction_id=gateway_id,
        needs_operator=not stored_ok,
        operator_reason=None if stored_ok else "result-not-stored",
        not_sent_confirmed=False if found_by_lookup else None,
        clear_next_lookup=found_by_lookup,
    )
    return stored_ok, update, gateway_id


def take_for_lookup(
    tx: StoreTransaction,
    pseudonym_key: bytes,
    record: IntentRecord,
    owner: LeaseRef,
    *,
    owner_not_live: bool = True,
    detail: dict[str, Any] | None = None,
    execution_id: str | None = None,
) -> bool:
    """``(PENDING, attempt, dead owner) → (PENDING, attempt, owner)``: the intent taken to
    be looked up, by its holder or the sweep; False when another took it first."""
    previous = record.owner
    return transition(
        tx,
        pseudonym_key,
        record.idempotency_key,
        IntentGuard(IntentStatus.PENDING, record.attempt, previous, owner_not_live=owner_not_live),
        IntentUpdate(owner=owner),
        HistoryEvent.TAKEN_FOR_RECONCILE,
        from_status=IntentStatus.PENDING,
        to_status=IntentStatus.PENDING,
        attempt=record.attempt,
        owner=owner,
        detail={
            **(detail or {}),
            "previous_holder": None if previous is None else previous.holder,
            "previous_token": None if previous is None else previous.token,
        },
        execution_id=execution_id,
    )


__all__ = ["ask", "completed_update", "lookup_of", "max_key_age_ms", "take_for_lookup"]
