"""The execution store's one face: every verb on executions, on a ``SQLAlchemyStore``.

``SQLAlchemyExecutionStore`` is the one class callers hold (``core.executions.
ExecutionStore``); each method names the operation and hands it to its body, a
function over one transaction grouped with the tables it writes: the delivery's life
in ``execution_delivery``, pauses in ``pauses``, cancels in ``cancels``, the sweep's
and operators' verbs in ``execution_admin`` (the re-drive and expiry in
``redrive_and_expiry``), listings of intents in ``intent_listings``, retention in
``retention``, the audit trail, meta values and the sweep's ticks in ``audit_trail``.
The row plumbing they share (``*_txn`` over the caller's transaction) is in
``execution_rows``. docs/store.md maps each operation to its statements and
transactions.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING

from celery_agboss.core.executions import (
    AnsweredPause,
    Audit,
    AuditEntry,
    DeliveryStart,
    ExecutionMessage,
    ExecutionRecord,
    ExecutionState,
    ExecutionStore,
    RedriveDecision,
    ReleaseOutcome,
)
from celery_agboss.core.pauses import PauseRecord
from celery_agboss.core.store_protocol import (
    FencedTransaction,
    IntentRecord,
    LeaseRef,
    StoreTransaction,
)
from celery_agboss.store import audit_trail, cancels, intent_listings, pauses, retention
from celery_agboss.store import execution_admin as admin
from celery_agboss.store import execution_delivery as delivery
from celery_agboss.store import redrive_and_expiry as sweeping
from celery_agboss.store.execution_rows import SHARED_WAIT_MS
from celery_agboss.store.redrive_and_expiry import RedriveClaim, UnsealedExecution
from celery_agboss.store.retention import RetentionResult
from celery_agboss.store.sqlalchemy_store import SQLAlchemyStore


class SQLAlchemyExecutionStore:
    """Execution verbs on the same database (and engine) as a ``SQLAlchemyStore``."""

    def __init__(self, store: SQLAlchemyStore, *, shared_wait_ms: int = SHARED_WAIT_MS) -> None:
        self.store = store
        # How long an execution that waits for another one on a shared record waits
        # before it looks again (re-driven by the sweep).
        self.shared_wait_ms = shared_wait_ms

    # --- the delivery's life: publish, start, verdicts in its fenced transaction, release ----
    def record_requested(self, message: ExecutionMessage) -> bool:
        return delivery.record_requested(self.store, message)

    def start_delivery(
        self, message: ExecutionMessage, holder: str, ttl_ms: int, max_recovery_attempts: int
    ) -> DeliveryStart:
        return delivery.start_delivery(
            self.store, self.shared_wait_ms, message, holder, ttl_ms, max_recovery_attempts
        )

    def start_in_transaction(
        self, message: ExecutionMessage, holder: str, ttl_ms: int, max_recovery_attempts: int
    ) -> DeliveryStart:
        return delivery.start_in_transaction(
            self.store, self.shared_wait_ms, message, holder, ttl_ms, max_recovery_attempts
        )

    def finish_in(
        self, tx: FencedTransaction, result: str, reached: Collection[str] | None = None
    ) -> ExecutionRecord:
        return delivery.finish_in(tx, result, reached)

    def fail_in(self, tx: FencedTransaction, error: str, reason: str) -> ExecutionRecord:
        return delivery.fail_in(tx, error, reason)

    def finish_and_release(
        self, lease: LeaseRef, ttl_ms: int, result: str, reached: Collection[str] | None
    ) -> ExecutionRecord | None:
        return delivery.finish_and_release(self.store, lease, ttl_ms, result, reached)

    def fail_and_release(
        self, lease: LeaseRef, ttl_ms: int, error: str, reason: str
    ) -> ExecutionRecord | None:
        return delivery.fail_and_release(self.store, lease, ttl_ms, error, reason)

    def wait_in(
        self,
        tx: FencedTransaction,
        delay_ms: int,
        reason: str,
        message: ExecutionMessage | None = None,
    ) -> ExecutionRecord:
        return delivery.wait_in(tx, delay_ms, reason, message)

    def undo_wait_in(self, tx: FencedTransaction, delay_ms: int, reason: str) -> ExecutionRecord:
        return delivery.undo_wait_in(tx, delay_ms, reason)

    def waiting_operator_in(self, tx: FencedTransaction, reason: str) -> ExecutionRecord:
        return delivery.waiting_operator_in(tx, reason)

    def cancel_in(
        self, tx: FencedTransaction, reason: str, *, payments_handled: bool = False
    ) -> ExecutionRecord:
        return cancels.cancel_in(tx, reason, self.shared_wait_ms, payments_handled=payments_handled)

    def compensating_in(
        self,
        tx: FencedTransaction,
        reason: str,
        error: str | None = None,
        *,
        continuing: bool = False,
    ) -> ExecutionRecord:
        return delivery.compensating_in(tx, reason, error, continuing=continuing)

    def cancel_request_in(self, tx: FencedTransaction) -> str | None:
        return cancels.cancel_request_in(tx)

    # --- pauses: the body's, an answer, the listing ------------------------------------------
    def pause_in(
        self, tx: FencedTransaction, name: str, payload: str | None, *, accept_early: bool = False
    ) -> tuple[bool, str | None]:
        return pauses.pause_in(tx, name, payload, accept_early=accept_early)

    def answer_pause(
        self, pause_id: str, answer: str, *, audit: Audit | None = None
    ) -> AnsweredPause:
        return pauses.answer_pause(self.store, pause_id, answer, audit=audit)

    def list_pauses(self, limit: int = 100) -> list[tuple[str, str, str]]:
        return pauses.list_pauses(self.store, limit)

    def read_pauses(
        self,
        *,
        pause_id: str | None = None,
        execution_id: str | None = None,
        shown_unopened: bool = False,
    ) -> list[PauseRecord]:
        return pauses.read_pauses(
            self.store,
            pause_id=pause_id,
            execution_id=execution_id,
            shown_unopened=shown_unopened,
        )

    # --- the end of a delivery ---------------------------------------------------------------
    def release_delivery(self, lease: LeaseRef, *, will_republish: bool = False) -> ReleaseOutcome:
        return delivery.release_delivery(self.store, lease, will_republish=will_republish)

    def release_in(
        self, tx: FencedTransaction, record: ExecutionRecord, *, will_republish: bool = False
    ) -> ReleaseOutcome:
        return delivery.release_in(tx, record, will_republish=will_republish)

    def mark_links_dispatched(self, execution_id: str) -> None:
        return delivery.mark_links_dispatched(self.store, execution_id)

    # --- reads -------------------------------------------------------------------------------
    def read_execution(self, execution_id: str) -> ExecutionRecord | None:
        return admin.read_execution(self.store, execution_id)

    def list_executions(
        self,
        states: Sequence[ExecutionState] | None = None,
        limit: int = 100,
        after_id: str | None = None,
    ) -> list[ExecutionRecord]:
        return admin.list_executions(self.store, states, limit, after_id)

    # --- the sweep ---------------------------------------------------------------------------
    def find_redrivable(
        self, limit: int, requested_grace_ms: int, *, as_of_ms: int | None = None
    ) -> list[UnsealedExecution]:
        return sweeping.find_redrivable(self.store, limit, requested_grace_ms, as_of_ms=as_of_ms)

    def claim_redrive(
        self,
        execution_id: str,
        expected_updated_at_ms: int,
        max_recovery_attempts: int,
        *,
        next_redrive_delay_ms: int = 0,
    ) -> RedriveDecision:
        return sweeping.claim_redrive(
            self.store,
            execution_id,
            expected_updated_at_ms,
            max_recovery_attempts,
            next_redrive_delay_ms=next_redrive_delay_ms,
        )

    def claim_redrive_row(
        self,
        execution_id: str,
        expected_updated_at_ms: int,
        max_recovery_attempts: int,
        *,
        next_redrive_delay_ms: int = 0,
    ) -> RedriveClaim:
        return sweeping.claim_redrive_row(
            self.store,
            execution_id,
            expected_updated_at_ms,
            max_recovery_attempts,
            next_redrive_delay_ms=next_redrive_delay_ms,
        )

    def count_unopened_redrive(self, claimed: UnsealedExecution) -> bool:
        return sweeping.count_unopened_redrive(self.store, claimed)

    def find_expiring(self, limit: int) -> list[str]:
        return sweeping.find_expiring(self.store, limit)

    def expire_if_due(self, execution_id: str) -> UnsealedExecution | None:
        return sweeping.expire_if_due(self.store, execution_id)

    # --- operators ---------------------------------------------------------------------------
    def request_cancel(
        self,
        execution_id: str,
        reason: str,
        *,
        payments_handled: bool = False,
        audit: Audit | None = None,
    ) -> ExecutionRecord | None:
        return cancels.request_cancel(
            self.store,
            self.shared_wait_ms,
            execution_id,
            reason,
            payments_handled=payments_handled,
            audit=audit,
        )

    def end_cancel_requested(
        self, execution_id: str, reason: str, *, payments_handled: bool = False
    ) -> ExecutionRecord | None:
        return cancels.end_cancel_requested(
            self.store, self.shared_wait_ms, execution_id, reason, payments_handled=payments_handled
        )

    def executions_waiting_on(self, idempotency_key: str) -> list[str]:
        return admin.executions_waiting_on(self.store, idempotency_key)

    def unblock(
        self,
        execution_id: str,
        reason: str,
        *,
        reset_recovery_count: bool = False,
        audit: Audit | None = None,
    ) -> ExecutionRecord | None:
        return admin.unblock(
            self.store, execution_id, reason, reset_recovery_count=reset_recovery_count, audit=audit
        )

    def intents_needing_operator(self, execution_id: str) -> list[str]:
        return admin.intents_needing_operator(self.store, execution_id)

    def accept_divergence(
        self,
        execution_id: str,
        reason: str,
        *,
        audit: Audit | None = None,
        completed: Callable[[StoreTransaction, ExecutionRecord], None] | None = None,
    ) -> ExecutionRecord | None:
        return admin.accept_divergence(
            self.store, execution_id, reason, audit=audit, completed=completed
        )

    def pending_intent_keys(self, execution_id: str) -> list[str]:
        return admin.pending_intent_keys(self.store, execution_id)

    def move(
        self,
        execution_id: str,
        from_states: Sequence[ExecutionState],
        to_state: ExecutionState,
        reason: str,
        *,
        not_before_delay_ms: int | None = None,
        reset_recovery_count: bool = False,
        planned: bool = False,
        audit: Audit | None = None,
    ) -> ExecutionRecord | None:
        return admin.move(
            self.store,
            execution_id,
            from_states,
            to_state,
            reason,
            not_before_delay_ms=not_before_delay_ms,
            reset_recovery_count=reset_recovery_count,
            planned=planned,
            audit=audit,
        )

    def failed_after_payment(self, limit: int = 100) -> list[tuple[ExecutionRecord, list[str]]]:
        return admin.failed_after_payment(self.store, limit)

    def mark_payments_handled(
        self, execution_id: str, *, audit: Audit | None = None
    ) -> ExecutionRecord | None:
        return admin.mark_payments_handled(self.store, execution_id, audit=audit)

    # --- the audit trail and meta values -----------------------------------------------------
    def append_audit(
        self,
        actor: str,
        action: str,
        target: str,
        reason: str,
        before: str | None = None,
        after: str | None = None,
    ) -> None:
        return audit_trail.append_audit(self.store, actor, action, target, reason, before, after)

    def list_audit(self, target: str | None = None, limit: int = 100) -> list[AuditEntry]:
        return audit_trail.list_audit(self.store, target, limit)

    def set_meta(self, key: str, value: str) -> None:
        return audit_trail.set_meta(self.store, key, value)

    def get_meta(self, key: str) -> tuple[str, int] | None:
        return audit_trail.get_meta(self.store, key)

    # --- intents: what the sweep reconciles and operators are shown ---------------------
    def find_stranded_keys(
        self, limit: int, *, as_of_ms: int | None = None
    ) -> list[tuple[str, str]]:
        return intent_listings.find_stranded_keys(self.store, limit, as_of_ms=as_of_ms)

    def list_pending_intents(
        self, *, limit: int, operator_only: bool = False
    ) -> list[IntentRecord]:
        return intent_listings.list_pending_intents(
            self.store, limit=limit, operator_only=operator_only
        )

    def list_intents_of(self, execution_id: str) -> list[IntentRecord]:
        return intent_listings.list_intents_of(self.store, execution_id)

    def find_cancel_requested(self, limit: int) -> list[str]:
        return cancels.find_cancel_requested(self.store, limit)

    def put_cancel_request_last(self, execution_id: str) -> None:
        cancels.put_cancel_request_last(self.store, execution_id)

    # --- the sweep's ticks and retention --------------------------------------------------
    def claim_tick(self, interval_ms: int, claimant: str) -> int | None:
        return audit_trail.claim_tick(self.store, interval_ms, claimant)

    def delete_settled_intents_before(self, cutoff_ms: int, limit: int) -> RetentionResult:
        return retention.delete_settled_intents_before(self.store, cutoff_ms, limit)

    def delete_effects_before(self, cutoff_ms: int, limit: int) -> RetentionResult:
        return retention.delete_effects_before(self.store, cutoff_ms, limit)

    def delete_terminal_executions_before(self, cutoff_ms: int, limit: int) -> int:
        return retention.delete_terminal_executions_before(self.store, cutoff_ms, limit)

    def delete_released_lease(self, lease: LeaseRef) -> bool:
        return retention.delete_released_lease(self.store, lease)

    def delete_dead_sweeper_leases(self, older_than_ms: int, limit: int) -> int:
        return retention.delete_dead_sweeper_leases(self.store, older_than_ms, limit)


if TYPE_CHECKING:  # mypy proves the one face implements the protocol the engine uses

    def _implements_the_protocol(store: SQLAlchemyExecutionStore) -> ExecutionStore:
        return store


__all__ = ["SQLAlchemyExecutionStore"]
