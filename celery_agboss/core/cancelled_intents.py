"""A ``NotSent`` during a cancel: what becomes of a cancelled execution's PENDING intent.

A cancelled execution never resends, so its intent must end. Reconcile's ``NotSent``
settles it ``FAILED`` only when the call's lookup proves absence (``not_sent_proven``,
the one rule the sweep's records and views use too). A replay-only ``NotSent`` just says
a resend under the same key would be safe: the payment may exist, so the intent is
flagged for a person instead (never an ambiguous payment marked failed). One rule, for
both callers: a delivery of the cancelled execution (under its lease) and the sweep's
cancel step.
"""

from __future__ import annotations

import enum

from celery_agboss.core.engine_settings import EngineSettings
from celery_agboss.core.history import HistoryEvent
from celery_agboss.core.lookup import not_sent_proven
from celery_agboss.core.store_protocol import (
    IntentGuard,
    IntentRecord,
    IntentStatus,
    IntentUpdate,
    LeaseRef,
    StoreTransaction,
)
from celery_agboss.core.transitions import transition

OPERATOR_REASON = (
    "cancel requested; reconcile answered NotSent, which does not prove the gateway never "
    "processed it: check the gateway, then `agboss resolve`"
)


class CancelledIntent(str, enum.Enum):
    """How the intent ended (or did not) in this transaction."""

    FAILED = "failed"  # absence proven: settled, nothing was charged
    FLAGGED = "flagged"  # the payment may exist: waits for an operator
    LOST = "lost"  # the compare-and-set lost: someone else moved the intent first


def settle_not_sent_for_cancel(
    tx: StoreTransaction,
    settings: EngineSettings,
    intent: IntentRecord,
    guard: IntentGuard,
    *,
    by: str,
    actor: LeaseRef | None,
    execution_id: str | None = None,
) -> CancelledIntent:
    """End ``intent`` (PENDING, reconcile answered ``NotSent``) of a cancelled execution,
    guarded by ``guard``, with its history row; ``by`` names the caller there and
    ``actor`` the lease it acts under (None: the sweep, which holds none), and
    ``execution_id`` the execution whose delivery acts (None: the sweep)."""
    call = settings.call_named(intent.name)
    if not not_sent_proven(call):
        update = IntentUpdate(needs_operator=True, operator_reason=OPERATOR_REASON)
        event, to_status, ended = (
            HistoryEvent.UNRECONCILED,
            IntentStatus.PENDING,
            CancelledIntent.FLAGGED,
        )
        why = "cancel requested; absence not proven"
    else:
        update = IntentUpdate(status=IntentStatus.FAILED, owner=None, clear_next_lookup=True)
        event, to_status, ended = (
            HistoryEvent.NOT_SENT_PROVEN,
            IntentStatus.FAILED,
            CancelledIntent.FAILED,
        )
        why = "cancel requested; reconcile proved not sent"
    won = transition(
        tx,
        settings.pseudonym_key,
        intent.idempotency_key,
        guard,
        update,
        event,
        from_status=IntentStatus.PENDING,
        to_status=to_status,
        attempt=intent.attempt,
        owner=actor,
        detail={"by": by, "why": why},
        execution_id=execution_id,
    )
    return ended if won else CancelledIntent.LOST


__all__ = ["CancelledIntent", "settle_not_sent_for_cancel"]
