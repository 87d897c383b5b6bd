"""The sweep's and the operators' execution verbs: listing, unblocking, moving by hand
(re-driving and expiring: ``redrive_and_expiry``; cancels: ``cancels``; pause answers:
``pauses``; the audit trail and meta values: ``audit_trail``).

Every claim is a compare-and-set under the execution row's lock that re-checks
that no lease is live, so several sweepers (two beats) and operators at once
decide one after the other and only one of them re-publishes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from sqlalchemy import and_, exists, func, not_, or_, select

from celery_agboss.core import sabotage
from celery_agboss.core.execution_states import (
    divergence_accepted,
    may_move_by_hand,
    unblocks,
)
from celery_agboss.core.executions import (
    Audit,
    ExecutionRecord,
    ExecutionState,
)
from celery_agboss.core.protections import (
    PAYMENTS_HANDLED_VERB_CLAIMS_NOTHING,
    RESOLVE_REDRIVES_CREATOR_ONLY,
)
from celery_agboss.core.shared_records import unhandled_payments
from celery_agboss.core.shared_steps import step_covers
from celery_agboss.core.store_protocol import INTENT_RECORD, IntentStatus, StoreTransaction
from celery_agboss.core.undo_steps import UNDO_TASK_CANCELLED, UNDO_TASK_REDRIVEN, steps_undone
from celery_agboss.errors import SealedValueUnopenableError
from celery_agboss.store.cancels import declared_txn, undos_left_txn
from celery_agboss.store.execution_rows import (
    audit_change_txn,
    execution_lease_live,
    has_pending_intent_txn,
    intents_made_by_undos_txn,
    pending_intent_keys_txn,
    read_execution_txn,
    record_of,
    require_execution_txn,
    set_execution_txn,
    terminal_txn,
    undo_declarations_txn,
)
from celery_agboss.store.execution_updates import TERMINAL_VALUES
from celery_agboss.store.handled_payments import (
    claim_handled_txn,
    payment_steps,
    refuse_handled_txn,
)
from celery_agboss.store.intent_listings import used_by_execution
from celery_agboss.store.schema import outbound_calls, record_uses
from celery_agboss.store.schema_executions import executions
from celery_agboss.store.sealed_columns import sealer_of
from celery_agboss.store.sqlalchemy_store import SQLAlchemyStore
from celery_agboss.store.transactions import SQLTransaction
from celery_agboss.store.unopened import (
    list_executions_shown,
    showing_unopened,
    unopened_fields,
    unopened_text,
)

_e = executions.c
_i = outbound_calls.c
_u = record_uses.c


def _needing_operator() -> Any:
    """An intent waiting for a person: a PENDING one flagged for one, or a COMPLETED one
    whose result could not be stored."""
    return or_(
        and_(_i.status == IntentStatus.PENDING.value, _i.needs_operator),
        and_(_i.status == IntentStatus.COMPLETED.value, not_(_i.result_stored)),
    )


def _operator_needed(tx: SQLTransaction, execution_id: str) -> bool:
    """An intent of the execution (``used_by_execution``) still needs an operator."""
    needed = exists().where(_needing_operator(), used_by_execution(execution_id))
    return bool(tx.execute(select(needed)).scalar())


Judged = TypeVar("Judged")
Fact = Callable[[], bool]


def locked_if(
    tx: SQLTransaction,
    execution_id: str,
    read: Callable[..., Judged | None],
    rule: Callable[[Judged, Fact, Fact], bool],
    blocked: Fact | None = None,
) -> Judged | None:
    """The execution read by ``read`` under its row lock, then its lease's (one lock
    order), when core's ``rule`` lets a hand decision go on; else None. The rule is
    asked with whether a live lease runs it and whether something blocks it (default:
    a pending intent), each read only if the rule asks."""
    row = read(tx, execution_id, lock=True)
    live = partial(execution_lease_live, tx, execution_id)
    pending = blocked or partial(has_pending_intent_txn, tx, execution_id)
    return None if row is None or not rule(row, live, pending) else row


# --- reads -------------------------------------------------------------------------


def read_execution(store: SQLAlchemyStore, execution_id: str) -> ExecutionRecord | None:
    with store.read_transaction() as tx:
        return read_execution_txn(tx, execution_id)


def list_executions(
    store: SQLAlchemyStore,
    states: Sequence[ExecutionState] | None = None,
    limit: int = 100,
    after_id: str | None = None,
) -> list[ExecutionRecord]:
    """For operators: a value no key of this process opens, or a state a newer version
    wrote, is shown as such (``store.unopened``), its row listed with the others."""
    return list_executions_shown(store, states, limit, after_id)


# --- operators ---------------------------------------------------------------------


def executions_waiting_on(store: SQLAlchemyStore, idempotency_key: str) -> list[str]:
    """Every execution an intent may hold up: its creator and each execution that used
    it (replayed, joined, took it over for reconcile). Settling the intent re-drives
    each one that waits for it: no wait nobody can end (design: waiters re-driven)."""
    with store.read_transaction() as tx:
        row = tx.execute(
            select(_i.execution_id).where(_i.idempotency_key == idempotency_key)
        ).first()
        users = (
            []
            if sabotage.active(RESOLVE_REDRIVES_CREATOR_ONLY)
            else tx.users_of(INTENT_RECORD, idempotency_key)
        )
    creator = [] if row is None else [str(row.execution_id)]
    return list(dict.fromkeys(creator + users))


def unblock(
    store: SQLAlchemyStore,
    execution_id: str,
    reason: str,
    *,
    reset_recovery_count: bool = False,
    audit: Audit | None = None,
) -> ExecutionRecord | None:
    """``WAITING_OPERATOR`` → ``WAITING`` (due now, a planned re-drive) once no intent it
    created or used needs an operator any more, under its row and lease locks; None
    when it does not wait for an intent (another state, "cancelled after a completed
    payment", a live lease) or an intent still needs a person."""
    with store.transaction() as tx:
        needed = partial(_operator_needed, tx, execution_id)
        record = locked_if(tx, execution_id, read_execution_txn, unblocks, needed)
        if record is None:
            return None
        values: dict[str, Any] = {
            "state": ExecutionState.WAITING.value,
            "reason": reason[:1000],
            "not_before_ms": tx.now_expr(),
            "redrive_planned": True,
        }
        if reset_recovery_count:
            values["recovery_count"] = 0
        if (record.reason or "").startswith(UNDO_TASK_CANCELLED):
            # An undo's task cancelled before its refund: the operator sends it on.
            values.update(cancel_requested=False, cancel_reason=UNDO_TASK_REDRIVEN)
        set_execution_txn(tx, execution_id, **values)
        after = require_execution_txn(tx, execution_id)
        audit_change_txn(tx, audit, execution_id, record, after)
        return after


def intents_needing_operator(store: SQLAlchemyStore, execution_id: str) -> list[str]:
    """Keys of the intents of the execution (``used_by_execution``) that wait for a
    person."""
    with store.read_transaction() as tx:
        rows = tx.execute(
            select(_i.idempotency_key)
            .where(_needing_operator(), used_by_execution(execution_id))
            .order_by(_i.first_attempt_at_ms, _i.idempotency_key)
        ).all()
        return [str(row.idempotency_key) for row in rows]


def accept_divergence(
    store: SQLAlchemyStore,
    execution_id: str,
    reason: str,
    *,
    audit: Audit | None = None,
    completed: Callable[[StoreTransaction, ExecutionRecord], None] | None = None,
) -> ExecutionRecord | None:
    """An operator accepts a divergence: the execution ``COMPLETED`` with the result its
    body returned (kept when it diverged), under its row and lease locks; None unless
    it waits for a divergence, runs under no live lease and has no pending intent.
    ``completed``: what else that end writes, in its transaction (an undo's task: the
    mark that its undo finished, as its delivery's ``COMPLETED`` writes it)."""
    with store.transaction() as tx:
        record = locked_if(tx, execution_id, read_execution_txn, divergence_accepted)
        if record is None:
            return None
        after = terminal_txn(tx, execution_id, ExecutionState.COMPLETED, reason=reason[:1000])
        audit_change_txn(tx, audit, execution_id, record, after)
        if completed is not None:
            completed(tx, after)
        return after


def pending_intent_keys(store: SQLAlchemyStore, execution_id: str) -> list[str]:
    """The keys of the execution's pending intents (``pending_intent_of``)."""
    with store.read_transaction() as tx:
        return pending_intent_keys_txn(tx, execution_id)


def move(
    store: SQLAlchemyStore,
    execution_id: str,
    from_states: Sequence[ExecutionState],
    to_state: ExecutionState,
    reason: str,
    *,
    not_before_delay_ms: int | None = None,
    reset_recovery_count: bool = False,
    planned: bool = False,
    audit: Audit | None = None,
) -> ExecutionRecord | None:
    def movable(record: ExecutionRecord, live: Fact, pending: Fact) -> bool:
        return record.state in from_states and not live() and may_move_by_hand(to_state, pending())

    with store.transaction() as tx:
        record = locked_if(tx, execution_id, read_execution_txn, movable)
        if record is None:
            return None
        values: dict[str, Any] = {"state": to_state.value, "reason": reason}
        if planned:
            values["redrive_planned"] = True
        if not_before_delay_ms is not None:
            values["not_before_ms"] = tx.now_expr() + max(0, not_before_delay_ms)
        if reset_recovery_count:
            values["recovery_count"] = 0
        if to_state.value in TERMINAL_VALUES:
            values["terminal_at_ms"] = tx.now_expr()
            values["wake_requested"] = False
        set_execution_txn(tx, execution_id, **values)
        after = require_execution_txn(tx, execution_id)
        audit_change_txn(tx, audit, execution_id, record, after)
        return after


# --- payments left behind ---------------------------------------------------------


_CANDIDATE_BATCH = 200
"""How many candidates of "failed after a payment" one read transaction judges."""


@dataclass(frozen=True)
class LeftBehind:
    """A "failed after a payment" execution the listing holds, with the keys of the
    payments it left behind. ``unopened``: what of it this process could not open
    (``table.column: why``), shown rather than left out; ``judged`` false when that
    was its undos' marks (what they refunded): every completed payment it made or used
    is then held, for a person to judge with the key, and retention keeps them all."""

    record: ExecutionRecord
    keys: list[str]
    unopened: str | None = None
    judged: bool = True


def failed_after_payment(
    store: SQLAlchemyStore, limit: int = 100, *, ended_before_ms: int | None = None
) -> list[tuple[ExecutionRecord, list[str]]]:
    """``payments_left_behind``'s executions and keys."""
    found = payments_left_behind(store, limit, ended_before_ms=ended_before_ms)
    return [(left.record, left.keys) for left in found]


def payments_left_behind(
    store: SQLAlchemyStore, limit: int = 100, *, ended_before_ms: int | None = None
) -> list[LeftBehind]:
    """Up to ``limit`` ``FAILED`` or ``CANCELLED`` executions that left a completed
    payment behind (``shared_records.unhandled_payments``: nobody undid it, no other
    execution completed on it or still uses it) and no operator said is dealt with, with
    the keys of those payments; oldest first.

    SQL only finds the candidates (a completed, uncompensated intent of theirs); core's
    rule decides each, and it reads what SQL cannot (its undos' refunds, in their sealed
    marks). Many candidates are not one — a failure whose undo refunded, or whose charge
    a second click completed on — and stay candidates until retention, so the
    candidates are paged through, a batch per read transaction (keyset on the sort
    order), until ``limit`` are found or none is left: older lookalikes never hide one.
    ``ended_before_ms``: only those that ended before it (what retention must keep).
    Each candidate is judged alone: one no key of this process opens is held, never
    skipped (``_left_behind``).
    """
    found: list[LeftBehind] = []
    after: tuple[int, str] | None = None
    while len(found) < limit:
        with store.read_transaction() as tx:
            candidates = _candidates(tx, after, ended_before_ms)
            rows = tx.execute(candidates.limit(_CANDIDATE_BATCH)).all()
            for row in rows:
                left = _left_behind(tx, row)
                if left.keys:
                    found.append(left)
                    if len(found) == limit:
                        break
        if len(rows) < _CANDIDATE_BATCH:
            break
        after = (int(rows[-1].ended_at), str(rows[-1].id))
    return found


def _left_behind(tx: SQLTransaction, row: Any) -> LeftBehind:
    """One candidate, judged alone. Its own values that do not open are shown as such
    (the rule reads none of them); when its undos' marks do not open, what they refunded
    is unknown, so every completed payment it made or used stays: retention deleting
    one would leave a customer charged with nobody told (design: retention)."""
    conn = tx.connection
    with showing_unopened(conn):
        record = record_of(row, conn)
    unopened = [
        f"{executions.name}.{name}: {text}"
        for name, text in unopened_fields(record, executions.name).items()
    ]
    try:
        keys = _payments_left_behind(tx, record)
    except SealedValueUnopenableError as error:
        where = f"{getattr(error, 'table', '?')}.{getattr(error, 'column', '?')}"
        why = f"{where}: {unopened_text(error, sealer_of(conn).ring)}"
        return LeftBehind(record, _completed_payments_of(tx, record.id), why, judged=False)
    return LeftBehind(record, keys, unopened[0] if unopened else None)


def _candidates(
    tx: SQLTransaction, after: tuple[int, str] | None, ended_before_ms: int | None = None
) -> Any:
    """``FAILED`` or ``CANCELLED``, not handled, with a completed uncompensated intent it
    created or used; ordered by when it ended, then id (``ended_at``: 0 for a row
    without an end time, on both databases), after the keyset ``after``."""
    # Two correlated look-ups, each on its index (an intent's execution_id, a use's
    # execution_id then the intent's key): one ``OR`` over both read every intent.
    completed = _completed_uncompensated()
    made = exists().where(*completed, _i.execution_id == _e.id)
    used = exists().where(
        _u.kind == INTENT_RECORD,
        _u.execution_id == _e.id,
        _i.idempotency_key == _u.record_key,
        *completed,
    )
    payment = or_(made, used)
    ended = func.coalesce(_e.terminal_at_ms, 0)
    statement = select(
        executions, tx.now_expr().label("read_at_ms"), ended.label("ended_at")
    ).where(
        _e.state.in_([ExecutionState.FAILED.value, ExecutionState.CANCELLED.value]),
        _e.payments_handled_at_ms.is_(None),
        payment,
    )
    if after is not None:
        statement = statement.where(
            or_(ended > after[0], and_(ended == after[0], _e.id > after[1]))
        )
    if ended_before_ms is not None:  # on its index: the few this old, not every failure
        statement = statement.where(_e.terminal_at_ms < ended_before_ms)
    return statement.order_by(ended, _e.id)


def _payments_left_behind(tx: SQLTransaction, record: ExecutionRecord) -> list[str]:
    """The keys of the payments the candidate left behind (core's rule); empty when none."""
    records = tx.shared_records_of(record.id)
    declared = declared_txn(tx)  # a claim without its undos leaves it behind too
    declarations = declared(record.id)
    undone = intents_made_by_undos_txn(tx, record.id, records, declarations)
    finished = steps_undone(tx, declarations)
    covers = step_covers(declared, record.id)
    left = unhandled_payments(
        records, record.id, undone=undone, undone_steps=finished, covers=covers
    )
    return [payment.key for payment in left]


def _completed_uncompensated() -> tuple[Any, Any]:
    """An intent a candidate's payment may be: completed, and no undo took it back."""
    return (_i.status == IntentStatus.COMPLETED.value, _i.compensated_at_ms.is_(None))


def _completed_payments_of(tx: SQLTransaction, execution_id: str) -> list[str]:
    """Every completed, uncompensated intent the execution made or used: what makes it a
    candidate, held whole when core's rule cannot read what its undos refunded."""
    rows = tx.execute(
        select(_i.idempotency_key)
        .where(*_completed_uncompensated(), used_by_execution(execution_id))
        .order_by(_i.first_attempt_at_ms, _i.idempotency_key)
    ).all()
    return [str(row.idempotency_key) for row in rows]


def _claim_handled(tx: SQLTransaction, execution_id: str) -> None:
    """The claims of ``cancel --payments-handled`` (``handled_payments.claim_handled_txn``):
    unclaimed, the charge refunded by hand would be handed to a later click on the same
    order as paid (goods shipped), or refunded again by that click's undo
    (design: cancel request, operator decisions). A payment step whose undos all ran is
    not claimed: its undo took it back already. With the claims switched off under test,
    still refused while another live execution uses one."""
    write = not sabotage.active(PAYMENTS_HANDLED_VERB_CLAIMS_NOTHING)
    declarations = undo_declarations_txn(tx, execution_id)
    left, _ = undos_left_txn(tx, declarations, tx.shared_records_of(execution_id))
    payments = left & payment_steps(tx, declarations)
    again = f"payments-handled {execution_id} --reason TEXT"
    claim_handled_txn(tx, execution_id, declarations, payments, again=again, write=write)


def mark_payments_handled(
    store: SQLAlchemyStore, execution_id: str, *, audit: Audit | None = None
) -> ExecutionRecord | None:
    """An operator dealt with the payments a ``FAILED`` or ``CANCELLED`` execution left
    behind (refunded at the gateway, or kept); None unless it is one of those. Refused,
    nothing written, as ``cancel --payments-handled`` is (``refuse_handled_txn``, and the
    claims themselves while another live execution uses a charge: ``_claim_handled``);
    else what the word covers is claimed with the flag."""
    with store.transaction() as tx:
        record = read_execution_txn(tx, execution_id, lock=True)
        if record is None or record.state not in (
            ExecutionState.FAILED,
            ExecutionState.CANCELLED,
        ):
            return None
        refuse_handled_txn(tx, execution_id)
        _claim_handled(tx, execution_id)
        set_execution_txn(tx, execution_id, payments_handled_at_ms=tx.now_expr())
        after = require_execution_txn(tx, execution_id)
        audit_change_txn(tx, audit, execution_id, record, after)
        return after


__all__ = [
    "LeftBehind",
    "accept_divergence",
    "executions_waiting_on",
    "failed_after_payment",
    "intents_needing_operator",
    "list_executions",
    "locked_if",
    "mark_payments_handled",
    "move",
    "payments_left_behind",
    "pending_intent_keys",
    "read_execution",
    "unblock",
]
