"""Cancels: a request recorded, and its end, by a delivery, the sweep or an operator.

A cancel never ends an execution while a payment may be in flight (a pending intent)
or a delivery runs it (a live lease): the request is kept and its running body, its
next delivery or the sweep honours it. Its end is ``shared_records.cancel_decision``'s,
written under the execution row's lock. An operator's ``--payments-handled`` is kept on
the row with that end (its payments' undos are then never run: ``payment_steps``), or
refused when no end can be written now; it is never dropped from a request.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import and_, func, not_, or_, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.sql.selectable import Exists

from celery_agboss.core import sabotage
from celery_agboss.core.execution_states import (
    cancel_ends_now,
    cancel_reason_of,
    cancel_verdict,
)
from celery_agboss.core.executions import (
    CANCELLABLE_STATES,
    Audit,
    ExecutionRecord,
    ExecutionState,
)
from celery_agboss.core.protections import (
    PAYMENTS_HANDLED_CLAIMED_AFTER_UNDOS,
    PAYMENTS_HANDLED_DROPPED_WHILE_RUNNING,
    PAYMENTS_HANDLED_SKIPS_EFFECT_UNDOS,
    PAYMENTS_HANDLED_STEP_UNCLAIMED,
)
from celery_agboss.core.shared_records import CancelDecision, CancelStep, cancel_decision
from celery_agboss.core.shared_steps import Declared, record_kinds, step_covers
from celery_agboss.core.store_protocol import FencedTransaction, SharedRecord
from celery_agboss.core.undo_steps import (
    UndoDeclaration,
    steps_undone,
    undo_task_cancel_verdict,
)
from celery_agboss.errors import OperatorRefusedError
from celery_agboss.store import undo_tasks_running as undo_tasks
from celery_agboss.store.execution_rows import (
    audit_change_txn,
    execution_lease_live,
    has_pending_intent_txn,
    intents_made_by_undos_txn,
    pending_intent_of,
    read_execution_txn,
    require_execution_txn,
    require_with_pending_txn,
    set_execution_txn,
    sql,
    write_verdict_txn,
)
from celery_agboss.store.execution_updates import cancel_request_statement, undoing
from celery_agboss.store.handled_payments import (
    claim_handled_txn,
    declared_txn,
    handled_payment_steps_in,
    payment_steps,
    refuse_handled_txn,
)
from celery_agboss.store.intents import owner_live_expr
from celery_agboss.store.leases import lease_live
from celery_agboss.store.schema import outbound_calls
from celery_agboss.store.schema_executions import executions
from celery_agboss.store.sealed_columns import opened, sealed
from celery_agboss.store.sqlalchemy_store import SQLAlchemyStore
from celery_agboss.store.transactions import SQLTransaction

_e = executions.c
_i = outbound_calls.c


# --- a pause inside an undo ----------------------------------------------------------------


def paused_in_undo_txn(tx: SQLTransaction, record: ExecutionRecord) -> bool:
    """``record`` waits for a pause one of its undos made: its pause is answered despite a
    cancel request, and a cancel leaves it alone, as it leaves a ``COMPENSATING`` one."""
    if record.state is not ExecutionState.PAUSED:
        return False
    return bool(tx.execute(select(undoing(record.id))).scalar())


def paused_in_undo(store: SQLAlchemyStore, record: ExecutionRecord) -> bool:
    """``paused_in_undo_txn`` in a read of its own (an operator's check before acting)."""
    if record.state is not ExecutionState.PAUSED:
        return False
    with store.read_transaction() as tx:
        return paused_in_undo_txn(tx, record)


def cancel_reason_kept(conn: Connection, execution_id: str, reason: str) -> Any:
    """The row's cancel reason if it has one, else ``reason`` (sealed for the row)."""
    return func.coalesce(
        _e.cancel_reason, sealed(conn, executions.name, "cancel_reason", execution_id, reason)
    )


def opened_cancel_reason(conn: Connection, execution_id: str, stored: str | None) -> str | None:
    return opened(conn, executions.name, "cancel_reason", execution_id, stored)


def end_cancelled_txn(
    tx: SQLTransaction,
    execution_id: str,
    reason: str,
    wait_ms: int,
    *,
    payments_handled: bool = False,
    undos_ran: bool = False,
) -> ExecutionRecord:
    """The end of a cancel request, once nothing is pending and no lease is live (the
    caller checked both under the row locks), as ``shared_records.cancel_decision``
    rules from its payments: ``CANCELLED``; ``COMPENSATING`` when its undos must run
    first (a delivery runs them, then cancels it); ``WAITING`` while another execution
    still uses one of its payments; or ``WAITING_OPERATOR`` "cancelled after a
    completed payment", listed by ``agboss pending`` until an operator settles it.
    ``wait_ms``: how long a wait for another execution lasts before it looks again;
    ``payments_handled``: an operator says the payments are dealt with now (kept on the
    row, so the end after its undos or its wait honours it: ``_handled_step``);
    ``undos_ran``: the delivery that ran its undos ends it."""
    reason = reason[:900]
    cancel = {
        "cancel_requested": True,
        "cancel_reason": cancel_reason_kept(tx.connection, execution_id, reason),
    }
    row = tx.execute(
        select(_e.options, _e.payments_handled_at_ms).where(_e.id == execution_id)
    ).first()
    handled = payments_handled or (row is not None and row.payments_handled_at_ms is not None)
    declared = declared_txn(tx)
    if handled:
        step, other = _handled_step(tx, execution_id, declared, undos_ran=undos_ran)
    else:
        declarations = declared(execution_id)
        records = tx.shared_records_of(execution_id)
        left, steps = undos_left_txn(tx, declarations, records)
        decision = cancel_decision(
            [*records, *steps],
            execution_id,
            undoable={d.step_key for d in declarations},
            undone=intents_made_by_undos_txn(tx, execution_id, records, declarations),
            undos_left=left,
            undone_steps={d.step_key for d in declarations} - left,
            undos_ran=undos_ran,
            covers=step_covers(declared, execution_id),
        )
        step, other = decision.step, decision.other
    verdict = cancel_verdict(step, reason, other)
    if verdict.state is ExecutionState.CANCELLED and not handled and row is not None:
        verdict = undo_task_cancel_verdict(verdict, row.options)  # an undo's task: a person
    values: dict[str, Any] = dict(cancel)
    if verdict.state is ExecutionState.WAITING:  # looks again once the other may have ended
        values.update(not_before_ms=tx.now_expr() + wait_ms, redrive_planned=True)
    if verdict.state in (ExecutionState.WAITING, ExecutionState.WAITING_OPERATOR):
        values["wake_requested"] = False
    if payments_handled:
        # The operator's confirmation: not listed again as "failed after a payment", and
        # read again by the end of the undos or the wait it leads to.
        values["payments_handled_at_ms"] = tx.now_expr()
    return write_verdict_txn(tx, execution_id, verdict, **values)


def _handled_step(
    tx: SQLTransaction, execution_id: str, declared: Declared, *, undos_ran: bool
) -> tuple[CancelStep, str | None]:
    """The end of a cancel whose payments an operator dealt with at the gateway: they are
    accounted for, and their undos are not run (``payment_steps``: the delivery that runs
    the others skips them, ``compensation.run_undos``), but the undos of its fenced effects
    (a debit of the app's own ledger) still run, decided by the one rule over those steps
    alone (design: cancel request). A person's word also settles what only a person could
    (an effect another execution claimed without its undo: ``OPERATOR``). Its payment
    steps are claimed as the delivery's undos claim them, and so are the charges it sent
    without an undo (``core.handled_steps``: never read undone, never replayed as paid) —
    at once, also when its effects' undos run first: left unclaimed until they ran, a
    later click would be handed a charge refunded by hand as paid meanwhile."""
    if sabotage.active(PAYMENTS_HANDLED_SKIPS_EFFECT_UNDOS):
        return CancelStep.CANCEL, None
    declarations = declared(execution_id)
    records = tx.shared_records_of(execution_id)
    left, steps = undos_left_txn(tx, declarations, records)
    payments = left & payment_steps(tx, declarations)
    effects = left - payments
    decision = cancel_decision(
        [s for s in steps if s.key in effects],
        execution_id,
        undoable=effects,
        undos_left=effects,
        undos_ran=undos_ran,
        covers=step_covers(declared, execution_id),
    )
    if not effects or decision.step is CancelStep.OPERATOR:
        decision = CancelDecision(CancelStep.CANCEL)
    late = sabotage.active(PAYMENTS_HANDLED_CLAIMED_AFTER_UNDOS)
    write = decision.step is CancelStep.CANCEL or not late  # late: refused, not claimed
    _claim_handled(tx, execution_id, declarations, payments, undos_ran=undos_ran, write=write)
    return decision.step, decision.other


def _claim_handled(
    tx: SQLTransaction,
    execution_id: str,
    declarations: Sequence[UndoDeclaration],
    payments: set[str],
    *,
    undos_ran: bool,
    write: bool = True,
) -> None:
    """``_handled_step``'s claims: its payment steps with undos left (``payments``) and the
    charges it sent or relied on without one, as the delivery's undos claim them; at the
    operator's acceptance, refused while another live execution uses one (also with the
    claims switched off under test: ``write``)."""
    write = write and not sabotage.active(PAYMENTS_HANDLED_STEP_UNCLAIMED)
    again = f"cancel {execution_id} --payments-handled --reason TEXT"
    claim_handled_txn(
        tx, execution_id, declarations, payments, again=again, in_delivery=undos_ran, write=write
    )


def undos_left_txn(
    tx: SQLTransaction, declarations: Sequence[UndoDeclaration], records: Sequence[SharedRecord]
) -> tuple[set[str], list[SharedRecord]]:
    """The steps the execution declared undos for that are not all marked done (the one
    rule, ``undo_steps.steps_undone``), and the records of those not among ``records``
    (its intents): a fenced effect's, read as ``shared_steps.decide_step`` reads it, in
    the cancel's transaction."""
    left = {d.step_key for d in declarations} - steps_undone(tx, declarations)
    known = {record.key for record in records}
    steps: list[SharedRecord] = []
    for declaration in declarations:
        if declaration.step_key not in left or declaration.step_key in known:
            continue
        known.add(declaration.step_key)
        kinds = record_kinds(declaration.kind)
        for kind in kinds:
            record = tx.read_shared(kind, declaration.step_key)
            if record is not None:
                steps.append(record)
                break
    return left, steps


def request_cancel(
    store: SQLAlchemyStore,
    wait_ms: int,
    execution_id: str,
    reason: str,
    *,
    payments_handled: bool = False,
    audit: Audit | None = None,
) -> ExecutionRecord | None:
    """Record a cancel request. An execution that runs under no live lease, has no
    pending intent and is not ``COMPENSATING`` (nor paused inside an undo) ends now
    (``CANCELLED``, its undos first, a wait for another execution that shares a payment,
    or "cancelled after a completed payment"); any other keeps the request, which its
    running body's next ``outbound()`` or ``fenced_effect()`` honours, or its next
    delivery, or the sweep. ``payments_handled``: an operator says the completed
    payments are dealt with; kept on the row only with an end written now, else refused
    with nothing written (``_handled_not_now``). ``audit``: the operator's row, written in
    this transaction."""
    with store.transaction() as tx:
        record = read_execution_txn(tx, execution_id, lock=True)
        if record is None and undo_tasks.record_revoked_undo_task(tx, execution_id):
            record = read_execution_txn(tx, execution_id, lock=True)
        if record is None or record.terminal:
            return record
        if payments_handled:  # nothing written: a refund task, or another user, may act
            refuse_handled_txn(tx, execution_id)
        in_undo = paused_in_undo_txn(tx, record)
        if not in_undo and cancel_ends_now(
            record,
            lambda: execution_lease_live(tx, execution_id),
            lambda: has_pending_intent_txn(tx, execution_id),
        ):
            set_execution_txn(tx, execution_id, cancel_requested=True, cancel_reason=reason)
            after = end_cancelled_txn(
                tx, execution_id, reason, wait_ms, payments_handled=payments_handled
            )
        else:
            if payments_handled and not sabotage.active(PAYMENTS_HANDLED_DROPPED_WHILE_RUNNING):
                raise _handled_not_now(tx, record, in_undo)  # nothing written: rolled back
            set_execution_txn(
                tx,
                execution_id,
                cancel_requested=True,
                cancel_reason=cancel_reason_kept(tx.connection, execution_id, reason),
            )
            after = require_execution_txn(tx, execution_id)
        audit_change_txn(tx, audit, execution_id, record, after)
        return after


def _handled_not_now(
    tx: SQLTransaction, record: ExecutionRecord, in_undo: bool
) -> OperatorRefusedError:
    """``--payments-handled`` of an execution that cannot end now: a delivery took its lease,
    an intent of it is pending, or its undos run, since the operator's verb checked it.
    Refused, nothing written (design: cancel request, operator decisions): kept with the
    request, the word would also cover a payment that delivery makes after it (never
    refunded, nobody told); dropped, the request's end would run the refund the operator
    made by hand. The operator looks again once it stopped."""
    if in_undo or record.state is ExecutionState.COMPENSATING:
        code, what = "wrong-state", "started running its undos"
    elif execution_lease_live(tx, record.id):
        code, what = "lease-live", "started running (a delivery took its lease)"
    else:
        code, what = "pending-intent", "got a PENDING intent (a payment may be in flight)"
    return OperatorRefusedError(
        f"execution {record.id} {what} while the cancel was being checked; nothing was "
        "recorded: --payments-handled covers the payments you dealt with, and a running "
        "delivery may make or refund another. Wait until it stops (`celery -A proj agboss "
        f"show {record.id}`), deal with what it left at the gateway, then cancel again",
        code=code,
        execution_id=record.id,
    )


def end_cancel_requested(
    store: SQLAlchemyStore,
    wait_ms: int,
    execution_id: str,
    reason: str,
    *,
    payments_handled: bool = False,
) -> ExecutionRecord | None:
    """The sweep's and the operators' end of a cancel request, under the execution's
    row lock and its lease's: only while it is not running (no live lease), not
    ``COMPENSATING`` nor paused inside an undo, and has no pending intent; the record as
    it is then (None when unknown). ``CANCELLED``, or "cancelled after a completed
    payment"."""
    with store.transaction() as tx:
        record = read_execution_txn(tx, execution_id, lock=True)
        if record is None or record.terminal:
            return record
        if paused_in_undo_txn(tx, record) or not cancel_ends_now(
            record,
            lambda: execution_lease_live(tx, execution_id),
            lambda: has_pending_intent_txn(tx, execution_id),
            keep_operator_wait=not payments_handled,
        ):
            return record
        return end_cancelled_txn(
            tx,
            execution_id,
            record.cancel_reason or reason,
            wait_ms,
            payments_handled=payments_handled,
        )


def cancel_in(
    tx: FencedTransaction, reason: str, wait_ms: int, *, payments_handled: bool = False
) -> ExecutionRecord:
    """``CANCELLED`` — unless the execution has a pending intent (a payment may be in
    flight: it is reconciled first and the execution is left as it was), or completed
    an outbound call its undos did not take care of (money moved: ``WAITING_OPERATOR``,
    "cancelled after a completed payment", never silently ``CANCELLED``). A revoke's
    cancel request ends here, in the delivery that settled its intents (and ran its
    undos: it never hands them to a re-drive)."""
    t, execution_id = sql(tx), tx.lease.scope
    record, pending = require_with_pending_txn(t, execution_id)
    if record.terminal or pending:
        return record
    return end_cancelled_txn(
        t,
        execution_id,
        record.cancel_reason or reason,
        wait_ms,
        payments_handled=payments_handled,
        undos_ran=True,
    )


def cancel_request_in(tx: FencedTransaction) -> str | None:
    """The reason of the execution's cancel request, read in the caller's fenced
    transaction (the one that would authorise the next send or write); None when there
    is none. On PostgreSQL the row is read ``FOR SHARE``: a cancel being recorded now
    waits for this transaction, so it either is seen here or comes after this send's
    claim (and stops the next one)."""
    t, execution_id = sql(tx), tx.lease.scope
    row = t.execute(cancel_request_statement(t.connection), {"e_id": execution_id}).first()
    if row is None:
        return None
    stored = opened_cancel_reason(t.connection, execution_id, row.cancel_reason)
    return cancel_reason_of(bool(row.cancel_requested), stored)


CANCEL_FLAGS_FROM = (ExecutionState.REQUESTED, ExecutionState.RUNNING, ExecutionState.WAITING)
"""The states from which the sweep's cancel step moves an execution whose pending intent
needs an operator to ``WAITING_OPERATOR`` (``PAUSED`` and ``PARKED`` stay as they are)."""


def find_cancel_requested(store: SQLAlchemyStore, limit: int) -> list[str]:
    """Ids of executions with a cancel request the sweep's cancel step can act on now:
    not terminal, not running (no live lease), not waiting for their operator, not
    paused inside an undo (``undoing``: its compensation goes on), and one
    of the step's three cases: nothing pending (it ends them); a pending intent whose
    lookup confirmed it was not sent and no live lease owns (it settles it); a pending
    intent that needs an operator, the execution ``REQUESTED``, ``RUNNING`` or
    ``WAITING`` (it moves it to ``WAITING_OPERATOR``). Only a listing: each is ended
    under its row locks (``end_cancel_requested``).

    Why in the listing: a row the step can do nothing for yet (its intent waits for a
    lookup, the reconcile step's to make) would, listed, keep its place at the head of
    every batch (nothing written, ``updated_at_ms`` unchanged) and hide every row behind
    it. Left out, it comes back as soon as its intent changes into one of the cases
    above; every row listed is written (ended, moved, or its intent settled), so each
    run's batch moves on past it and every actionable row is reached."""
    states = [state.value for state in CANCELLABLE_STATES - {ExecutionState.WAITING_OPERATOR}]
    with store.read_transaction() as tx:
        now = tx.now_expr()
        pending = pending_intent_of(_e.id)
        assert isinstance(pending, Exists)  # narrowed below by the step's cases
        settleable = pending.where(
            _i.not_sent_confirmed, not_(_i.needs_operator), not_(owner_live_expr(now))
        )
        flagged = and_(
            _e.state.in_([state.value for state in CANCEL_FLAGS_FROM]),
            pending.where(_i.needs_operator),
        )
        rows = tx.execute(
            select(_e.id)
            .where(
                _e.cancel_requested,
                _e.state.in_(states),
                not_(and_(_e.state == ExecutionState.PAUSED.value, undoing(_e.id))),
                not_(lease_live(now, _e.id)),
                or_(not_(pending), settleable, flagged),
            )
            .order_by(_e.updated_at_ms, _e.id)
            .limit(limit)
        ).all()
        return [str(row.id) for row in rows]


def put_cancel_request_last(store: SQLAlchemyStore, execution_id: str) -> None:
    """The cancel step raised on this row: it goes to the end of the oldest-first listing
    (``updated_at_ms`` now), so a row that raises every run (an intent sealed under a key
    no longer configured) never holds the others back."""
    with store.transaction() as tx:
        last = update(executions).where(_e.id == execution_id, _e.cancel_requested)
        tx.execute(last.values(updated_at_ms=tx.now_expr()))


__all__ = [
    "CANCEL_FLAGS_FROM",
    "cancel_in",
    "cancel_request_in",
    "declared_txn",
    "end_cancel_requested",
    "end_cancelled_txn",
    "find_cancel_requested",
    "handled_payment_steps_in",
    "paused_in_undo",
    "paused_in_undo_txn",
    "payment_steps",
    "put_cancel_request_last",
    "request_cancel",
    "undoing",
    "undos_left_txn",
]
