"""The pieces every intent transition is made of: one guarded compare-and-set, one
chained history row in the same transaction, one structured log event
(``celery_agboss.core.log_events``).

Every intent write is made through here: its creation (``create``, the claim), every
transition after it — the holder's state machine (``state_machine``, ``settle``),
reconcile (``reconcile``, ``stranded``), a cancel's ``NotSent`` (``cancelled_intents``)
and the operator's ``resolve`` — and the two marks on a failed intent that move no status
(``mark_failed``: a retry authorised, a failure handed to another execution), so none of
them can disagree on what a write records. ``tests/unit/test_intent_writes.py`` holds it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

from celery_agboss.core import sabotage
from celery_agboss.core.failures import field_mask, stored_text
from celery_agboss.core.fault_points import fault_point
from celery_agboss.core.history import HistoryEvent, next_history_row
from celery_agboss.core.log_events import OUTBOUND_CALL_TRANSACTION_ID_FAILED, log_event
from celery_agboss.core.masking import NO_MASKING, MaskingPolicy
from celery_agboss.core.outbound import OutboundCall
from celery_agboss.core.protections import INTENT_CAS_WITHOUT_PREDICATE
from celery_agboss.core.store_protocol import (
    JSON,
    HistoryRow,
    IntentGuard,
    IntentStatus,
    IntentUpdate,
    LeaseRef,
    NewIntent,
    StoreTransaction,
)

ERROR_TEXT_LIMIT = 500
"""Characters of an error text kept in history: enough to read, too little to hold a dump."""


def cas(tx: StoreTransaction, key: str, guard: IntentGuard, update: IntentUpdate) -> bool:
    """One ``UPDATE … WHERE <guard>``, judged by its row count.

    Sabotaged (design: R15), a miss writes anyway: the row is re-read and updated under a
    guard built from what it now holds, which is an UPDATE without a predicate.
    """
    if tx.update_intent(key, guard, update):
        return True
    if not sabotage.active(INTENT_CAS_WITHOUT_PREDICATE):
        return False
    for _ in range(5):  # the row may change between the read and the write: chase it
        current = tx.read_intent(key)
        if current is None:
            return False
        loose = IntentGuard(status=current.status, attempt=current.attempt, owner=current.owner)
        if tx.update_intent(key, loose, update):
            return True
    return False


def mark_failed(tx: StoreTransaction, key: str, guard: IntentGuard, update: IntentUpdate) -> bool:
    """A guarded write to a ``FAILED`` intent that leaves it ``FAILED`` (who may send it
    again): no history row, since its status did not change; False when the row moved."""
    if guard.status is not IntentStatus.FAILED:
        raise ValueError(f"mark_failed guards a FAILED intent, not {guard.status.value}")
    return tx.update_intent(key, guard, update)


def transition(
    tx: StoreTransaction,
    pseudonym_key: bytes,
    key: str,
    guard: IntentGuard,
    update: IntentUpdate,
    event: HistoryEvent,
    *,
    from_status: IntentStatus,
    to_status: IntentStatus,
    attempt: int,
    owner: LeaseRef | None,
    detail: JSON = None,
    execution_id: str | None = None,
    tail: HistoryTail | None = None,
) -> bool:
    """The guarded compare-and-set and, when it won, its history row chained to the
    intent's last (the compare-and-set locked the intent's row); False when it lost
    (someone else moved the intent first) and nothing was written. ``execution_id``: the
    execution whose delivery makes the change (None for the sweep and operators);
    ``tail``: the last row the caller wrote for this intent, when it keeps it: the row is
    written after it in one statement (otherwise, or when another row came first, the
    last row is read and the new one chained to it)."""
    if not cas(tx, key, guard, update):
        return False
    known = None if tail is None else tail.take(key)
    fields: dict[str, Any] = {
        "from_status": from_status,
        "to_status": to_status,
        "attempt": attempt,
        "owner": owner,
        "detail": detail,
        "execution_id": execution_id,
    }
    if known is not None:
        row = _history_row(tx, pseudonym_key, known, key, event, **fields)
        if tx.append_history_after(row):
            assert tail is not None
            tail.keep(row)
            return True
    row = _history_row(tx, pseudonym_key, tx.last_history(key), key, event, **fields)
    tx.append_history(row)
    if tail is not None:
        tail.keep(row)
    return True


def create(
    tx: StoreTransaction,
    pseudonym_key: bytes,
    intent: NewIntent,
    detail: JSON = None,
    tail: HistoryTail | None = None,
) -> bool:
    """The claim of a new intent (``PENDING``, attempt 1, owned by its creator's lease) and,
    when it inserted, its first history row, written by the same store call (one
    statement on PostgreSQL); False when the key existed and nothing was written (the
    insert does nothing on a conflict, so two claims never both win)."""
    row = replace(claim_row(pseudonym_key, intent, detail), at_ms=tx.now_ms)
    if not tx.insert_intent(intent, first_history=row):
        return False
    if tail is not None:
        tail.keep(row)
    return True


def claim_row(pseudonym_key: bytes, intent: NewIntent, detail: JSON = None) -> HistoryRow:
    """The first history row of a claimed intent (its ``at_ms`` is the writer's to set)."""
    return history_row(
        pseudonym_key,
        None,
        intent.idempotency_key,
        HistoryEvent.CLAIMED,
        from_status=None,
        to_status=IntentStatus.PENDING,
        attempt=1,
        owner=intent.owner,
        detail=detail,
        execution_id=intent.execution_id,
        at_ms=0,
    )


class HistoryTail:
    """The history row one outbound call wrote last (its claim, then each transition), so
    its next row chains to it without reading it back. Only a hint: the store writes
    the next row only while this one is still the intent's last, and otherwise the row
    is read and chained as usual (someone else moved the intent, or the transaction
    that wrote the hint rolled back)."""

    __slots__ = ("_row",)

    def __init__(self) -> None:
        self._row: HistoryRow | None = None

    def keep(self, row: HistoryRow) -> None:
        self._row = row

    def take(self, key: str) -> HistoryRow | None:
        row, self._row = self._row, None
        return row if row is not None and row.idempotency_key == key else None


def _history_row(
    tx: StoreTransaction,
    pseudonym_key: bytes,
    previous: HistoryRow | None,
    key: str,
    event: HistoryEvent,
    **fields: Any,
) -> HistoryRow:
    return history_row(pseudonym_key, previous, key, event, at_ms=tx.now_ms, **fields)


def history_row(
    pseudonym_key: bytes,
    previous: HistoryRow | None,
    key: str,
    event: HistoryEvent,
    *,
    from_status: IntentStatus | None,
    to_status: IntentStatus,
    attempt: int,
    owner: LeaseRef | None,
    detail: JSON,
    execution_id: str | None,
    at_ms: int,
) -> HistoryRow:
    """The history row of a transition, chained to ``previous`` (``at_ms`` is outside
    its digest: a statement that reads the clock as it writes the row replaces it)."""
    return next_history_row(
        pseudonym_key,
        previous,
        idempotency_key=key,
        at_ms=at_ms,
        event=event,
        from_status=None if from_status is None else from_status.value,
        to_status=to_status.value,
        attempt=attempt,
        holder=None if owner is None else owner.holder,
        token=None if owner is None else owner.token,
        detail=detail if detail is not None else {},
        execution_id=execution_id,
    )


def policy_of(call: OutboundCall) -> MaskingPolicy:
    mask = call.mask
    return mask if isinstance(mask, MaskingPolicy) else NO_MASKING


def mask_result(call: OutboundCall, result: Any) -> tuple[bool, JSON]:
    """``(True, stored form)`` or ``(False, a not-stored marker)``; never raises (design: R24)."""
    try:
        return policy_of(call).try_mask_result(result)
    except Exception as exc:  # a custom policy object that raised something else
        return False, {"agboss_result_not_stored": f"masking raised {type(exc).__name__}"}


def transaction_id_of(call: OutboundCall, result: Any) -> str | None:
    """The gateway's own id when the call can tell it; a failing extractor, or a value no
    database can hold, records none."""
    if call.transaction_id is None:
        return None
    failed = "transaction_id raised"
    try:
        value = call.transaction_id(result)
        if value is None:
            return None
        failed = "transaction_id returned a value that cannot be stored"
        text = str(value)[:256]
        text.encode("utf-8")  # a lone surrogate cannot be stored by either database
    except Exception as exc:
        log_event(
            OUTBOUND_CALL_TRANSACTION_ID_FAILED,
            logging.WARNING,
            f"{failed}; no gateway id recorded",
            call=call.name,
            error=type(exc).__name__,
        )
        return None
    if "\x00" in text:  # PostgreSQL text holds no NUL: settle would fail on every try
        return None
    return text


NOT_STORED_TEXT = "<not stored: the masking policy failed>"


def masked_text(call: OutboundCall, text: Any) -> str:
    """A text the store keeps about a call (an error's, a reconcile's ``Unknown`` reason),
    as the call's policy lets it be stored; a marker when the policy fails (fail
    closed: the text may hold what the policy hides)."""
    try:
        masked = policy_of(call).mask_error_text(str(text))[:ERROR_TEXT_LIMIT]
        return masked.encode("utf-8", "backslashreplace").decode("utf-8")
    except Exception:
        return NOT_STORED_TEXT


def masked_by_calls(calls: list[OutboundCall], text: str) -> str:
    """An error text of a delivery through the error masking of every call it made, in
    turn: a decline quoting a card number is masked by the policy of the call that got
    it; a policy that fails stores a marker instead (fail closed)."""
    masked = text
    for call in calls:
        if policy_of(call).masks_errors:
            masked = masked_text(call, masked)
            if masked == NOT_STORED_TEXT:
                break
    return masked


def fields_masked_by_calls(calls: list[OutboundCall], value: Any) -> Any:
    """A value a delivery's error carries (the refused request an SDK error keeps) through
    the field paths of every call it made, as a stored request is (design: masking)."""
    for call in calls:
        mask = field_mask(policy_of(call))
        if mask is not None:
            value = mask(value)
    return value


def error_detail(call: OutboundCall, exc: BaseException) -> dict[str, Any]:
    """What history keeps of an exception: its type, and its text masked by the policy
    (its field paths too, when the text is made of an argument carrying the request)."""
    detail: dict[str, Any] = {"error_type": f"{type(exc).__module__}.{type(exc).__qualname__}"}
    try:
        policy = policy_of(call)
        masked = stored_text(exc, policy.mask_error_text, field_mask(policy))[:ERROR_TEXT_LIMIT]
        # History is canonical JSON: a lone surrogate (bytes decoded with surrogateescape)
        # would make the transition that records this error fail, after the money moved.
        detail["error"] = masked.encode("utf-8", "backslashreplace").decode("utf-8")
    except Exception:
        detail["error"] = None  # the policy failed: the text is not stored (fail closed)
    return detail


@dataclass(frozen=True)
class CallRef:
    """How logs and errors name an intent: never the business key in clear."""

    call: str
    execution_id: str
    idempotency_key: str  # for fault points only: it holds a business key in clear
    handle: str | None  # HMAC handle of the business key, for business-keyed calls

    def fields(self, **more: Any) -> dict[str, Any]:
        out: dict[str, Any] = {"call": self.call, "execution_id": self.execution_id}
        if self.handle is not None:
            out["business_key_handle"] = self.handle
        else:
            out["idempotency_key"] = self.idempotency_key  # a step key: task id and name only
        out.update(more)
        return out


def fault(name: str, lease: LeaseRef, ref: CallRef, **more: object) -> None:
    """A fault point with the context tests filter on: scope, holder, token, key."""
    fault_point(
        name,
        **lease.fields(),
        call=ref.call,
        key=ref.idempotency_key,
        execution_id=ref.execution_id,
        **more,
    )


__all__ = [
    "CallRef",
    "HistoryTail",
    "cas",
    "claim_row",
    "create",
    "error_detail",
    "fault",
    "history_row",
    "mark_failed",
    "mask_result",
    "masked_text",
    "policy_of",
    "transaction_id_of",
    "transition",
]
