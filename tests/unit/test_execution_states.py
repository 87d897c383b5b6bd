"""The execution state machine, as core decides it (``core.execution_states``): the store
reads the facts under its locks and writes what these rules answer
(design: execution states, never terminal while pending, recovery cap)."""

from __future__ import annotations

from dataclasses import replace

from celery_agboss.core.execution_states import (
    cancel_ends_at_start,
    cancel_ends_now,
    cancel_reason_of,
    cancel_verdict,
    delivery_state,
    divergence_accepted,
    expires_now,
    fail_verdict,
    finish_verdict,
    may_move_by_hand,
    over_recovery_cap,
    redrive_count,
    start_without_body,
    taken_over,
    unblocks,
    wakes_on_release,
)
from celery_agboss.core.executions import (
    CANCELLED_AFTER_PAYMENT,
    DIVERGENCE,
    UNDO_WAITS,
    ExecutionRecord,
    ExecutionState,
    StartKind,
    WaitKind,
    shared_wait_reason,
    wait_kind,
    waited_for,
)
from celery_agboss.core.shared_records import CancelStep
from celery_agboss.core.store_protocol import INTENT_RECORD, IntentStatus, SharedRecord

S = ExecutionState

RECORD = ExecutionRecord(
    id="e-1",
    task_name="shop.pay",
    state=S.RUNNING,
    args="[]",
    kwargs="{}",
    options="{}",
    eta_ms=None,
    expires_ms=None,
    requested_at_ms=0,
    started_at_ms=0,
    not_before_ms=None,
    wake_requested=False,
    recovery_count=0,
    deliveries=1,
    cancel_requested=False,
    cancel_reason=None,
    reason=None,
    result=None,
    error=None,
    terminal_at_ms=None,
    links_dispatched=False,
    updated_at_ms=0,
    read_at_ms=0,
)


def test_a_body_that_returned_completes_unless_it_diverged_or_something_is_pending() -> None:
    assert finish_verdict([], pending=False).state is S.COMPLETED
    pending = finish_verdict([], pending=True)
    assert pending.state is S.WAITING_OPERATOR and "pending" in (pending.reason or "")
    record = SharedRecord(
        kind=INTENT_RECORD,
        key="k-1",
        name="shop.charge",
        status=IntentStatus.COMPLETED,
        creator="e-0",
        sent_by="e-0",
        reliance=0,
        undo_by=None,
        compensated=False,
        users=(),
    )
    diverged = finish_verdict([record], pending=False)
    assert diverged.state is S.WAITING_OPERATOR
    assert (diverged.reason or "").startswith(DIVERGENCE) and "k-1" in (diverged.reason or "")


def test_a_failure_is_never_terminal_while_an_intent_is_pending() -> None:
    assert fail_verdict("declined", pending=False).state is S.FAILED
    waiting = fail_verdict("declined", pending=True)
    assert waiting.state is S.WAITING_OPERATOR and not waiting.terminal
    assert may_move_by_hand(S.FAILED, pending=True) is False
    assert may_move_by_hand(S.WAITING, pending=True) is True


def test_each_end_of_a_cancel_request_has_its_state() -> None:
    assert cancel_verdict(CancelStep.CANCEL, "r", None).state is S.CANCELLED
    assert cancel_verdict(CancelStep.UNDO_FIRST, "r", None).state is S.COMPENSATING
    assert "e-2" in (cancel_verdict(CancelStep.WAIT, "r", "e-2").reason or "")
    operator = cancel_verdict(CancelStep.OPERATOR, "r", None)
    assert operator.state is S.WAITING_OPERATOR
    assert (operator.reason or "").startswith(CANCELLED_AFTER_PAYMENT)
    assert cancel_reason_of(False, "r") is None
    assert cancel_reason_of(True, None) == "cancel requested"
    assert cancel_reason_of(True, "by ops") == "by ops"


def test_a_cancel_ends_at_once_only_while_nothing_runs_or_is_pending() -> None:
    waiting = replace(RECORD, state=S.WAITING, cancel_requested=True)
    assert cancel_ends_at_start(waiting, live=False, pending=lambda: False)
    assert not cancel_ends_at_start(waiting, live=True, pending=lambda: False)
    assert not cancel_ends_at_start(waiting, live=False, pending=lambda: True)
    not_requested = replace(waiting, cancel_requested=False)
    assert not cancel_ends_at_start(not_requested, False, pending=lambda: 1 / 0 == 0)
    assert cancel_ends_now(waiting, live=_no, pending=_no)
    assert not cancel_ends_now(replace(waiting, state=S.COMPENSATING), _no, _no)
    assert not cancel_ends_now(waiting, _yes, _no) and not cancel_ends_now(waiting, _no, _yes)
    operator = replace(waiting, state=S.WAITING_OPERATOR)
    assert cancel_ends_now(operator, _no, _no)
    assert not cancel_ends_now(operator, _unasked, _unasked, keep_operator_wait=True)


def test_only_an_execution_no_delivery_started_expires() -> None:
    requested = replace(RECORD, state=S.REQUESTED, started_at_ms=None, expires_ms=100)
    assert expires_now(replace(requested, read_at_ms=100), _no, _no)
    assert expires_now(replace(requested, read_at_ms=101), _no, _no)
    requested = replace(requested, read_at_ms=100)
    early = replace(requested, read_at_ms=99)
    assert not expires_now(early, _unasked, _unasked), "the database's clock says: not yet"
    assert not expires_now(replace(requested, expires_ms=None), _unasked, _unasked)
    assert not expires_now(requested, _yes, _no) and not expires_now(requested, _no, _yes)
    started = replace(requested, state=S.WAITING, started_at_ms=1)
    assert not expires_now(started, _unasked, _unasked), "it charged: it goes on"
    assert not expires_now(replace(requested, started_at_ms=1), _unasked, _unasked)


def test_an_operator_wait_ends_by_itself_only_when_nobody_has_to_decide() -> None:
    over_intent = replace(RECORD, state=S.WAITING_OPERATOR, reason="OutboundCallUnreconciledError")
    assert unblocks(over_intent, _no, _no)
    assert not unblocks(over_intent, _yes, _no) and not unblocks(over_intent, _no, _yes)
    for decided_by_a_person in (DIVERGENCE + ": x", CANCELLED_AFTER_PAYMENT + ": y"):
        assert not unblocks(replace(over_intent, reason=decided_by_a_person), _unasked, _unasked)
    assert not unblocks(replace(over_intent, state=S.WAITING), _unasked, _unasked)


def test_a_divergence_is_accepted_only_from_its_own_wait() -> None:
    diverged = replace(RECORD, state=S.WAITING_OPERATOR, reason=DIVERGENCE + ": charge")
    assert divergence_accepted(diverged, _no, _no)
    assert not divergence_accepted(diverged, _yes, _no)
    assert not divergence_accepted(diverged, _no, _yes)
    other = replace(diverged, reason="OutboundCallUnreconciledError")
    assert not divergence_accepted(other, _unasked, _unasked)


def _no() -> bool:
    return False


def _yes() -> bool:
    return True


def _unasked() -> bool:
    raise AssertionError("decided without this fact: it costs the store a query")


def test_a_delivery_start_and_its_take_over_count() -> None:
    assert start_without_body(replace(RECORD, state=S.COMPLETED)) is StartKind.TERMINAL
    assert start_without_body(replace(RECORD, state=S.PAUSED)) is StartKind.WAITING_ANSWER
    assert start_without_body(RECORD) is None
    assert taken_over(RECORD)
    assert not taken_over(replace(RECORD, redrive_planned=True))
    assert not taken_over(replace(RECORD, state=S.WAITING))
    assert over_recovery_cap(replace(RECORD, recovery_count=3), 3)
    assert not over_recovery_cap(replace(RECORD, recovery_count=2), 3)
    assert delivery_state(S.COMPENSATING) is S.COMPENSATING
    assert delivery_state(S.WAITING) is S.RUNNING


def test_only_recoveries_count_toward_the_cap() -> None:
    died = redrive_count(RECORD)
    assert (died.taken_over, died.counted, died.planned) == (True, False, False)
    lost = redrive_count(replace(RECORD, state=S.REQUESTED))
    assert (lost.taken_over, lost.counted) == (False, True)
    planned = redrive_count(replace(RECORD, state=S.WAITING, redrive_planned=True))
    assert (planned.planned, planned.taken_over, planned.counted) == (True, False, False)
    sabotaged = redrive_count(replace(RECORD, state=S.WAITING, redrive_planned=True), True)
    assert sabotaged.counted


def test_a_deferred_message_wakes_on_release_unless_the_execution_ended_or_waits() -> None:
    assert wakes_on_release(replace(RECORD, wake_requested=True))
    assert not wakes_on_release(RECORD)
    assert not wakes_on_release(replace(RECORD, wake_requested=True, state=S.COMPLETED))
    assert not wakes_on_release(replace(RECORD, wake_requested=True, state=S.PARKED))


def test_each_reason_the_rules_write_is_read_back_as_its_kind_of_wait() -> None:
    """The operator's listing and verbs read a wait's kind from these reasons: a reason
    written by the rules and read as another kind would offer the wrong command."""
    operator = cancel_verdict(CancelStep.OPERATOR, "r", None).reason
    assert wait_kind(operator) is WaitKind.CANCELLED_AFTER_PAYMENT
    assert wait_kind(f"{DIVERGENCE}: k-1") is WaitKind.DIVERGENCE
    assert wait_kind(cancel_verdict(CancelStep.WAIT, "r", "e-2").reason) is WaitKind.SHARED
    assert wait_kind(f"{UNDO_WAITS}: execution e-2 still uses a step") is WaitKind.SHARED
    assert wait_kind(finish_verdict([], pending=True).reason) is WaitKind.OTHER
    assert wait_kind(None) is WaitKind.OTHER


def test_a_shared_wait_names_the_execution_it_waits_for() -> None:
    assert waited_for(cancel_verdict(CancelStep.WAIT, "r", "e-2").reason) == "e-2"
    assert waited_for(shared_wait_reason(UNDO_WAITS, "e-3", "still uses a step")) == "e-3"
    assert waited_for(f"{DIVERGENCE}: execution e-4 differs") is None
    assert waited_for(None) is None
