"""``resolve``: an operator says what became of an intent the gateway could not tell us
about, checked against the call before anything is written (design: operator decisions)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from celery_agboss.core import sabotage
from celery_agboss.core.executions import (
    ExecutionRecord,
)
from celery_agboss.core.history import HistoryEvent
from celery_agboss.core.log_events import (
    OPERATOR_RESOLVED,
    log_event,
)
from celery_agboss.core.lookup import max_key_age_ms
from celery_agboss.core.outbound import OutboundCall
from celery_agboss.core.protections import (
    OPERATOR_GATEWAY_ID_REPLACED,
    OPERATOR_RESULT_UNCHECKED,
)
from celery_agboss.core.resolutions import (
    Resolution,
    completed_resolution,
    not_sent_resolution,
    wrong_state,
)
from celery_agboss.core.store_protocol import IntentGuard, IntentRecord
from celery_agboss.core.transitions import mask_result, transaction_id_of, transition
from celery_agboss.operator.acting import _after_answer
from celery_agboss.operator.common import (
    _NO_RESULT,
    _acting,
    _intent_summary,
    _refuse,
    refuse_a_newer_state,
)
from celery_agboss.store.audit_trail import insert_audit_txn
from celery_agboss.store.execution_rows import execution_lease_live
from celery_agboss.store.transactions import SQLTransaction


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
        raise _refuse(
            "bad-input",
            f"{call.name} declares no way to check a result an operator gives (neither "
            "validate_result= nor transaction_id= on its OutboundCall), so a mistyped one "
            "would reach its body as the gateway's answer: declare one (e.g. "
            "transaction_id=lambda receipt: receipt['id']) where the call is made, "
            "then resolve again",
        )
    raised = ""
    try:
        found = call.transaction_id(result)
    except Exception as exc:
        found = None
        raised = (
            f"; its declared transaction_id= raised {type(exc).__name__}: {exc} (if this "
            "is the result send returns, that reader is wrong: fix it where the call is "
            "declared, deploy, then resolve again)"
        )
    if not found:
        raise _refuse(
            "bad-input",
            f"{call.name} finds no gateway id in this result ({type(result).__name__})"
            f"{raised}: give the result in the form its send returns, e.g. the receipt as "
            'JSON \'{"id": "ch_...", "status": "succeeded", ...}\', not the bare id',
        )


def _refuse_a_resend_past_retention(
    runtime: Any, intent: IntentRecord, now_ms: int, may_charge_twice: bool
) -> None:
    """A ``--not-sent`` makes the next delivery send the intent again under its key; past
    the call's key retention the gateway may no longer deduplicate it (the one bound a
    reconcile's resend uses: ``lookup.max_key_age_ms``). Refused then, unless the
    operator names the risk."""
    if may_charge_twice:
        return
    call = runtime.engine_settings.call_named(intent.name)
    bound = (
        None if call is None else max_key_age_ms(call, runtime.engine_settings.attempt_timeout_ms)
    )
    first = intent.first_attempt_at_ms
    if call is not None and (bound is None or (first is not None and now_ms - first < bound)):
        return
    why = (
        f"no OutboundCall named {intent.name!r} is registered here, so its key retention is unknown"
        if call is None
        else "its idempotency key may have expired at the gateway (key_retention)"
    )
    raise _refuse(
        "past-retention",
        f"a --not-sent makes the next delivery send this intent again, but {why}: if the "
        "gateway did process it, the resend is a second charge. Check the gateway once "
        "more; to send it again anyway, add --may-charge-twice (may_charge_twice=True)",
    )


@dataclass(frozen=True)
class ResolveResult:
    intent: IntentRecord
    execution: ExecutionRecord | None  # its creator
    republished: bool  # the creator was published again
    # Every execution the answer published again: the creator and each other one that
    # waited on the intent (a double click that took it over).
    republished_ids: list[str] = field(default_factory=list)


def resolve(
    app: Any,
    idempotency_key: str,
    *,
    reason: str,
    completed: Any = _NO_RESULT,
    not_sent: bool = False,
    actor: str | None = None,
    may_charge_twice: bool = False,
) -> ResolveResult:
    """Settle an intent an operator checked at the gateway, then let its execution go on.

    ``completed=result``: the payment exists; its result is stored (masked as the call
    says) and replayed by the next delivery, nothing is sent. ``not_sent=True``: the
    gateway never processed it; the intent becomes ``FAILED`` and the next delivery sends
    it again under the same key — refused once that key may have expired at the gateway
    (past the call's ``key_retention``), where a resend is deduplicated no more: if the
    gateway did process it, that is a second charge; ``may_charge_twice=True``
    (``--may-charge-twice``) says so and goes on. Refused while its owner's lease (or the
    execution's) is live, or while an execution it would send on is in a state a newer
    version wrote. The change, its history row and the audit row commit together.
    """
    if (completed is _NO_RESULT) == (not not_sent):
        raise _refuse(
            "bad-input", "say what happened: exactly one of completed=RESULT or not_sent=True"
        )
    why, who, runtime = _acting(app, reason, actor)
    waiting = runtime.executions.executions_waiting_on(idempotency_key)
    with runtime.store.transaction() as tx:
        intent = _resolvable_intent(tx, idempotency_key, not_sent)
        for execution_id in dict.fromkeys([intent.execution_id, *waiting]):
            refuse_a_newer_state(tx, execution_id)  # what the answer would send on
        if not_sent:
            _refuse_a_resend_past_retention(runtime, intent, tx.now_ms, may_charge_twice)
            resolution = not_sent_resolution(who, may_charge_twice=may_charge_twice)
        else:
            resolution = _completed(runtime, intent, who, completed)
        after = _write(tx, runtime.engine_settings.pseudonym_key, intent, resolution, who, why)
    log_event(
        OPERATOR_RESOLVED,
        execution_id=intent.execution_id,
        call=intent.name,
        decision=resolution.decision,
        actor=who,
    )
    execution, republished, sent_on = _after_answer(runtime, idempotency_key, f"resolved by {who}")
    return ResolveResult(after, execution, republished, sent_on)


def _resolvable_intent(tx: SQLTransaction, idempotency_key: str, not_sent: bool) -> IntentRecord:
    """The intent, read under its row lock; refused while a delivery may still settle it
    itself (its owner's lease, or its execution's, is live) or when it is in no state an
    operator resolves (``resolutions.wrong_state``)."""
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
    if execution_lease_live(tx, intent.execution_id):
        raise _refuse(
            "lease-live",
            f"execution {intent.execution_id} is running under a live lease; its delivery "
            "reconciles this intent itself. Wait for it to end, then look again",
        )
    refused = wrong_state(intent, not_sent)
    if refused is not None:
        raise _refuse("wrong-state", refused)
    return intent


def _completed(runtime: Any, intent: IntentRecord, who: str, completed: Any) -> Resolution:
    """The operator's result, checked by the call and masked as it says (fail closed)."""
    call = runtime.engine_settings.call_named(intent.name)
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
    given = transaction_id_of(call, completed)
    recorded = intent.gateway_transaction_id
    if recorded not in (None, given) and not sabotage.active(OPERATOR_GATEWAY_ID_REPLACED):
        raise _refuse(  # the gateway's own answer named the payment: it is not replaced
            "bad-input",
            f"the gateway answered {intent.idempotency_key} with transaction {recorded!r}, "
            f"and the result given names {given!r}: another payment's, or none. Give "
            f"{recorded}'s own result as the gateway shows it; nothing was changed",
        )
    return completed_resolution(intent, who, stored, given)


def _write(
    tx: SQLTransaction,
    pseudonym_key: bytes,
    intent: IntentRecord,
    resolution: Resolution,
    who: str,
    why: str,
) -> IntentRecord:
    """The change through ``transition()`` (its compare-and-set and history row) and the
    audit row, in the caller's transaction; the intent as it is then."""
    key = intent.idempotency_key
    guard = IntentGuard(intent.status, intent.attempt, intent.owner, owner_not_live=True)
    if not transition(
        tx,
        pseudonym_key,
        key,
        guard,
        resolution.update,
        HistoryEvent.RESOLVED_BY_OPERATOR,
        from_status=intent.status,
        to_status=resolution.to_status,
        attempt=intent.attempt,
        owner=None,
        detail={"actor": who, "decision": resolution.decision, "reason": why[:500]},
    ):
        raise _refuse(
            "conflict",
            "the intent changed while it was being resolved; look at it again (`agboss show KEY`)",
        )
    after = tx.read_intent(key)
    assert after is not None
    insert_audit_txn(
        tx,
        actor=who,
        action=f"resolve:{resolution.decision}",
        target=key,
        reason=why,
        before=json.dumps(_intent_summary(intent)),
        after=json.dumps(_intent_summary(after)),
    )
    return after
