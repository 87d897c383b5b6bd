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

A delivery's release meets a claim of another thread of the same delivery (a body's
threads may still call while the delivery ends). The release takes the lease row first,
then the execution's: queued first behind a holder of the execution's row, it holds the
lease row, so the claim waits for the lease row, not beside it; once the release commits,
the claim is fenced and writes nothing. Its twin (``RELEASE_LOCKS_EXECUTION_FIRST``)
locks the execution's row first: the release waits for the lease row the claim holds,
the claim for the execution's row the release holds, and PostgreSQL fails one.
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import text

from celery_agboss.core.executions import ExecutionMessage, StartKind
from celery_agboss.core.protections import LEASE_LOCK_WAITS, RELEASE_LOCKS_EXECUTION_FIRST
from celery_agboss.core.store_protocol import LeaseRef, NewIntent
from celery_agboss.core.transitions import claim_row
from celery_agboss.errors import ExecutionFencedError
from celery_agboss.store.execution_store import SQLAlchemyExecutionStore
from celery_agboss.testing.switches import sabotage
from tests.contract.one_statement_world import HISTORY_KEY, TTL_MS, charge_key, started
from tests.support.lock_waits import in_thread, waiting_backends
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


def _worst_case(executions: SQLAlchemyExecutionStore, one_statement: bool) -> dict[str, Any]:
    """The start and the claim queued behind a holder of the execution's row, in the
    order that would close a cycle; a renewal sent while they wait. What each gave."""
    engine = executions.store.engine
    lease = started(executions, "ordered")
    duplicate = ExecutionMessage("ordered", "shop.charge", "[42]", "{}", "{}")
    outcome: dict[str, Any] = {}
    with engine.connect() as holder:
        holder.execute(text("SELECT id FROM agboss_executions WHERE id = 'ordered' FOR UPDATE"))
        start = in_thread(
            lambda: executions.start_delivery(duplicate, "duplicate", TTL_MS, 3).kind,
            outcome,
            "start",
        )
        wait_until(lambda: waiting_backends(engine) >= 1, 10, message="the start's wait")
        claim = in_thread(lambda: _claim(executions, lease, one_statement), outcome, "claim")
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


def _release_before_claim(
    executions: SQLAlchemyExecutionStore, one_statement: bool
) -> dict[str, Any]:
    """The delivery's release, then a claim of another of its threads, queued behind a
    holder of the execution's row (the release first: the order that closes a cycle when
    the release holds that row while it waits for the lease row). What each gave, and the
    intent the claim would have written."""
    engine = executions.store.engine
    lease = started(executions, "releasing")
    outcome: dict[str, Any] = {}
    with engine.connect() as holder:
        holder.execute(text("SELECT id FROM agboss_executions WHERE id = 'releasing' FOR UPDATE"))
        release = in_thread(lambda: executions.release_delivery(lease), outcome, "release")
        wait_until(lambda: waiting_backends(engine) >= 1, 10, message="the release's wait")
        claim = in_thread(lambda: _claim(executions, lease, one_statement), outcome, "claim")
        wait_until(lambda: waiting_backends(engine) >= 2, 10, message="the claim's wait")
        holder.commit()
    for thread in (release, claim):
        thread.join(20)
        assert not thread.is_alive(), f"{thread.name} never returned"
    outcome["intent"] = executions.store.read_intent(charge_key(lease))
    return outcome


@pytest.mark.parametrize("one_statement", [True, False], ids=["one-statement", "transaction"])
def test_a_release_and_a_claim_of_the_same_delivery_never_deadlock(
    executions: SQLAlchemyExecutionStore, one_statement: bool
) -> None:
    outcome = _release_before_claim(executions, one_statement)
    assert outcome["release"].released is True, outcome
    assert isinstance(outcome["claim"], ExecutionFencedError), outcome
    assert outcome["intent"] is None  # fenced: nothing claimed under the released lease


def test_a_release_that_locks_the_execution_first_deadlocks_with_the_claim(
    executions: SQLAlchemyExecutionStore,
) -> None:
    """Sabotage twin: the release locks the execution's row before the lease row."""
    with sabotage(RELEASE_LOCKS_EXECUTION_FIRST):
        outcome = _release_before_claim(executions, one_statement=False)
    failed = [value for value in outcome.values() if isinstance(value, BaseException)]
    assert any("deadlock" in repr(error).lower() for error in failed), outcome
