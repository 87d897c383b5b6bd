"""What an operator changes about an execution: re-drive, accept a divergence, cancel,
unpark, answer a pause. Each is refused while it could race a delivery that may
still send money, and leaves an audit row, written in the transaction of the change.
A FAILED or CANCELLED execution that left a payment behind is marked handled here."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from celery_agboss.core import sabotage
from celery_agboss.core.executions import (
    CANCELLED_AFTER_PAYMENT,
    REDRIVABLE_STATES,
    TERMINAL_STATES,
    Audit,
    ExecutionRecord,
    ExecutionState,
    WaitKind,
    execution_summary,
    wait_kind,
)
from celery_agboss.core.log_events import (
    OPERATOR_ACCEPTED,
    OPERATOR_CANCELLED,
    OPERATOR_PAUSE_ANSWERED,
    OPERATOR_PAUSE_ANSWERED_EARLY,
    OPERATOR_PAYMENTS_HANDLED,
    OPERATOR_REDRIVEN,
    OPERATOR_UNPARKED,
    log_event,
)
from celery_agboss.core.protections import (
    AUDIT_AFTER_THE_CHANGE,
    CANCEL_OF_AN_ENDED_EXECUTION_REPORTED,
    REDRIVE_NOW_IGNORES_NOT_BEFORE,
)
from celery_agboss.core.undo_task_marks import undo_task_accepted
from celery_agboss.operator.common import (
    _acting,
    _execution,
    _refuse,
    refused_if_newer,
    refusing_newer_states,
)
from celery_agboss.runtime.app_runtime import Runtime
from celery_agboss.runtime.messages import dumps, republish
from celery_agboss.runtime.task_events import send_revoked_event
from celery_agboss.store.cancels import paused_in_undo


def _audit_afterwards(
    runtime: Runtime, audit: Audit, target: str, before: ExecutionRecord | None, after: Any
) -> None:
    """Sabotage only (``AUDIT_AFTER_THE_CHANGE``): the audit row as it once was written,
    after the change, in a transaction of its own."""
    if sabotage.active(AUDIT_AFTER_THE_CHANGE) and isinstance(after, ExecutionRecord):
        runtime.executions.append_audit(
            audit.actor,
            audit.action,
            target,
            audit.reason,
            None if before is None else execution_summary(before),
            execution_summary(after),
        )


def _made(
    runtime: Runtime,
    audit: Audit,
    before: ExecutionRecord,
    after: ExecutionRecord | None,
    doing: str,
) -> ExecutionRecord:
    """``after``, the operator's change as the store made it; a ``conflict`` refusal when
    the store made none (the execution changed, or a delivery holds its lease)."""
    _audit_afterwards(runtime, audit, before.id, before, after)
    if after is None:
        raise _refuse(
            "conflict",
            f"execution {before.id} changed (or a delivery holds its "
            f"lease) while it was being {doing}; look at it again",
        )
    return after


def redrive_now(runtime: Runtime, execution_id: str, *, reason: str) -> bool:
    """Publish the execution's message again now (same id, arguments and options), by the
    same compare-and-set the sweep uses; False when it is not due for one (running under a
    live lease, terminal, waiting for an answer, a cancel is pending, or its
    ``not_before`` is still ahead).

    ``not_before`` is the execution's own time (design: re-driven when due): the retry its
    body asked for (a balance charged after a cooling-off), an undo's or a cancel's wait
    for another execution, or the spacing the sweep keeps while a message of it may still
    be queued. Published now, the body would run early (a charge the customer could still
    have cancelled), so such a row is left to the sweep, which publishes it then. The
    verbs that mean "now" (``redrive``, ``unpark``, an answered pause, a resolve's
    unblocked waiters) make the row due in their own transaction first. A message's own
    ETA (a publish with a countdown) is kept by ``republish`` either way."""
    record = runtime.executions.read_execution(execution_id)
    if record is None or record.state not in REDRIVABLE_STATES:
        return False
    if record.cancel_requested and record.state is not ExecutionState.COMPENSATING:
        return False  # the cancel ends it; undos running (or answered) go on, as the sweep's
    if _not_due(runtime, record):
        return False  # judged on the row the claim below compares (``updated_at_ms``)
    settings = runtime.settings
    decision = runtime.executions.claim_redrive(
        execution_id,
        record.updated_at_ms,
        settings.max_recovery_attempts,
        next_redrive_delay_ms=max(2 * max(settings.sweep_interval_ms, 1000), settings.lease_ttl_ms),
    )
    if not decision.republish or decision.execution is None:
        return False
    message = decision.execution
    if message.started_at_ms is not None:
        message = replace(message, expires_ms=None)
    republish(runtime.app, message, not_before_ms=None)
    log_event(OPERATOR_REDRIVEN, execution_id=execution_id, task=record.task_name, reason=reason)
    return True


def _not_due(runtime: Runtime, record: ExecutionRecord) -> bool:
    """``record``'s ``not_before`` is later than now on the database's clock (design: A3)."""
    if record.not_before_ms is None or sabotage.active(REDRIVE_NOW_IGNORES_NOT_BEFORE):
        return False
    return record.not_before_ms > runtime.store.now_ms()


def _after_answer(
    runtime: Runtime, idempotency_key: str, note: str
) -> tuple[ExecutionRecord | None, bool, list[str]]:
    """An intent was settled by a person: every execution that waited for it (its creator,
    and any that replayed, joined or took it over) goes on (design: waiters re-driven).
    The creator's record, whether it was published again, and every execution published
    again (the creator's alone would hide the others the answer sent on)."""
    waiting = runtime.executions.executions_waiting_on(idempotency_key)
    republished: dict[str, bool] = {}
    for execution_id in waiting:
        record = runtime.executions.read_execution(execution_id)
        if record is None or record.state in TERMINAL_STATES:
            continue
        runtime.executions.unblock(execution_id, note, reset_recovery_count=True)
        republished[execution_id] = redrive_now(runtime, execution_id, reason=note)
    sent_on = [execution_id for execution_id, again in republished.items() if again]
    creator = waiting[0] if waiting else None
    if creator is None:
        return None, False, sent_on
    return runtime.executions.read_execution(creator), republished.get(creator, False), sent_on


@refusing_newer_states
def redrive(app: Any, execution_id: str, reason: str, *, actor: str | None = None) -> bool:
    """Send a ``WAITING_OPERATOR`` execution on when nothing is left for a person to
    decide (every intent it created or used is settled): ``WAITING`` and published again
    now, its recovery count reset. Refused while an intent still needs an operator
    (resolve it instead), after a cancel that came when a payment had completed (cancel
    it), or while it runs. True when it was published again."""
    why, who, runtime = _acting(app, reason, actor)
    record = _execution(
        runtime, execution_id, "the waiting ones with `celery -A proj agboss pending`"
    )
    if record.state is not ExecutionState.WAITING_OPERATOR:
        raise _refuse(
            "wrong-state",
            f"execution {execution_id} is {record.state.value}; only "
            "one waiting for an operator is re-driven by hand (PARKED: `unpark`)",
        )
    kind = wait_kind(record.reason)
    if kind is WaitKind.CANCELLED_AFTER_PAYMENT:
        raise _refuse(
            "wrong-state",
            f"execution {execution_id} was {CANCELLED_AFTER_PAYMENT}: "
            "refund it at the gateway if needed, then `celery -A proj agboss cancel "
            f"{execution_id} --payments-handled --reason TEXT`",
        )
    if kind is WaitKind.DIVERGENCE:
        raise _refuse(
            "wrong-state",
            f"execution {execution_id} diverged: a re-run would "
            "diverge again. Deal with what the old path charged, then `celery -A "
            f"proj agboss accept {execution_id} --reason TEXT`",
        )
    keys = runtime.executions.intents_needing_operator(execution_id)
    if keys:
        raise _refuse(
            "pending-intent",
            f"execution {execution_id} waits for these intents: "
            f"{', '.join(keys)}; look each up at the gateway and `resolve` it (the "
            "execution then goes on by itself)",
        )
    audit = Audit(who, "redrive", why)
    moved = runtime.executions.unblock(
        execution_id, f"re-driven by {who}: {why}", reset_recovery_count=True, audit=audit
    )
    _made(runtime, audit, record, moved, "re-driven")
    return redrive_now(runtime, execution_id, reason=f"re-driven by {who}")


@refusing_newer_states
def accept(app: Any, execution_id: str, reason: str, *, actor: str | None = None) -> bool:
    """Accept a divergence (design: divergence): a re-run's body no longer reached a call an earlier
    delivery made and that completed (or may have). Once what that old path charged is
    dealt with at the gateway (refunded, or kept), the execution ``COMPLETED`` with the
    result its body returned, and is published again so that a delivery hands it to the
    result backend and its links. Refused while an intent of it is pending (resolve it
    first) or a delivery runs it. True when it was published again. An undo's task
    accepted has finished its undo, as one whose body returned: its parent's step may
    read undone from then on, and a later click pay anew (accept it once the refund is
    made)."""
    why, who, runtime = _acting(app, reason, actor)
    record = _execution(
        runtime, execution_id, "the waiting ones with `celery -A proj agboss pending`"
    )
    if (
        record.state is not ExecutionState.WAITING_OPERATOR
        or wait_kind(record.reason) is not WaitKind.DIVERGENCE
    ):
        raise _refuse(
            "wrong-state",
            f"execution {execution_id} is {record.state.value} "
            f"({record.reason or 'no reason'}), not waiting for a divergence",
        )
    pending = runtime.executions.pending_intent_keys(execution_id)
    if pending:
        raise _refuse(
            "pending-intent",
            f"execution {execution_id} has a PENDING intent "
            f"({', '.join(pending)}): settle it first (`agboss resolve`)",
        )
    audit = Audit(who, "accept-divergence", why)
    settings = runtime.engine_settings
    accepted = runtime.executions.accept_divergence(
        execution_id,
        f"accepted by {who}: {why}",
        audit=audit,
        completed=lambda tx, after: undo_task_accepted(tx, settings, after),
    )
    accepted = _made(runtime, audit, record, accepted, "accepted")
    log_event(OPERATOR_ACCEPTED, execution_id=execution_id, actor=who)
    republish(runtime.app, replace(accepted, expires_ms=None), not_before_ms=None)
    return True


def _refuse_a_cancel_now(runtime: Runtime, record: ExecutionRecord) -> None:
    """A cancel's refusals while something else must end first: its undos running, a
    payment that may be in flight, a delivery holding its lease."""
    if record.state is ExecutionState.COMPENSATING:
        raise _refuse(
            "wrong-state",
            f"execution {record.id} is running its undos (COMPENSATING), which a "
            "cancel cannot stop: once they are done it ends FAILED (undone after a "
            "failure) or CANCELLED (undone for a cancel)",
        )
    if paused_in_undo(runtime.store, record):
        raise _refuse(
            "wrong-state",
            f"execution {record.id} is running its undos (PAUSED inside one, for the "
            "answer to its pause), which a cancel cannot stop: answer the pause "
            "(`agboss pauses`); once they are done it ends FAILED (undone after a failure) "
            "or CANCELLED (undone for a cancel)",
        )
    pending = runtime.executions.pending_intent_keys(record.id)
    if pending:
        raise _refuse(
            "pending-intent",
            f"execution {record.id} has a PENDING intent ({', '.join(pending)}): the "
            "payment may have been made. Settle it first — the sweep reconciles it, or "
            "`celery -A proj agboss resolve KEY --completed RESULT_JSON | --not-sent --reason "
            "TEXT` — then cancel again",
        )
    lease = runtime.store.read_lease(record.id)
    if lease is not None and lease.live:
        raise _refuse(
            "lease-live",
            f"execution {record.id} is running now (holder {lease.holder}, token "
            f"{lease.token}); wait for it to end, or revoke it (app.control.revoke(id)): "
            "its next outbound call or fenced effect then stops it",
        )


@refusing_newer_states
def cancel(
    app: Any,
    execution_id: str,
    reason: str,
    *,
    actor: str | None = None,
    payments_handled: bool = False,
) -> ExecutionRecord:
    """Stop an execution that is not running: a ``REQUESTED`` or waiting execution becomes
    ``CANCELLED`` and never runs. Refused while it has a pending intent (the payment may
    have been made: settle it first), while a delivery runs it under a live lease, or
    while its undos run (``COMPENSATING``, or ``PAUSED`` inside one): a cancel cannot
    stop them.

    One that completed an outbound call (money moved) is never silently cancelled: it
    waits for an operator, "cancelled after a completed payment", until the call is
    dealt with at the gateway (a refund, or nothing) and ``payments_handled=True``
    (``--payments-handled``) confirms the cancel. That confirmation covers its payments
    only: their undos are never run after it (the refund made by hand is not made again),
    while undos of its fenced effects not run yet (a wallet it debited) still run first
    (``COMPENSATING``); its payment steps stay claimed, never read undone nor replayed
    as paid (``core.handled_steps``). It is kept on the row with the cancel's end, or
    refused with nothing written when a delivery took the lease (or an intent became
    pending) after the checks below, or while a refund's undo task of it is published
    and not ended (``store.undo_tasks_running``: it may still refund). The Django admin's
    checkbox comes here too (``store.cancels``)."""
    why, who, runtime = _acting(app, reason, actor)
    executions = runtime.executions
    record = _execution(runtime, execution_id, "them with `celery -A proj agboss executions`")
    if record.state is ExecutionState.CANCELLED:
        return record
    if record.state in TERMINAL_STATES:
        raise _refuse(
            "wrong-state",
            f"execution {execution_id} is already {record.state.value}; there is nothing to cancel",
        )
    _refuse_a_cancel_now(runtime, record)
    audit = Audit(who, "cancel:payments-handled" if payments_handled else "cancel", why)
    updated = executions.request_cancel(
        execution_id, why, payments_handled=payments_handled, audit=audit
    )
    assert updated is not None
    if (
        updated.state in TERMINAL_STATES
        and updated.state is not ExecutionState.CANCELLED
        and not sabotage.active(CANCEL_OF_AN_ENDED_EXECUTION_REPORTED)
    ):
        raise _refuse(  # its delivery ended between the checks above and the store's lock
            "wrong-state",
            f"execution {execution_id} ended {updated.state.value} while the cancel was "
            "being checked; nothing was cancelled (`celery -A proj agboss show "
            f"{execution_id}`: a payment it made stands until you refund it)",
        )
    _audit_afterwards(runtime, audit, execution_id, record, updated)
    log_event(OPERATOR_CANCELLED, execution_id=execution_id, state=updated.state.value, actor=who)
    if updated.state is ExecutionState.CANCELLED:
        send_revoked_event(runtime.app, execution_id, ExecutionState.CANCELLED)
    return updated


@refusing_newer_states
def payments_handled(
    app: Any, execution_id: str, reason: str, *, actor: str | None = None
) -> ExecutionRecord:
    """Say that the payment a ``FAILED`` or ``CANCELLED`` execution left behind ("failed
    after a payment", listed by ``agboss pending``) is dealt with: refunded at the
    gateway, or kept on purpose. Nothing is sent; ``pending`` stops listing it."""
    why, who, runtime = _acting(app, reason, actor)
    record = _execution(runtime, execution_id, "them with `celery -A proj agboss pending`")
    if record.state not in (ExecutionState.FAILED, ExecutionState.CANCELLED):
        raise _refuse(
            "wrong-state",
            f"execution {execution_id} is {record.state.value}: only a FAILED or CANCELLED "
            "execution that left a payment behind is marked handled (a waiting one: "
            "`agboss cancel ID --payments-handled`)",
        )
    audit = Audit(who, "payments-handled", why)
    marked = runtime.executions.mark_payments_handled(execution_id, audit=audit)
    _audit_afterwards(runtime, audit, execution_id, record, marked)
    if marked is None:
        raise _refuse("conflict", f"execution {execution_id} changed; look at it again")
    log_event(OPERATOR_PAYMENTS_HANDLED, execution_id=execution_id, actor=who)
    return marked


@dataclass(frozen=True)
class UnparkResult:
    execution: ExecutionRecord
    republished: bool


@refusing_newer_states
def unpark(app: Any, execution_id: str, reason: str, *, actor: str | None = None) -> UnparkResult:
    """Give a ``PARKED`` execution (recovery cap reached) another go: its recovery count
    starts again from zero and its message is published again now."""
    why, who, runtime = _acting(app, reason, actor)
    record = _execution(
        runtime,
        execution_id,
        "the parked ones with `celery -A proj agboss executions --state PARKED`",
    )
    if record.state is not ExecutionState.PARKED:
        raise _refuse(
            "wrong-state",
            f"execution {execution_id} is {record.state.value}, not "
            "PARKED; only a parked execution can be unparked",
        )
    moved = runtime.executions.move(
        execution_id,
        [ExecutionState.PARKED],
        ExecutionState.WAITING,
        f"unparked by {who}: {why}",
        not_before_delay_ms=0,
        reset_recovery_count=True,
        planned=True,
        audit=(audit := Audit(who, "unpark", why)),
    )
    moved = _made(runtime, audit, record, moved, "unparked")
    log_event(OPERATOR_UNPARKED, execution_id=execution_id, actor=who)
    republished = redrive_now(runtime, execution_id, reason=f"unparked by {who}")
    final = runtime.executions.read_execution(execution_id) or moved
    return UnparkResult(final, republished)


def answer_pause(app: Any, pause_id: str, answer: Any, *, actor: str | None = None) -> bool:
    """Answer a pause once and publish its task again; a second answer raises
    ``NotPausedError`` and moves nothing (design: PS11), also when answers race on several
    processes, and so does an answer to a pause whose execution no longer waits for it
    (cancelled, ended). ``pause_id`` is ``"<execution id>:<name>"``, as
    ``celery -A proj agboss pauses`` lists it. With ``actor`` (an operator's answer, as
    ``agboss answer-pause`` gives) the answer goes into the audit trail.

    An answer that comes before the body stored its pause is kept for it, once, while the
    execution is not terminal (design: early answers); a pause declared with
    ``accept_early=True`` takes it. ``NotPausedError`` with ``found=False``: no such
    execution.

    True when the task was published again now; False when the answer was kept early,
    when the delivery that paused still held its lease (it publishes the task when it
    lets go), or when the publish must be left to the sweep."""
    return answer_pause_outcome(app, pause_id, answer, actor=actor).republished


@dataclass(frozen=True)
class PauseAnswerOutcome:
    """What one answer did: ``early``, kept for a pause the body has not reached yet;
    ``republished``, the task was published again now."""

    early: bool
    republished: bool


def answer_pause_outcome(
    app: Any, pause_id: str, answer: Any, *, actor: str | None = None
) -> PauseAnswerOutcome:
    """``answer_pause``, saying also whether the answer was kept early (what
    ``agboss answer-pause`` prints)."""
    runtime = Runtime.of(app)
    stored = _answer_text(pause_id, answer)
    audit = None if actor is None else Audit(actor, "answer-pause", f"pause {pause_id} answered")
    try:
        answered = runtime.executions.answer_pause(pause_id, stored, audit=audit)
    except ValueError as error:  # read under its lock, before the answer is written
        refused_if_newer(app, _paused_execution(runtime, pause_id), error)
    record = answered.record
    if audit is not None:
        _audit_afterwards(runtime, audit, record.id, None, record)
    if answered.early:
        log_event(OPERATOR_PAUSE_ANSWERED_EARLY, execution_id=record.id, pause=pause_id)
        return PauseAnswerOutcome(early=True, republished=False)
    log_event(OPERATOR_PAUSE_ANSWERED, execution_id=record.id, pause=pause_id)
    republished = redrive_now(runtime, record.id, reason=f"pause {pause_id} answered")
    return PauseAnswerOutcome(early=False, republished=republished)


def _answer_text(pause_id: Any, answer: Any) -> str:
    """The answer as stored (JSON), after the two arguments are checked: a wrong one is
    refused by name here, not by whatever inside first trips over it."""
    if not isinstance(pause_id, str):
        raise TypeError(
            "pause_id must be the text '<execution id>:<name>' (as `celery -A proj agboss "
            f"pauses` lists it), not {pause_id!r}"
        )
    try:
        return dumps(answer)
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"answer must be a value JSON can carry (text, numbers, lists, dicts, dates, "
            f"decimals...), not {type(answer).__name__}: {exc}"
        ) from None


def _paused_execution(runtime: Runtime, pause_id: str) -> str:
    """The execution of ``pause_id``: its stored row's, else the part of the id before
    its last ``:`` (as ``store.pauses`` reads an answer that comes early)."""
    found = runtime.executions.read_pauses(pause_id=pause_id, shown_unopened=True)
    return found[0].execution_id if found else pause_id.rpartition(":")[0]
