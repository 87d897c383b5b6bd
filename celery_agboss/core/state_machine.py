"""The outbound-call state machine, holder side (design: claim): the claim, and the loop that
hands each case to its step.

One ``run_outbound`` per ``outbound()`` call. Every write is one fenced transaction
and every compare-and-set one guarded ``UPDATE`` judged by its row count, so a race is
decided by the predicates, not by which database happens to serialise transactions
(SQLite does, PostgreSQL does not). The claim inserts first and reads only on a
conflict, in the same transaction: a first call pays one round of the store. No
transaction is open while the gateway is called. A ``PENDING`` intent is always
treated as possibly sent: it goes to reconcile (``core/reconcile.py``), never
straight back to the gateway. Sending and settling live in ``core/settle.py``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from typing import Any

from celery_agboss.core import fault_points, sabotage
from celery_agboss.core.failures import rebuild_failure
from celery_agboss.core.history import HistoryEvent
from celery_agboss.core.inflight import IN_FLIGHT, InFlightSend
from celery_agboss.core.log_events import (
    OUTBOUND_CALL_COMPENSATED,
    OUTBOUND_CALL_FAILURE_REPLAYED,
    OUTBOUND_CALL_JOINED,
    OUTBOUND_CALL_OUTCOME_UNKNOWN,
    OUTBOUND_CALL_REPLAYED,
    OUTBOUND_CALL_UNRECONCILED,
    log_event,
)
from celery_agboss.core.lookup import max_key_age_ms
from celery_agboss.core.outbound import Outcome
from celery_agboss.core.prepared import (
    Holder,
    PreparedCall,
    Resend,
    failure_to_body,
    prepare_call,
)
from celery_agboss.core.protections import (
    FINGERPRINT_NOT_CHECKED,
    FOREIGN_ERROR_ESCAPES_CLAIMED_CALL,
    JOIN_ON_ANY_FINGERPRINT,
    LIVE_OWNER_TAKEN_OVER,
    NOT_SENT_RESEND_UNBOUNDED,
    RECORD_USE_NOT_NOTED,
    REPLAY_AFTER_UNDO,
    REPLAY_NOT_STORED_MARKER,
    RETENTION_DELETES_WHAT_IT_LISTED,
)
from celery_agboss.core.reconcile import reconcile_pending, take_for_reconcile
from celery_agboss.core.resolutions import resend_age_waived
from celery_agboss.core.settle import send_and_settle
from celery_agboss.core.shared_records import (
    FailureClaim,
    compensated_error,
    failure_claim,
    hands_failure_to_another,
)
from celery_agboss.core.store_protocol import (
    INTENT_RECORD,
    JSON,
    IntentGuard,
    IntentRecord,
    IntentStatus,
    IntentUpdate,
    NewIntent,
    Reliance,
)
from celery_agboss.core.transitions import claim_row, create, fault, mark_failed, transition
from celery_agboss.errors import (
    AGBossError,
    IdempotencyKeyConflictError,
    OutboundCallCompensatedError,
    OutboundCallFailureNotReplayableError,
    OutboundCallInFlightError,
    OutboundCallOutcomeUnknownError,
    OutboundCallResultNotStoredError,
    OutboundCallUnreconciledError,
)

MAX_CLAIM_ROUNDS = 8
"""Reads and compare-and-sets one call may go through before it reports contention."""

COMPENSATION_WAIT_S = 5.0
COMPENSATION_POLL_S = 0.25
"""How long a replay that found its step's undo started waits for that undo to end."""


def run_outbound(holder: Holder, p: PreparedCall) -> tuple[Any, Outcome]:
    """Claim (design: claim), then send/settle, reconcile, replay or join; the result and how.

    The claim is the first write, and from the moment it may have committed until the
    outcome is recorded the intent may be PENDING in this holder's hands, possibly sent.
    An ordinary exception that is not ours (a soft time limit, raised at any bytecode; a
    bug) must not reach the body then: a body that catches it and calls again gets a new
    step key (``#2``), a second charge. It becomes an unknown outcome, a signal that stops
    the delivery (design: signals and errors), the intent left for reconcile. This is the
    one place that sees every path after the claim (send, settle, reconcile, join). Our
    own errors, a definite failure raised to the body on purpose, and what is not an
    ``Exception`` (``SystemExit``, ``KeyboardInterrupt``) go through as they are."""
    try:
        return _claim_then_settle(holder, p)
    except Exception as exc:
        if (
            isinstance(exc, AGBossError)
            or exc is p.to_body.error
            or sabotage.active(FOREIGN_ERROR_ESCAPES_CLAIMED_CALL)
        ):
            raise
        log_event(
            OUTBOUND_CALL_OUTCOME_UNKNOWN,
            logging.WARNING,
            "an error that is not celery_agboss's interrupted the call before its outcome "
            "was recorded; it will be reconciled",
            **p.ref.fields(error_type=type(exc).__name__),
        )
        raise OutboundCallOutcomeUnknownError(
            f"{type(exc).__name__} interrupted the call before its outcome was recorded; "
            "this delivery stops and the intent will be reconciled",
            **p.ref.fields(),
        ) from exc


def _claim_then_settle(holder: Holder, p: PreparedCall) -> tuple[Any, Outcome]:
    """``run_outbound``'s rounds: claim or read, then the step the intent's state calls for."""
    me = holder.lease_ref
    saw_live_owner = False
    for _ in range(MAX_CLAIM_ROUNDS):
        claim = _claim_or_read(holder, p)
        record = claim.record
        fault(
            fault_points.OUTBOUND_AFTER_READ,
            me,
            p.ref,
            status=None if record is None else record.status,
        )
        if claim.inserted:
            return send_and_settle(holder, p, 1)
        if record is None:
            continue  # gone between the insert and the read (retention): claim again
        if record.status is IntentStatus.COMPLETED:
            if claim.reliance is Reliance.UNDONE and not sabotage.active(REPLAY_AFTER_UNDO):
                raise _compensated(holder, p)
            if claim.reliance is Reliance.ABSENT and not sabotage.active(
                RETENTION_DELETES_WHAT_IT_LISTED
            ):
                continue  # retention took it while this read waited: never hand it out
            return _replay(p, record)
        if record.status is IntentStatus.FAILED:
            _check_fingerprint(p, record.fingerprint)
            if failure_claim(record, holder.execution_id) is FailureClaim.RESEND:
                if _claim_failed(holder, p, record):
                    # After a definite failure nothing was processed; one settled as never
                    # sent (no failure kept) is treated as possibly sent.
                    unproven = record.failure is None
                    return send_and_settle(
                        holder, p, record.attempt + 1, after_possible_send=unproven
                    )
                continue
            if _hand_out_failure(holder, p, record):
                raise _replayed_failure(holder, p, record)
            continue
        # PENDING: possibly sent, whoever owns it.
        if record.owner == me or (record.owner_live and not sabotage.active(LIVE_OWNER_TAKEN_OVER)):
            running = IN_FLIGHT.find(p.idempotency_key, record.owner, record.attempt)
            if running is not None:
                joined = _join(holder, p, running)
                if joined is not None:
                    return joined
                continue
            if record.owner != me:
                if saw_live_owner:
                    raise OutboundCallInFlightError(
                        **p.ref.fields(attempt=record.attempt),
                    )
                saw_live_owner = True  # read once more: a sender here may just have settled
                continue
            mine = record  # my own earlier attempt, not running
        else:
            taken = take_for_reconcile(holder, p, record)
            if taken is None:
                continue
            mine = taken
        answer = reconcile_pending(holder, p, mine)
        if isinstance(answer, Resend):
            return send_and_settle(holder, p, answer.attempt, after_possible_send=True)
        return answer
    raise OutboundCallInFlightError(
        "the intent kept changing under this call; another party is working on it",
        **p.ref.fields(),
    )


@dataclass(frozen=True)
class _Claim:
    inserted: bool
    record: IntentRecord | None
    reliance: Reliance | None = None  # a completed business-keyed intent's hand-out


def _claim_or_read(holder: Holder, p: PreparedCall) -> _Claim:
    """Claim the intent (``PENDING``, attempt 1, owned and sent by me) or, when one exists,
    read it. A first call costs one statement where the store has one
    (``_claimed_in_one``), else one fenced transaction, never a read followed by an
    insert. The insert is ``ON CONFLICT DO NOTHING``: a concurrent claim of the same key
    makes it insert nothing, and the fenced transaction's read sees the row that claim
    committed.

    The claim that authorises the send checks the cancel request in its statement or
    transaction. An
    intent another execution created (a shared business key) is noted as used by this
    one, so retention keeps it while this execution lives (design: retention); a completed
    one's result handed to this execution is written on the record in the same
    transaction — unless an undo claimed it first (``Reliance.UNDONE``)."""
    me = holder.lease_ref
    intent = NewIntent(
        idempotency_key=p.idempotency_key,
        execution_id=holder.execution_id,
        name=p.call.name,
        business_key_handle=p.ref.handle,
        fingerprint=p.fingerprint,
        request=p.stored_request,
        owner=me,
    )
    detail = {"call": p.call.name, "execution_id": holder.execution_id}
    if _claimed_in_one(holder, p, intent, detail):
        return _Claim(True, None)
    with holder.fenced(engine_only=True) as tx:
        holder.check_cancel(tx)
        if create(tx, holder.settings.pseudonym_key, intent, detail, tail=p.tail):
            return _Claim(True, None)
        record = tx.read_intent(p.idempotency_key)
        if record is None:
            return _Claim(False, None)
        if sabotage.active(RECORD_USE_NOT_NOTED):
            return _Claim(False, record)
        if record.execution_id != holder.execution_id:
            tx.record_use(INTENT_RECORD, p.idempotency_key, holder.execution_id)
        reliance = None
        if (
            record.status is IntentStatus.COMPLETED
            and record.business_key_handle is not None
            and record.result_stored
            and record.fingerprint == p.fingerprint
        ):
            fault(fault_points.OUTBOUND_BEFORE_RELY, me, p.ref)
            reliance = tx.rely_on(INTENT_RECORD, p.idempotency_key, holder.execution_id)
        return _Claim(False, record, reliance)


def _claimed_in_one(holder: Holder, p: PreparedCall, intent: NewIntent, detail: JSON) -> bool:
    """The claim of a new key as one statement, where the store has one: True when it
    inserted. False when nothing was written (no such statement, or the key exists):
    the fenced transaction claims or reads it."""
    row = claim_row(holder.settings.pseudonym_key, intent, detail)
    done = holder.claim_unless_cancelled(intent, row)
    if done is None or not done.inserted or done.now_ms is None:
        return False
    p.tail.keep(replace(row, at_ms=done.now_ms))
    return True


def _compensated(holder: Holder, p: PreparedCall) -> OutboundCallCompensatedError:
    """The step's undo claimed it before this execution relied on it: its success is never
    handed out again. The undo may still be running: wait for it, bounded, so the error
    can say it is done; one that is not done by then is told as claimed, not undone
    (the body may then open a new attempt under a new business key)."""
    deadline = time.monotonic() + COMPENSATION_WAIT_S
    while True:
        with holder.fenced() as tx:
            record = tx.read_intent(p.idempotency_key)
        undone = record is None or record.compensated_at_ms is not None
        if undone or time.monotonic() >= deadline:
            break
        time.sleep(COMPENSATION_POLL_S)
    log_event(
        OUTBOUND_CALL_COMPENSATED,
        logging.WARNING,
        "this step was claimed by another execution's undo; its result is not handed out",
        **p.ref.fields(undone=undone),
    )
    return compensated_error(
        p.call.name,
        undone=undone,
        undo_by=None if record is None else record.undo_by,
        **p.ref.fields(),
    )


def _check_fingerprint(p: PreparedCall, stored: str) -> None:
    """Another request under this key is refused, never sent, replayed or joined."""
    if stored != p.fingerprint and not sabotage.active(FINGERPRINT_NOT_CHECKED):
        raise IdempotencyKeyConflictError(
            f"the idempotency key of {p.call.name!r} was used with another request; "
            "nothing was sent",
            **p.ref.fields(),
        )


def _replay(p: PreparedCall, record: IntentRecord) -> tuple[Any, Outcome]:
    _check_fingerprint(p, record.fingerprint)
    if not record.result_stored and not sabotage.active(REPLAY_NOT_STORED_MARKER):
        raise OutboundCallResultNotStoredError(
            "the call completed but its result could not be stored; an operator must supply it",
            **p.ref.fields(attempt=record.attempt),
        )
    log_event(
        OUTBOUND_CALL_REPLAYED,
        logging.INFO,
        "stored result returned",
        **p.ref.fields(attempt=record.attempt),
    )
    return record.result, Outcome.REPLAYED


def _hand_out_failure(holder: Holder, p: PreparedCall, record: IntentRecord) -> bool:
    """Before a failure is raised to another execution than the one whose attempt failed,
    that execution's retry authorisation is revoked, for good, by a compare-and-set on
    the same row its own claim would change: the two never both win. False when the row
    moved first (the authorised retry took it): read it again."""
    if not hands_failure_to_another(record, holder.execution_id):
        return True
    with holder.fenced() as tx:
        return mark_failed(
            tx,
            p.idempotency_key,
            IntentGuard(IntentStatus.FAILED, record.attempt, record.owner),
            IntentUpdate(retry_for=None, failure_shared=True),
        )


def _replayed_failure(holder: Holder, p: PreparedCall, record: IntentRecord) -> BaseException:
    """A definite failure is raised again, as it was, so the re-run (or another execution
    of the same business key) takes the path its first sender's body took; sending it
    again could charge the card a body went past and another too. A failure that cannot
    be rebuilt as it was stops the delivery for an operator instead of another branch."""
    failure = rebuild_failure(record.failure)
    if failure is None:
        stored = record.failure if isinstance(record.failure, dict) else {}
        return OutboundCallFailureNotReplayableError(
            f"{p.call.name} failed definitely in an earlier delivery, which went past the "
            f"failure ({stored.get('type', 'unknown type')}); it cannot be raised again here "
            "as it was (its class is not imported, or will not take its arguments), so "
            "the body could take another path: an operator decides",
            **p.ref.fields(attempt=record.attempt),
        )
    log_event(
        OUTBOUND_CALL_FAILURE_REPLAYED,
        logging.INFO,
        "a definite failure is raised again, not resent",
        **p.ref.fields(attempt=record.attempt),
    )
    return failure_to_body(holder, p, record.attempt, failure)


def _resend_bound(holder: Holder, p: PreparedCall, record: IntentRecord) -> int | None:
    """The key-age bound of sending a ``FAILED`` intent again (design: key age). A definite
    failure moved no money: any age. One settled as never sent (an operator's
    ``--not-sent``, a cancel's proof) may have been sent after all; past the gateway's
    retention its resend would not be deduplicated, as for a reconcile's resend — unless
    the operator accepted that risk."""
    if record.failure is not None or resend_age_waived(record):
        return None
    if sabotage.active(NOT_SENT_RESEND_UNBOUNDED):
        return None
    return max_key_age_ms(p.call, holder.settings.attempt_timeout_ms)


def _claim_failed(holder: Holder, p: PreparedCall, record: IntentRecord) -> bool:
    """``(FAILED, attempt, retry_for) → (PENDING, attempt + 1, me)``: a definite failure
    moved no money, so the next attempt is sent under the same key without a lookup —
    by the execution a retry authorised, the authorisation consumed by the same
    compare-and-set (a hand-out to another execution that revoked it makes it miss).
    One settled as never sent is sent again only while its key is young enough; else it
    goes back to ``PENDING`` for an operator (key-too-old), as a reconcile's resend does."""
    me = holder.lease_ref
    bound = _resend_bound(holder, p, record)
    guard = IntentGuard(
        IntentStatus.FAILED, record.attempt, record.owner, retry_for=record.retry_for
    )
    with holder.fenced() as tx:
        holder.check_cancel(tx)  # the claim that authorises the send
        won = transition(
            tx,
            holder.settings.pseudonym_key,
            p.idempotency_key,
            replace(guard, max_key_age_ms=bound),
            IntentUpdate(
                status=IntentStatus.PENDING,
                attempt=record.attempt + 1,
                owner=me,
                start_attempt=True,
                not_sent_confirmed=False,
                retry_for=None,
                failure=None,  # this attempt's outcome replaces the failure it follows
                operator_reason=None,  # an operator's waiver covers one resend
                sent_by=holder.execution_id,
            ),
            HistoryEvent.CLAIMED,
            from_status=IntentStatus.FAILED,
            to_status=IntentStatus.PENDING,
            attempt=record.attempt + 1,
            owner=me,
            detail={"after": "definite-failure" if record.failure else "not-sent"},
            execution_id=holder.execution_id,
        )
        if won or bound is None:
            return won
        too_old = transition(
            tx,
            holder.settings.pseudonym_key,
            p.idempotency_key,
            guard,
            IntentUpdate(
                status=IntentStatus.PENDING,
                needs_operator=True,
                operator_reason="key-too-old",
                not_sent_confirmed=True,
            ),
            HistoryEvent.UNRECONCILED,
            from_status=IntentStatus.FAILED,
            to_status=IntentStatus.PENDING,
            attempt=record.attempt,
            owner=record.owner,
            detail={"reason": "key-too-old", "key_age_bound_ms": bound},
            execution_id=holder.execution_id,
        )
    if not too_old:
        return False  # moved by someone else: read again
    log_event(
        OUTBOUND_CALL_UNRECONCILED,
        logging.WARNING,
        "settled as never sent, but its key may have expired at the gateway: not resent",
        **p.ref.fields(attempt=record.attempt, reason="key-too-old"),
    )
    raise OutboundCallUnreconciledError(
        "this intent was settled as never sent, but its idempotency key is too old to send "
        "it again safely (key_age + attempt_timeout >= key_retention); an operator decides",
        **p.ref.fields(attempt=record.attempt, reason="key-too-old"),
    )


def _join(holder: Holder, p: PreparedCall, running: InFlightSend) -> tuple[Any, Outcome] | None:
    """Wait for this process's own send of the key; only an equal request may join (design: R16).
    The joiner relies on the result: written on a business-keyed record like a replay."""
    if running.fingerprint != p.fingerprint and not sabotage.active(JOIN_ON_ANY_FINGERPRINT):
        raise IdempotencyKeyConflictError(
            f"a call of {p.call.name!r} with another request is in flight under this key; "
            "nothing was sent",
            **p.ref.fields(),
        )
    if running.wait():
        if p.ref.handle is not None:
            with holder.fenced() as tx:
                relied = tx.rely_on(INTENT_RECORD, p.idempotency_key, holder.execution_id)
            if relied is Reliance.UNDONE:
                raise _compensated(holder, p)
        log_event(
            OUTBOUND_CALL_JOINED,
            logging.INFO,
            "joined the send in flight",
            **p.ref.fields(attempt=running.attempt),
        )
        return running.result, Outcome.JOINED
    return None  # it ended without a result: the store decides what comes next


__all__ = ["prepare_call", "run_outbound"]
