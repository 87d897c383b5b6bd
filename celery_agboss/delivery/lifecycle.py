"""One delivery of a ``PaymentTask``: start it, run the body under the lease, map the end
(design: what Celery records). The start (lease + ``RUNNING``) is one write; a duplicate
of a live execution is deferred, one of a terminal execution replays the stored outcome
(``replaying``). What a delivery must stop for (``AGBossSignal``) becomes ``Ignore`` or a
retry (``waits``); only an application exception with every intent settled makes
``FAILED`` (after its undos, ``compensating``). The verdict is written under the fence
*before* Celery hears of it, the lease released once no send under it can still run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, NoReturn

from celery.exceptions import Ignore, Reject, Retry

from celery_agboss.core import sabotage
from celery_agboss.core.execution_context import ExecutionContext
from celery_agboss.core.executions import (
    DeliveryStart,
    ExecutionRecord,
    ExecutionState,
    ReleaseOutcome,
    StartKind,
)
from celery_agboss.core.fault_points import DELIVERY_AFTER_VERDICT, fault_point
from celery_agboss.core.holder_clocks import SYSTEM_CLOCK
from celery_agboss.core.lease import SentAt, handle_for_grant, new_holder
from celery_agboss.core.log_events import (
    EXECUTION_COMPLETED,
    EXECUTION_DEFERRED,
    EXECUTION_FAILED,
    EXECUTION_FENCED,
    EXECUTION_NOT_RECORDED_AT_PUBLISH,
    EXECUTION_PARKED,
    EXECUTION_REFUSED,
    EXECUTION_RELEASE_FAILED,
    EXECUTION_STARTED,
    EXECUTION_TAKEN_OVER,
    EXECUTION_WAITING,
    EXECUTION_WAITING_OPERATOR,
    log_event,
)
from celery_agboss.core.protections import (
    CANCEL_REQUEST_IGNORED,
    FENCE_RECORDED_AS_FAILURE,
    LEASE_KEPT_AFTER_A_BROKEN_END,
    REJECT_WAITS_FOR_THE_SWEEP,
    RELEASE_WITH_UNSETTLED_ATTEMPT,
)
from celery_agboss.core.store_protocol import LeaseRef
from celery_agboss.delivery.cancelling import cancel_request_of, end_with_cancel
from celery_agboss.delivery.compensating import finish_verdict, resume_undo, undo_after_failure
from celery_agboss.delivery.outcomes import encode_error, encode_result
from celery_agboss.delivery.replaying import replay_terminal
from celery_agboss.delivery.verdicts import Fail, Finish, ForOperator, Verdict, Wait
from celery_agboss.delivery.waits import (
    log_store_failure,
    long_wait,
    retry_not_published,
    retry_or_requeue,
    retry_requested,
    start_failed,
    sweep_after_ms,
    wait_then_retry,
)
from celery_agboss.errors import (
    AGBossSignal,
    CancelRequestedError,
    ExecutionFencedError,
    ExecutionIdConflictError,
    LongWaitRequested,
    OutboundCallFailureNotReplayableError,
    OutboundCallInFlightError,
    OutboundCallResultNotStoredError,
    OutboundCallUnreconciledError,
    PauseRequested,
    PublishNotRecorded,
    ResultNotStorableError,
    RetryNotPublished,
    StoreError,
    StoreNotMigratedError,
    store_trouble_behind,
)
from celery_agboss.runtime.app_runtime import Runtime
from celery_agboss.runtime.messages import arguments_as_kept, message_from_request
from celery_agboss.runtime.task_events import (
    TASK_DEFERRED,
    TASK_FENCED,
    TASK_PARKED,
    TASK_PAUSED,
    TASK_RECONCILING,
    TASK_REFUSED,
    TASK_REPLAYED,
    TASK_UNRECONCILED,
    TASK_WAITING,
    send_agboss_event,
)

CONTEXT_ATTRIBUTE = "agboss_context"
"""Where a delivery keeps its ``ExecutionContext``: on ``task.request``, which is
per-thread (a threads pool runs several deliveries of one task instance at once)."""
BEFORE_START_ERROR = "agboss_before_start_error"  # what before_start raised (task.py)


class Delivery:
    """The life of one delivery; made and run by ``PaymentTask.__call__``."""

    def __init__(self, task: Any, runtime: Runtime, request: Any) -> None:
        self.task = task
        self.runtime = runtime
        self.request = request
        self.settings = runtime.settings
        self.execution_id = str(request.id)
        self.ctx: ExecutionContext | None = None
        self.cancel_reason = "cancel requested"
        self.recovering = False  # this execution is a crash recovery (see _start)

    # --- start -------------------------------------------------------------------------

    def run(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        message = message_from_request(self.task.name, self.request)
        sent = SentAt.now(SYSTEM_CLOCK)
        try:
            self.runtime.engine_settings  # noqa: B018 - the tenant, read before any lease
            start = self.runtime.executions.start_delivery(
                message,
                new_holder(),
                self.settings.lease_ttl_ms,
                self.settings.max_recovery_attempts,
            )
        except ExecutionIdConflictError as exc:
            self._refuse_another_task(exc)
        except (StoreError, StoreNotMigratedError, ValueError) as exc:  # see start_failed
            start_failed(self, exc)
        if start.kind is not StartKind.STARTED:
            return self._not_started(start)
        assert start.grant is not None
        lease = handle_for_grant(start.grant, self.settings.lease_ttl_ms, sent)
        self.runtime.renewer.track(lease)
        self.ctx = ExecutionContext(
            self.runtime.store,
            lease,
            self.execution_id,
            self.runtime.engine_settings,
            renewer=self.runtime.renewer,
            cancel_probe=(
                None
                if sabotage.active(CANCEL_REQUEST_IGNORED)
                else self.runtime.executions.cancel_request_in
            ),
        )
        setattr(self.request, CONTEXT_ATTRIBUTE, self.ctx)
        fields = {"token": lease.ref.token, "recovery_count": start.execution.recovery_count}
        # From the record: the take-over's own retry may be what finishes a recovery.
        self.recovering = start.took_over or start.execution.recovery_count > 0
        if start.took_over:
            self.log_decision(EXECUTION_TAKEN_OVER, logging.WARNING, **fields)
            self.send_event(TASK_RECONCILING, reason="taken-over", **fields)
        else:
            self.log_decision(EXECUTION_STARTED, **fields)
        if start.recorded_at_start and not getattr(self.request, "is_eager", False):
            self.log_decision(
                EXECUTION_NOT_RECORDED_AT_PUBLISH,
                logging.WARNING,
                hint="the publisher did not know this task as a PaymentTask, so a message "
                "the broker lost before a worker started it would have left no trace: "
                "import the task's module where you publish, or list its name in "
                "agboss_payment_tasks",
            )
        try:
            resume_undo(self, start)  # an undo that started goes on; the body never runs again
            if start.execution.cancel_requested and not sabotage.active(CANCEL_REQUEST_IGNORED):
                self.cancel_reason = start.execution.cancel_reason or self.cancel_reason
                self.cancel()
            return self._run_body(*arguments_as_kept(self.task, start.execution, args, kwargs))
        finally:
            setattr(self.request, CONTEXT_ATTRIBUTE, None)
            if not sabotage.active(LEASE_KEPT_AFTER_A_BROKEN_END):
                self.ctx.end_if_open("the delivery ended without releasing its lease")

    def _refuse_another_task(self, exc: ExecutionIdConflictError) -> NoReturn:
        """Another task's execution id: its body never runs. In-process (``apply``) the
        caller gets the error; a broker's message is dropped, its result left alone."""
        self.log_decision(EXECUTION_REFUSED, logging.ERROR, reason=str(exc))
        if getattr(self.request, "is_eager", False):
            raise exc
        self.send_event(TASK_REFUSED, reason="the execution id belongs to another task")
        raise Ignore()

    def _not_started(self, start: DeliveryStart) -> Any:
        record = start.execution
        if start.kind is StartKind.TERMINAL:
            return replay_terminal(self, record)
        if start.kind is StartKind.DEFERRED:
            self.log_decision(EXECUTION_DEFERRED)
            self.send_event(
                TASK_DEFERRED, reason="a live delivery holds the lease; woken on release"
            )
        elif start.kind is StartKind.PARKED:
            self.log_decision(EXECUTION_PARKED, logging.ERROR, recovery_count=record.recovery_count)
            self.send_event(TASK_PARKED, recovery_count=record.recovery_count)
        else:  # waiting for an answer
            event = {
                ExecutionState.PAUSED: TASK_PAUSED,
                ExecutionState.PARKED: TASK_PARKED,
                ExecutionState.WAITING: TASK_WAITING,  # a cancel waits for another execution
            }.get(record.state, TASK_UNRECONCILED)
            self.log_decision(EXECUTION_WAITING, state=record.state.value)
            self.send_event(event, state=record.state.value)
        raise Ignore()

    # --- the body ---------------------------------------------------------------------

    def _run_body(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        try:
            raised_before_start = getattr(self.request, BEFORE_START_ERROR, None)
            if isinstance(raised_before_start, BaseException):
                raise raised_before_start
            try:
                result = self.task.run(*args, **kwargs)
            except Ignore:
                self.context().raise_if_stopped()  # raised past a signal it caught: that
                raise
            self.context().raise_if_stopped()  # signal, as if it had not been caught
        except Retry as exc:
            retry_requested(self, exc)
        except LongWaitRequested as exc:
            long_wait(self, exc)
        except RetryNotPublished as exc:
            retry_not_published(self, exc)
        except Reject as exc:
            self._rejected(exc)
        except Ignore:
            self.verdict(Finish(encode_result(None)))
            self.release()
            raise
        except PauseRequested as exc:
            self.release()
            self.send_event(TASK_PAUSED, pause_id=f"{self.execution_id}:{exc.name}")
            raise Ignore() from None
        except ExecutionFencedError as exc:
            self.fenced(exc)
        except (
            OutboundCallUnreconciledError,
            OutboundCallResultNotStoredError,
            OutboundCallFailureNotReplayableError,
        ) as exc:
            self.for_operator(exc)
        except CancelRequestedError as exc:  # recorded while the body ran: stop it here
            self.cancel_reason = str(exc.fields.get("reason") or self.cancel_reason)
            self.cancel()
        except StoreError as exc:  # a signal too: handed over, never the body's failure
            self.store_failed(exc)
        except AGBossSignal as exc:  # unknown outcome, in flight elsewhere
            self.later(exc)
        except Exception as exc:
            self._failed(exc)
            raise
        except PublishNotRecorded as exc:  # another app's publish refused: as through ours
            self._failed(exc.error)
            raise exc.error from None
        except BaseException:
            self.abandon()
            raise
        return self._completed(result)

    def _rejected(self, exc: Reject) -> NoReturn:
        """A body's ``Reject``: requeued, ``WAITING``; dropped, ``FAILED`` (or an operator's)."""
        if exc.requeue or sabotage.active(REJECT_WAITS_FOR_THE_SWEEP):
            self.verdict(Wait(0, "rejected, requeued"))
            self.release()
            raise exc
        reason = exc.reason if isinstance(exc.reason, BaseException) else exc
        self._failed(reason if isinstance(reason, Exception) else RuntimeError(repr(reason)))
        raise exc

    def _completed(self, result: Any) -> Any:
        try:
            encoded = encode_result(result, allow_pickle=self.uses_pickle())
        except ResultNotStorableError as exc:
            # Refused before anything is recorded as done: a duplicate could not return it.
            self._failed(exc)
            raise exc from None
        record = self.conclude(finish_verdict(self, encoded))  # an undo's task: its mark too
        fault_point(DELIVERY_AFTER_VERDICT)  # e.g. a soft time limit: link_ends hands back
        if record is not None and record.state is ExecutionState.WAITING_OPERATOR:
            # A divergence, or an intent still pending: never silently COMPLETED.
            self.log_decision(EXECUTION_WAITING_OPERATOR, logging.ERROR, reason=record.reason)
            self.send_event(TASK_UNRECONCILED, reason=record.reason)
            raise Ignore()
        # A crash recovery is RECONCILED, whatever its last call did: the sweep may
        # have looked the payment up first, and then this delivery only replays it.
        outcome = "RECONCILED" if self.recovering else self._last_outcome()
        self.log_decision(EXECUTION_COMPLETED, outcome=outcome)
        if outcome == "RECONCILED":
            self.send_event(TASK_RECONCILING, outcome=outcome)
        elif outcome == "REPLAYED":
            self.send_event(TASK_REPLAYED, outcome=outcome)
        return result

    def _failed(self, exc: Exception) -> None:
        """An application exception: ``FAILED`` (stored) unless an intent is pending. One
        raised by a revoke (``terminate=True, signal="SIGUSR1"``) meets a cancel request:
        the execution is cancelled instead, once what it left pending is reconciled."""
        trouble = store_trouble_behind(exc)  # a publish refused for the store's outage
        if trouble is not None:
            self.store_failed(trouble)
        if not self.settle_sends():
            self.abandon()
            raise Ignore() from None
        if self._cancel_requested_now():
            self.cancel()
        ctx = self.context()
        error = encode_error(exc, ctx.mask_error_text, ctx.mask_error_fields)
        reason = undo_after_failure(self, error, type(exc).__name__)  # the undos, first
        record = self.conclude(Fail(error, reason))
        if record is not None and record.state is ExecutionState.WAITING_OPERATOR:
            self.log_decision(EXECUTION_WAITING_OPERATOR, logging.ERROR, error=type(exc).__name__)
            self.send_event(TASK_UNRECONCILED, reason="failed while an outbound call is pending")
            raise Ignore() from None
        self.log_decision(EXECUTION_FAILED, logging.WARNING, error=type(exc).__name__)

    def later(self, exc: AGBossSignal) -> NoReturn:
        """Not known yet: retry soon through the broker, or (a longer wait) through the store."""
        in_flight = isinstance(exc, OutboundCallInFlightError)
        delay = self.settings.lease_ttl_seconds if in_flight else self.settings.retry_delay_seconds
        settled = self.settle_sends()
        if settled:
            self.verdict(Wait(sweep_after_ms(self.settings, delay), type(exc).__name__))
        else:
            # A send may still be running: the lease is left to expire; start after it.
            delay = max(delay, self.settings.lease_ttl_seconds + 1)
        self.log_decision(EXECUTION_WAITING, reason=type(exc).__name__, delay=delay)
        wait_then_retry(self, delay, release=settled, reason=type(exc).__name__)

    def for_operator(self, exc: AGBossSignal) -> NoReturn:
        self.settle_sends()
        self.verdict(ForOperator(f"{type(exc).__name__}: {exc}"))
        self.release()
        self.log_decision(EXECUTION_WAITING_OPERATOR, logging.ERROR, reason=type(exc).__name__)
        self.send_event(TASK_UNRECONCILED, reason=type(exc).__name__)
        raise Ignore() from None

    def cancel(self) -> NoReturn:
        """A cancel was requested: the body does not run (``cancelling.end_with_cancel``)."""
        end_with_cancel(self)

    def _cancel_requested_now(self) -> bool:
        reason = cancel_request_of(self.runtime, self.execution_id)
        if reason is None or sabotage.active(CANCEL_REQUEST_IGNORED):
            return False
        self.cancel_reason = reason
        return True

    def fenced(self, exc: ExecutionFencedError) -> NoReturn:
        """Superseded: nothing stored, nothing released; the new holder continues."""
        ctx = self.context()
        # No write of this delivery is trusted any more; its renewals stop once no send
        # under the lease can still be running (if the lease was lost, they stop at once).
        ctx.stop_renewing_when_settled("fenced")
        self.log_decision(EXECUTION_FENCED, logging.WARNING, token=ctx.lease.ref.token)
        self.send_event(TASK_FENCED, token=ctx.lease.ref.token)
        if sabotage.active(FENCE_RECORDED_AS_FAILURE):
            raise RuntimeError(f"sabotage: fenced delivery recorded as a failure ({exc})")
        raise Ignore() from None

    def store_failed(self, exc: StoreError) -> NoReturn:
        """The store failed mid-delivery: leave the lease to expire; try again after it."""
        self.abandon()
        log_store_failure(self, "delivery", exc)
        retry_or_requeue(self, self.settings.lease_ttl_seconds + 1, exc)

    def abandon(self) -> None:
        """Stop without a verdict and without releasing: the lease is renewed until no send
        under it can still be running, then left to expire; the next holder reconciles."""
        ctx = self.ctx
        if ctx is None:
            return
        if sabotage.active(RELEASE_WITH_UNSETTLED_ATTEMPT) and ctx.running_sends():
            ctx.release(self._releaser([]))  # sabotage: handed over under a live send (design: R18)
            return
        ctx.stop_renewing_when_settled("the delivery stopped without a verdict")

    def settle_sends(self) -> bool:
        """Wait for this delivery's sends, each up to its ``attempt_timeout`` bound; False
        while one may still reach the gateway (then its lease is never released)."""
        if sabotage.active(RELEASE_WITH_UNSETTLED_ATTEMPT):
            return True  # sabotage: stop waiting for sends on the wire (design: R18)
        return self.context().settle_all()

    # --- writes -----------------------------------------------------------------------

    def verdict(self, verdict: Verdict) -> ExecutionRecord | None:
        """Write the delivery's verdict in a fenced transaction (holder clocks checked
        first). A fence turns into ``Ignore`` (nothing stored); a store error leaves the
        lease to expire and schedules another delivery after it."""
        executions = self.runtime.executions
        ctx = self.context()
        try:
            with ctx.fenced() as tx:
                return verdict.write_in(executions, ctx, tx)
        except ExecutionFencedError as exc:
            self.fenced(exc)
        except StoreError as exc:
            self.store_failed(exc)

    def conclude(self, verdict: Finish | Fail) -> ExecutionRecord | None:
        """The verdict with the release (one statement, else one fenced transaction) once
        no send under the lease can still run, else the verdict alone and the release after
        the sends settle; a holder that outlived its lease commits neither."""
        ctx = self.context()
        if (
            sabotage.active(RELEASE_WITH_UNSETTLED_ATTEMPT)
            or not self.settle_sends()
            or not ctx.reserve_release()
        ):
            record = self.verdict(verdict)
            self.release()
            return record
        executions = self.runtime.executions
        outcome: ReleaseOutcome | None = None  # the one statement's never wakes
        try:
            record = verdict.end_in_one(executions, ctx)
            if record is None:
                with ctx.fenced() as tx:
                    record = verdict.write_in(executions, ctx, tx)
                    outcome = executions.release_in(tx, record)
                    tx.release_at_commit()
        except ExecutionFencedError as exc:
            self.fenced(exc)
        except StoreError as exc:
            self.store_failed(exc)
        ctx.released_at_commit()
        self._republish_if_woken(outcome)
        return record

    def _releaser(
        self, captured: list[ReleaseOutcome], *, will_republish: bool = False
    ) -> Callable[[LeaseRef], ReleaseOutcome]:
        """Release and read ``wake_requested`` in one transaction (``captured`` gets it)."""

        def releaser(ref: LeaseRef) -> ReleaseOutcome:
            outcome = self.runtime.executions.release_delivery(ref, will_republish=will_republish)
            captured.append(outcome)
            return outcome

        return releaser

    def release(self, *, will_republish: bool = False) -> None:
        ctx = self.context()
        if not self.settle_sends():
            return  # a send may still be running: never released under it
        captured: list[ReleaseOutcome] = []
        try:
            ctx.release(self._releaser(captured, will_republish=will_republish))
        except StoreError as exc:
            error = type(exc).__name__
            self.log_decision(
                EXECUTION_RELEASE_FAILED, logging.WARNING, step="release", error=error
            )
            return
        if captured:
            self._republish_if_woken(captured[0])

    def _republish_if_woken(self, outcome: ReleaseOutcome | None) -> None:
        if outcome is not None and outcome.republish and outcome.execution is not None:
            try:
                self.runtime.republish(outcome.execution, reason="woken", honour_not_before=False)
            except (Exception, StoreError):
                # The execution is not terminal and has no lease: the sweep re-drives it.
                self.log_decision(EXECUTION_RELEASE_FAILED, logging.WARNING, step="republish")

    # --- small things -------------------------------------------------------------------

    def context(self) -> ExecutionContext:
        assert self.ctx is not None
        return self.ctx

    def use_context(self, ctx: ExecutionContext) -> None:
        """Go on in ``ctx`` (the undos', on this delivery's lease) for the rest of it."""
        self.ctx = ctx
        setattr(self.request, CONTEXT_ATTRIBUTE, ctx)

    def _last_outcome(self) -> str | None:
        outcome = self.ctx.last_outcome if self.ctx is not None else None
        return None if outcome is None else outcome.value

    def uses_pickle(self) -> bool:
        return str(self.runtime.app.conf.result_serializer) == "pickle"

    def log_decision(self, event: str, level: int = logging.INFO, **fields: Any) -> None:
        log_event(event, level, execution_id=self.execution_id, task=self.task.name, **fields)

    def send_event(self, type_: str, **fields: Any) -> None:
        send_agboss_event(self.task, type_, execution_id=self.execution_id, **fields)


__all__ = ["BEFORE_START_ERROR", "CONTEXT_ATTRIBUTE", "Delivery"]
