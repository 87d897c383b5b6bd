"""What an operator may do, in Python (``celery -A proj agboss …`` calls the same functions).

Every action is refused (``OperatorRefusedError``, nothing changed) while it could race
with a delivery that may still send money: an intent whose owner's lease is live, an
execution running under a live lease, a cancel while a payment's outcome is unknown.
Every change is a compare-and-set and leaves an audit row (who, when, why, before and
after); ``resolve`` writes its audit row in the same transaction as the change.
"""

from __future__ import annotations

import getpass
import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from celery_agboss.core import sabotage
from celery_agboss.core.executions import (
    CANCELLED_AFTER_PAYMENT,
    DIVERGENCE,
    REDRIVABLE_STATES,
    TERMINAL_STATES,
    AuditEntry,
    ExecutionRecord,
    ExecutionState,
)
from celery_agboss.core.history import HistoryEvent
from celery_agboss.core.log_events import (
    OPERATOR_ACCEPTED,
    OPERATOR_CANCELLED,
    OPERATOR_PAUSE_ANSWERED,
    OPERATOR_REDRIVEN,
    OPERATOR_RESOLVED,
    OPERATOR_UNPARKED,
    log_event,
)
from celery_agboss.core.outbound import OutboundCall
from celery_agboss.core.store import (
    HistoryRow,
    IntentGuard,
    IntentRecord,
    IntentStatus,
    IntentUpdate,
    LeaseState,
)
from celery_agboss.core.transitions import mask_result, transaction_id_of, transition
from celery_agboss.errors import OperatorRefusedError
from celery_agboss.messages import dumps, republish
from celery_agboss.runtime import Runtime, runtime_of
from celery_agboss.store import sweep_queries as q
from celery_agboss.task_events import send_task_event

logger = logging.getLogger("celery_agboss")

_NO_RESULT = object()

OPERATOR_RESULT_UNCHECKED = sabotage.register("operator-result-unchecked")
"""Sabotage: ``resolve --completed`` stores whatever JSON it is given (a bare charge id
pasted from the dashboard); the next delivery replays it into a body that expected the
receipt, and fails there."""


def _agboss(app: Any) -> Runtime:
    return runtime_of(app)


def default_actor() -> str:
    """Who is acting: the OS user (what the audit row records unless told otherwise)."""
    try:
        return getpass.getuser()
    except Exception:  # no passwd entry (containers): the uid still identifies someone
        return os.environ.get("USER") or f"uid:{os.getuid()}"


def _refuse(code: str, message: str, **fields: Any) -> OperatorRefusedError:
    return OperatorRefusedError(message, code=code, **fields)


def _execution(agboss: Runtime, execution_id: str, listing: str) -> ExecutionRecord:
    """The execution an operator named, or a not-found refusal saying how to list them."""
    record = agboss.executions.read_execution(execution_id)
    if record is None:
        raise _refuse("not-found", f"no execution has the id {execution_id!r}; list {listing}")
    return record


def _require_reason(reason: str) -> str:
    text = (reason or "").strip()
    if not text:
        raise _refuse("bad-input", "a reason is required: say why, it goes into the audit trail")
    return text


# --- reading -------------------------------------------------------------------------


def list_pending(app: Any, *, operator_only: bool = False, limit: int = 100) -> list[IntentRecord]:
    """Intents that may have been sent and are not settled (and completed ones whose result
    could not be stored), the ones waiting for an operator first."""
    return q.list_pending_intents(_agboss(app).store, limit=limit, operator_only=operator_only)


def list_executions(
    app: Any,
    *,
    states: Sequence[ExecutionState] | None = None,
    limit: int = 100,
    after_id: str | None = None,
) -> list[ExecutionRecord]:
    """Executions by id (``after_id`` pages), optionally only those in ``states``."""
    return _agboss(app).executions.list_executions(states or None, limit=limit, after_id=after_id)


@dataclass(frozen=True)
class Description:
    """Everything known about one execution, or about the execution of one intent."""

    execution: ExecutionRecord | None
    lease: LeaseState | None
    intents: list[IntentRecord]
    history: dict[str, list[HistoryRow]]
    audit: list[AuditEntry]
    focus: str | None  # the idempotency key asked for, when one was


def describe(app: Any, key_or_id: str) -> Description:
    """An idempotency key or an execution (task) id: the execution, its lease, its intents
    with their history, and the audit trail."""
    agboss = _agboss(app)
    store = agboss.store
    intent = store.read_intent(key_or_id)
    execution_id = intent.execution_id if intent is not None else key_or_id
    execution = agboss.executions.read_execution(execution_id)
    if intent is None and execution is None:
        raise _refuse(
            "not-found",
            f"no intent and no execution is named {key_or_id!r}; list them with "
            "`celery -A proj agboss pending` or `… agboss executions`",
        )
    intents = q.list_intents_of(store, execution_id) if execution is not None else [intent]
    intents = [i for i in intents if i is not None]
    audit = agboss.executions.list_audit(execution_id, limit=50)
    for item in intents:
        audit += agboss.executions.list_audit(item.idempotency_key, limit=50)
    audit.sort(key=lambda entry: entry.id)
    return Description(
        execution=execution,
        lease=store.read_lease(execution_id) if execution is not None else None,
        intents=intents,
        history={i.idempotency_key: store.read_history(i.idempotency_key) for i in intents},
        audit=audit,
        focus=intent.idempotency_key if intent is not None else None,
    )


# --- re-driving ----------------------------------------------------------------------


def redrive_now(agboss: Runtime, execution_id: str, *, reason: str) -> bool:
    """Publish the execution's message again now (same id, arguments and options), by the
    same compare-and-set the sweep uses; False when it is not due for one (running under a
    live lease, terminal, waiting for an answer, or a cancel is pending)."""
    record = agboss.executions.read_execution(execution_id)
    if record is None or record.state not in REDRIVABLE_STATES or record.cancel_requested:
        return False
    settings = agboss.settings
    decision = agboss.executions.claim_redrive(
        execution_id,
        record.updated_at_ms,
        settings.max_recovery_attempts,
        next_redrive_delay_ms=max(
            2 * round(max(settings.sweep_interval_seconds, 1.0) * 1000), settings.lease_ttl_ms
        ),
    )
    if not decision.republish or decision.execution is None:
        return False
    message = decision.execution
    if message.started_at_ms is not None:
        message = replace(message, expires_ms=None)
    republish(agboss.app, message, not_before_ms=None)
    log_event(OPERATOR_REDRIVEN, execution=execution_id, task=record.task_name, reason=reason)
    return True


def _after_answer(
    agboss: Runtime, idempotency_key: str, note: str
) -> tuple[ExecutionRecord | None, bool]:
    """An intent was settled by a person: every execution that waited for it (its creator,
    and any that replayed, joined or took it over) goes on. The creator's record and
    whether it was published again are returned."""
    waiting = agboss.executions.executions_waiting_on(idempotency_key)
    republished: dict[str, bool] = {}
    for execution_id in waiting:
        record = agboss.executions.read_execution(execution_id)
        if record is None or record.state in TERMINAL_STATES:
            continue
        agboss.executions.unblock(execution_id, note, reset_recovery_count=True)
        republished[execution_id] = redrive_now(agboss, execution_id, reason=note)
    creator = waiting[0] if waiting else None
    if creator is None:
        return None, False
    return agboss.executions.read_execution(creator), republished.get(creator, False)


# --- waits for an operator ----------------------------------------------------------


@dataclass(frozen=True)
class OperatorWait:
    """An execution waiting for a person, and the command that ends the wait."""

    execution: ExecutionRecord
    intents: list[str]  # keys of the intents (created or used) that need an operator
    ends_with: str  # the command that ends it


def list_waits(app: Any, *, limit: int = 100) -> list[OperatorWait]:
    """Every ``WAITING_OPERATOR`` execution with what ends its wait: ``resolve`` of the
    intents it waits for, ``cancel --payments-handled`` after a cancel that came when a
    payment had completed, or ``redrive`` when nothing is left to decide. A wait nobody
    can end is never listed: there is always one of these."""
    agboss = _agboss(app)
    waits = []
    for record in agboss.executions.list_executions([ExecutionState.WAITING_OPERATOR], limit=limit):
        keys = agboss.executions.intents_needing_operator(record.id)
        if (record.reason or "").startswith(CANCELLED_AFTER_PAYMENT):
            ends = (
                f"celery -A proj agboss cancel {record.id} --payments-handled --reason TEXT "
                "(once the payment is refunded at the gateway, or left as it is)"
            )
        elif (record.reason or "").startswith(DIVERGENCE):
            ends = (
                f"celery -A proj agboss accept {record.id} --reason TEXT (once what the "
                "old path charged is refunded, or kept), or cancel it --payments-handled"
            )
        elif keys:
            ends = (
                "celery -A proj agboss resolve KEY (--completed RESULT_JSON | --not-sent) "
                "--reason TEXT, for each key"
            )
        else:
            ends = f"celery -A proj agboss redrive {record.id} --reason TEXT"
        waits.append(OperatorWait(record, keys, ends))
    return waits


def redrive(app: Any, execution_id: str, reason: str, *, actor: str | None = None) -> bool:
    """Send a ``WAITING_OPERATOR`` execution on when nothing is left for a person to
    decide (every intent it created or used is settled): ``WAITING`` and published again
    now, its recovery count reset. Refused while an intent still needs an operator
    (resolve it instead), after a cancel that came when a payment had completed (cancel
    it), or while it runs. True when it was published again."""
    why = _require_reason(reason)
    who = actor or default_actor()
    agboss = _agboss(app)
    record = _execution(
        agboss, execution_id, "the waiting ones with `celery -A proj agboss pending`"
    )
    if record.state is not ExecutionState.WAITING_OPERATOR:
        raise _refuse(
            "wrong-state",
            f"execution {execution_id} is {record.state.value}; only "
            "one waiting for an operator is re-driven by hand (PARKED: `unpark`)",
        )
    if (record.reason or "").startswith(CANCELLED_AFTER_PAYMENT):
        raise _refuse(
            "wrong-state",
            f"execution {execution_id} was {CANCELLED_AFTER_PAYMENT}: "
            "refund it at the gateway if needed, then `celery -A proj agboss cancel "
            f"{execution_id} --payments-handled --reason TEXT`",
        )
    if (record.reason or "").startswith(DIVERGENCE):
        raise _refuse(
            "wrong-state",
            f"execution {execution_id} diverged: a re-run would "
            "diverge again. Deal with what the old path charged, then `celery -A "
            f"proj agboss accept {execution_id} --reason TEXT`",
        )
    keys = agboss.executions.intents_needing_operator(execution_id)
    if keys:
        raise _refuse(
            "pending-intent",
            f"execution {execution_id} waits for these intents: "
            f"{', '.join(keys)}; look each up at the gateway and `resolve` it (the "
            "execution then goes on by itself)",
        )
    moved = agboss.executions.unblock(
        execution_id, f"re-driven by {who}: {why}", reset_recovery_count=True
    )
    if moved is None:
        raise _refuse(
            "conflict",
            f"execution {execution_id} changed (or a delivery holds its "
            "lease) while it was being re-driven; look at it again",
        )
    agboss.executions.append_audit(
        who, "redrive", execution_id, why, _execution_summary(record), _execution_summary(moved)
    )
    return redrive_now(agboss, execution_id, reason=f"re-driven by {who}")


def accept(app: Any, execution_id: str, reason: str, *, actor: str | None = None) -> bool:
    """Accept a divergence (DESIGN §4): a re-run's body no longer reached a call an earlier
    delivery made and that completed (or may have). Once what that old path charged is
    dealt with at the gateway (refunded, or kept), the execution ``COMPLETED`` with the
    result its body returned, and is published again so that a delivery hands it to the
    result backend and its links. Refused while an intent of it is pending (resolve it
    first) or a delivery runs it. True when it was published again."""
    why = _require_reason(reason)
    who = actor or default_actor()
    agboss = _agboss(app)
    record = _execution(
        agboss, execution_id, "the waiting ones with `celery -A proj agboss pending`"
    )
    if record.state is not ExecutionState.WAITING_OPERATOR or not (record.reason or "").startswith(
        DIVERGENCE
    ):
        raise _refuse(
            "wrong-state",
            f"execution {execution_id} is {record.state.value} "
            f"({record.reason or 'no reason'}), not waiting for a divergence",
        )
    pending = agboss.executions.pending_intent_keys(execution_id)
    if pending:
        raise _refuse(
            "pending-intent",
            f"execution {execution_id} has a PENDING intent "
            f"({', '.join(pending)}): settle it first (`agboss resolve`)",
        )
    accepted = agboss.executions.accept_divergence(execution_id, f"accepted by {who}: {why}")
    if accepted is None:
        raise _refuse(
            "conflict",
            f"execution {execution_id} changed (or a delivery holds its "
            "lease) while it was being accepted; look at it again",
        )
    agboss.executions.append_audit(
        who,
        "accept-divergence",
        execution_id,
        why,
        _execution_summary(record),
        _execution_summary(accepted),
    )
    log_event(OPERATOR_ACCEPTED, execution=execution_id, actor=who)
    republish(agboss.app, replace(accepted, expires_ms=None), not_before_ms=None)
    return True


# --- resolve ---------------------------------------------------------------------------


def _refuse_a_result_the_call_would_not_return(call: OutboundCall, result: Any) -> None:
    """The next delivery replays the operator's result as if ``send`` had returned it: a
    bare charge id pasted for a receipt would make its body fail. Checked by the call's
    ``validate_result``, else by its ``transaction_id`` reader (which must find the id)."""
    if sabotage.active(OPERATOR_RESULT_UNCHECKED):
        return
    if call.validate_result is not None:
        try:
            call.validate_result(result)
        except Exception as exc:
            raise _refuse(
                "bad-input",
                f"{call.name} does not take this result: {exc}. Give "
                "the result in the form its send returns",
            ) from None
        return
    if call.transaction_id is None:
        return
    try:
        found = call.transaction_id(result)
    except Exception:
        found = None
    if not found:
        raise _refuse(
            "bad-input",
            f"{call.name} finds no gateway id in this result ({type(result).__name__}): give "
            "the result in the form its send returns, e.g. the receipt as JSON "
            '\'{"id": "ch_...", "status": "succeeded", ...}\', not the bare id',
        )


@dataclass(frozen=True)
class ResolveResult:
    intent: IntentRecord
    execution: ExecutionRecord | None
    republished: bool


def _intent_summary(intent: IntentRecord) -> dict[str, Any]:
    return {
        "status": intent.status.value,
        "attempt": intent.attempt,
        "needs_operator": intent.needs_operator,
        "operator_reason": intent.operator_reason,
        "not_sent_confirmed": intent.not_sent_confirmed,
        "result_stored": intent.result_stored,
        "gateway_transaction_id": intent.gateway_transaction_id,
        "execution_id": intent.execution_id,
    }


def resolve(
    app: Any,
    idempotency_key: str,
    *,
    reason: str,
    completed: Any = _NO_RESULT,
    not_sent: bool = False,
    actor: str | None = None,
) -> ResolveResult:
    """Settle an intent an operator checked at the gateway, then let its execution go on.

    ``completed=result``: the payment exists; its result is stored (masked as the call
    says) and replayed by the next delivery, nothing is sent. ``not_sent=True``: the
    gateway never processed it; the intent becomes ``FAILED`` and the next delivery sends
    it again under the same key. Refused while its owner's lease (or the execution's) is
    live. The change, its history row and the audit row commit together.
    """
    if (completed is _NO_RESULT) == (not not_sent):
        raise _refuse(
            "bad-input", "say what happened: exactly one of completed=RESULT or not_sent=True"
        )
    why = _require_reason(reason)
    who = actor or default_actor()
    agboss = _agboss(app)
    store = agboss.store
    pseudonym_key = agboss.engine_settings.pseudonym_key
    with store.transaction() as tx:
        intent = tx.read_intent(idempotency_key)
        if intent is None:
            raise _refuse(
                "not-found",
                f"no intent has the idempotency key {idempotency_key!r}; "
                "list them with `celery -A proj agboss pending`",
            )
        if intent.owner_live and intent.owner is not None:
            raise _refuse(
                "owner-live",
                f"the intent is held right now by a live delivery (holder {intent.owner.holder}, "
                f"token {intent.owner.token}): it is being sent or looked up. Wait until its "
                "lease ends (`agboss show KEY`), then resolve it if it still needs you",
            )
        if q.execution_lease_live(tx, intent.execution_id):
            raise _refuse(
                "lease-live",
                f"execution {intent.execution_id} is running under a live lease; its delivery "
                "reconciles this intent itself. Wait for it to end, then look again",
            )
        stored_marker = intent.status is IntentStatus.COMPLETED and not intent.result_stored
        if intent.status is not IntentStatus.PENDING and not stored_marker:
            raise _refuse(
                "wrong-state", f"the intent is already {intent.status.value}; nothing to resolve"
            )
        if stored_marker and not_sent:
            raise _refuse(
                "wrong-state",
                "the gateway answered this intent (it is COMPLETED, "
                "only its result could not be stored): resolve it with --completed",
            )
        call = agboss.engine_settings.call_named(intent.name)
        if not_sent:
            decision = "not-sent"
            to_status = IntentStatus.FAILED
            update = IntentUpdate(
                status=IntentStatus.FAILED,
                owner=None,
                needs_operator=False,
                operator_reason=f"resolved by {who}: not sent",
                not_sent_confirmed=True,
                clear_next_lookup=True,
            )
        else:
            decision = "completed"
            to_status = IntentStatus.COMPLETED
            if call is None:
                raise _refuse(
                    "bad-input",
                    f"no OutboundCall named {intent.name!r} is registered in this process, so "
                    "its masking policy is unknown and nothing is stored (fail closed): "
                    "register it where the app is made, AGBoss(app).register(call)",
                )
            _refuse_a_result_the_call_would_not_return(call, completed)
            stored_ok, stored = mask_result(call, completed)
            if not stored_ok:
                raise _refuse(
                    "bad-input",
                    f"the masking policy of {intent.name} cannot store "
                    "this result; give the result in the form the call returns",
                )
            update = IntentUpdate(
                status=IntentStatus.COMPLETED,
                owner=None,
                complete=not stored_marker,
                result=stored,
                result_stored=True,
                needs_operator=False,
                operator_reason=f"resolved by {who}: completed",
                clear_next_lookup=True,
                gateway_transaction_id=transaction_id_of(call, completed),
            )
        guard = IntentGuard(intent.status, intent.attempt, intent.owner, owner_not_live=True)
        if not transition(
            tx,
            pseudonym_key,
            idempotency_key,
            guard,
            update,
            HistoryEvent.RESOLVED_BY_OPERATOR,
            from_status=intent.status,
            to_status=to_status,
            attempt=intent.attempt,
            owner=None,
            detail={"actor": who, "decision": decision, "reason": why[:500]},
        ):
            raise _refuse(
                "conflict",
                "the intent changed while it was being resolved; "
                "look at it again (`agboss show KEY`)",
            )
        after = tx.read_intent(idempotency_key)
        assert after is not None
        q.insert_audit_txn(
            tx,
            actor=who,
            action=f"resolve:{decision}",
            target=idempotency_key,
            reason=why,
            before=json.dumps(_intent_summary(intent)),
            after=json.dumps(_intent_summary(after)),
        )
    log_event(
        OPERATOR_RESOLVED,
        execution=intent.execution_id,
        call=intent.name,
        decision=decision,
        actor=who,
    )
    execution, republished = _after_answer(agboss, idempotency_key, f"resolved by {who}")
    return ResolveResult(after, execution, republished)


# --- cancel and unpark -----------------------------------------------------------------


def _execution_summary(record: ExecutionRecord) -> str:
    return json.dumps(
        {
            "state": record.state.value,
            "cancel_requested": record.cancel_requested,
            "recovery_count": record.recovery_count,
            "reason": record.reason,
        }
    )


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
    have been made: settle it first) or while a delivery runs it under a live lease.

    One that completed an outbound call (money moved) is never silently cancelled: it
    waits for an operator, "cancelled after a completed payment", until the call is
    dealt with at the gateway (a refund, or nothing) and ``payments_handled=True``
    (``--payments-handled``) confirms the cancel."""
    why = _require_reason(reason)
    who = actor or default_actor()
    agboss = _agboss(app)
    executions = agboss.executions
    record = _execution(agboss, execution_id, "them with `celery -A proj agboss executions`")
    if record.state is ExecutionState.CANCELLED:
        return record
    if record.state in TERMINAL_STATES:
        raise _refuse(
            "wrong-state",
            f"execution {execution_id} is already {record.state.value}; there is nothing to cancel",
        )
    if record.state is ExecutionState.COMPENSATING:
        raise _refuse(
            "wrong-state",
            f"execution {execution_id} is running its undo "
            "(COMPENSATING); it ends FAILED once the undo is done",
        )
    pending = executions.pending_intent_keys(execution_id)
    if pending:
        raise _refuse(
            "pending-intent",
            f"execution {execution_id} has a PENDING intent ({', '.join(pending)}): the "
            "payment may have been made. Settle it first — the sweep reconciles it, or "
            "`celery -A proj agboss resolve KEY --completed RESULT_JSON | --not-sent --reason "
            "TEXT` — then cancel again",
        )
    lease = agboss.store.read_lease(execution_id)
    if lease is not None and lease.live:
        raise _refuse(
            "lease-live",
            f"execution {execution_id} is running now (holder {lease.holder}, token "
            f"{lease.token}); wait for it to end, or revoke it (app.control.revoke(id)): "
            "its next outbound call or fenced effect then stops it",
        )
    updated = executions.request_cancel(execution_id, why, payments_handled=payments_handled)
    if updated is not None and updated.state not in TERMINAL_STATES:
        updated = executions.end_cancel_requested(
            execution_id, why, payments_handled=payments_handled
        )
    assert updated is not None
    action = "cancel:payments-handled" if payments_handled else "cancel"
    executions.append_audit(
        who, action, execution_id, why, _execution_summary(record), _execution_summary(updated)
    )
    log_event(OPERATOR_CANCELLED, execution=execution_id, state=updated.state.value, actor=who)
    if updated.state is ExecutionState.CANCELLED:
        send_task_event(
            agboss.app,
            "task-revoked",
            execution_id,
            terminated=False,
            agboss_state=ExecutionState.CANCELLED.value,
        )
    return updated


@dataclass(frozen=True)
class UnparkResult:
    execution: ExecutionRecord
    republished: bool


def unpark(app: Any, execution_id: str, reason: str, *, actor: str | None = None) -> UnparkResult:
    """Give a ``PARKED`` execution (recovery cap reached) another go: its recovery count
    starts again from zero and its message is published again now."""
    why = _require_reason(reason)
    who = actor or default_actor()
    agboss = _agboss(app)
    record = _execution(
        agboss,
        execution_id,
        "the parked ones with `celery -A proj agboss executions --state PARKED`",
    )
    if record.state is not ExecutionState.PARKED:
        raise _refuse(
            "wrong-state",
            f"execution {execution_id} is {record.state.value}, not "
            "PARKED; only a parked execution can be unparked",
        )
    moved = agboss.executions.move(
        execution_id,
        [ExecutionState.PARKED],
        ExecutionState.WAITING,
        f"unparked by {who}: {why}",
        not_before_delay_ms=0,
        reset_recovery_count=True,
        planned=True,
    )
    if moved is None:
        raise _refuse(
            "conflict",
            f"execution {execution_id} changed (or a delivery holds its "
            "lease) while it was being unparked; look at it again",
        )
    agboss.executions.append_audit(
        who, "unpark", execution_id, why, _execution_summary(record), _execution_summary(moved)
    )
    log_event(OPERATOR_UNPARKED, execution=execution_id, actor=who)
    republished = redrive_now(agboss, execution_id, reason=f"unparked by {who}")
    final = agboss.executions.read_execution(execution_id) or moved
    return UnparkResult(final, republished)


# --- pauses ----------------------------------------------------------------------------


def answer_pause(app: Any, pause_id: str, answer: Any) -> bool:
    """Answer a pause once and publish its task again; a second answer raises
    ``NotPausedError`` and moves nothing (PS11). ``pause_id`` is
    ``"<execution id>:<name>"``, as ``celery -A proj agboss pauses`` lists it.
    True when the task was published again now (else the sweep re-drives it)."""
    agboss = _agboss(app)
    record = agboss.executions.answer_pause(pause_id, dumps(answer))
    log_event(OPERATOR_PAUSE_ANSWERED, execution=record.id, pause=pause_id)
    return redrive_now(agboss, record.id, reason=f"pause {pause_id} answered")


def list_pauses(app: Any, *, limit: int = 100) -> list[tuple[str, str, str]]:
    """``(pause_id, execution_id, status)`` of the pauses waiting for an answer."""
    return _agboss(app).executions.list_pauses(limit)


__all__ = [
    "Description",
    "OperatorWait",
    "ResolveResult",
    "UnparkResult",
    "accept",
    "answer_pause",
    "cancel",
    "default_actor",
    "describe",
    "list_executions",
    "list_pauses",
    "list_pending",
    "list_waits",
    "redrive",
    "redrive_now",
    "resolve",
    "unpark",
]
