"""What an operator's ``resolve`` writes on an intent, given what the operator says.

Pure rules, no store: ``operator.resolving`` checks the intent and the call, asks here
which state follows and what the row gets, and writes it through ``transition()`` with
its history row and audit row (design: operator decisions).
"""

from __future__ import annotations

from dataclasses import dataclass

from celery_agboss.core.store_protocol import JSON, IntentRecord, IntentStatus, IntentUpdate

NOT_SENT = "not-sent"
COMPLETED = "completed"


@dataclass(frozen=True)
class Resolution:
    """The decision an operator's resolve writes: its name, the state, the row's change."""

    decision: str  # NOT_SENT or COMPLETED
    to_status: IntentStatus
    update: IntentUpdate


def only_its_result_lost(intent: IntentRecord) -> bool:
    """A COMPLETED intent whose result could not be stored: the gateway answered it."""
    return intent.status is IntentStatus.COMPLETED and not intent.result_stored


def wrong_state(intent: IntentRecord, not_sent: bool) -> str | None:
    """Why this intent cannot be resolved so, or None: only a PENDING one, or a COMPLETED
    one whose result was lost (and then only as completed: the gateway answered it)."""
    marker = only_its_result_lost(intent)
    if intent.status is not IntentStatus.PENDING and not marker:
        return f"the intent is already {intent.status.value}; nothing to resolve"
    if marker and not_sent:
        return (
            "the gateway answered this intent (it is COMPLETED, only its result could not "
            "be stored): resolve it with --completed"
        )
    return None


MAY_CHARGE_TWICE = "; resend accepted past the key's retention"
"""Ends the reason of a ``--not-sent --may-charge-twice``: the operator named the risk, so
the resend is not bounded by the key's age (``resend_age_waived``)."""


def not_sent_resolution(who: str, *, may_charge_twice: bool = False) -> Resolution:
    """The gateway never processed it: ``FAILED`` with no failure. No body was handed one,
    so none took another path on it, and the next execution that reaches it sends it
    under the same key (design: failure replay, retry authorisation) while the key is
    young enough (design: key age), or at any age when the operator accepted the risk."""
    waiver = MAY_CHARGE_TWICE if may_charge_twice else ""
    return Resolution(
        NOT_SENT,
        IntentStatus.FAILED,
        IntentUpdate(
            status=IntentStatus.FAILED,
            owner=None,
            needs_operator=False,
            operator_reason=f"resolved by {who}: not sent{waiver}",
            not_sent_confirmed=True,
            clear_next_lookup=True,
            failure=None,
            retry_for=None,
        ),
    )


def resend_age_waived(intent: IntentRecord) -> bool:
    """An operator's ``--not-sent --may-charge-twice`` is on this intent: its resend goes
    out whatever the key's age."""
    return (intent.operator_reason or "").endswith(MAY_CHARGE_TWICE)


def completed_resolution(
    intent: IntentRecord, who: str, stored: JSON, gateway_transaction_id: str | None
) -> Resolution:
    """The payment exists: ``COMPLETED`` with the operator's result (already masked), which
    the next delivery replays; an intent that only lost its result keeps its completion
    time."""
    return Resolution(
        COMPLETED,
        IntentStatus.COMPLETED,
        IntentUpdate(
            status=IntentStatus.COMPLETED,
            owner=None,
            complete=not only_its_result_lost(intent),
            result=stored,
            result_stored=True,
            needs_operator=False,
            operator_reason=f"resolved by {who}: completed",
            clear_next_lookup=True,
            gateway_transaction_id=gateway_transaction_id,
        ),
    )


__all__ = [
    "Resolution",
    "completed_resolution",
    "not_sent_resolution",
    "resend_age_waived",
    "wrong_state",
]
