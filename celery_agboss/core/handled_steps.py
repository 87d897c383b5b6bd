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
another, it is left as it is. A charge the execution sent and declared no undo of is such a
step too (``handled_steps``): unclaimed, a later click on the order would replay it as paid.
Claimed, it covers nobody: another execution that relied on it and failed owes its own
undos, and waits for, or is listed to, a person (``shared_steps.claim_covers``).

The operator's word is refused while another live execution still uses such a step
(``claim_handled_steps``): a claim does not stop that one, which, re-delivered, would be
handed the charge as paid (goods shipped on a charge maybe refunded by hand), or, failing,
would read it covered by a claimer whose undo never runs (nobody told). The claim at
acceptance is that one decision, not a read before it: a click's replay in between makes
its compare-and-set miss (it matches the reliance read), the step is read again, found
used, and the word refused with nothing written. A step claimed, a replay's own
compare-and-set (``undo_by`` unset) misses in turn and it is told "claimed for undo".
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from celery_agboss.core import sabotage
from celery_agboss.core.execution_context import ExecutionContext
from celery_agboss.core.executions import ExecutionState
from celery_agboss.core.protections import (
    PAYMENTS_HANDLED_SKIPS_RELIED_CHARGES,
    PAYMENTS_HANDLED_SKIPS_UNDECLARED_CHARGES,
    PAYMENTS_HANDLED_WHILE_ANOTHER_USES,
)
from celery_agboss.core.shared_records import (
    UndoDecision,
    UndoOutcome,
    moved_money,
    undo_decision,
)
from celery_agboss.core.shared_steps import UndosOf, record_kinds
from celery_agboss.core.store_protocol import (
    INTENT_RECORD,
    IntentStatus,
    SharedRecord,
    StoreTransaction,
)
from celery_agboss.core.undo_steps import UndoDeclaration
from celery_agboss.errors import OperatorRefusedError, OutboundCallInFlightError

HANDLED_CLAIM_ROUNDS = 8
"""Claims of one handled step that may miss (another relied on it meanwhile) before it
reports contention."""


def claim_handled_step(
    tx: StoreTransaction,
    execution_id: str,
    step: str,
    kind: str | None = None,
    *,
    in_delivery: bool = True,
    write: bool = True,
) -> UndoDecision:
    """Claim ``step`` for ``execution_id`` (module docstring); the decision as
    ``undo_decision`` reads it. ``in_delivery`` (the compensating delivery, whose word was
    accepted): a ``WAIT`` is taken as ``UNDO`` and claimed, never waited for. At
    acceptance a ``WAIT`` is answered, unclaimed, for the caller to refuse: the claim is the
    one decision, and a click that relied after any earlier read makes its compare-and-set
    miss, so it is read again and met. ``kind``: the record's kind when declared, else
    both tables are read. Not ``write`` (a protection switched off under test): decided,
    never claimed."""
    kinds = record_kinds(kind)
    takes_wait = in_delivery or sabotage.active(PAYMENTS_HANDLED_WHILE_ANOTHER_USES)
    for _ in range(HANDLED_CLAIM_ROUNDS):
        found = [(k, r) for k in kinds if (r := tx.read_shared(k, step)) is not None]
        if not found:
            return UndoDecision(UndoOutcome.UNDO)  # never reached: nothing to claim
        record_kind, record = found[0]
        decision = undo_decision(record, execution_id)
        if decision.outcome is UndoOutcome.WAIT and not takes_wait:
            return decision
        if decision.outcome not in (UndoOutcome.UNDO, UndoOutcome.WAIT) or not write:
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


def claim_handled_steps(
    tx: StoreTransaction,
    execution_id: str,
    steps: Mapping[str, str | None],
    *,
    in_delivery: bool,
    again: str,
    write: bool = True,
) -> None:
    """Claim every one of ``steps`` (each with its record's kind when known). At an
    operator's acceptance (not ``in_delivery``) the claims are the one decision: another
    live execution still using one is refused (``wrong-state``, naming it) and contention
    is ``conflict``, both raised for the caller's transaction to roll back with every claim
    made so far (nothing written); never a signal escaping the admin, the CLI or the sweep.
    ``again``: the operator's command, named in the refusal. Not ``write`` (a claim switched
    off under test): the refusal still happens, nothing is claimed."""
    others: set[str] = set()
    for step in sorted(steps):
        if in_delivery:
            if write:
                claim_handled_step(tx, execution_id, step, steps[step])
            continue
        try:
            decision = claim_handled_step(
                tx, execution_id, step, steps[step], in_delivery=False, write=write
            )
        except OutboundCallInFlightError as exc:
            raise OperatorRefusedError(
                f"execution {execution_id}: {exc}; nothing was recorded. Try again in a moment",
                code="conflict",
                execution_id=execution_id,
            ) from None
        if decision.outcome is UndoOutcome.WAIT and decision.other:
            others.add(decision.other)
    if others:
        running = _running(tx, steps, others)
        raise refused_while_another_uses(execution_id, sorted(others), again, running)


def _running(
    tx: StoreTransaction, steps: Mapping[str, str | None], others: Collection[str]
) -> set[str]:
    """Which of ``others`` run now (``RUNNING``), as the steps' records read their users:
    the refusal's advice differs for one that runs and one that waits."""
    running: set[str] = set()
    for step, kind in steps.items():
        for record_kind in record_kinds(kind):
            record = tx.read_shared(record_kind, step)
            users = [] if record is None else record.users
            running.update(
                u.execution_id
                for u in users
                if u.execution_id in others and u.state == ExecutionState.RUNNING.value
            )
    return running


def handled_steps(
    execution_id: str,
    declarations: Sequence[UndoDeclaration],
    payments: Collection[str],
    records: Sequence[SharedRecord],
    undone: Collection[str],
) -> dict[str, str | None]:
    """What ``--payments-handled`` of the execution covers, each step with its record's
    kind when known: ``payments`` (its steps with declared undos that are payments:
    ``store.handled_payments.payment_steps``), and every charge among ``records`` (its
    own) it declared no undo of and that is its to account for — not one its undos made
    (``undone``: their refunds): one it sent, or one it relied on that nobody completed on
    and nobody else claimed (its sender ended without claiming it: ``_relied_on``).
    Unclaimed, a later click would be handed such a charge, refunded by hand, as paid."""
    steps: dict[str, str | None] = {}
    for declaration in (d for d in declarations if d.step_key in payments):
        steps.setdefault(declaration.step_key, declaration.kind)
    sent = not sabotage.active(PAYMENTS_HANDLED_SKIPS_UNDECLARED_CHARGES)
    declared = {d.step_key for d in declarations}
    for record in records:
        if record.key in declared or record.key in undone:
            continue
        if (sent and moved_money(record, execution_id)) or _relied_on(record, execution_id):
            steps.setdefault(record.key, INTENT_RECORD)
    return steps


def _relied_on(record: SharedRecord, execution_id: str) -> bool:
    """A completed charge another execution sent that this one's undo decision would take
    (``UNDO``: nobody completed on it, none live, nobody else claimed it). Not one another
    live execution still uses (``WAIT``): that one's own word accounts for it, and refusing
    here too would have two waiting clicks each refused for the other. One that relies on
    it while the word is given makes the claim refuse (``claim_handled_steps``)."""
    if record.kind != INTENT_RECORD or record.status is not IntentStatus.COMPLETED:
        return False
    if record.sent_by == execution_id or sabotage.active(PAYMENTS_HANDLED_SKIPS_RELIED_CHARGES):
        return False
    return undo_decision(record, execution_id).outcome is UndoOutcome.UNDO


def refused_while_another_uses(
    execution_id: str, others: Sequence[str], again: str, running: Collection[str] = ()
) -> OperatorRefusedError:
    """The refusal (``wrong-state``) of an operator's word on the execution's payments while
    ``others``, live, still use a step it would claim (module docstring), with the way out
    (``again``: the cancel, or ``payments-handled``). One that waits (not in ``running``)
    is cancelled plainly first: its own ``--payments-handled`` would be refused naming this
    one, while a plain cancel leaves it no longer live (it waits its turn, or for a person,
    and then its own word is accepted). One that runs may complete: wait for it."""
    other = others[0]
    if other in running:
        way = f"wait until {other} ends (it runs: let it complete, or cancel it)"
    else:
        way = (
            f"{other} waits: cancel it plainly first (`celery -A proj agboss cancel {other} "
            "--reason TEXT`; it then waits its turn or for you, and its own "
            "`--payments-handled` comes after)"
        )
    return OperatorRefusedError(
        f"execution {execution_id} shares a payment with {', '.join(others)}, which may "
        f"still complete on it (handed the charge as paid); nothing was recorded. {way}, "
        f"then run `celery -A proj agboss {again}` again",
        code="wrong-state",
        execution_id=execution_id,
    )


def decide_handled_step(
    ctx: ExecutionContext, declaration: UndoDeclaration, undos_of: UndosOf | None = None
) -> UndoDecision:
    """``decide_step`` for a payment step an operator dealt with: claimed under the
    delivery's lease (``claim_handled_step``), never waited for. Claimed at the word's
    acceptance already, it reads ``UNDO`` as ``decide_step`` would."""
    with ctx.fenced() as tx:
        return claim_handled_step(tx, ctx.execution_id, declaration.step_key, declaration.kind)


__all__ = [
    "claim_handled_step",
    "claim_handled_steps",
    "decide_handled_step",
    "handled_steps",
    "refused_while_another_uses",
]
