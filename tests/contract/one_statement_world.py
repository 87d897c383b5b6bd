"""What the one-statement tests on PostgreSQL share (with the ``executions`` fixture of
the contract suite's conftest): a started execution, and a claimed intent's settle."""

from __future__ import annotations

from celery_agboss.core.executions import ExecutionMessage
from celery_agboss.core.history import HistoryEvent
from celery_agboss.core.store_protocol import (
    IntentGuard,
    IntentStatus,
    IntentTransition,
    IntentUpdate,
    LeaseRef,
    NewIntent,
)
from celery_agboss.core.transitions import claim_row, history_row
from celery_agboss.store.execution_store import SQLAlchemyExecutionStore
from celery_agboss.store.sqlalchemy_store import SQLAlchemyStore

TTL_MS = 30_000
HISTORY_KEY = b"one-statement-tests-history-key32"


def started(executions: SQLAlchemyExecutionStore, execution_id: str) -> LeaseRef:
    """A recorded execution's first delivery started: its lease."""
    message = ExecutionMessage(execution_id, "shop.charge", "[42]", "{}", "{}")
    assert executions.record_requested(message)
    start = executions.start_delivery(message, f"holder-{execution_id}", TTL_MS, 3)
    assert start.grant is not None
    return start.grant.lease


def charge_key(lease: LeaseRef) -> str:
    return f"default:t:{lease.scope}:shop.charge"


def claimed_settle(store: SQLAlchemyStore, lease: LeaseRef) -> IntentTransition:
    """An intent claimed by ``lease`` (``PENDING`` with its first history row) and the
    transition that completes it."""
    key = charge_key(lease)
    intent = NewIntent(key, lease.scope, "shop.charge", None, "fp", {}, lease)
    first = claim_row(HISTORY_KEY, intent)
    with store.transaction() as tx:
        assert tx.insert_intent(intent, first_history=first)
    row = history_row(
        HISTORY_KEY,
        first,
        key,
        HistoryEvent.COMPLETED,
        from_status=IntentStatus.PENDING,
        to_status=IntentStatus.COMPLETED,
        attempt=1,
        owner=lease,
        detail={},
        execution_id=lease.scope,
        at_ms=0,
    )
    settle = IntentUpdate(status=IntentStatus.COMPLETED, result={"id": "ch_1"}, complete=True)
    return IntentTransition(key, IntentGuard(IntentStatus.PENDING, 1, lease), settle, row)


__all__ = ["HISTORY_KEY", "TTL_MS", "charge_key", "claimed_settle", "started"]
