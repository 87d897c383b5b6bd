"""Which state an execution moves to, given the facts: the execution state machine.

Pure functions, no SQL: the store reads the facts under its row and lease locks
(is an intent of it pending, is a lease live, which shared records did the body not
reach), asks here, and writes the answer under the same compare-and-set guards as
before. The delivery's verdicts, the sweep's and the operators' verbs all ask the same
rules, so none can end an execution another would have kept
(design: execution states, never terminal while pending, recovery cap).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from celery_agboss.core import sabotage
from celery_agboss.core.execution_facts import ExecutionFacts
from celery_agboss.core.executions import (
    ANSWER_STATES,
    CANCEL_WAITS,
    CANCELLABLE_STATES,
    CANCELLED_AFTER_PAYMENT,
    DIVERGENCE,
    TERMINAL_STATES,
    ExecutionRecord,
    ExecutionState,
    StartKind,
    WaitKind,
    shared_wait_reason,
    wait_kind,
)
from celery_agboss.core.keys import is_business_key
from celery_agboss.core.protections import (
    DIVERGENCE_COMPLETED,
    EXPIRY_BY_THE_WORKERS_CLOCK,
    EXPIRY_DECIDED_BY_LISTING,
    STARTED_EXECUTIONS_EXPIRE,
)
from celery_agboss.core.shared_records import CancelStep
from celery_agboss.core.store_protocol import SharedRecord

REASON_LIMIT = 1000
"""Characters of a reason the execution row keeps."""

DEFAULT_CANCEL_REASON = "cancel requested"


@dataclass(frozen=True)
class Verdict:
    """The state an execution moves to, with the reason it is stored with."""

    state: ExecutionState
    reason: str | None

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES


# --- a delivery's verdicts -----------------------------------------------------------------


def finish_verdict(unreached: Sequence[SharedRecord], pending: bool) -> Verdict:
    """The body returned: ``COMPLETED`` — unless it no longer reaches a record an earlier
    delivery created that may have charged (design: divergence), or an intent of it is
    pending; then ``WAITING_OPERATOR``, named as such, its result kept for a person."""
    if sabotage.active(DIVERGENCE_COMPLETED):
        return Verdict(ExecutionState.COMPLETED, None)
    if unreached:
        names = ", ".join(sorted({record.name for record in unreached}))
        keys = ", ".join(_named(record.key) for record in unreached)
        reason = (
            f"{DIVERGENCE}: the body no longer calls {names}; an earlier delivery "
            f"did, and it may have charged ({keys})"
        )
        return Verdict(ExecutionState.WAITING_OPERATOR, reason[:REASON_LIMIT])
    if pending:
        return Verdict(
            ExecutionState.WAITING_OPERATOR, "completed while an outbound call of it is pending"
        )
    return Verdict(ExecutionState.COMPLETED, None)


def _named(key: str) -> str:
    """A record's key as a reason (stored and logged) may show it: a business-keyed one
    holds the business key in clear (design: R17), so it is named by its kind only; an
    operator finds it with ``agboss show``, which lists the execution's records."""
    return "a business-keyed record" if is_business_key(key) else key


def fail_verdict(reason: str, pending: bool) -> Verdict:
    """``FAILED`` — never while an intent of it is pending: ``WAITING_OPERATOR`` then
    (design: never terminal while pending)."""
    if pending:
        why = f"failed while an outbound call is pending: {reason}"
        return Verdict(ExecutionState.WAITING_OPERATOR, why[:REASON_LIMIT])
    return Verdict(ExecutionState.FAILED, reason)


def may_start_compensating(record: ExecutionRecord, pending: bool, continuing: bool) -> bool:
    """Undos start only while nothing of the execution is pending (a payment may be in
    flight); a delivery that continues them goes on (design: compensating)."""
    return not record.terminal and (continuing or not pending)


def cancel_verdict(step: CancelStep, reason: str, other: str | None) -> Verdict:
    """The end of a cancel request as ``shared_records.cancel_decision`` ruled from its
    payments (design: cancel request): ``CANCELLED``; ``COMPENSATING`` while its undos
    run first; ``WAITING`` while ``other`` still uses a payment of it; otherwise
    ``WAITING_OPERATOR``, "cancelled after a completed payment"."""
    if step is CancelStep.CANCEL:
        return Verdict(ExecutionState.CANCELLED, reason)
    if step is CancelStep.UNDO_FIRST:
        return Verdict(
            ExecutionState.COMPENSATING, f"cancel requested; its undos run first: {reason}"
        )
    if step is CancelStep.WAIT:
        return Verdict(
            ExecutionState.WAITING,
            shared_wait_reason(CANCEL_WAITS, str(other), "still uses a payment of it"),
        )
    return Verdict(ExecutionState.WAITING_OPERATOR, f"{CANCELLED_AFTER_PAYMENT}: {reason}")


def cancel_reason_of(requested: bool, reason: str | None) -> str | None:
    """The reason of an execution's cancel request as the body is told it; None when
    none was requested."""
    if not requested:
        return None
    return reason or DEFAULT_CANCEL_REASON


# --- a delivery's start and end -----------------------------------------------------------------


def start_without_body(record: ExecutionRecord) -> StartKind | None:
    """A delivery of an ended execution, or of one that waits for a person, runs nothing."""
    if record.state in TERMINAL_STATES:
        return StartKind.TERMINAL
    if record.state in ANSWER_STATES:
        return StartKind.WAITING_ANSWER
    return None


def cancel_ends_at_start(record: ExecutionRecord, live: bool, pending: Callable[[], bool]) -> bool:
    """A delivery that finds a cancel request of an execution not running (no live lease,
    nothing pending) that never started or waits ends it before the body runs.
    ``pending`` is asked last, and only then: every delivery's start comes here, and
    reading it costs the store a query."""
    waiting = record.state in (ExecutionState.REQUESTED, ExecutionState.WAITING)
    return record.cancel_requested and waiting and not live and not pending()


def taken_over(record: ExecutionRecord) -> bool:
    """The previous delivery never said how it ended: a take-over, not the planned end of
    an undo's wait for another execution."""
    running = record.state in (ExecutionState.RUNNING, ExecutionState.COMPENSATING)
    return running and not record.redrive_planned


def over_recovery_cap(record: ExecutionFacts, max_recovery_attempts: int) -> bool:
    """One more recovery would pass ``agboss_max_recovery_attempts`` (design: recovery cap)."""
    return record.recovery_count + 1 > max_recovery_attempts


def delivery_state(state: ExecutionState) -> ExecutionState:
    """A started delivery runs the body (``RUNNING``), or continues undos that started:
    ``COMPENSATING`` stays, so an execution deciding about a step they share keeps seeing
    it undoing."""
    if state is ExecutionState.COMPENSATING:
        return ExecutionState.COMPENSATING
    return ExecutionState.RUNNING


def wakes_on_release(record: ExecutionRecord) -> bool:
    """A message deferred while the lease was held is re-published once it is released,
    unless the execution ended or waits for a person."""
    return record.wake_requested and release_wakes(record.state)


def release_wakes(state: ExecutionState) -> bool:
    """A wake requested of an execution in ``state`` re-publishes it at the release: it
    has not ended, and does not wait for a person."""
    return state not in TERMINAL_STATES and state not in ANSWER_STATES


# --- the sweep and the operators ---------------------------------------------------------------


@dataclass(frozen=True)
class RedriveCount:
    """How a re-drive counts toward the recovery cap (design: recovery cap, re-drive)."""

    planned: bool  # the planned end of a wait: no recovery
    taken_over: bool  # its delivery died: counted once, when the new delivery starts
    counted: bool  # its message was lost: counted now


def redrive_count(record: ExecutionFacts, planned_counted: bool = False) -> RedriveCount:
    """A ``RUNNING`` (or ``COMPENSATING``) execution's delivery died; a ``REQUESTED`` one's
    message, or a waiting one's retry message, was lost; the planned end of a wait (a long
    retry, an answered pause, an operator's decision) is no recovery. ``planned_counted``:
    the sabotage that counts planned waits too."""
    planned = record.redrive_planned and not planned_counted
    running = record.state in (ExecutionState.RUNNING, ExecutionState.COMPENSATING)
    over = running and not planned
    return RedriveCount(planned, over, not over and not planned)


def cancel_ends_now(
    record: ExecutionRecord,
    live: Callable[[], bool],
    pending: Callable[[], bool],
    *,
    keep_operator_wait: bool = False,
) -> bool:
    """A cancel request ends the execution at once while it is not running (no live
    lease), nothing of it is pending and it is not ``COMPENSATING``; otherwise the
    request waits for its body, its next delivery or the sweep. ``keep_operator_wait``
    (the end of an earlier request, by the sweep or an operator who did not say the
    payments are handled): an execution waiting for its operator is left to them, not
    churned. ``live`` and ``pending`` are asked in that order, only when needed: each
    costs the store a query."""
    if record.state not in CANCELLABLE_STATES:
        return False
    if keep_operator_wait and record.state is ExecutionState.WAITING_OPERATOR:
        return False
    return not live() and not pending()


def never_started(record: ExecutionFacts) -> bool:
    """No delivery ever started it: only such an execution may expire
    (design: expires bounds the start). One that started, charged and then waits goes
    on whatever its ``expires``: expiring it would leave the customer charged and the
    rest undone."""
    if sabotage.active(STARTED_EXECUTIONS_EXPIRE):
        return record.state in (ExecutionState.REQUESTED, ExecutionState.WAITING)
    return record.state is ExecutionState.REQUESTED and record.started_at_ms is None


def expires_now(
    record: ExecutionFacts, live: Callable[[], bool], pending: Callable[[], bool]
) -> bool:
    """An execution past its ``expires`` on the database's clock (``read_at_ms``: read
    again under its row lock, so a delivery that started it meanwhile keeps it) ends
    only while it never started, runs under no live lease and has nothing pending;
    ``live`` and ``pending`` are asked last. The sweep and a worker holding an expired
    message both ask this."""
    listed = sabotage.active(EXPIRY_DECIDED_BY_LISTING) and record.state not in TERMINAL_STATES
    due = (record.expires_ms is not None and record.expires_ms <= record.read_at_ms) or (
        sabotage.active(EXPIRY_BY_THE_WORKERS_CLOCK)
    )
    return (listed or (due and never_started(record))) and not live() and not pending()


def unblocks(
    record: ExecutionRecord, live: Callable[[], bool], operator_needed: Callable[[], bool]
) -> bool:
    """A wait for an operator over an intent ends (``WAITING``, due now) once no intent it
    created or used needs a person: not a wait a person decides (a divergence, a cancel
    after a payment), not while a delivery runs it."""
    if record.state is not ExecutionState.WAITING_OPERATOR:
        return False
    if wait_kind(record.reason).a_person_decides:
        return False
    return not live() and not operator_needed()


def divergence_accepted(
    record: ExecutionRecord, live: Callable[[], bool], pending: Callable[[], bool]
) -> bool:
    """An operator's acceptance of a divergence completes the execution only while it
    waits for exactly that, runs under no live lease and has nothing pending."""
    if record.state is not ExecutionState.WAITING_OPERATOR:
        return False
    if wait_kind(record.reason) is not WaitKind.DIVERGENCE:
        return False
    return not live() and not pending()


def may_move_by_hand(to_state: ExecutionState, pending: bool) -> bool:
    """An operator's move: never to a terminal state while an intent is pending."""
    return not (to_state in TERMINAL_STATES and pending)


__all__ = [
    "DEFAULT_CANCEL_REASON",
    "Verdict",
    "cancel_ends_at_start",
    "cancel_ends_now",
    "cancel_reason_of",
    "cancel_verdict",
    "delivery_state",
    "divergence_accepted",
    "expires_now",
    "fail_verdict",
    "finish_verdict",
    "may_move_by_hand",
    "may_start_compensating",
    "over_recovery_cap",
    "redrive_count",
    "start_without_body",
    "taken_over",
    "unblocks",
    "wakes_on_release",
]
