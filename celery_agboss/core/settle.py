"""Send one claimed attempt and settle what came back (design: send, settle).

The send runs in a worker thread bounded by ``attempt_timeout``; the lease is checked
on the holder's clocks immediately before it, nothing awaited in between. A result
is settled by ``(PENDING, attempt, me) → COMPLETED``; a definite failure by
``→ FAILED`` and re-raised; anything else (an error of unknown outcome, a timeout, a
lost lease) leaves the intent PENDING, recorded as such, for reconcile (design: R25). A wait
interrupted while the send runs (a signal, a soft time limit) settles nothing: the
holder's ``send_interrupted`` keeps the lease alive under the send (design: R18, R23).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, NoReturn

from celery_agboss.core import fault_points, sabotage
from celery_agboss.core.failures import encode_failure, field_mask
from celery_agboss.core.history import HistoryEvent
from celery_agboss.core.inflight import IN_FLIGHT, BoundedRun, InFlightSend, RunState, run_bounded
from celery_agboss.core.log_events import (
    OUTBOUND_CALL_ANSWERED_AFTER_HAND_OVER,
    OUTBOUND_CALL_FAILED,
    OUTBOUND_CALL_HISTORY_NOT_WRITTEN,
    OUTBOUND_CALL_OUTCOME_UNKNOWN,
    OUTBOUND_CALL_SENT,
    OUTBOUND_CALL_SUPERSEDED,
    log_event,
)
from celery_agboss.core.lookup import completed_update
from celery_agboss.core.outbound import CallContext, Outcome
from celery_agboss.core.prepared import (
    Holder,
    PreparedCall,
    failure_to_body,
    holder_transition,
    holder_transition_in_one,
)
from celery_agboss.core.protections import (
    SEND_NOT_BOUNDED,
    SEND_WITHOUT_LEASE_CHECK,
    SUPERSEDED_SILENTLY_REPORTED,
    UNKNOWN_ERRORS_ARE_DEFINITE,
)
from celery_agboss.core.store_protocol import (
    INTENT_RECORD,
    JSON,
    IntentStatus,
    IntentUpdate,
)
from celery_agboss.core.transitions import (
    error_detail,
    fault,
    masked_text,
    policy_of,
)
from celery_agboss.errors import (
    ExecutionFencedError,
    OutboundCallOutcomeUnknownError,
    OutboundCallResultNotStoredError,
    StoreError,
)

UNBOUNDED_SEND_S = 365 * 86400.0
"""The "bound" of a send when the protection (design: R22) is switched off (tests only)."""


def send_and_settle(
    holder: Holder, p: PreparedCall, attempt: int, *, after_possible_send: bool = False
) -> tuple[Any, Outcome]:
    """Send ``attempt`` (already claimed by this holder) and settle what came back;
    ``after_possible_send`` as ``CallContext`` has it."""
    me = holder.lease_ref
    timeout_s = holder.settings.attempt_timeout_ms / 1000
    if sabotage.active(SEND_NOT_BOUNDED):
        timeout_s = UNBOUNDED_SEND_S
    entry = InFlightSend(
        p.idempotency_key, me, attempt, p.fingerprint, time.monotonic() + timeout_s
    )
    IN_FLIGHT.begin(entry)
    try:
        fault(fault_points.OUTBOUND_BEFORE_SEND, me, p.ref, attempt=attempt)
        if not sabotage.active(SEND_WITHOUT_LEASE_CHECK):
            try:
                holder.assert_can_send()
            except ExecutionFencedError:
                log_event(
                    OUTBOUND_CALL_SUPERSEDED,
                    logging.WARNING,
                    "the lease was lost before the send; nothing sent",
                    **p.ref.fields(attempt=attempt),
                )
                raise
        context = CallContext(
            p.idempotency_key, p.request, attempt, p.call.name, after_possible_send
        )
        started: list[BoundedRun] = []

        def before_start(run: BoundedRun) -> None:
            holder.send_started(run)  # refuses (nothing sent) once released or interrupted
            started.append(run)

        try:
            run = run_bounded(
                f"send:{p.call.name}",
                p.call.send,
                context,
                timeout_s,
                on_late=_late_answer_logger(p, attempt),
                before_start=before_start,
            )
            state = run.wait()
        except BaseException:
            # A signal, a soft time limit, a shutdown while the send may be on the wire:
            # the send goes on in its thread, so the lease must outlive it (design: R18, R23).
            if started:
                holder.send_interrupted(started[0])
            raise
        fault(fault_points.OUTBOUND_AFTER_SEND, me, p.ref, attempt=attempt, outcome=state.value)
        if state is RunState.RETURNED:
            result = settle_result(holder, p, attempt, run.result)
            entry.finish(succeeded=True, result=result)
            return result, Outcome.SENT
        if state is RunState.RAISED:
            assert run.error is not None
            settle_error(holder, p, attempt, run.error)
        record_unknown(holder, p, attempt, {"reason": "attempt-timeout"})
        holder.send_overran(run)
        log_event(
            OUTBOUND_CALL_OUTCOME_UNKNOWN,
            logging.WARNING,
            "the send overran attempt_timeout; the lease is no longer renewed",
            **p.ref.fields(attempt=attempt),
        )
        raise OutboundCallOutcomeUnknownError(
            "the send did not answer within attempt_timeout; it will be reconciled",
            **p.ref.fields(attempt=attempt),
        )
    finally:
        if not entry.finished.is_set():
            entry.finish(succeeded=False)
        IN_FLIGHT.end(entry)


def _late_answer_logger(p: PreparedCall, attempt: int) -> Callable[[BoundedRun], None]:
    def on_late(run: BoundedRun) -> None:
        log_event(
            OUTBOUND_CALL_ANSWERED_AFTER_HAND_OVER,
            logging.WARNING,
            "a send that overran attempt_timeout answered; nothing stored",
            **p.ref.fields(attempt=attempt, raised=run.error is not None),
        )

    return on_late


def settle_result(holder: Holder, p: PreparedCall, attempt: int, result: Any) -> Any:
    """``(PENDING, attempt, me) → COMPLETED``; a miss is success only if my attempt completed."""
    stored_ok, update, gateway_id = completed_update(p.call, result, found_by_lookup=False)
    fault(fault_points.OUTBOUND_BEFORE_SETTLE, holder.lease_ref, p.ref, attempt=attempt)
    shared = p.ref.handle is not None and stored_ok  # its result is handed to me now
    update = replace(update, rely=shared)
    event = HistoryEvent.COMPLETED if stored_ok else HistoryEvent.RESULT_NOT_STORED
    try:
        settled = _settle(
            holder,
            p,
            attempt,
            update,
            event,
            {"gateway_transaction_id": gateway_id},
            to_status=IntentStatus.COMPLETED,
            relied=shared,
        )
    except ExecutionFencedError:
        return _handed_over(p, attempt, result)
    except StoreError as exc:
        log_event(
            OUTBOUND_CALL_OUTCOME_UNKNOWN,
            logging.WARNING,
            "the store failed while settling; the intent will be reconciled",
            **p.ref.fields(attempt=attempt),
        )
        raise OutboundCallOutcomeUnknownError(
            "the gateway answered but the store failed while recording it; it will be reconciled",
            **p.ref.fields(attempt=attempt),
        ) from exc
    if not settled:
        return _handed_over(p, attempt, result)
    log_event(
        OUTBOUND_CALL_SENT,
        logging.INFO,
        "sent and settled",
        **p.ref.fields(attempt=attempt, gateway_transaction_id=gateway_id),
    )
    if not stored_ok:
        raise OutboundCallResultNotStoredError(
            "the call completed but its result could not be stored; an operator must supply it",
            **p.ref.fields(attempt=attempt),
        )
    return result


def _settle(
    holder: Holder,
    p: PreparedCall,
    attempt: int,
    update: IntentUpdate,
    event: HistoryEvent,
    detail: JSON,
    *,
    to_status: IntentStatus,
    relied: bool = False,
) -> bool:
    """``(PENDING, attempt, me) → to_status``: one statement where the store has one, else
    a fenced transaction (with the record use marked relied, when ``relied``). True when
    the intent now holds this attempt's outcome: written here, or already written by this
    attempt and owner (a miss that finds its own write is no hand-over). False: the
    attempt was handed over."""
    me = holder.lease_ref
    if holder_transition_in_one(
        holder, p, me, attempt, update, event, detail, to_status=to_status, relied=relied
    ):
        return True
    with holder.fenced(engine_only=True) as tx:
        if holder_transition(
            tx, holder, p, me, attempt, update, event, detail, to_status=to_status
        ):
            if relied:
                tx.rely_on(INTENT_RECORD, p.idempotency_key, holder.execution_id, counted=True)
            return True
        now = tx.read_intent(p.idempotency_key)
    return (
        now is not None and now.status is to_status and now.attempt == attempt and now.owner == me
    )


def _handed_over(p: PreparedCall, attempt: int, result: Any) -> Any:
    """The answer came after the attempt was handed over: stored nowhere, reported (design: R20)."""
    log_event(
        OUTBOUND_CALL_ANSWERED_AFTER_HAND_OVER,
        logging.WARNING,
        "the attempt was handed over before its answer was stored; nothing stored",
        **p.ref.fields(attempt=attempt),
    )
    if sabotage.active(SUPERSEDED_SILENTLY_REPORTED):
        return result
    log_event(
        OUTBOUND_CALL_SUPERSEDED,
        logging.WARNING,
        "this delivery's attempt was superseded",
        **p.ref.fields(attempt=attempt),
    )
    raise ExecutionFencedError(
        "the lease was handed over while the call was in flight; the new holder reconciles it",
        **p.ref.fields(attempt=attempt),
    )


def settle_error(holder: Holder, p: PreparedCall, attempt: int, exc: BaseException) -> NoReturn:
    """A definite failure becomes FAILED and is re-raised; anything else stays PENDING
    (design: R25)."""
    if sabotage.active(UNKNOWN_ERRORS_ARE_DEFINITE):
        definite = True
    else:
        try:
            definite = p.call.is_definite_failure(exc) is True
        except Exception:
            definite = False  # a classifier that fails classifies nothing as definite (design: A15)
    detail = error_detail(p.call, exc)
    if not definite:
        record_unknown(holder, p, attempt, {"reason": "send-raised", **detail})
        log_event(
            OUTBOUND_CALL_OUTCOME_UNKNOWN,
            logging.WARNING,
            "send raised an error of unknown outcome; it will be reconciled",
            **p.ref.fields(attempt=attempt, error_type=detail["error_type"]),
        )
        raise OutboundCallOutcomeUnknownError(
            "send raised an error that is not a definite failure; it will be reconciled",
            **p.ref.fields(attempt=attempt),
        ) from exc
    failure = encode_failure(
        exc, lambda text: masked_text(p.call, text), field_mask(policy_of(p.call))
    )
    update = IntentUpdate(
        status=IntentStatus.FAILED, failure=failure, retry_for=None, failure_shared=False
    )
    event = HistoryEvent.FAILED_DEFINITE
    try:
        settled = _settle(holder, p, attempt, update, event, detail, to_status=IntentStatus.FAILED)
    except ExecutionFencedError as fenced:
        _handed_over_error(p, attempt, fenced)
    except StoreError as store_error:
        raise OutboundCallOutcomeUnknownError(
            "a definite failure could not be recorded; the intent will be reconciled",
            **p.ref.fields(attempt=attempt),
        ) from store_error
    if not settled:
        _handed_over_error(p, attempt, None)
    log_event(
        OUTBOUND_CALL_FAILED,
        logging.INFO,
        "definite failure recorded",
        **p.ref.fields(attempt=attempt, error_type=detail["error_type"]),
    )
    raise failure_to_body(holder, p, attempt, exc)


def _handed_over_error(p: PreparedCall, attempt: int, cause: BaseException | None) -> NoReturn:
    log_event(
        OUTBOUND_CALL_ANSWERED_AFTER_HAND_OVER,
        logging.WARNING,
        "a definite failure arrived after the attempt was handed over; nothing stored",
        **p.ref.fields(attempt=attempt),
    )
    raise ExecutionFencedError(
        "the lease was handed over while the call was in flight; the new holder reconciles it",
        **p.ref.fields(attempt=attempt),
    ) from cause


def record_unknown(holder: Holder, p: PreparedCall, attempt: int, detail: JSON) -> None:
    """Quarantine record of an unknown outcome (best effort: the intent is PENDING anyway)."""
    me = holder.lease_ref
    try:
        with holder.fenced() as tx:
            holder_transition(
                tx, holder, p, me, attempt, IntentUpdate(), HistoryEvent.OUTCOME_UNKNOWN, detail
            )
    except (ExecutionFencedError, StoreError) as exc:
        log_event(
            OUTBOUND_CALL_HISTORY_NOT_WRITTEN,
            logging.WARNING,
            "the unknown outcome could not be recorded in history; the intent stays PENDING",
            **p.ref.fields(attempt=attempt, error_type=type(exc).__name__),
        )


__all__ = ["record_unknown", "send_and_settle"]
