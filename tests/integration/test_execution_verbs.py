"""The execution verbs on both stores, without a worker: one transaction each, decided
by the database (P1, P4; traps 3, 4, 9, 10).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from celery_agboss.core.executions import ExecutionMessage, ExecutionState, StartKind
from celery_agboss.errors import ExecutionFencedError, NotPausedError
from celery_agboss.store.execution_store import SQLAlchemyExecutionStore
from celery_agboss.store.sqlalchemy_store import SQLAlchemyStore

# Time moves only by ``advance`` (the store's clock offset), so the lease needs no short
# TTL here; a long one keeps SQLite's watchdog (a quarter of the TTL) from rolling back a
# verdict that a loaded machine was slow to commit (it once took over 1.25 s in CI).
TTL_MS = 60_000
CAP = 3


@pytest.fixture
def verbs(database_url: str) -> Iterator[SQLAlchemyExecutionStore]:
    store = SQLAlchemyStore(database_url)
    offset = {"ms": 0}
    store.clock_offset_source = lambda: offset["ms"]
    executions = SQLAlchemyExecutionStore(store)
    executions.offset = offset  # type: ignore[attr-defined]
    yield executions
    store.close()


def advance(verbs: SQLAlchemyExecutionStore, ms: int) -> None:
    verbs.offset["ms"] += ms  # type: ignore[attr-defined]


def message(execution_id: str = "t-1", retries: int = 0) -> ExecutionMessage:
    return ExecutionMessage(
        execution_id, "shop.charge", "[42]", "{}", f'{{"retries": {retries}}}', None, None
    )


def test_a_publish_is_recorded_once_and_a_later_message_refreshes_it(
    verbs: SQLAlchemyExecutionStore,
) -> None:
    assert verbs.record_requested(message()) is True
    assert verbs.record_requested(message(retries=1)) is False
    record = verbs.read_execution("t-1")
    assert record is not None and record.state is ExecutionState.REQUESTED
    assert record.options == '{"retries": 1}'


def test_a_second_delivery_under_a_live_lease_is_deferred_and_woken_on_release(
    verbs: SQLAlchemyExecutionStore,
) -> None:
    first = verbs.start_delivery(message(), "h1", TTL_MS, CAP)
    assert first.kind is StartKind.STARTED and first.grant is not None
    second = verbs.start_delivery(message(retries=1), "h2", TTL_MS, CAP)
    assert second.kind is StartKind.DEFERRED and second.execution.wake_requested
    # Not re-entrant: the same holder is deferred too.
    assert verbs.start_delivery(message(), "h1", TTL_MS, CAP).kind is StartKind.DEFERRED
    with verbs.store.fenced(first.grant.lease, TTL_MS) as tx:
        verbs.wait_in(tx, 0, "retry")
    released = verbs.release_delivery(first.grant.lease)
    assert released.released and released.republish
    assert released.execution is not None and released.execution.options == '{"retries": 1}'
    assert not released.execution.wake_requested


def test_a_release_of_a_finished_execution_publishes_nothing(
    verbs: SQLAlchemyExecutionStore,
) -> None:
    first = verbs.start_delivery(message(), "h1", TTL_MS, CAP)
    assert first.grant is not None
    verbs.start_delivery(message(), "h2", TTL_MS, CAP)
    with verbs.store.fenced(first.grant.lease, TTL_MS) as tx:
        verbs.finish_in(tx, '{"json": 1}')
    released = verbs.release_delivery(first.grant.lease)
    assert released.released and not released.republish
    again = verbs.start_delivery(message(), "h3", TTL_MS, CAP)
    assert again.kind is StartKind.TERMINAL and again.execution.result == '{"json": 1}'


def test_a_take_over_counts_and_the_cap_parks_the_execution(
    verbs: SQLAlchemyExecutionStore,
) -> None:
    for n in range(CAP + 1):
        start = verbs.start_delivery(message(), f"h{n}", TTL_MS, CAP)
        assert start.kind is StartKind.STARTED
        assert start.took_over is (n > 0)
        assert start.execution.recovery_count == n
        advance(verbs, TTL_MS + 1)  # the holder died: its lease expires
    parked = verbs.start_delivery(message(), "last", TTL_MS, CAP)
    assert parked.kind is StartKind.PARKED
    assert parked.execution.state is ExecutionState.PARKED
    assert "agboss_max_recovery_attempts=3" in (parked.execution.reason or "")


def test_a_superseded_holder_can_write_no_verdict(verbs: SQLAlchemyExecutionStore) -> None:
    old = verbs.start_delivery(message(), "old", TTL_MS, CAP)
    assert old.grant is not None
    advance(verbs, TTL_MS + 1)
    new = verbs.start_delivery(message(), "new", TTL_MS, CAP)
    assert new.grant is not None and new.grant.lease.token == old.grant.lease.token + 1
    with pytest.raises(ExecutionFencedError), verbs.store.fenced(old.grant.lease, TTL_MS) as tx:
        verbs.fail_in(tx, '{"type": "x"}', "zombie")
    assert not verbs.release_delivery(old.grant.lease).released
    record = verbs.read_execution("t-1")
    assert record is not None and record.state is ExecutionState.RUNNING


def test_only_one_of_two_sweepers_claims_a_redrive(verbs: SQLAlchemyExecutionStore) -> None:
    start = verbs.start_delivery(message(), "h1", TTL_MS, CAP)
    assert start.grant is not None
    assert verbs.find_redrivable(10, 0) == [], "a live lease is not re-driven"
    advance(verbs, TTL_MS + 1)
    found = verbs.find_redrivable(10, 0)
    assert [r.id for r in found] == ["t-1"]
    first = verbs.claim_redrive("t-1", found[0].updated_at_ms, CAP, next_redrive_delay_ms=5_000)
    second = verbs.claim_redrive("t-1", found[0].updated_at_ms, CAP)
    assert first.republish and not second.republish
    assert verbs.find_redrivable(10, 0) == [], "not again before its delay"


def test_a_requested_execution_is_redriven_only_after_its_grace(
    verbs: SQLAlchemyExecutionStore,
) -> None:
    verbs.record_requested(message())
    assert verbs.find_redrivable(10, 60_000) == []
    advance(verbs, 60_001)
    assert [r.id for r in verbs.find_redrivable(10, 60_000)] == ["t-1"]


def test_a_cancel_of_a_waiting_execution_is_final(verbs: SQLAlchemyExecutionStore) -> None:
    verbs.record_requested(message())
    record = verbs.request_cancel("t-1", "customer cancelled")
    assert record is not None and record.state is ExecutionState.CANCELLED
    assert verbs.start_delivery(message(), "h1", TTL_MS, CAP).kind is StartKind.TERMINAL


def test_a_pause_is_answered_once(verbs: SQLAlchemyExecutionStore) -> None:
    start = verbs.start_delivery(message(), "h1", TTL_MS, CAP)
    assert start.grant is not None
    with verbs.store.fenced(start.grant.lease, TTL_MS) as tx:
        assert verbs.pause_in(tx, "approve", '"please"') == (False, None)
    verbs.release_delivery(start.grant.lease)
    assert verbs.start_delivery(message(), "h2", TTL_MS, CAP).kind is StartKind.WAITING_ANSWER
    answered = verbs.answer_pause("t-1:approve", '"yes"')
    assert answered.record.state is ExecutionState.WAITING and not answered.early
    with pytest.raises(NotPausedError):
        verbs.answer_pause("t-1:approve", '"no"')
    again = verbs.start_delivery(message(), "h3", TTL_MS, CAP)
    assert again.grant is not None
    with verbs.store.fenced(again.grant.lease, TTL_MS) as tx:
        assert verbs.pause_in(tx, "approve", None) == (True, '"yes"')
