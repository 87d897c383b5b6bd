"""A delivery's verdict and its lease's release as one PostgreSQL statement
(design: one round trip per state change).

The plain end (nothing pending, nothing diverged) is one statement and writes what the
fenced transaction writes; any other end is decided on reads, as the transaction
decides it, and written in one statement while the pending intent read is unchanged.
A stale token, an expired lease and a take-over committed during the statement's lock
wait are refused as the transaction refuses them: nothing written, the lease kept. The
twin drops the verdict's join to the fence: the zombie's verdict overwrites the row.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import pytest
from sqlalchemy import text

from celery_agboss.core.execution_states import Verdict
from celery_agboss.core.executions import ExecutionRecord, ExecutionState
from celery_agboss.core.protections import ONE_STATEMENT_WITHOUT_FENCE
from celery_agboss.core.store_protocol import LeaseRef, NewIntent
from celery_agboss.errors import ExecutionFencedError
from celery_agboss.store.execution_store import SQLAlchemyExecutionStore
from celery_agboss.store.verdict_release import conclude_txn
from celery_agboss.testing.switches import sabotage
from tests.contract.one_statement_world import TTL_MS, started
from tests.support.lock_waits import during_a_change, statements_of

pytestmark = pytest.mark.postgres

RESULT = '{"json": "ch_1"}'


def intent_of(executions: SQLAlchemyExecutionStore, lease: LeaseRef, settled: bool) -> str:
    """An intent of the execution: PENDING, or COMPLETED by an earlier delivery."""
    key = f"default:t:{lease.scope}:charge"
    intent = NewIntent(key, lease.scope, "shop.charge", None, "fp", {}, lease)
    with executions.store.transaction() as tx:
        assert tx.insert_intent(intent)
    if settled:
        with executions.store.engine.begin() as conn:
            conn.execute(
                text(
                    "UPDATE agboss_outbound_calls SET status = 'COMPLETED' "
                    "WHERE idempotency_key = :k"
                ),
                {"k": key},
            )
    return key


def by_transaction(
    executions: SQLAlchemyExecutionStore, lease: LeaseRef, reached: frozenset[str]
) -> ExecutionRecord:
    """The end as the fenced transaction writes it (the path before the one statement)."""
    with executions.store.fenced(lease, TTL_MS) as tx:
        record = executions.finish_in(tx, RESULT, reached)
        executions.release_in(tx, record)
        tx.release_at_commit()
    return record


def released(executions: SQLAlchemyExecutionStore, lease: LeaseRef) -> bool:
    state = executions.store.read_lease(lease.scope)
    assert state is not None and state.token == lease.token
    return state.released


LEFT_OUT = {"id", "args", "requested_at_ms", "started_at_ms", "updated_at_ms", "read_at_ms"}
LEFT_OUT |= {"terminal_at_ms"}


def comparable(record: ExecutionRecord | None) -> dict[str, Any]:
    """The row's values but its own id (named in a reason too) and times."""
    assert record is not None
    values = {name: value for name, value in asdict(record).items() if name not in LEFT_OUT}
    values["reason"] = (record.reason or "").replace(record.id, "<id>")
    return values


def test_a_plain_end_is_one_statement_and_writes_what_the_transaction_writes(
    executions: SQLAlchemyExecutionStore,
) -> None:
    one, other = started(executions, "end-1"), started(executions, "end-2")
    ended: list[ExecutionRecord | None] = []
    sent = statements_of(
        executions.store.engine,
        lambda: ended.append(executions.finish_and_release(one, TTL_MS, RESULT, frozenset())),
    )
    assert len(sent) == 1, sent
    assert ended[0] is not None and ended[0].state is ExecutionState.COMPLETED
    assert comparable(ended[0]) == comparable(by_transaction(executions, other, frozenset()))
    assert released(executions, one) and released(executions, other)


def test_a_plain_failure_is_one_statement_and_fails_the_execution(
    executions: SQLAlchemyExecutionStore,
) -> None:
    lease = started(executions, "fail-1")
    record = executions.fail_and_release(lease, TTL_MS, '{"error": "declined"}', "declined")
    assert record is not None and record.state is ExecutionState.FAILED
    assert record.reason == "declined" and record.error == '{"error": "declined"}'
    assert released(executions, lease)


@pytest.mark.parametrize(
    ("settled", "reached"),
    [(False, False), (True, False), (False, True)],
    ids=["pending-not-reached", "completed-not-reached", "pending-reached"],
)
def test_an_end_that_is_not_plain_is_decided_as_the_transaction_decides(
    executions: SQLAlchemyExecutionStore, settled: bool, reached: bool
) -> None:
    """An intent pending, or one an earlier delivery completed that this body did not
    reach (a divergence): ``WAITING_OPERATOR``, as the fenced transaction writes it."""
    one, other = started(executions, "odd-1"), started(executions, "odd-2")
    keys = [intent_of(executions, lease, settled) for lease in (one, other)]
    reach = [frozenset([key]) if reached else frozenset() for key in keys]
    ended: list[ExecutionRecord | None] = []
    sent = statements_of(
        executions.store.engine,
        lambda: ended.append(executions.finish_and_release(one, TTL_MS, RESULT, reach[0])),
    )
    assert len(sent) > 1, sent  # the plain statement wrote nothing; decided on reads
    assert ended[0] is not None and ended[0].state is ExecutionState.WAITING_OPERATOR
    assert comparable(ended[0]) == comparable(by_transaction(executions, other, reach[1]))
    assert released(executions, one)


def test_a_pending_intent_that_appeared_after_the_reads_writes_nothing(
    executions: SQLAlchemyExecutionStore,
) -> None:
    lease = started(executions, "late-pending")
    intent_of(executions, lease, settled=False)
    engine = executions.store.engine
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        done = conclude_txn(
            conn,
            lease,
            TTL_MS,
            Verdict(ExecutionState.COMPLETED, None),
            {"result": RESULT},
            pending=False,  # what a read before the intent was claimed saw
        )
    assert not done.fenced and done.record is None
    record = executions.read_execution("late-pending")
    assert record is not None and record.state is ExecutionState.RUNNING
    assert not released(executions, lease)


def _refused_both_ways(
    executions: SQLAlchemyExecutionStore, stale: LeaseRef, other: LeaseRef
) -> None:
    with pytest.raises(ExecutionFencedError):
        executions.finish_and_release(stale, TTL_MS, RESULT, frozenset())
    with pytest.raises(ExecutionFencedError):
        by_transaction(executions, other, frozenset())
    for lease in (stale, other):
        record = executions.read_execution(lease.scope)
        assert record is not None and record.state is ExecutionState.RUNNING


def test_an_expired_lease_is_refused_as_the_transaction_refuses_it(
    executions: SQLAlchemyExecutionStore,
) -> None:
    one, other = started(executions, "expired-1"), started(executions, "expired-2")
    executions.offset["ms"] += TTL_MS + 1_000  # type: ignore[attr-defined]
    _refused_both_ways(executions, one, other)
    assert not released(executions, one)


def test_a_stale_token_is_refused_as_the_transaction_refuses_it(
    executions: SQLAlchemyExecutionStore,
) -> None:
    one, other = started(executions, "stale-1"), started(executions, "stale-2")
    executions.offset["ms"] += TTL_MS + 1_000  # type: ignore[attr-defined]
    for lease in (one, other):
        assert executions.store.acquire_lease(lease.scope, "successor", TTL_MS) is not None
    _refused_both_ways(executions, one, other)


def _end_during_a_take_over(executions: SQLAlchemyExecutionStore) -> ExecutionRecord:
    """The zombie's end sent while a take-over holds the lease row; the take-over commits
    once the statement waits for it. The execution's row after both."""
    lease = started(executions, "zombie")
    outcome = during_a_change(
        executions.store.engine,
        "UPDATE agboss_leases SET holder = 'successor', token = token + 1 WHERE scope = :scope",
        {"scope": lease.scope},
        lambda: executions.finish_and_release(lease, TTL_MS, RESULT, frozenset()),
    )
    assert isinstance(outcome, ExecutionFencedError), outcome
    record = executions.read_execution("zombie")
    assert record is not None
    return record


def test_a_take_over_committed_during_the_lock_wait_fences_the_end(
    executions: SQLAlchemyExecutionStore,
) -> None:
    assert _end_during_a_take_over(executions).state is ExecutionState.RUNNING


def test_without_the_fence_in_the_statement_the_zombie_ends_the_execution(
    executions: SQLAlchemyExecutionStore,
) -> None:
    """Sabotage twin: the verdict no longer joins the fence's row."""
    with sabotage(ONE_STATEMENT_WITHOUT_FENCE):
        record = _end_during_a_take_over(executions)
    assert record.state is ExecutionState.COMPLETED
