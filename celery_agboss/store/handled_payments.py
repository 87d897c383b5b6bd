"""What an operator's ``cancel --payments-handled`` (or ``payments-handled`` of an ended
execution) covers, read from the store: when the word is refused, the steps it claims
(``core.handled_steps``), those whose undos a delivery then skips, and whether a claimer's
payment on a step was dealt with by a person — so that its claim covers nobody
(``shared_steps.claim_covers``), in a cancel, the verb, a listing and a delivery alike."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from sqlalchemy import select

from celery_agboss.core import sabotage
from celery_agboss.core.handled_steps import claim_handled_steps, handled_steps
from celery_agboss.core.protections import (
    PAYMENTS_HANDLED_DELIVERY_CLAIMS_NEW_CHARGES,
    PAYMENTS_HANDLED_SKIPS_MONEYLESS_UNDOS,
)
from celery_agboss.core.store_protocol import EFFECT_RECORD, INTENT_RECORD, StoreTransaction
from celery_agboss.core.undo_steps import UndoDeclaration, steps_undone
from celery_agboss.store import undo_tasks_running as undo_tasks
from celery_agboss.store.execution_rows import (
    intents_made_by_undos_txn,
    sql,
    undo_declarations_txn,
)
from celery_agboss.store.schema_executions import executions
from celery_agboss.store.transactions import SQLTransaction

_e = executions.c
_KINDS = [INTENT_RECORD, EFFECT_RECORD]
"""A step's record kinds, read in this order when its declarations do not say."""


def payment_steps(tx: StoreTransaction, declarations: Sequence[UndoDeclaration]) -> set[str]:
    """The steps of ``declarations`` that ``--payments-handled`` covers, for the cancel's
    end and for the undos a delivery runs after it (``run_undos``' ``handled``): every one
    but a fenced effect (a write to the app's own ledger, whose undo still runs), known by
    its record as ``decide_step`` reads it, else by what its declarations say, and but a
    step whose every declaration says its call moves no money (``moves_money=False``). A
    step of unknown kind counts as a payment: its undo may send a refund."""
    said: dict[str, set[str | None]] = {}
    moneyless: dict[str, bool] = {}
    for declaration in declarations:
        said.setdefault(declaration.step_key, set()).add(declaration.kind)
        step = declaration.step_key
        moneyless[step] = moneyless.get(step, True) and not declaration.moves_money
    if sabotage.active(PAYMENTS_HANDLED_SKIPS_MONEYLESS_UNDOS):
        moneyless.clear()
    payments: set[str] = set()
    for step, kinds in said.items():
        if moneyless.get(step, False):
            continue
        read = [kind for kind in _KINDS if kind in kinds] or _KINDS
        found = next((kind for kind in read if tx.read_shared(kind, step) is not None), None)
        if not (found == EFFECT_RECORD or (found is None and kinds == {EFFECT_RECORD})):
            payments.add(step)
    return payments


def handled_payments_txn(
    tx: SQLTransaction, execution_id: str, declarations: Sequence[UndoDeclaration]
) -> dict[str, str | None]:
    """Every step ``--payments-handled`` of the execution covers, with its record's kind
    (``core.handled_steps.handled_steps``): its payments with declared undos, and the
    charges it sent without one."""
    records = tx.shared_records_of(execution_id)
    undone = intents_made_by_undos_txn(tx, execution_id, records, declarations)
    payments = payment_steps(tx, declarations)
    return handled_steps(execution_id, declarations, payments, records, undone)


def refuse_handled_txn(tx: SQLTransaction, execution_id: str) -> None:
    """Raise ``OperatorRefusedError`` (``wrong-state``), before anything is written, while
    a refund task of the execution may still refund (a refund by hand and that task's both
    made). Another live execution still using a step the word covers is refused by the
    claim itself (``claim_handled_txn``): one decision, no read that a click's replay could
    slip past before the claim."""
    undo_tasks.refuse_while_a_refund_task_runs(tx, execution_id, payment_steps)


def claim_handled_txn(
    tx: SQLTransaction,
    execution_id: str,
    declarations: Sequence[UndoDeclaration],
    payments: set[str],
    *,
    again: str,
    in_delivery: bool = False,
    write: bool = True,
) -> None:
    """Claim what the operator's word covers, as the delivery's undos claim: ``payments``
    (its payment steps whose undos are left) and the charges it sent, or relied on, without
    an undo (``handled_payments_txn``). At acceptance (not ``in_delivery``) another live
    user of one is refused, contention is ``conflict``, both rolled back with the rest
    (``core.handled_steps.claim_handled_steps``; ``again``: the operator's command). What
    the word covers was decided then: the delivery that ends the cancel claims only
    ``payments`` and what it claimed already, never a charge it relied on that read
    ``WAIT`` then (its sender live) and ``UNDO`` now (its sender undoing, not claimed yet):
    taken, the sender's own refund would be skipped for a word that never covered it.
    Not ``write`` (a claim switched off under test): the refusal still happens."""
    handled = handled_payments_txn(tx, execution_id, declarations)
    undeclared = handled.keys() - {d.step_key for d in declarations}
    if in_delivery and not sabotage.active(PAYMENTS_HANDLED_DELIVERY_CLAIMS_NEW_CHARGES):
        mine = {r.key for r in tx.shared_records_of(execution_id) if r.undo_by == execution_id}
        undeclared &= mine
    steps = {step: handled.get(step) for step in payments | undeclared}
    claim_handled_steps(tx, execution_id, steps, in_delivery=in_delivery, again=again, write=write)


def _handled_at(tx: SQLTransaction, execution_id: str) -> int | None:
    statement = select(_e.payments_handled_at_ms).where(_e.id == execution_id)
    found = tx.execute(statement).scalar()
    return None if found is None else int(found)


def handled_payment_steps_in(
    tx: StoreTransaction, execution_id: str, declarations: Sequence[UndoDeclaration]
) -> frozenset[str]:
    """The payment steps (``payment_steps``) whose undos a delivery of the execution must
    not run: an operator said its payments are dealt with (``payments_handled_at_ms``,
    kept by ``cancel --payments-handled``, which never writes it while a delivery holds
    the lease: ``request_cancel``). Empty without that word."""
    t = sql(tx)
    if _handled_at(t, execution_id) is None:
        return frozenset()
    return frozenset(payment_steps(t, declarations))


def handled_by_hand_txn(
    tx: StoreTransaction,
    execution_id: str,
    step: str,
    declarations: Sequence[UndoDeclaration] | None = None,
    covered: Collection[str] | None = None,
) -> bool:
    """``shared_steps.HandledIn``: an operator said the execution's payments are dealt with,
    ``step`` is one the word covers (``handled_payments_txn``: the one answer its claims
    were made from), and its undos of it did not all run before (``steps_undone``,
    refunded): the claim it holds there is a person's word, no undo. ``declarations``: the
    execution's, when the caller read them; ``covered``: what ``word_covers_txn`` read."""
    t = sql(tx)
    if covered is None and _handled_at(t, execution_id) is None:
        return False  # no word: nothing read further
    if declarations is None:
        declarations = undo_declarations_txn(t, execution_id)
    if covered is None:
        covered = word_covers_txn(t, execution_id, declarations)
    if step not in covered:
        return False
    of_step = [d for d in declarations if d.step_key == step]
    return step not in steps_undone(t, of_step, refunded=True)


def word_covers_txn(
    tx: SQLTransaction, execution_id: str, declarations: Sequence[UndoDeclaration]
) -> frozenset[str]:
    """The steps an operator's word on the execution covers (``handled_payments_txn``);
    empty without that word."""
    if _handled_at(tx, execution_id) is None:
        return frozenset()
    return frozenset(handled_payments_txn(tx, execution_id, declarations))


@dataclass
class DeclaredUndos:
    """``shared_steps.Declared`` in one transaction: every undo an execution declared, and
    what a person's word on it covers, each read once per execution (a listing asks for
    every claimer and step)."""

    tx: SQLTransaction
    cache: dict[str, list[UndoDeclaration]] = field(default_factory=dict)
    covered: dict[str, frozenset[str]] = field(default_factory=dict)

    def __call__(self, execution_id: str) -> list[UndoDeclaration]:
        if execution_id not in self.cache:
            self.cache[execution_id] = undo_declarations_txn(self.tx, execution_id)
        return self.cache[execution_id]

    def handled_by_hand(self, execution_id: str, step: str) -> bool:
        declarations = self(execution_id)
        if execution_id not in self.covered:
            self.covered[execution_id] = word_covers_txn(self.tx, execution_id, declarations)
        covered = self.covered[execution_id]
        return handled_by_hand_txn(self.tx, execution_id, step, declarations, covered)


def declared_txn(tx: SQLTransaction) -> DeclaredUndos:
    """What ``shared_steps.step_covers`` compares a claimer's undos with, in ``tx``."""
    return DeclaredUndos(tx)


__all__ = [
    "DeclaredUndos",
    "claim_handled_txn",
    "declared_txn",
    "handled_by_hand_txn",
    "handled_payment_steps_in",
    "handled_payments_txn",
    "payment_steps",
    "refuse_handled_txn",
    "word_covers_txn",
]
