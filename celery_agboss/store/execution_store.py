"""The execution store's one face: every verb on executions, on a ``SQLAlchemyStore``.

``SQLAlchemyExecutionStore`` is the one class callers hold (``core.executions.
ExecutionStore``); each verb names the operation and is its body, a function over one
transaction grouped with the tables it writes: the delivery's life in
``execution_delivery``, pauses in ``pauses``, cancels in ``cancels``, the sweep's and
operators' verbs in ``execution_admin`` (the re-drive and expiry in
``redrive_and_expiry``), listings of intents in ``intent_listings``, retention in
``retention``, the audit trail, meta values and the sweep's ticks in ``audit_trail``.
A body over the store is made a verb by ``on_store``, one over the caller's fenced
transaction is one as it is, so a verb's parameters are written once, beside its body;
``on_store_and_wait`` also hands it the face's ``shared_wait_ms``. The row
plumbing the bodies share (``*_txn`` over the caller's transaction) is in
``execution_rows``. docs/store.md maps each operation to its statements and
transactions.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import update_wrapper
from typing import TYPE_CHECKING, Concatenate, ParamSpec, TypeVar

from celery_agboss.core.executions import ExecutionRecord, ExecutionStore
from celery_agboss.core.store_protocol import FencedTransaction
from celery_agboss.store import audit_trail, cancels, intent_listings, pauses, retention
from celery_agboss.store import execution_admin as admin
from celery_agboss.store import execution_delivery as delivery
from celery_agboss.store import redrive_and_expiry as sweeping
from celery_agboss.store.execution_rows import SHARED_WAIT_MS
from celery_agboss.store.sqlalchemy_store import SQLAlchemyStore

P = ParamSpec("P")
R = TypeVar("R")


def on_store(
    body: Callable[Concatenate[SQLAlchemyStore, P], R],
) -> Callable[Concatenate[SQLAlchemyExecutionStore, P], R]:
    """``body`` as a verb of the face: called with the face's store, its parameters and
    docstring its own, so a verb's signature is written once, where its body is."""

    def verb(self: SQLAlchemyExecutionStore, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return body(self.store, *args, **kwargs)

    update_wrapper(verb, body)
    return verb


def on_store_and_wait(
    body: Callable[Concatenate[SQLAlchemyStore, int, P], R],
) -> Callable[Concatenate[SQLAlchemyExecutionStore, P], R]:
    """``on_store`` for a body that also takes the face's ``shared_wait_ms``."""

    def verb(self: SQLAlchemyExecutionStore, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return body(self.store, self.shared_wait_ms, *args, **kwargs)

    update_wrapper(verb, body)
    return verb


class SQLAlchemyExecutionStore:
    """Execution verbs on the same database (and engine) as a ``SQLAlchemyStore``."""

    def __init__(self, store: SQLAlchemyStore, *, shared_wait_ms: int = SHARED_WAIT_MS) -> None:
        self.store = store
        # How long an execution that waits for another one on a shared record waits
        # before it looks again (re-driven by the sweep).
        self.shared_wait_ms = shared_wait_ms

    # --- the delivery's life: publish, start, verdicts in its fenced transaction, release ----
    record_requested = on_store(delivery.record_requested)
    start_delivery = on_store_and_wait(delivery.start_delivery)
    start_in_transaction = on_store_and_wait(delivery.start_in_transaction)
    finish_in = staticmethod(delivery.finish_in)
    fail_in = staticmethod(delivery.fail_in)
    finish_and_release = on_store(delivery.finish_and_release)
    fail_and_release = on_store(delivery.fail_and_release)
    wait_in = staticmethod(delivery.wait_in)
    undo_wait_in = staticmethod(delivery.undo_wait_in)
    waiting_operator_in = staticmethod(delivery.waiting_operator_in)

    def cancel_in(
        self, tx: FencedTransaction, reason: str, *, payments_handled: bool = False
    ) -> ExecutionRecord:
        return cancels.cancel_in(tx, reason, self.shared_wait_ms, payments_handled=payments_handled)

    compensating_in = staticmethod(delivery.compensating_in)
    cancel_request_in = staticmethod(cancels.cancel_request_in)

    # --- pauses: the body's, an answer, the listing ------------------------------------------
    pause_in = staticmethod(pauses.pause_in)
    answer_pause = on_store(pauses.answer_pause)
    list_pauses = on_store(pauses.list_pauses)
    read_pauses = on_store(pauses.read_pauses)

    # --- the end of a delivery ---------------------------------------------------------------
    release_delivery = on_store(delivery.release_delivery)
    release_in = staticmethod(delivery.release_in)
    mark_links_dispatched = on_store(delivery.mark_links_dispatched)

    # --- reads -------------------------------------------------------------------------------
    read_execution = on_store(admin.read_execution)
    list_executions = on_store(admin.list_executions)

    # --- the sweep ---------------------------------------------------------------------------
    find_redrivable = on_store(sweeping.find_redrivable)
    claim_redrive = on_store(sweeping.claim_redrive)
    claim_redrive_row = on_store(sweeping.claim_redrive_row)
    count_unopened_redrive = on_store(sweeping.count_unopened_redrive)
    find_expiring = on_store(sweeping.find_expiring)
    expire_if_due = on_store(sweeping.expire_if_due)

    # --- operators ---------------------------------------------------------------------------
    request_cancel = on_store_and_wait(cancels.request_cancel)
    end_cancel_requested = on_store_and_wait(cancels.end_cancel_requested)
    executions_waiting_on = on_store(admin.executions_waiting_on)
    unblock = on_store(admin.unblock)
    intents_needing_operator = on_store(admin.intents_needing_operator)
    accept_divergence = on_store(admin.accept_divergence)
    pending_intent_keys = on_store(admin.pending_intent_keys)
    move = on_store(admin.move)
    failed_after_payment = on_store(admin.failed_after_payment)
    mark_payments_handled = on_store(admin.mark_payments_handled)

    # --- the audit trail and meta values -----------------------------------------------------
    append_audit = on_store(audit_trail.append_audit)
    list_audit = on_store(audit_trail.list_audit)
    set_meta = on_store(audit_trail.set_meta)
    get_meta = on_store(audit_trail.get_meta)

    # --- intents: what the sweep reconciles and operators are shown ---------------------
    find_stranded_keys = on_store(intent_listings.find_stranded_keys)
    list_pending_intents = on_store(intent_listings.list_pending_intents)
    list_intents_of = on_store(intent_listings.list_intents_of)
    find_cancel_requested = on_store(cancels.find_cancel_requested)
    put_cancel_request_last = on_store(cancels.put_cancel_request_last)

    # --- the sweep's ticks and retention --------------------------------------------------
    claim_tick = on_store(audit_trail.claim_tick)
    delete_settled_intents_before = on_store(retention.delete_settled_intents_before)
    delete_effects_before = on_store(retention.delete_effects_before)
    delete_terminal_executions_before = on_store(retention.delete_terminal_executions_before)
    delete_released_lease = on_store(retention.delete_released_lease)
    delete_dead_sweeper_leases = on_store(retention.delete_dead_sweeper_leases)


if TYPE_CHECKING:  # mypy proves the one face implements the protocol the engine uses

    def _implements_the_protocol(store: SQLAlchemyExecutionStore) -> ExecutionStore:
        return store


__all__ = ["SQLAlchemyExecutionStore"]
