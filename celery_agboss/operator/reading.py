"""What an operator reads: pending intents, executions, waits for a person, pauses."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from celery_agboss.core.executions import (
    CANCEL_WAITS,
    OPERATOR_WAIT_STATES,
    UNDO_WAITS,
    AuditEntry,
    ExecutionRecord,
    ExecutionState,
    WaitKind,
    wait_kind,
    waited_for,
)
from celery_agboss.core.history import HistoryVerdict, verify_history
from celery_agboss.core.pauses import PauseRecord
from celery_agboss.core.store_protocol import (
    HistoryRow,
    IntentRecord,
    LeaseState,
)
from celery_agboss.operator.common import _refuse
from celery_agboss.runtime.app_runtime import Runtime
from celery_agboss.store.counts import unsettled_counted
from celery_agboss.store.execution_admin import LeftBehind, payments_left_behind
from celery_agboss.store.intent_listings import list_intents_used_by
from celery_agboss.store.schema import intent_history
from celery_agboss.store.schema_executions import executions
from celery_agboss.store.unopened import (
    list_executions_shown,
    read_history_shown,
    read_intent_shown,
    unopened_fields,
)


def _limit(limit: Any) -> int:
    """How many rows a listing may answer: a positive int. A negative or zero one would
    answer an empty list, which an operator reads as "nothing there"."""
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise TypeError(f"limit must be a positive int (how many rows to list), not {limit!r}")
    if limit < 1:
        raise ValueError(f"limit must be a positive int (how many rows to list), not {limit}")
    return limit


def _states(states: Any) -> list[ExecutionState] | None:
    """``states`` as ExecutionStates: one state or several, each an ExecutionState or its
    name (``"COMPLETED"``); None (or none given): every state."""
    if states is None:
        return None
    given = [states] if isinstance(states, str) else states
    try:
        listed = list(given)
    except TypeError:
        listed = [given]
    known = ", ".join(state.value for state in ExecutionState)
    found = []
    for state in listed:
        if isinstance(state, str) and state.strip().upper() in ExecutionState.__members__:
            found.append(ExecutionState[state.strip().upper()])
        else:
            raise ValueError(
                f"states must be ExecutionStates or their names, not {state!r}; one of {known}"
            )
    return found or None


def list_pending(app: Any, *, operator_only: bool = False, limit: int = 100) -> list[IntentRecord]:
    """Intents that may have been sent and are not settled (and completed ones whose result
    could not be stored), the ones waiting for an operator first."""
    return Runtime.of(app).executions.list_pending_intents(
        limit=_limit(limit), operator_only=operator_only
    )


def list_executions(
    app: Any,
    *,
    states: Sequence[ExecutionState | str] | ExecutionState | str | None = None,
    limit: int = 100,
    after_id: str | None = None,
) -> list[ExecutionRecord]:
    """Executions by id (``after_id`` pages), optionally only those in ``states`` (one or
    several, each an ExecutionState or its name; ValueError for another); a value no key
    opens, or a state a newer version wrote, shown as such (``store.unopened``)."""
    return list_executions_shown(
        Runtime.of(app).store, _states(states), limit=_limit(limit), after_id=after_id
    )


@dataclass(frozen=True)
class Description:
    """Everything known about one execution, or about the execution of one intent."""

    execution: ExecutionRecord | None
    lease: LeaseState | None
    intents: list[IntentRecord]
    history: dict[str, list[HistoryRow]]
    audit: list[AuditEntry]
    focus: str | None  # the idempotency key asked for, when one was
    # Each intent's history chain recomputed with the deployment's key: a row changed,
    # removed or reordered in the database since it was written shows here.
    chains: dict[str, HistoryVerdict]
    pauses: list[PauseRecord]  # the execution's, with what each asks and its answer
    # Per intent, every execution it may hold up (``executions_waiting_on``): its creator
    # first, then each that replayed, joined, took it over or sent it. A settle of it
    # re-drives each of them that waits.
    used_by: dict[str, list[str]] = field(default_factory=dict)


def describe(app: Any, key_or_id: str) -> Description:
    """An idempotency key or an execution (task) id: the execution, its lease, its intents
    with their history, and the audit trail. An execution's intents are every one it
    created, used or sent (``list_intents_used_by``), so that a shared intent it waits for
    (a double click) shows on it as on ``agboss pending``; a key's execution is its
    creator, and ``used_by`` names every other execution on it. A value no key of this
    process opens, or a state a newer version wrote, is shown as such (``store.unopened``):
    the operator needs the page of exactly that execution."""
    runtime = Runtime.of(app)
    store = runtime.store
    intent = read_intent_shown(store, key_or_id)
    execution_id = intent.execution_id if intent is not None else key_or_id
    found = list_executions_shown(store, limit=1, execution_id=execution_id)
    execution = found[0] if found else None
    if intent is None and execution is None:
        raise _refuse(
            "not-found",
            f"no intent and no execution is named {key_or_id!r}; list them with "
            "`celery -A proj agboss pending` or `… agboss executions`",
        )
    intents = list_intents_used_by(store, execution_id) if execution is not None else [intent]
    intents = [i for i in intents if i is not None]
    used_by = {
        i.idempotency_key: runtime.executions.executions_waiting_on(i.idempotency_key)
        for i in intents
    }
    audit = runtime.executions.list_audit(execution_id, limit=50)
    for item in intents:
        audit += runtime.executions.list_audit(item.idempotency_key, limit=50)
    audit.sort(key=lambda entry: entry.id)
    history = {i.idempotency_key: read_history_shown(store, i.idempotency_key) for i in intents}
    key = runtime.engine_settings.pseudonym_key
    return Description(
        execution=execution,
        lease=store.read_lease(execution_id) if execution is not None else None,
        intents=intents,
        history=history,
        audit=audit,
        focus=intent.idempotency_key if intent is not None else None,
        chains={i.idempotency_key: _chain(key, history[i.idempotency_key], i) for i in intents},
        pauses=(
            runtime.executions.read_pauses(execution_id=execution_id, shown_unopened=True)
            if execution
            else []
        ),
        used_by=used_by,
    )


def _chain(key: bytes, rows: list[HistoryRow], intent: IntentRecord) -> HistoryVerdict:
    """The intent's history chain recomputed. A row whose detail did not open cannot be:
    the rows before it are checked, and the verdict says the chain is not checked whole
    (``first_broken_seq`` None), never that it is broken: nothing was changed."""
    for index, row in enumerate(rows):
        detail = unopened_fields(row, intent_history.name).get("detail")
        if detail is None:
            continue
        before = verify_history(key, rows[:index], idempotency_key=intent.idempotency_key)
        if not before.ok:
            return before
        return HistoryVerdict(
            False,
            None,
            f"row {row.seq}'s detail is {detail}: the {index} row(s) before it are chained; "
            f"check the rest with `celery -A proj agboss show {intent.idempotency_key}` in a "
            "process holding that key",
        )
    return verify_history(
        key, rows, idempotency_key=intent.idempotency_key, expected_last_status=intent.status.value
    )


@dataclass(frozen=True)
class OperatorWait:
    """An execution waiting for a person, and the command that ends the wait."""

    execution: ExecutionRecord
    intents: list[str]  # keys of the intents (created or used) that need an operator
    ends_with: str  # the command that ends it


def list_waits(app: Any, *, limit: int = 100) -> list[OperatorWait]:
    """Every execution waiting for a person (``OPERATOR_WAIT_STATES``), oldest first, with
    what ends its wait: ``unpark`` of a ``PARKED`` one; for a ``WAITING_OPERATOR`` one,
    ``resolve`` of the intents it waits for, ``cancel --payments-handled`` after a cancel
    that came when a payment had completed, or ``redrive`` when nothing is left to
    decide. A wait nobody can end is never listed: there is always one of these."""
    runtime = Runtime.of(app)
    found = list_executions_shown(
        runtime.store,
        sorted(OPERATOR_WAIT_STATES, key=lambda state: state.value),
        limit=_limit(limit),
        oldest_first=True,
    )
    return [
        OperatorWait(
            record,
            keys := runtime.executions.intents_needing_operator(record.id),
            _wait_ends_with(record, keys),
        )
        for record in found
    ]


def _wait_ends_with(record: ExecutionRecord, keys: list[str]) -> str:
    """The command that ends ``record``'s wait for a person."""
    if record.state is ExecutionState.PARKED:
        # Its state says it all: the next delivery reconciles whatever it left unsettled.
        return (
            f"celery -A proj agboss unpark {record.id} --reason TEXT (once what kills its "
            "deliveries is fixed: a crash loop parks it again)"
        )
    sealed_reason = _unopened_reason(record)
    if sealed_reason is not None:
        # What it waits for is in its reason: no command is guessed without it.
        return (
            f"its reason is {sealed_reason}: `celery -A proj agboss show {record.id}` "
            "in a process holding that key says what ends the wait"
        )
    kind = wait_kind(record.reason)
    if kind is WaitKind.CANCELLED_AFTER_PAYMENT:
        return (
            f"celery -A proj agboss cancel {record.id} --payments-handled --reason TEXT "
            "(once the payment is refunded at the gateway, or left as it is)"
        )
    if kind is WaitKind.DIVERGENCE:
        return (
            f"celery -A proj agboss accept {record.id} --reason TEXT (once what the "
            "old path charged is refunded, or kept), or cancel it --payments-handled"
        )
    if keys:
        return (
            "celery -A proj agboss resolve KEY (--completed RESULT_JSON | --not-sent) "
            "--reason TEXT, for each key"
        )
    return f"celery -A proj agboss redrive {record.id} --reason TEXT"


def count_unsettled(app: Any) -> tuple[int, int]:
    """``(unsettled, of them flagged for an operator)``: the intents ``list_pending``
    lists, counted, so that a listing of only the flagged ones can say how many others
    are not settled (each may be a payment)."""
    with Runtime.of(app).store.read_transaction() as tx:
        unsettled, flagged = tx.execute(unsettled_counted()).one()
    return int(unsettled), int(flagged or 0)


@dataclass(frozen=True)
class PaymentLeftBehind:
    """A ``FAILED`` or ``CANCELLED`` execution that left a completed payment behind
    ("failed after a payment"): the customer is charged and nothing will change that."""

    execution: ExecutionRecord
    intents: list[str]  # the keys of those payments
    ends_with: str  # the command that ends the listing, once the payment is dealt with
    # What of it this process could not open (``table.column: why``), else None
    unopened: str | None = None


def list_failed_after_payment(app: Any, *, limit: int = 100) -> list[PaymentLeftBehind]:
    """Every ``FAILED`` or ``CANCELLED`` execution with a completed payment it sent or
    relies on that no undo took back and no other execution completed on or still uses,
    until an operator says it is dealt with."""
    found = payments_left_behind(Runtime.of(app).store, _limit(limit))
    return [
        PaymentLeftBehind(left.record, left.keys, _payments_ends_with(left), left.unopened)
        for left in found
    ]


def _payments_ends_with(left: LeftBehind) -> str:
    handled = f"`celery -A proj agboss payments-handled {left.record.id} --reason TEXT`"
    if not left.judged:
        # What its undos refunded did not open: a payment listed may be refunded already.
        return (
            f"could not be judged ({left.unopened}): every completed payment it made or "
            "used is listed, refunds its undos made among them; look at it with "
            f"`celery -A proj agboss show {left.record.id}` in a process holding that key "
            f"before refunding anything, then {handled}"
        )
    return f"refund it at the gateway (or keep it on purpose), then {handled}"


@dataclass(frozen=True)
class SharedWait:
    """An execution waiting for another one that shares a record with it: a cancel, or an
    undo, of a step the other still uses. It ends by itself when the other one ends
    (re-driven, it then keeps the step for it, undoes it, or asks a person)."""

    execution: ExecutionRecord
    other: str  # the execution it waits for (a reason that did not open: what says so)


def list_shared_waits(app: Any, *, limit: int = 100) -> list[SharedWait]:
    """Up to ``limit`` executions that wait for another one on a shared record, by id.
    Filtered before the limit (in SQL, then by their opened reason, a batch at a time):
    plain retries, however many, never hide one."""
    store = Runtime.of(app).store
    limit = _limit(limit)
    waits: list[SharedWait] = []
    after: str | None = None
    while len(waits) < limit:
        records = list_executions_shown(
            store,
            [ExecutionState.WAITING, ExecutionState.COMPENSATING],
            limit=_SHARED_BATCH,
            after_id=after,
            reason_starts=(CANCEL_WAITS, UNDO_WAITS),
        )
        for record in records:
            sealed_reason = _unopened_reason(record)
            # Whom it waits for is in its reason: listed, saying it cannot be read here.
            other = waited_for(record.reason) if sealed_reason is None else sealed_reason
            if other is not None and len(waits) < limit:
                waits.append(SharedWait(record, other))
        if len(records) < _SHARED_BATCH:
            break
        after = records[-1].id
    return waits


_SHARED_BATCH = 500
"""Executions read per transaction while looking for shared waits: with sealed reasons
(which SQL cannot filter) every waiting one is a candidate."""


def _unopened_reason(record: ExecutionRecord) -> str | None:
    """The record's reason when a listing could not open it (``store.unopened``)."""
    return unopened_fields(record, executions.name).get("reason")


def list_pauses(app: Any, *, limit: int = 100) -> list[tuple[str, str, str]]:
    """``(pause_id, execution_id, status)`` of the pauses waiting for an answer."""
    return Runtime.of(app).executions.list_pauses(_limit(limit))


def read_pause(app: Any, pause_id: str) -> PauseRecord | None:
    """The pause ``pause_id`` (``"<execution id>:<name>"``) with what it asks
    (``payload``) and its answer once given; None when no pause has that id. For
    whoever answers it: an approval is given on what the pause asks."""
    found = Runtime.of(app).executions.read_pauses(pause_id=pause_id)
    return found[0] if found else None
