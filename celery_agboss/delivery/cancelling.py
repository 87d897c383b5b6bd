"""A delivery of an execution with a cancel request: reconcile only, then ``CANCELLED``.

A revoke (with or without ``terminate``) or ``cancel()`` is recorded as a cancel
request (design: cancel request). The body never runs again after it: a delivery that starts
with the request set only settles what earlier deliveries left ``PENDING`` — each
intent is looked up through the engine's ``reconcile_stranded`` under this
delivery's lease, which never sends — and then writes ``CANCELLED`` in a fenced
transaction. An intent the lookup proved was never processed (``NotSent`` from a call
that declares ``lookup_proves_absence``) is settled ``FAILED``: nothing moved, and a
cancelled execution never resends it. A ``NotSent`` that proves nothing (a replay-only
gateway: "a resend under this key would be deduplicated") may hide a payment, so the
intent is flagged for an operator instead — an ambiguous payment is never "failed".
"""

from __future__ import annotations

import enum
import logging
from typing import NoReturn

from celery.exceptions import Ignore

from celery_agboss.core.cancelled_intents import CancelledIntent, settle_not_sent_for_cancel
from celery_agboss.core.execution_context import ExecutionContext
from celery_agboss.core.execution_states import cancel_reason_of
from celery_agboss.core.executions import ExecutionState
from celery_agboss.core.log_events import (
    EXECUTION_CANCELLED,
    EXECUTION_CANCELLING,
    EXECUTION_WAITING,
    EXECUTION_WAITING_OPERATOR,
)
from celery_agboss.core.store_protocol import IntentGuard, IntentRecord, IntentStatus
from celery_agboss.core.stranded import StrandedOutcome, reconcile_stranded
from celery_agboss.delivery.compensating import undo_before_cancel
from celery_agboss.delivery.delivery_like import DeliveryLike
from celery_agboss.delivery.verdicts import Cancel, ForOperator, Wait
from celery_agboss.delivery.waits import sweep_after_ms, wait_then_retry
from celery_agboss.errors import ExecutionFencedError, StoreError
from celery_agboss.runtime.app_runtime import Runtime
from celery_agboss.runtime.task_events import (
    TASK_UNRECONCILED,
    TASK_WAITING,
    send_revoked_in_delivery,
)

RECONCILED_BY = "cancel"
"""How history rows and log lines name this reconcile (the sweep's says "sweep")."""


class CancelReadiness(str, enum.Enum):
    """What stands between a cancel request and ``CANCELLED``."""

    SETTLED = "SETTLED"  # no PENDING intent left: cancel now
    OWN_SEND = "OWN_SEND"  # this delivery's own attempt is pending: leave the lease to expire
    LATER = "LATER"  # a lookup failed, or another live owner: try again later
    OPERATOR = "OPERATOR"  # a lookup could not tell: an operator decides


def end_with_cancel(d: DeliveryLike) -> NoReturn:
    """A cancel was requested (a revoke, ``cancel()``): the body does not run. What
    earlier deliveries left PENDING is looked up, never sent; then the declared undos
    and ``CANCELLED``, or a wait for what is not settled yet, or an operator."""
    d.log_decision(EXECUTION_CANCELLING, reason=d.cancel_reason)
    try:
        readiness = reconcile_for_cancel(d.runtime, d.context())
    except ExecutionFencedError as exc:
        d.fenced(exc)
    except StoreError as exc:
        d.store_failed(exc)
    if readiness is CancelReadiness.SETTLED:
        record = undo_before_cancel(d, d.cancel_reason)  # its undos run first
        if record is None:
            record = d.verdict(Cancel(d.cancel_reason))
        if record is not None and record.state is ExecutionState.CANCELLED:
            d.release()
            d.log_decision(EXECUTION_CANCELLED, reason=d.cancel_reason)
            send_revoked_in_delivery(d.task)
            raise Ignore()
        if record is not None and record.state is ExecutionState.WAITING_OPERATOR:
            # A payment of it completed: never silently CANCELLED; a person decides.
            d.release()
            d.log_decision(EXECUTION_WAITING_OPERATOR, logging.ERROR, reason=record.reason)
            d.send_event(TASK_UNRECONCILED, reason=record.reason)
            raise Ignore()
        readiness = CancelReadiness.LATER  # an intent appeared meanwhile: look again
    if readiness is CancelReadiness.OPERATOR:
        d.verdict(ForOperator("cancel requested; a lookup could not tell"))
        d.release()
        d.log_decision(EXECUTION_WAITING_OPERATOR, logging.ERROR, reason="cancel-unreconciled")
        d.send_event(TASK_UNRECONCILED, reason="cancel requested; a lookup could not tell")
        raise Ignore()
    if readiness is CancelReadiness.OWN_SEND:
        # This delivery's own attempt is pending (its body was stopped mid-send): the
        # lease expires once the send settled, and the next holder reconciles it.
        d.abandon()
        d.log_decision(EXECUTION_WAITING, reason="cancel requested; own attempt pending")
        d.send_event(TASK_WAITING, reason="cancel requested; own attempt pending")
        raise Ignore()
    delay = d.settings.retry_delay_seconds
    d.verdict(Wait(sweep_after_ms(d.settings, delay), "cancel requested"))
    d.log_decision(EXECUTION_WAITING, reason="cancel requested; an intent is not settled yet")
    wait_then_retry(d, delay, release=True, reason="cancel-requested")


def pending_intents(runtime: Runtime, execution_id: str) -> list[IntentRecord]:
    """The execution's pending intents (the one definition: created by it, owned through
    its lease, or held on its behalf), oldest first."""
    records = map(runtime.store.read_intent, runtime.executions.pending_intent_keys(execution_id))
    return [i for i in records if i is not None and i.status is IntentStatus.PENDING]


def reconcile_for_cancel(runtime: Runtime, ctx: ExecutionContext) -> CancelReadiness:
    """Look up every PENDING intent of the execution (never send); how far that got."""
    me = ctx.lease_ref
    ttl_ms = ctx.lease.ttl_ms
    for intent in pending_intents(runtime, ctx.execution_id):
        if intent.owner == me:
            return CancelReadiness.OWN_SEND
        if intent.owner_live:
            return CancelReadiness.LATER
        ctx.assert_held()
        outcome = reconcile_stranded(
            runtime.store,
            runtime.engine_settings,
            intent.idempotency_key,
            sweeper_lease=me,
            sweeper_ttl_ms=ttl_ms,
            by=RECONCILED_BY,
            for_execution=ctx.execution_id,
        )
        if outcome is StrandedOutcome.COMPLETED:
            continue
        if outcome is StrandedOutcome.NOT_SENT_CONFIRMED:
            settled = _settle_not_sent(runtime, ctx, intent.idempotency_key)
            if settled is not CancelReadiness.SETTLED:
                return settled
            continue
        if outcome is StrandedOutcome.UNRECONCILED:
            return CancelReadiness.OPERATOR
        return CancelReadiness.LATER  # lookup failed, unknown call, taken by another
    return CancelReadiness.SETTLED


def cancel_request_of(runtime: Runtime, execution_id: str) -> str | None:
    """The reason of the execution's cancel request, read now; None when there is none
    (or the store cannot say: the delivery then goes on as it would have)."""
    try:
        record = runtime.executions.read_execution(execution_id)
    except StoreError:
        return None
    if record is None:
        return None
    return cancel_reason_of(record.cancel_requested, record.cancel_reason)


def _settle_not_sent(runtime: Runtime, ctx: ExecutionContext, key: str) -> CancelReadiness:
    """After a ``NotSent`` (the intent handed back with no owner), under this delivery's
    lease: the one rule of ``settle_not_sent_for_cancel``."""
    with ctx.fenced() as tx:
        intent = tx.read_intent(key)
        if intent is None or intent.status is not IntentStatus.PENDING:
            return CancelReadiness.SETTLED if intent is not None else CancelReadiness.LATER
        if not intent.not_sent_confirmed or intent.owner is not None:
            return CancelReadiness.LATER
        ended = settle_not_sent_for_cancel(
            tx,
            runtime.engine_settings,
            intent,
            IntentGuard(IntentStatus.PENDING, intent.attempt, None),
            by=RECONCILED_BY,
            actor=ctx.lease_ref,
            execution_id=ctx.execution_id,
        )
    return _READINESS_AFTER[ended]


_READINESS_AFTER = {
    CancelledIntent.FAILED: CancelReadiness.SETTLED,
    CancelledIntent.FLAGGED: CancelReadiness.OPERATOR,
    CancelledIntent.LOST: CancelReadiness.LATER,
}


__all__ = ["cancel_request_of", "end_with_cancel"]
