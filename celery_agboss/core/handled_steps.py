"""What becomes of a payment step an operator dealt with by hand (``cancel
--payments-handled``): the one rule both the cancel's end and the delivery that runs the
execution's other undos apply.

The store cannot tell a charge refunded by hand from one kept, so the step must never be
read undone (a later click would pay again under a new attempt) nor be replayed as paid
(an order reading paid on a refunded charge): the cancelled execution claims it
(``undo_by``) and never marks it compensated; a later click is told "claimed for undo",
and a new attempt is a person's to start (docs/undo.md). It never waits for another
execution that still uses it: its undo is never run, so there is nothing to wait for,
and waiting would hold back the undos of the execution's fenced effects (a wallet's
credit-back) for ever. Kept for an execution that completed on it, or already claimed by
another, it is left as it is.

The operator's word is refused while another live execution still uses such a step
(``refuse_while_another_uses``): a claim does not stop that one, which, re-delivered,
would be handed the charge as paid (goods shipped on a charge maybe refunded by hand),
or, failing, would read it covered by a claimer whose undo never runs (nobody told).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from celery_agboss.core import sabotage
from celery_agboss.core.execution_context import ExecutionContext
from celery_agboss.core.protections import (
    PAYMENTS_HANDLED_STEP_WAITS,
    PAYMENTS_HANDLED_WHILE_ANOTHER_USES,
)
from celery_agboss.core.shared_records import UndoDecision, UndoOutcome, undo_decision
from celery_agboss.core.shared_steps import UndosOf, decide_step, record_kinds
from celery_agboss.core.store_protocol import StoreTransaction
from celery_agboss.core.undo_steps import UndoDeclaration
from celery_agboss.errors import OperatorRefusedError, OutboundCallInFlightError

HANDLED_CLAIM_ROUNDS = 8
"""Claims of one handled step that may miss (another relied on it meanwhile) before it
reports contention."""


def claim_handled_step(
    tx: StoreTransaction, execution_id: str, step: str, kind: str | None = None
) -> UndoDecision:
    """Claim ``step`` for ``execution_id`` without waiting for another user of it (module
    docstring); the decision as ``undo_decision`` reads it, a ``WAIT`` taken as ``UNDO``.
    ``kind``: the record's kind when declared, else both tables are read."""
    kinds = record_kinds(kind)
    for _ in range(HANDLED_CLAIM_ROUNDS):
        found = [(k, r) for k in kinds if (r := tx.read_shared(k, step)) is not None]
        if not found:
            return UndoDecision(UndoOutcome.UNDO)  # never reached: nothing to claim
        record_kind, record = found[0]
        decision = undo_decision(record, execution_id)
        if decision.outcome not in (UndoOutcome.UNDO, UndoOutcome.WAIT):
            return decision
        if record.undo_by is not None or tx.claim_undo(
            record_kind, record.key, execution_id, record.reliance
        ):
            return UndoDecision(UndoOutcome.UNDO)
    raise OutboundCallInFlightError(
        "a step whose payment an operator dealt with kept changing while it was claimed; "
        "another execution is working on it",
        execution_id=execution_id,
    )


def claim_handled_for_cancel(
    tx: StoreTransaction, execution_id: str, step: str, kind: str | None
) -> UndoDecision:
    """``claim_handled_step`` on an operator's cancel: contention is refused (``conflict``,
    rolled back with the rest), never a signal escaping the admin, the CLI or the sweep."""
    try:
        return claim_handled_step(tx, execution_id, step, kind)
    except OutboundCallInFlightError as exc:
        raise OperatorRefusedError(
            f"execution {execution_id}: {exc}; nothing was recorded. Try again in a moment",
            code="conflict",
            execution_id=execution_id,
        ) from None


def refuse_while_another_uses(
    tx: StoreTransaction,
    execution_id: str,
    declarations: Sequence[UndoDeclaration],
    payments: Collection[str],
) -> None:
    """Raise ``OperatorRefusedError`` (``wrong-state``) while another live execution still
    uses one of ``payments`` (the steps of ``declarations`` ``--payments-handled`` would
    claim), naming those executions (module docstring)."""
    if sabotage.active(PAYMENTS_HANDLED_WHILE_ANOTHER_USES):
        return
    others: set[str] = set()
    for declaration in (d for d in declarations if d.step_key in payments):
        step, kind = declaration.step_key, declaration.kind
        kinds = record_kinds(kind)
        found = [r for k in kinds if (r := tx.read_shared(k, step)) is not None]
        decision = undo_decision(found[0], execution_id) if found else None
        if decision is not None and decision.outcome is UndoOutcome.WAIT and decision.other:
            others.add(decision.other)
    if others:
        named = ", ".join(sorted(others))
        raise OperatorRefusedError(
            f"execution {execution_id} shares a payment with {named}, which may still "
            "complete on it (handed the charge as paid); nothing was recorded. End that "
            f"one first (`celery -A proj agboss cancel {sorted(others)[0]} "
            "--payments-handled`, or let it complete), then cancel this one again",
            code="wrong-state",
            execution_id=execution_id,
        )


def decide_handled_step(
    ctx: ExecutionContext, declaration: UndoDeclaration, undos_of: UndosOf | None = None
) -> UndoDecision:
    """``decide_step`` for a payment step an operator dealt with: claimed under the
    delivery's lease (``claim_handled_step``), never waited for."""
    if sabotage.active(PAYMENTS_HANDLED_STEP_WAITS):
        return decide_step(ctx, declaration, undos_of)
    with ctx.fenced() as tx:
        return claim_handled_step(tx, ctx.execution_id, declaration.step_key, declaration.kind)


__all__ = [
    "claim_handled_for_cancel",
    "claim_handled_step",
    "decide_handled_step",
    "refuse_while_another_uses",
]
