"""The undo of a step several executions may share, decided from its record.

``core.compensation`` runs an execution's undos; before the first undo of a step it asks
here what to do with the step (``decide_step``): ``shared_records.undo_decision`` over the
record as the store reads it, and — when it undoes — the claim of the record by a
compare-and-set on the reliance that decision read, in the same fenced transaction. A
claim that misses (another execution relied on the step, or claimed it, meanwhile) reads
and decides again. A holder past its lease decides nothing (design: P5).

A claim covers another execution's undos of the step only when the claimer declared
every one of them (same undo, same arguments, or the same task): a claimer that only
releases stock never skips the refund the other declared. The other then waits for a
person (``UndoNotCoveredError``), and the claimer leaves the step claimed, not
compensated, so a later replay is never told it was undone. A claimer whose payment a
person dealt with (``cancel --payments-handled``) runs none of its undos of it, so its
claim covers nobody (``claim_covers``).

The step reads compensated once every undo the claimer declared for it finished, which
the claimer's delivery and its undos' tasks each learn at their own end
(``compensated_if_taken_back``): judged under the record's row lock, so two ends
committing at once never both miss the other's mark.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from celery_agboss.core import sabotage
from celery_agboss.core.canonical import canonical_json
from celery_agboss.core.engine_settings import EngineSettings
from celery_agboss.core.execution_context import ExecutionContext
from celery_agboss.core.fault_points import UNDO_BEFORE_CLAIM, UNDO_BEFORE_COMPENSATED, fault_point
from celery_agboss.core.keys import business_key_handle
from celery_agboss.core.log_events import UNDO_COVERED, UNDO_KEPT, UNDO_WAITS, log_event
from celery_agboss.core.protections import (
    FENCED_HOLDER_STARTS_UNDO,
    HANDLED_CLAIMER_COVERS,
    UNDO_COVERED_BY_OTHER_UNDOS,
    UNDO_MARKS_READ_UNLOCKED,
    UNDO_TASK_MARK_NOT_KEPT,
)
from celery_agboss.core.shared_records import (
    StepCovers,
    UndoDecision,
    UndoOutcome,
    undo_decision,
)
from celery_agboss.core.store_protocol import (
    EFFECT_RECORD,
    INTENT_RECORD,
    SharedRecord,
    StoreTransaction,
)
from celery_agboss.core.undo_steps import UndoDeclaration, steps_undone, undo_task_done_key
from celery_agboss.errors import OutboundCallInFlightError, OutboundCallUnreconciledError

MAX_DECISION_ROUNDS = 8
"""Reads and claims one step's undo decision may go through before it reports contention."""

HandledIn = Callable[[StoreTransaction, str, str], bool]
"""``(tx, execution id, step key)``: a person dealt with that execution's payment on the
step (``cancel --payments-handled``) and not every undo it declared for it ran before:
what it claimed there, it never undoes (``core.handled_steps``)."""


class UndosOf(Protocol):
    """What an execution declared after a step, read in a decision's transaction."""

    def __call__(
        self, tx: StoreTransaction, execution_id: str, step: str
    ) -> list[UndoDeclaration]: ...

    def handled_by_hand(self, tx: StoreTransaction, execution_id: str, step: str) -> bool:
        """``HandledIn``: its undos of the step are never run (a person's word)."""
        ...


class UndoNotCoveredError(OutboundCallUnreconciledError):
    """Another execution claimed the undo of a shared step without declaring every undo
    this one did for it: this one's would be skipped (a refund nobody makes), so the
    execution waits for a person, as for an unreconciled refund."""


def undo_identity(declaration: UndoDeclaration) -> str:
    """What an undo does, whoever declared it: its name and arguments, or its task's
    name, args and kwargs (a task's options say how it is sent, not what it undoes).
    Arguments count: a refund of 100 (a shipping part) does not cover a refund of 1000;
    arguments that merely differ (an execution's own id) send the case to a person, who
    is told to check the gateway first: fail closed."""
    task = declaration.task
    what = None if task is None else [task.get("task"), task.get("args"), task.get("kwargs")]
    return canonical_json([declaration.undo, declaration.arguments, what])


def covered_by(theirs: Iterable[UndoDeclaration], mine: Iterable[UndoDeclaration]) -> bool:
    """Every undo of ``mine`` is among ``theirs`` (as many times): running theirs runs
    mine."""
    return not Counter(map(undo_identity, mine)) - Counter(map(undo_identity, theirs))


@dataclass(frozen=True)
class DeclaredAfter:
    """``UndosOf`` over a reader of an execution's declarations (``read``) and, where the
    caller can read it, ``HandledIn`` (without it, no claimer reads handled)."""

    read: Callable[[StoreTransaction, str], Sequence[UndoDeclaration]]
    handled: HandledIn | None = None

    def __call__(self, tx: StoreTransaction, execution_id: str, step: str) -> list[UndoDeclaration]:
        return [d for d in self.read(tx, execution_id) if d.step_key == step]

    def handled_by_hand(self, tx: StoreTransaction, execution_id: str, step: str) -> bool:
        return self.handled is not None and self.handled(tx, execution_id, step)


def claim_covers(
    theirs: Iterable[UndoDeclaration], mine: Iterable[UndoDeclaration], *, handled: bool
) -> bool:
    """A claimer's undos of a step (``theirs``) cover another execution's (``mine``): the
    one rule the delivery, a cancel and a listing ask. A claim covers only by the undos it
    runs (``covered_by``); a claimer a person's word settled (``handled``: ``HandledIn``)
    runs none, and what that person did at the gateway (a refund by hand, or the charge
    kept on purpose) is not in the store — so it covers nobody, not even an execution that
    declared no undo of the step (it relied on the charge: a refund may be owed). That
    one waits for, or is listed to, a person (``NOT_COVERED``; design: cancel request)."""
    if handled and not sabotage.active(HANDLED_CLAIMER_COVERS):
        return False
    return covered_by(theirs, mine)


def decide_step(
    ctx: ExecutionContext, declaration: UndoDeclaration, undos_of: UndosOf | None = None
) -> UndoDecision:
    """What this execution does with the step an undo belongs to (the one rule,
    ``shared_records.undo_decision``), read and — when it undoes — claimed in one fenced
    transaction: the claim matches the record's reliance as read, so an execution that
    relied on it meanwhile makes it miss, and the decision is taken again. ``undos_of``
    reads what the claimer declared (without it, any claim covers this execution)."""
    me = ctx.execution_id
    for _ in range(MAX_DECISION_ROUNDS):
        with _decision_transaction(ctx) as tx:
            kind, record = _step_record(tx, declaration)
            if record is None:
                return UndoDecision(UndoOutcome.UNDO)  # nothing left to share it with
            covers = _covers(tx, me, declaration.step_key, undos_of)
            decision = undo_decision(record, me, covers=covers)
            if decision.outcome is UndoOutcome.NOT_COVERED and undos_of is not None:
                note = _not_covered_note(tx, me, record, undos_of)
                decision = UndoDecision(decision.outcome, decision.other, note)
            claims = decision.outcome is UndoOutcome.UNDO and record.undo_by is None
            if claims:
                fault_point(UNDO_BEFORE_CLAIM, execution_id=me, key=record.key)
            if claims and not tx.claim_undo(kind, record.key, me, record.reliance):
                continue
        _log_decision(ctx, declaration, decision)
        return decision
    raise OutboundCallInFlightError(
        "the step kept changing while its undo was being decided; another execution is "
        "working on it",
        execution_id=me,
    )


def _covers(
    tx: StoreTransaction, me: str, step: str, undos_of: UndosOf | None
) -> Callable[[str], bool] | None:
    """Whether a claimer's undos of the step cover this execution's: read only when the
    step was claimed by another, in the decision's transaction."""
    if undos_of is None:
        return None

    def covers(claimer: str) -> bool:
        handled = undos_of.handled_by_hand(tx, claimer, step)
        return claim_covers(undos_of(tx, claimer, step), undos_of(tx, me, step), handled=handled)

    return covers


def _names(declarations: Iterable[UndoDeclaration], done: Callable[[str], bool] | None) -> str:
    """Undos by name (never their arguments: a receipt, an order), each done or not."""
    named = [
        d.undo if done is None else f"{d.undo} ({'done' if done(d.key) else 'not done'})"
        for d in declarations
    ]
    return ", ".join(named) or "none"


def _not_covered_note(
    tx: StoreTransaction, me: str, record: SharedRecord, undos_of: UndosOf
) -> str:
    """What the person deciding a ``NOT_COVERED`` step needs from the store: the claimer's
    undos of it and whether each is done, this execution's, and the other executions
    that wait on the same step (one settlement is for all of them)."""
    claimer, step = str(record.undo_by), record.key
    theirs = undos_of(tx, claimer, step)
    handled = undos_of.handled_by_hand(tx, claimer, step)
    done = lambda key: tx.read_effect(key) is not None  # noqa: E731 - the claimer's marks
    others = [
        u.execution_id
        for u in record.users
        if u.execution_id not in (me, claimer)
        and not claim_covers(theirs, undos_of(tx, u.execution_id, step), handled=handled)
    ]
    note = (
        f"its undos of the step: {_names(theirs, done)}; this execution's: "
        f"{_names(undos_of(tx, me, step), None)}"
    )
    if handled:
        note = f"{HANDLED_NOTE}; {note}"
    if others:
        note += (
            f"; executions {', '.join(others)} wait on the same step: one settlement is "
            "for all of them, and each still has to be ended"
        )
    return note


def _decision_transaction(ctx: ExecutionContext) -> AbstractContextManager[StoreTransaction]:
    if sabotage.active(FENCED_HOLDER_STARTS_UNDO):
        return ctx.store.transaction()
    return ctx.fenced()


def record_kinds(kind: str | None) -> list[str]:
    """Where a step's record may be: its declared kind, else either table (intent first)."""
    return [kind] if kind else [INTENT_RECORD, EFFECT_RECORD]


def _kinds(declaration: UndoDeclaration) -> list[str]:
    return record_kinds(declaration.kind)


def _step_record(
    tx: StoreTransaction, declaration: UndoDeclaration
) -> tuple[str, SharedRecord | None]:
    kinds = _kinds(declaration)
    for kind in kinds:
        record = tx.read_shared(kind, declaration.step_key)
        if record is not None:
            return kind, record
    return kinds[0], None


def mark_compensated(
    tx: StoreTransaction,
    execution_id: str,
    declaration: UndoDeclaration,
    undos_of: UndosOf | None = None,
) -> None:
    """Every undo this execution declared after the step is done: the step is compensated,
    and a later replay of it raises ``OutboundCallCompensatedError`` told "undone" —
    unless another execution of the step declared an undo this one did not run (its
    refund, say): the step then stays claimed, never read undone, and that execution
    waits for a person (``UndoNotCoveredError``)."""
    for kind in _kinds(declaration):
        if undos_of is not None and _not_covered(tx, kind, execution_id, declaration, undos_of):
            continue
        tx.mark_compensated(kind, declaration.step_key, execution_id)


def compensated_if_taken_back(
    tx: StoreTransaction,
    execution_id: str,
    declaration: UndoDeclaration,
    declarations: Iterable[UndoDeclaration],
    undos_of: UndosOf | None = None,
) -> None:
    """``mark_compensated`` once every undo the claimer declared after the step (those of
    ``declarations`` on it) is finished as the record reads it (``steps_undone``, refunded):
    an undo's task counts once it completed, not once published, so whichever finishes
    the step last marks it — the claimer's delivery, or that task at its ``COMPLETED``.
    Called once the caller's own mark is written, and judged under the record's row lock
    (one lock order: after the caller's lease and execution rows): of two ends committing
    at once, the second waits and then reads the first's mark, where each would otherwise
    miss the other's and the step stay claimed for ever (design: compensated step). Not
    taken back yet, the claimer keeps its tasks' marks (``_keep_task_marks``)."""
    step = declaration.step_key
    of_step = [d for d in declarations if d.step_key == step]
    fault_point(UNDO_BEFORE_COMPENSATED, execution_id=execution_id, key=step, undo=declaration.undo)
    if not sabotage.active(UNDO_MARKS_READ_UNLOCKED):
        for kind in _kinds(declaration):
            tx.lock_shared(kind, step)
    if step in steps_undone(tx, of_step, refunded=True):
        mark_compensated(tx, execution_id, declaration, undos_of)
    else:
        _keep_task_marks(tx, execution_id, of_step)


def _keep_task_marks(
    tx: StoreTransaction, execution_id: str, of_step: Iterable[UndoDeclaration]
) -> None:
    """The claimer has undos of the step still to finish (one waits for a person, maybe
    for weeks): it will read its tasks' marks then, so it notes that it uses each one
    written (design: retention). A mark is its task's record, and that task is terminal:
    retention would take it with the task's, and the step would never read undone."""
    if sabotage.active(UNDO_TASK_MARK_NOT_KEPT):
        return
    for declaration in of_step:
        if declaration.task is not None:  # a use is written only while the mark exists
            tx.record_use(EFFECT_RECORD, undo_task_done_key(declaration.key), execution_id)


def _not_covered(
    tx: StoreTransaction, kind: str, me: str, declaration: UndoDeclaration, undos_of: UndosOf
) -> bool:
    """Another user of the step declared undos for it that this execution's do not cover."""
    if sabotage.active(UNDO_COVERED_BY_OTHER_UNDOS):
        return False
    step = declaration.step_key
    record = tx.read_shared(kind, step)
    others = [] if record is None else [u for u in record.users if u.execution_id != me]
    if not others:
        return False
    mine = undos_of(tx, me, step)
    return any(not covered_by(mine, undos_of(tx, u.execution_id, step)) for u in others)


HANDLED_NOTE = (
    "its payment on the step was dealt with by a person (cancel --payments-handled): its "
    "undos of it are never run, and whether the charge was refunded or kept is not recorded"
)
"""What a ``NOT_COVERED`` reason says of a claimer a person's word settled."""


class Declared(Protocol):
    """Every undo an execution declared (what the store keeps), read in one transaction."""

    def __call__(self, execution_id: str) -> Sequence[UndoDeclaration]: ...

    def handled_by_hand(self, execution_id: str, step: str) -> bool:
        """``HandledIn`` in the same transaction."""
        ...


def _of_step(declared: Declared, execution_id: str, step: str) -> list[UndoDeclaration]:
    return [d for d in declared(execution_id) if d.step_key == step]


def step_covers(declared: Declared, me: str) -> StepCovers:
    """``decide_step``'s covers rule for a cancel and a listing, over what the store reads
    (``declared``): a claimer covers ``me`` on a step only when it declared every undo
    ``me`` did for it, and runs them (``claim_covers``)."""
    return lambda claimer, step: claim_covers(
        _of_step(declared, claimer, step),
        _of_step(declared, me, step),
        handled=declared.handled_by_hand(claimer, step),
    )


def not_covered_error(
    settings: EngineSettings, execution_id: str, steps: Mapping[str, UndoDecision]
) -> UndoNotCoveredError:
    """What an execution whose undos another's claim would skip waits for a person with:
    each such step by its handle (never a business key in clear), its claimer, what each
    declared (by name) and whether the claimer's ran — so the person checks the gateway
    before refunding (the claimer's undo may have refunded already)."""
    named = [
        f"step {next(iter(loggable_step(settings, key).values()))} claimed for undo by "
        f"execution {decision.other} ({decision.note or 'its undos not read'})"
        for key, decision in steps.items()
    ]
    return UndoNotCoveredError(
        f"{'; '.join(named)}, whose undos do not cover every one this execution declared "
        "for it: those were not run (a refund may be owed). Check the gateway first (the "
        "refund may have been made already), do by hand what is still owed (one refund "
        "settles the step for every execution on it), then "
        f"`agboss cancel {execution_id} --payments-handled`",
        execution_id=execution_id,
    )


def _log_decision(
    ctx: ExecutionContext, declaration: UndoDeclaration, decision: UndoDecision
) -> None:
    fields = {
        "execution_id": ctx.execution_id,
        "other": decision.other,
        **loggable_step(ctx.settings, declaration.step_key),
    }
    if decision.outcome is UndoOutcome.KEEP:
        log_event(UNDO_KEPT, logging.INFO, "another execution completed on this step", **fields)
    elif decision.outcome is UndoOutcome.COVERED:
        log_event(UNDO_COVERED, logging.INFO, "another execution's undo claimed it", **fields)
    elif decision.outcome is UndoOutcome.WAIT:
        log_event(UNDO_WAITS, logging.INFO, "another execution still uses this step", **fields)
    elif decision.outcome is UndoOutcome.NOT_COVERED:
        message = "another execution's undo claimed it without this one's undos"
        log_event(UNDO_COVERED, logging.ERROR, message, covered=False, **fields)


def step_notes(settings: EngineSettings, decisions: Mapping[str, UndoDecision]) -> list[str]:
    """How the steps an execution did not undo are named in its reason ("kept for …")."""
    notes = []
    for key, decision in decisions.items():
        if decision.outcome in (UndoOutcome.KEEP, UndoOutcome.COVERED):
            what = "kept for" if decision.outcome is UndoOutcome.KEEP else "claimed for undo by"
            name = next(iter(loggable_step(settings, key).values()))
            notes.append(f"step {name} {what} {decision.other}")
    return notes


def loggable_step(settings: EngineSettings, key: str) -> dict[str, Any]:
    """A step key as a log may show it (design: R17): a business-keyed one (``<tenant>:b:…``)
    holds the business key in clear, so only its HMAC handle is logged."""
    if key.split(":", 2)[1:2] == ["b"]:
        return {"step_key_handle": business_key_handle(settings.pseudonym_key, key)}
    return {"step_key": key}


__all__ = [
    "HANDLED_NOTE",
    "Declared",
    "DeclaredAfter",
    "HandledIn",
    "UndosOf",
    "claim_covers",
    "compensated_if_taken_back",
    "decide_step",
    "loggable_step",
    "mark_compensated",
    "not_covered_error",
    "record_kinds",
    "step_covers",
    "step_notes",
]
