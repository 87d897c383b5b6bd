"""Records several executions share: every decision about one, read from the record.

A business-keyed intent or fenced effect is one record for every execution that names
its key: a double click, a saga's later step, a duplicate publish. Which execution
happened to create it decides nothing. Each rule here is one function over what the
store reads of the record (``SharedRecord``: its row, the executions that used it,
relied on it or completed on it, and their states), and the delivery, the sweep and
the operator all call the same one:

- **who sent**: an intent's ``sent_by`` is the execution whose delivery started its
  current attempt (history rows name the execution of every transition); an execution
  **moved money** when it sent the attempt a ``COMPLETED`` intent completed with;
- **who relies**: an execution relies on a record whose result was handed to it (it
  settled, replayed, joined or reconciled it). The hand-out writes it on the record, by
  a compare-and-set that an undo's start makes fail (and the reverse), so an undo and a
  replay never both win; it outlives the execution's own row;
- **what a failing or cancelled execution does with a step it relied on**
  (``undo_decision``): another execution completed on it → keep it; another still uses
  it → wait for that one; otherwise undo it, once, by whichever execution claims it —
  covering the others only when it declared every undo they did for the step;
- **what a cancel accounts for** (``cancel_decision``): its payments (``payment_of``)
  and every other step (a fenced effect) whose declared undos are not all done;
- **which records a re-run must reach** (``counts_for_divergence``): every record any
  delivery of the execution sent, took over, reconciled or replayed, not only those it
  created;
- **may a definite failure be sent again** (``failure_claim``): replayed by default;
  sent again only under a retry authorisation for this execution, which any hand-out of
  the failure to another execution revokes.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Any

from celery_agboss.core import sabotage
from celery_agboss.core.executions import TERMINAL_STATES, ExecutionState
from celery_agboss.core.protections import (
    CANCEL_SKIPS_EFFECT_UNDOS,
    COMPLETION_READ_FROM_EXECUTION_ROWS,
    DIVERGENCE_BY_CREATOR,
    HAND_OUT_KEEPS_RETRY,
    PASSED_FAILURE_RESENT,
    PAYMENTS_BY_CREATOR,
    UNDO_COVERED_BY_OTHER_UNDOS,
    UNDO_IGNORES_OTHER_EXECUTIONS,
    UNDO_REFUNDS_COUNTED_AS_PAYMENTS,
)
from celery_agboss.core.store_protocol import (
    INTENT_RECORD,
    IntentRecord,
    IntentStatus,
    RecordUser,
    SharedRecord,
)
from celery_agboss.errors import OutboundCallCompensatedError

_SETTLED_FOR_DIVERGENCE = (IntentStatus.PENDING, IntentStatus.COMPLETED)
_NOT_RUNNING_AGAIN = frozenset(TERMINAL_STATES)


class UndoOutcome(str, enum.Enum):
    UNDO = "UNDO"  # nobody else relies on it: undo it (claimed by compare-and-set)
    KEEP = "KEEP"  # another execution completed on it: never undone
    WAIT = "WAIT"  # another execution still uses it: wait for it to end
    COVERED = "COVERED"  # another execution's undo claimed it: undone once, by that one
    # Another execution's undo claimed it, but that one did not declare every undo this
    # one did for the step: this one's would be skipped, so a person decides.
    NOT_COVERED = "NOT_COVERED"


@dataclass(frozen=True)
class UndoDecision:
    outcome: UndoOutcome
    other: str | None = None  # the execution it is kept for, waits for, or is covered by
    note: str = ""  # NOT_COVERED: what each declared, for the person who decides


def user(record: SharedRecord, execution_id: str) -> RecordUser | None:
    for found in record.users:
        if found.execution_id == execution_id:
            return found
    return None


def relies(record: SharedRecord, execution_id: str) -> bool:
    """The record's result was handed to the execution (who relies)."""
    found = user(record, execution_id)
    return found is not None and found.relied


def moved_money(record: SharedRecord, execution_id: str) -> bool:
    """The execution sent the attempt this ``COMPLETED`` intent completed with (who sent)."""
    return (
        record.kind == INTENT_RECORD
        and record.status is IntentStatus.COMPLETED
        and record.sent_by == execution_id
    )


def payment_of(record: SharedRecord, execution_id: str) -> bool:
    """A completed intent the execution moved the money of, or relies on: what a cancel
    must account for (its undo, another execution's, or a person)."""
    if record.kind != INTENT_RECORD or record.status is not IntentStatus.COMPLETED:
        return False
    if sabotage.active(PAYMENTS_BY_CREATOR):
        return record.creator == execution_id
    return moved_money(record, execution_id) or relies(record, execution_id)


def used_by(record: SharedRecord, execution_id: str) -> bool:
    """Any delivery of the execution created, sent, took over, reconciled, replayed or
    joined the record."""
    return (
        record.creator == execution_id
        or record.sent_by == execution_id
        or user(record, execution_id) is not None
    )


def counts_for_divergence(record: SharedRecord, execution_id: str) -> bool:
    """A record a re-run of the execution must reach again: one an earlier delivery used
    and that completed or may have (``PENDING``)."""
    if record.status not in _SETTLED_FOR_DIVERGENCE:
        return False
    if sabotage.active(DIVERGENCE_BY_CREATOR):
        return record.creator == execution_id
    return used_by(record, execution_id)


def diverged(
    records: Iterable[SharedRecord], reached: Collection[str], execution_id: str
) -> list[SharedRecord]:
    """The records an earlier delivery used that this delivery's body no longer reached:
    the body took another path, so the execution waits for a person."""
    return [r for r in records if counts_for_divergence(r, execution_id) and r.key not in reached]


def _still_uses(other: RecordUser) -> bool:
    """Live, and neither undoing (``COMPENSATING``) nor on its way to a cancel: it may
    still complete on the record. A cancelled execution waiting for its turn is not, so
    two executions never wait for each other."""
    if other.state is None:
        return False
    state = ExecutionState(other.state)
    if state in _NOT_RUNNING_AGAIN or state is ExecutionState.COMPENSATING:
        return False
    return not (other.cancel_requested and state is not ExecutionState.RUNNING)


def _completed_on(other: RecordUser) -> bool:
    """It completed while relying on the record: written on the record (its use) when it
    completed, so it outlives the execution's row."""
    on_record = other.completed_on and not sabotage.active(COMPLETION_READ_FROM_EXECUTION_ROWS)
    return on_record or (other.relied and other.state == ExecutionState.COMPLETED.value)


def undo_decision(
    record: SharedRecord, execution_id: str, *, covers: Callable[[str], bool] | None = None
) -> UndoDecision:
    """What a failing or cancelled execution does with a step it relied on: keep it for
    an execution that completed on it, wait for one that still uses it, or undo it —
    once: an undo another execution claimed covers this one only when that one declared
    every undo this one did for the step (``covers(claimer)``; a caller that does not
    ask, a listing, takes it as covered). Else this one's undos would be skipped for
    the claimer's other ones (a refund for a stock release): ``NOT_COVERED``."""
    if record.undo_by is not None:
        if record.undo_by == execution_id:
            return UndoDecision(UndoOutcome.UNDO)
        if covers is None or covers(record.undo_by) or sabotage.active(UNDO_COVERED_BY_OTHER_UNDOS):
            return UndoDecision(UndoOutcome.COVERED, record.undo_by)
        return UndoDecision(UndoOutcome.NOT_COVERED, record.undo_by)
    if sabotage.active(UNDO_IGNORES_OTHER_EXECUTIONS):
        return UndoDecision(UndoOutcome.UNDO)
    others = [u for u in record.users if u.execution_id != execution_id]
    for other in others:
        if _completed_on(other):
            return UndoDecision(UndoOutcome.KEEP, other.execution_id)
    for other in others:
        if _still_uses(other):
            return UndoDecision(UndoOutcome.WAIT, other.execution_id)
    return UndoDecision(UndoOutcome.UNDO)


class CancelStep(str, enum.Enum):
    CANCEL = "CANCEL"  # every payment is accounted for: CANCELLED
    UNDO_FIRST = "UNDO_FIRST"  # its undos run first (COMPENSATING), then the cancel ends
    WAIT = "WAIT"  # a payment another execution still uses: wait for it
    OPERATOR = "OPERATOR"  # a payment nobody undoes: a person decides


@dataclass(frozen=True)
class CancelDecision:
    step: CancelStep
    other: str | None = None  # the execution a WAIT waits for


StepCovers = Callable[[str, str], bool]
"""``(claimer, step key)``: the claimer's undos of the step cover this execution's
(``shared_steps.covered_by`` over what both declared), as ``decide_step`` asks it."""


def _covers_step(covers: StepCovers | None, step: str) -> Callable[[str], bool] | None:
    return None if covers is None else (lambda claimer: covers(claimer, step))


def cancel_decision(
    records: Iterable[SharedRecord],
    execution_id: str,
    *,
    undoable: Collection[str] = (),
    undone: Collection[str] = (),
    undos_left: Collection[str] = (),
    undone_steps: Collection[str] = (),
    undos_ran: bool = False,
    covers: StepCovers | None = None,
) -> CancelDecision:
    """How a cancel of the execution ends, from its payments and its undos left to run:
    each is kept for an execution that completed on it, covered by an undo (its own, run
    or to run, or another's that covers its undos: ``covers``), waited for while another
    execution still uses it — or left for a person ("cancelled after a completed
    payment"), never silently ``CANCELLED``: a claim that skips its undos
    (``NOT_COVERED``) goes to a person at once, running its undos first would not run
    those.
    ``undoable``: the steps it declared undos for; ``undone``: the intents its undos made
    (their refunds, not payments to account for); ``undos_left``: the steps whose
    declared undos are not all marked done (``undo_steps.steps_undone``). Such a step that
    is no payment (a fenced effect: a debit of the app's own ledger) is accounted for as
    a payment is, from its record in ``records`` (none: nobody to keep it for, it is
    undone): a cancel never ends ``CANCELLED`` with an undo it declared not run.
    ``undone_steps``: those whose every declared undo is marked done (``_to_account_for``)."""
    accounted, unhandled = _accounted_for_cancel(
        records, execution_id, undone, undos_left, undone_steps
    )
    not_covered: set[str] = set()
    for record in accounted:
        decision = undo_decision(record, execution_id, covers=_covers_step(covers, record.key))
        if decision.outcome in (UndoOutcome.KEEP, UndoOutcome.COVERED):
            continue
        if decision.outcome is UndoOutcome.WAIT:
            return CancelDecision(CancelStep.WAIT, decision.other)
        if decision.outcome is UndoOutcome.NOT_COVERED:
            not_covered.add(record.key)
        unhandled.append(record.key)
    if not unhandled:
        return CancelDecision(CancelStep.CANCEL)
    runnable = {*undoable, *undos_left}
    if not undos_ran and any(k in runnable and k not in not_covered for k in unhandled):
        return CancelDecision(CancelStep.UNDO_FIRST)
    return CancelDecision(CancelStep.OPERATOR)


def _accounted_for_cancel(
    records: Iterable[SharedRecord],
    execution_id: str,
    undone: Collection[str],
    undos_left: Collection[str],
    undone_steps: Collection[str],
) -> tuple[list[SharedRecord], list[str]]:
    """What a cancel accounts for: the records of its payments (``_to_account_for``) and
    of its other steps with undos left (``_effect_undo_left``); and the keys of those
    steps whose record the store no longer has (nobody to keep them for: undone)."""
    left = frozenset(() if sabotage.active(CANCEL_SKIPS_EFFECT_UNDOS) else undos_left)
    records = list(records)
    accounted = [
        record
        for record in records
        if _to_account_for(record, execution_id, undone, undone_steps)
        or _effect_undo_left(record, left)
    ]
    return accounted, sorted(left - {record.key for record in records})


def _effect_undo_left(record: SharedRecord, left: Collection[str]) -> bool:
    """A step that is no payment (a fenced effect) with undos left to run, that no undo
    took back: owed as a payment's refund is. A payment is ruled by ``_to_account_for``
    alone."""
    if record.kind == INTENT_RECORD or record.key not in left:
        return False
    return not (record.compensated and record.undo_by is not None)


def _to_account_for(
    record: SharedRecord, execution_id: str, undone: Collection[str], undone_steps: Collection[str]
) -> bool:
    """A payment an ended execution must account for: one it moved the money of or relies
    on, that no undo took back, and that is not itself an undo's (a refund its undo made
    is the taking back, not a payment). What a cancel and the "failed after a payment"
    listing both ask. One it claimed and ran every undo of (``undone_steps``) is not its
    own to account for even while its record is not compensated: its undo's task carries
    the refund (and waits for a person if it fails), or another execution's undos it did
    not declare wait for one (``UndoNotCoveredError``) — one place tells the person what
    is owed, or one refund would be made twice."""
    if not payment_of(record, execution_id):
        return False
    if record.key in undone and not sabotage.active(UNDO_REFUNDS_COUNTED_AS_PAYMENTS):
        return False
    if record.undo_by == execution_id and record.key in undone_steps:
        return False
    return not (record.compensated and record.undo_by is not None)


def unhandled_payments(
    records: Iterable[SharedRecord],
    execution_id: str,
    *,
    undone: Collection[str] = (),
    undone_steps: Collection[str] = (),
    covers: StepCovers | None = None,
) -> list[SharedRecord]:
    """The payments a ``FAILED`` or ``CANCELLED`` execution left behind: completed ones it
    moved the money of or relies on that nobody undid, no other execution completed on,
    and none still uses — the customer is charged and nothing will change that; among
    them one another execution claimed without its undos (``covers``: ``NOT_COVERED``).
    ``undone``: the intents its undos made (their refunds). ``undone_steps``: the steps
    every undo it declared after them is done for: one it claimed stays uncompensated only
    while another execution's undos it did not declare wait for a person
    (``UndoNotCoveredError``), and that wait, not this listing, tells the person what is
    owed (listed here too, the refund it made would be made again)."""
    owed = (UndoOutcome.UNDO, UndoOutcome.NOT_COVERED)
    return [
        record
        for record in records
        if _to_account_for(record, execution_id, undone, undone_steps)
        and undo_decision(record, execution_id, covers=_covers_step(covers, record.key)).outcome
        in owed
    ]


def compensated_error(
    what: str, *, undone: bool, undo_by: str | None, **fields: Any
) -> OutboundCallCompensatedError:
    """What a replay of a step another execution's undo claimed is told: its success is
    never handed out again (the claim and the hand-out are one compare-and-set). Told
    "undone" only once that undo is done: a claimer whose refund is still in flight, or
    was refused and waits for a person, or whose undos did not cover another's (that
    one's refund waits for a person), has not refunded anything yet — never told to pay
    again then."""
    if undone:
        done = f"{what} under this business key was undone (refunded, released…) after it completed"
    else:
        done = (
            f"{what} under this business key was claimed for undo by execution {undo_by}, "
            "and not read undone: its refund may be in flight, made or refused, or another "
            "execution's undo of it was left to a person, who may have refunded it or kept "
            f"it (celery -A proj agboss show {undo_by})"
        )
    after = (
        "To pay again, open a new attempt under a new business key, e.g. "
        "business_key=f'order:{order_id}:attempt:2'"
        if undone
        else "Do not pay again under a new business key: the first payment may still be "
        "the customer's; a person who checked the gateway decides"
    )
    return OutboundCallCompensatedError(
        f"{done}. Its result is not handed out again. {after}",
        undone=undone,
        undo_by=undo_by,
        **fields,
    )


class FailureClaim(str, enum.Enum):
    RESEND = "RESEND"  # this execution may send it again (authorised, or never answered)
    REPLAY = "REPLAY"  # raise the failure again


def failure_claim(record: IntentRecord, execution_id: str) -> FailureClaim:
    """A ``FAILED`` intent is replayed (the failure raised again), so a re-run or another
    execution takes the path its first sender's body took; it is sent again only by the
    execution a retry authorised (``retry_for``). One settled ``FAILED`` without a
    failure (a lookup proved it never reached the gateway, or an operator said so) was
    never handed to a body, so no body took another path on it: whoever reaches it
    sends it, under the same key."""
    if sabotage.active(PASSED_FAILURE_RESENT):
        return FailureClaim.RESEND
    if record.failure is None or record.retry_for == execution_id:
        return FailureClaim.RESEND
    return FailureClaim.REPLAY


def hands_failure_to_another(record: IntentRecord, execution_id: str) -> bool:
    """Replaying this failure to ``execution_id`` hands it to another execution than the
    one whose attempt failed: the hand-out revokes any retry authorisation, for good."""
    if sabotage.active(HAND_OUT_KEEPS_RETRY):
        return False
    return record.sent_by != execution_id and (
        not record.failure_shared or record.retry_for is not None
    )


__all__ = [
    "CancelStep",
    "FailureClaim",
    "StepCovers",
    "UndoDecision",
    "UndoOutcome",
    "cancel_decision",
    "compensated_error",
    "diverged",
    "failure_claim",
    "hands_failure_to_another",
    "relies",
    "undo_decision",
    "unhandled_payments",
]
