"""A lease that expires while a fenced write waits for its row is refused
(design: one round trip per state change).

The holder's lease has a second left on the database clock when its write is sent. A
long transaction keeps the lease row locked (``FOR UPDATE``, changing nothing) until
the lease has expired, then ends. The fence reads the time once it holds the row: the
lease is expired, the write is refused and nothing is written. That holds for the
one-statement settle, the verdict with its release, and a fenced transaction's first
statement. The twin reads the time before the wait: the late holder's write goes
through.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import text

from celery_agboss.core.executions import ExecutionState
from celery_agboss.core.protections import FENCE_TIMED_BEFORE_LOCK_WAIT
from celery_agboss.core.store_protocol import (
    IntentStatus,
    LeaseRef,
)
from celery_agboss.errors import ExecutionFencedError
from celery_agboss.store.execution_store import SQLAlchemyExecutionStore
from celery_agboss.testing.switches import sabotage
from tests.contract.one_statement_world import (
    TTL_MS,
    charge_key,
    claimed_settle,
    started,
)
from tests.support.lock_waits import during_a_change

pytestmark = pytest.mark.postgres

LEFT_MS = 1_000
"""The lease's life left when the write is sent (on the database clock)."""


def _expired(executions: SQLAlchemyExecutionStore, lease: LeaseRef) -> Callable[[], bool]:
    offset: dict[str, int] = executions.offset  # type: ignore[attr-defined]

    def expired() -> bool:
        with executions.store.engine.connect() as conn:
            return bool(
                conn.execute(
                    text(
                        "SELECT expires_at_ms <= floor(extract(epoch FROM clock_timestamp()) "
                        "* 1000) + :offset FROM agboss_leases WHERE scope = :scope"
                    ),
                    {"offset": offset["ms"], "scope": lease.scope},
                ).scalar_one()
            )

    return expired


def _late(executions: SQLAlchemyExecutionStore, lease: LeaseRef, write: Callable[[], Any]) -> Any:
    """``write()`` sent with ``LEFT_MS`` of the lease left, behind a transaction that holds
    the lease row until the lease has expired; what it returned or raised."""
    executions.offset["ms"] = TTL_MS - LEFT_MS  # type: ignore[attr-defined]
    return during_a_change(
        executions.store.engine,
        "SELECT scope FROM agboss_leases WHERE scope = :scope FOR UPDATE",
        {"scope": lease.scope},
        write,
        commit_when=_expired(executions, lease),
    )


def _settle(executions: SQLAlchemyExecutionStore, lease: LeaseRef) -> Callable[[], Any]:
    store = executions.store
    change = claimed_settle(store, lease)
    return lambda: store.transition_in_one(lease, TTL_MS, change)


def _end(executions: SQLAlchemyExecutionStore, lease: LeaseRef) -> Callable[[], Any]:
    return lambda: executions.finish_and_release(lease, TTL_MS, '"ok"', frozenset())


def _fenced_transaction(executions: SQLAlchemyExecutionStore, lease: LeaseRef) -> Callable[[], Any]:
    def write() -> str:
        with executions.store.fenced(lease, TTL_MS) as tx:
            tx.execute(
                text("UPDATE agboss_executions SET reason = 'late write' WHERE id = :id"),
                {"id": lease.scope},
            )
        return "written"

    return write


WRITES: dict[str, Callable[[SQLAlchemyExecutionStore, LeaseRef], Callable[[], Any]]] = {
    "one-statement settle": _settle,
    "verdict with release": _end,
    "fenced transaction": _fenced_transaction,
}


def _nothing_written(executions: SQLAlchemyExecutionStore, lease: LeaseRef) -> bool:
    record = executions.read_execution(lease.scope)
    intent = executions.store.read_intent(charge_key(lease))
    return (
        record is not None
        and record.state is ExecutionState.RUNNING
        and record.reason is None
        and (intent is None or intent.status is IntentStatus.PENDING)
    )


@pytest.mark.parametrize("name", sorted(WRITES))
def test_a_lease_that_expired_during_the_lock_wait_is_refused(
    executions: SQLAlchemyExecutionStore, name: str
) -> None:
    lease = started(executions, "late")
    outcome = _late(executions, lease, WRITES[name](executions, lease))
    assert isinstance(outcome, ExecutionFencedError), outcome
    assert _nothing_written(executions, lease)


@pytest.mark.parametrize("name", sorted(WRITES))
def test_timed_before_the_wait_the_late_holder_writes(
    executions: SQLAlchemyExecutionStore, name: str
) -> None:
    """Sabotage twin: the fence reads the clock before it waits for the lease row."""
    lease = started(executions, "late")
    with sabotage(FENCE_TIMED_BEFORE_LOCK_WAIT):
        outcome = _late(executions, lease, WRITES[name](executions, lease))
    assert not isinstance(outcome, BaseException), outcome
    assert not _nothing_written(executions, lease)
