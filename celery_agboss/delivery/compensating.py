"""A delivery runs its execution's undos (``celery_agboss.core.compensation``).

Only two things start them, both inside the delivery, under its lease, in the body's
wrapper (never from ``on_failure`` in the worker's main process):

- an application exception from the body once every intent is settled
  (design: what fails an execution): ``COMPENSATING``, the undos in reverse, then ``FAILED``
  with that exception;
- a cancel request on an execution that declared undos: they run, then ``CANCELLED``
  (or, when a completed call was not undone, "cancelled after a completed payment").

A hard time limit, a kill, ``SystemExit``, a fence or an unknown outcome never does: a
crash is a hand-over (design: P5). The declarations are read and ``COMPENSATING`` is written in
fenced transactions, so a holder superseded mid-body whose body then raises runs none.
A delivery of an execution whose compensation started continues it — the undos not
marked done — and never runs the body again. While an undo runs, what stops it maps as
it does for the body (an unknown outcome waits and retries, an unreconciled refund
waits for an operator, a fence hands over); an undo that raises leaves the execution
waiting for an operator: money moved and its undo did not happen. So does the failure
of an undo's task (one declared as a signature, published by its parent's undo), whose
``COMPLETED``, in turn, is what lets its parent's step read undone (``finish_verdict``).
Once an operator said the execution's payments are dealt with (``cancel
--payments-handled``), the undos of its payments are not run; its fenced effects' are,
and its claim of a payment covers no other execution's undos of it (a person decides).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import NoReturn

from celery.exceptions import Ignore

from celery_agboss.core import sabotage
from celery_agboss.core.compensation import (
    CANCEL,
    FAILURE,
    CompensationStarted,
    UndoContext,
    UndoDeclaration,
    UndoStep,
    mark_started_in,
    read_declarations,
    read_started,
    run_undos,
    step_notes,
    task_undo_runner,
    trail_of,
    undo_registry,
)
from celery_agboss.core.execution_context import ExecutionContext
from celery_agboss.core.executions import (
    UNDO_WAITS,
    DeliveryStart,
    ExecutionRecord,
    ExecutionState,
    ExecutionStore,
    shared_wait_reason,
)
from celery_agboss.core.failures import stored_text
from celery_agboss.core.log_events import (
    EXECUTION_COMPENSATING,
    EXECUTION_FAILED,
    EXECUTION_WAITING,
    EXECUTION_WAITING_OPERATOR,
    log_event,
)
from celery_agboss.core.protections import (
    FAILURE_SKIPS_UNDO,
    FENCED_HOLDER_STARTS_UNDO,
    PAYMENTS_HANDLED_RUNS_PAYMENT_UNDOS,
    UNDO_ON_ANY_FAILURE,
    UNDO_REFUSAL_REPLAYED_ON_REDRIVE,
    UNDO_TASK_FAILURE_ENDS_FAILED,
)
from celery_agboss.core.store_protocol import FencedTransaction
from celery_agboss.core.undo_steps import (
    UNDO_OF_HEADER,
    UNDO_POSITION_HEADER,
)
from celery_agboss.core.undo_task_marks import undo_task_completed
from celery_agboss.delivery.delivery_like import DeliveryLike
from celery_agboss.delivery.outcomes import decode_error, encode_error
from celery_agboss.delivery.verdicts import Fail, Finish, ForOperator, UndoWait
from celery_agboss.errors import (
    AGBossSignal,
    ExecutionFencedError,
    OutboundCallFailureNotReplayableError,
    OutboundCallResultNotStoredError,
    OutboundCallUnreconciledError,
    PauseRequested,
    PublishNotRecorded,
    ResultNotStorableError,
    StoreError,
    UndoMustWait,
    store_trouble_behind,
)
from celery_agboss.runtime.task_events import TASK_PAUSED, TASK_UNRECONCILED, TASK_WAITING
from celery_agboss.store.handled_payments import handled_by_hand_txn, handled_payment_steps_in

TAKEN_OVER = "the previous delivery ended without a verdict"


# --- the three ways in -------------------------------------------------------------------


def resume_undo(d: DeliveryLike, start: DeliveryStart) -> None:
    """At the start of a delivery: continue a compensation an earlier delivery started
    (the remaining undos, then its end); return when there is none. Only an execution
    delivered before can have one, so a first delivery reads nothing."""
    ctx = d.context()
    earlier = start.execution.deliveries > 1
    trail_of(ctx).earlier_deliveries = earlier
    trail_of(ctx).undo_of = _header_undo_of(d)  # its undo_with() is refused
    if not earlier:
        return
    try:
        started = read_started(d.runtime.store, ctx.settings, ctx.execution_id)
    except StoreError as exc:
        d.store_failed(exc)
    if started is None:
        if start.took_over and sabotage.active(UNDO_ON_ANY_FAILURE):
            error = encode_error(RuntimeError(TAKEN_OVER))
            undo_after_failure(d, error, "TakenOver")
            _end_failed(d, CompensationStarted(FAILURE, "TakenOver", error))
        return
    declarations = _declarations(d)
    _start(d, started, len(declarations), continuing=True)
    _run(d, declarations, started.cause)
    if started.cause == CANCEL:
        d.cancel_reason = started.reason or d.cancel_reason
        d.cancel()  # nothing left to undo: settles and ends the cancel
    _end_failed(d, started)


def undo_after_failure(d: DeliveryLike, error: str, reason: str) -> str:
    """The body failed for real, every send settled: its undos, before ``FAILED`` is
    written (by the caller, with the reason returned: ``reason`` and the shared steps it
    left alone). Returns at once when none was declared, or when an intent is pending
    (no undo then: the execution waits for an operator instead). An undo's task (its
    parent counts that undo as run) waits for an operator instead of failing."""
    if sabotage.active(FAILURE_SKIPS_UNDO):
        return reason
    undoing = _undo_of(d)
    failure = decode_error(error)
    if undoing is not None and not isinstance(failure, ResultNotStorableError):
        # (A result JSON cannot hold comes after the body's refund went through: not an
        # undo that failed, and ``FAILED`` says why, as for any task.)
        _undo_failed(d, f"{d.task.name} of execution {undoing}", failure)
    declarations = _declarations(d)
    if declarations and _start(d, CompensationStarted(FAILURE, reason, error), len(declarations)):
        _run(d, declarations, FAILURE)
    return _with_notes(d, reason)


def _undo_of(d: DeliveryLike) -> str | None:
    """The execution whose step this one undoes, when it is an undo's task (published
    from a signature, ``UNDO_OF_HEADER``): that execution counts its undo as run once the
    task was published, so the task's failure is the undo's, and a person must see it."""
    if sabotage.active(UNDO_TASK_FAILURE_ENDS_FAILED):
        return None
    return _header_undo_of(d)


def _header_undo_of(d: DeliveryLike) -> str | None:
    """``UNDO_OF_HEADER`` of the delivery's message: the one reading of it."""
    found = _header(d, UNDO_OF_HEADER)
    return str(found) if found else None


def _header(d: DeliveryLike, name: str) -> object:
    """A custom header of the delivery's message (Celery also lifts it onto the request)."""
    headers = getattr(d.request, "headers", None)
    found = headers.get(name) if isinstance(headers, dict) else None
    return found if found is not None else getattr(d.request, name, None)


# --- an undo's task completes --------------------------------------------------------------


def finish_verdict(d: DeliveryLike, result: str) -> Finish:
    """``COMPLETED`` with ``result``; for an undo's task, with its undo finished in the same
    transaction (``UndoTaskFinish``): its parent's step reads undone from then on only."""
    undo_of, position = _header_undo_of(d), str(_header(d, UNDO_POSITION_HEADER) or "")
    if undo_of is None or not position.isdigit():
        return Finish(result)  # not an undo's task, or one published before the header
    return UndoTaskFinish(result, undo_of, int(position), d.task.name)


@dataclass(frozen=True)
class UndoTaskFinish(Finish):
    """An undo's task's ``COMPLETED``, written with the mark that its undo finished: the
    refund was made, so the step may read undone (design: compensated step). Never in the
    one statement, which has no room for the mark."""

    undo_of: str
    position: int
    task: str

    def write_in(
        self, executions: ExecutionStore, ctx: ExecutionContext, tx: FencedTransaction
    ) -> ExecutionRecord:
        record = super().write_in(executions, ctx, tx)
        if record.state is ExecutionState.COMPLETED:  # not a divergence, nothing pending
            undo_task_completed(
                tx,
                ctx.settings,
                ctx.execution_id,
                self.undo_of,
                self.position,
                self.task,
                token=tx.lease.token,
            )
        return record

    def end_in_one(
        self, executions: ExecutionStore, ctx: ExecutionContext
    ) -> ExecutionRecord | None:
        return None


def _with_notes(d: DeliveryLike, reason: str) -> str:
    """The execution's reason, naming the shared steps its undos left alone ("step … kept
    for <execution>", "claimed for undo by <execution>")."""
    ctx = d.context()
    notes = step_notes(ctx.settings, ctx.decisions) if isinstance(ctx, UndoContext) else []
    return "; ".join([reason, *notes])[:1000]


def undo_before_cancel(d: DeliveryLike, reason: str) -> ExecutionRecord | None:
    """A cancel request with nothing pending: the declared undos, then the cancel, as
    ``cancel_in`` wrote it; None when no undo was declared (the caller cancels)."""
    declarations = _declarations(d)
    started = CompensationStarted(CANCEL, reason, None)
    if not declarations or not _start(d, started, len(declarations)):
        return None
    _run(d, declarations, CANCEL)
    return _end_cancel(d, reason)


# --- the steps -----------------------------------------------------------------------------


def _declarations(d: DeliveryLike) -> list[UndoDeclaration]:
    ctx = d.context()
    trail = trail_of(ctx)
    if not trail.declared and not trail.earlier_deliveries:
        return []  # nothing declared by this delivery, and there was no other
    try:
        with ctx.fenced() as tx:
            return read_declarations(tx, ctx.settings, ctx.execution_id)
    except ExecutionFencedError as exc:
        if not sabotage.active(FENCED_HOLDER_STARTS_UNDO):
            d.fenced(exc)
        with d.runtime.store.read_transaction() as read:
            return read_declarations(read, ctx.settings, ctx.execution_id)
    except StoreError as exc:
        d.store_failed(exc)


def _start(
    d: DeliveryLike, started: CompensationStarted, count: int, *, continuing: bool = False
) -> bool:
    """``COMPENSATING`` and the start mark, in one fenced transaction; False when the
    execution may not start undo (an intent of it is pending)."""
    ctx = d.context()
    ctx.end_body()  # before the mark: a call of the body after it would pass as an undo's
    executions = d.runtime.executions
    why = f"undo after {started.reason}" if started.cause == FAILURE else "undo before cancel"
    try:
        with ctx.fenced() as tx:
            record = executions.compensating_in(tx, why, started.error, continuing=continuing)
            if record.state is not ExecutionState.COMPENSATING:
                return False
            mark_started_in(tx, ctx.settings, ctx.execution_id, started)
    except ExecutionFencedError as exc:
        if not sabotage.active(FENCED_HOLDER_STARTS_UNDO):
            d.fenced(exc)
    except StoreError as exc:
        d.store_failed(exc)
    log_event(
        EXECUTION_COMPENSATING,
        execution_id=d.execution_id,
        task=d.task.name,
        cause=started.cause,
        count=count,
        continuing=continuing,
    )
    return True


def _run(d: DeliveryLike, declarations: list[UndoDeclaration], cause: str) -> None:
    """The undos, in an ``UndoContext`` on this delivery's lease; whatever stops one
    ends the delivery as it would have ended the body (the next one continues). Those of
    payments an operator dealt with by hand are not run (``_handled_by_hand``)."""
    handled = _handled_by_hand(d, declarations)
    undo_ctx = UndoContext.over(d.context(), renewer=d.runtime.renewer)
    d.use_context(undo_ctx)
    registry = undo_registry(d.task.app)
    task = d.task
    running: list[UndoStep] = []

    def call(step: UndoStep) -> None:
        running.append(step)
        if step.task is not None:  # declared as a Celery signature
            task_undo_runner()(task, step)
        else:
            registry.require(step.name)(task, step, **step.arguments)

    try:
        run_undos(
            undo_ctx,
            declarations,
            call,
            cause=cause,
            handled=handled,
            handled_in=handled_by_hand_txn,
        )
    except PauseRequested as exc:
        d.release()
        d.send_event(TASK_PAUSED, pause_id=f"{d.execution_id}:{exc.name}")
        raise Ignore() from None
    except UndoMustWait as exc:
        _wait_for_other(d, exc)
    except ExecutionFencedError as exc:
        d.fenced(exc)
    except (
        OutboundCallUnreconciledError,
        OutboundCallResultNotStoredError,
        OutboundCallFailureNotReplayableError,
    ) as exc:
        d.for_operator(exc)
    except StoreError as exc:
        d.store_failed(exc)
    except AGBossSignal as exc:  # unknown outcome, in flight elsewhere: WAITING, retried
        d.later(exc)
    except Exception as exc:
        _undo_failed(d, running[-1].name if running else "?", exc)
    except PublishNotRecorded as exc:  # refused through another app: as through ours
        _undo_failed(d, running[-1].name if running else "?", exc.error)
    except BaseException:
        d.abandon()
        raise


def _handled_by_hand(d: DeliveryLike, declarations: list[UndoDeclaration]) -> frozenset[str]:
    """The payment steps whose undos an operator's ``cancel --payments-handled`` says were
    dealt with at the gateway (a refund by hand): running them would refund again
    (design: cancel request). Read under this delivery's lease, which that word is never
    written under, so it holds for every undo this delivery runs."""
    if sabotage.active(PAYMENTS_HANDLED_RUNS_PAYMENT_UNDOS):
        return frozenset()
    ctx = d.context()
    try:
        with ctx.fenced() as tx:
            return handled_payment_steps_in(tx, ctx.execution_id, declarations)
    except ExecutionFencedError as exc:
        if not sabotage.active(FENCED_HOLDER_STARTS_UNDO):
            d.fenced(exc)
        with d.runtime.store.read_transaction() as read:
            return handled_payment_steps_in(read, ctx.execution_id, declarations)
    except StoreError as exc:
        d.store_failed(exc)


def _wait_for_other(d: DeliveryLike, wait: UndoMustWait) -> NoReturn:
    """A step to undo is one another execution still uses: this execution stays
    ``COMPENSATING`` (so that one never waits for it in turn) and is re-driven once the
    wait is over, to decide again; the wait is planned, not a recovery."""
    if not d.settle_sends():
        d.abandon()
        raise Ignore() from None
    delay_ms = d.runtime.executions.shared_wait_ms
    reason = shared_wait_reason(UNDO_WAITS, wait.other, "still uses a step to undo")
    d.verdict(UndoWait(delay_ms, reason))
    d.release()
    d.log_decision(EXECUTION_WAITING, reason="undo-waits", other=wait.other, delay=delay_ms / 1000)
    d.send_event(TASK_WAITING, reason=reason, delay=delay_ms / 1000)
    raise Ignore() from None


def _undo_failed(d: DeliveryLike, name: str, exc: BaseException) -> NoReturn:
    """An undo raised (an undo function, or the body of an undo's task): money moved and
    was not given back, so a person decides (the undo is not marked done, the task not
    ended: a re-drive runs it again). A refund the gateway refused definitively (no
    money moved: a merchant balance too low) may then be sent again: otherwise the
    re-drive would only replay the refusal."""
    trouble = store_trouble_behind(exc)  # a publish refused for the store's outage
    if trouble is not None:
        d.store_failed(trouble)
    if not d.settle_sends():
        d.abandon()
        raise Ignore() from None
    ctx = d.context()
    told = stored_text(exc, ctx.mask_error_text, ctx.mask_error_fields)
    reason = f"undo {name} failed: {type(exc).__name__}: {told}"
    resend = not sabotage.active(UNDO_REFUSAL_REPLAYED_ON_REDRIVE)
    d.verdict(ForOperator(reason[:1000], retry_asked=resend))
    d.release()
    d.log_decision(EXECUTION_WAITING_OPERATOR, logging.ERROR, reason="undo failed", undo=name)
    d.send_event(TASK_UNRECONCILED, reason=f"undo {name} failed")
    raise Ignore() from None


def _end_failed(d: DeliveryLike, started: CompensationStarted) -> NoReturn:
    """``FAILED`` with the original failure, raised again for Celery (FAILURE, errbacks);
    its reason names the shared steps it left alone ("kept for <execution>")."""
    error = started.error or encode_error(RuntimeError(started.reason))
    record = d.conclude(Fail(error, _with_notes(d, started.reason)))
    if record is not None and record.state is ExecutionState.WAITING_OPERATOR:
        d.log_decision(EXECUTION_WAITING_OPERATOR, logging.ERROR, reason=record.reason)
        d.send_event(TASK_UNRECONCILED, reason=record.reason)
        raise Ignore()
    d.log_decision(EXECUTION_FAILED, logging.WARNING, error=started.reason, undone=True)
    raise decode_error(error)


def _end_cancel(d: DeliveryLike, reason: str) -> ExecutionRecord | None:
    """The cancel's end once its undos ran: ``CANCELLED`` when every payment of it is
    accounted for (undone, kept for another execution), else a wait or a person — the
    store's ``cancel_in``, by the one rule (``shared_records.cancel_decision``)."""
    ctx = d.context()
    try:
        with ctx.fenced() as ftx:
            return d.runtime.executions.cancel_in(ftx, reason)
    except ExecutionFencedError as exc:
        d.fenced(exc)
    except StoreError as exc:
        d.store_failed(exc)


__all__ = [
    "UndoTaskFinish",
    "finish_verdict",
    "resume_undo",
    "undo_after_failure",
    "undo_before_cancel",
]
