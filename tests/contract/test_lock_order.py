"""One lock order, lease then execution: a claim, a duplicate start and a renewal never
deadlock (design: one round trip per state change).

The holder's claim locks its lease row and then reads the execution's row ``FOR SHARE``.
A duplicate delivery's start locks the execution's row and then judges the lease: it
takes a lease row another transaction holds for live (``SKIP LOCKED``), never waiting
for it. The test orders the worst case: a transaction holds the execution's row, the
start queues for it first and the claim second (holding the lease row); then the row
is let go. The start gets the row, finds the lease locked, and defers; the claim goes
on. A renewal sent meanwhile skips the locked row and returns. The sweep and the
operators judge another holder's lease as the start does (``lock_lease``), under the
execution's row. The twin makes that judgement wait for the lease row: the start and
the claim wait for each other, and PostgreSQL fails one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import text

from celery_agboss.core.executions import ExecutionMessage, StartKind
from celery_agboss.core.protections import LEASE_LOCK_WAITS
from celery_agboss.core.store_protocol import LeaseRef, NewIntent
from celery_agboss.core.transitions import claim_row
from celery_agboss.store.execution_store import SQLAlchemyExecutionStore
from celery_agboss.testing.switches import sabotage
from tests.contract.one_statement_world import HISTORY_KEY, TTL_MS, charge_key, started
from tests.support.lock_waits import waiting_backends
from tests.support.processes import wait_until

pytestmark = pytest.mark.postgres


def _claim(executions: SQLAlchemyExecutionStore, lease: LeaseRef, one_statement: bool) -> Any:
    """The holder's claim, as one statement or as its fenced transaction (the same
    order: the lease row, then the execution's row)."""
    store = executions.store
    intent = NewIntent(charge_key(lease), lease.scope, "shop.charge", None, "fp", {}, lease)
    row = claim_row(HISTORY_KEY, intent)
    if one_statement:
        done = store.claim_in_one(lease, TTL_MS, intent, row, cancel_of=lease.scope)
        assert done is not None, "PostgreSQL claims in one statement"
        return done.inserted
    with store.fenced(lease, TTL_MS) as tx:
        assert executions.cancel_request_in(tx) is None
        return tx.insert_intent(intent, first_history=row)


def _in_thread(call: Callable[[], Any], outcome: dict[str, Any], name: str) -> threading.Thread:
    def run() -> None:
        try:
            outcome[name] = call()
        except BaseException as exc:  # judged by the test
            outcome[name] = exc

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread


def _worst_case(executions: SQLAlchemyExecutionStore, one_statement: bool) -> dict[str, Any]:
    """The start and the claim queued behind a holder of the execution's row, in the
    order that would close a cycle; a renewal sent while they wait. What each gave."""
    engine = executions.store.engine
    lease = started(executions, "ordered")
    duplicate = ExecutionMessage("ordered", "shop.charge", "[42]", "{}", "{}")
    outcome: dict[str, Any] = {}
    with engine.connect() as holder:
        holder.execute(text("SELECT id FROM agboss_executions WHERE id = 'ordered' FOR UPDATE"))
        start = _in_thread(
            lambda: executions.start_delivery(duplicate, "duplicate", TTL_MS, 3).kind,
            outcome,
            "start",
        )
        wait_until(lambda: waiting_backends(engine) >= 1, 10, message="the start's wait")
        claim = _in_thread(lambda: _claim(executions, lease, one_statement), outcome, "claim")
        wait_until(lambda: waiting_backends(engine) >= 2, 10, message="the claim's wait")
        outcome["renewal"] = executions.store.renew_leases([lease], TTL_MS)
        holder.commit()
    for thread in (start, claim):
        thread.join(20)
        assert not thread.is_alive(), f"{thread.name} never returned"
    return outcome


@pytest.mark.parametrize("one_statement", [True, False], ids=["one-statement", "transaction"])
def test_a_claim_a_duplicate_start_and_a_renewal_never_deadlock(
    executions: SQLAlchemyExecutionStore, one_statement: bool
) -> None:
    outcome = _worst_case(executions, one_statement)
    assert outcome["start"] is StartKind.DEFERRED, outcome
    assert outcome["claim"] is True, outcome
    assert len(outcome["renewal"]) == 1  # answered at once: the locked row skipped


def test_a_start_that_waits_for_the_lease_row_deadlocks_with_the_claim(
    executions: SQLAlchemyExecutionStore,
) -> None:
    """Sabotage twin: the start's lease read waits for the row lock."""
    with sabotage(LEASE_LOCK_WAITS):
        outcome = _worst_case(executions, one_statement=False)
    failed = [value for value in outcome.values() if isinstance(value, BaseException)]
    assert any("deadlock" in repr(error).lower() for error in failed), outcome
