"""What a delivery writes at its end (design: what Celery records): a closed set of verdicts.

Each member writes itself through its own verb of the execution store, inside the
delivery's fenced transaction, so a verdict mypy does not know is an error where it
is made, never a silent fall-through to another state.
"""

from __future__ import annotations

from dataclasses import dataclass

from celery_agboss.core.execution_context import ExecutionContext
from celery_agboss.core.executions import ExecutionMessage, ExecutionRecord, ExecutionStore
from celery_agboss.core.store_protocol import FencedTransaction


@dataclass(frozen=True)
class Finish:
    """``COMPLETED`` with the encoded result — ``WAITING_OPERATOR`` when an intent is
    pending or the body missed one an earlier delivery created (a divergence)."""

    result: str

    def write_in(
        self, executions: ExecutionStore, ctx: ExecutionContext, tx: FencedTransaction
    ) -> ExecutionRecord:
        return executions.finish_in(tx, self.result, ctx.reached_keys())

    def end_in_one(
        self, executions: ExecutionStore, ctx: ExecutionContext
    ) -> ExecutionRecord | None:
        """``write_in`` and the lease's release as one statement; None: use the transaction."""
        reached = ctx.reached_keys()
        return ctx.ended_in_one(
            lambda lease, ttl_ms: executions.finish_and_release(lease, ttl_ms, self.result, reached)
        )


@dataclass(frozen=True)
class Fail:
    """``FAILED`` with the stored error (``WAITING_OPERATOR`` while an intent is pending)."""

    error: str
    reason: str

    def write_in(
        self, executions: ExecutionStore, ctx: ExecutionContext, tx: FencedTransaction
    ) -> ExecutionRecord:
        return executions.fail_in(tx, self.error, self.reason)

    def end_in_one(
        self, executions: ExecutionStore, ctx: ExecutionContext
    ) -> ExecutionRecord | None:
        """``write_in`` and the lease's release as one statement; None: use the transaction."""
        return ctx.ended_in_one(
            lambda lease, ttl_ms: executions.fail_and_release(
                lease, ttl_ms, self.error, self.reason
            )
        )


@dataclass(frozen=True)
class Wait:
    """``WAITING`` until ``now + delay_ms``; with ``message``, what the sweep publishes then.
    ``retry_asked``: the body asked for this retry (``self.retry()``, ``autoretry_for``),
    which authorises sending again the definite failures that ended the delivery."""

    delay_ms: int
    reason: str
    message: ExecutionMessage | None = None
    retry_asked: bool = False

    def write_in(
        self, executions: ExecutionStore, ctx: ExecutionContext, tx: FencedTransaction
    ) -> ExecutionRecord:
        if self.retry_asked:
            ctx.authorise_retries(tx)
        return executions.wait_in(tx, self.delay_ms, self.reason, self.message)


@dataclass(frozen=True)
class Cancel:
    """``CANCELLED`` — unless an intent is pending (left as it was) or a payment of it
    completed (``WAITING_OPERATOR``)."""

    reason: str

    def write_in(
        self, executions: ExecutionStore, ctx: ExecutionContext, tx: FencedTransaction
    ) -> ExecutionRecord:
        return executions.cancel_in(tx, self.reason)


@dataclass(frozen=True)
class UndoWait:
    """Still ``COMPENSATING``, re-driven after ``delay_ms``: an undo waits for another
    execution that still uses a step it shares (a planned wait, not a recovery)."""

    delay_ms: int
    reason: str

    def write_in(
        self, executions: ExecutionStore, ctx: ExecutionContext, tx: FencedTransaction
    ) -> ExecutionRecord:
        return executions.undo_wait_in(tx, self.delay_ms, self.reason)


@dataclass(frozen=True)
class ForOperator:
    """``WAITING_OPERATOR``: a person decides; nothing runs until then.
    ``retry_asked``: what the person does next is a re-drive that should try again (an
    undo that failed), which authorises sending again the definite failures that ended
    the delivery, as a body's own retry does."""

    reason: str
    retry_asked: bool = False

    def write_in(
        self, executions: ExecutionStore, ctx: ExecutionContext, tx: FencedTransaction
    ) -> ExecutionRecord:
        if self.retry_asked:
            ctx.authorise_retries(tx)
        return executions.waiting_operator_in(tx, self.reason)


Verdict = Finish | Fail | Wait | UndoWait | Cancel | ForOperator
"""Every verdict there is."""


__all__ = ["Cancel", "Fail", "Finish", "ForOperator", "UndoWait", "Verdict", "Wait"]
