"""A delivery's plain start as one PostgreSQL statement
(design: one round trip per state change).

The first delivery of an execution its publisher recorded starts in one statement: the
same record and grant as the transaction's start, one round trip. Any row that is not
plain (cancel asked, not ``REQUESTED``, a lease row already there, a retry recorded,
another task, no row) is left untouched by the statement and decided by the
transaction. Two plain starts at once start one delivery. A cancel committed while the
statement waits for the execution's row is seen, and nothing runs; its twin checks the
row on the statement's snapshot, and the cancelled execution runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import pytest
from sqlalchemy import text

from celery_agboss.core.executions import DeliveryStart, ExecutionMessage, ExecutionState, StartKind
from celery_agboss.core.protections import ONE_STATEMENT_START_UNLOCKED
from celery_agboss.store.execution_start import start_plain_in_one
from celery_agboss.store.execution_store import SQLAlchemyExecutionStore
from celery_agboss.testing.switches import sabotage
from tests.support.lock_waits import at_once, during_a_change, statements_of

pytestmark = pytest.mark.postgres

TTL_MS = 30_000
CAP = 3
TASK = "shop.charge"
# What a worker's message looks like: no "retries" in a first attempt's options.
OPTIONS = '{"queue": "celery", "root_id": "%s"}'


def message(execution_id: str, *, options: str | None = None) -> ExecutionMessage:
    chosen = OPTIONS % execution_id if options is None else options
    return ExecutionMessage(execution_id, TASK, "[42]", "{}", chosen, None, None)


def recorded(executions: SQLAlchemyExecutionStore, execution_id: str) -> ExecutionMessage:
    """Recorded at publish as the publisher sees it, delivered as the worker sees it."""
    published = message(execution_id, options='{"queue": "celery", "headers": {"a": 1}}')
    assert executions.record_requested(published)
    return message(execution_id)


def start(executions: SQLAlchemyExecutionStore, delivered: ExecutionMessage) -> DeliveryStart:
    return executions.start_delivery(delivered, "holder-a", TTL_MS, CAP)


def plain(executions: SQLAlchemyExecutionStore, delivered: ExecutionMessage) -> Any:
    store = executions.store
    return start_plain_in_one(store.engine, delivered, "holder-b", TTL_MS, store.offset_ms())


def row_of(executions: SQLAlchemyExecutionStore, execution_id: str) -> dict[str, Any]:
    with executions.store.engine.connect() as conn:
        found = conn.execute(
            text(
                "SELECT e.*, l.holder, l.token, l.released FROM agboss_executions e "
                "LEFT JOIN agboss_leases l ON l.scope = e.id WHERE e.id = :id"
            ),
            {"id": execution_id},
        ).first()
    return {} if found is None else dict(found._mapping)


LEFT_OUT = {"id", "requested_at_ms", "started_at_ms", "updated_at_ms", "read_at_ms", "options"}


def test_a_plain_start_is_one_statement_and_writes_what_the_transaction_writes(
    executions: SQLAlchemyExecutionStore,
) -> None:
    one, other = recorded(executions, "plain-1"), recorded(executions, "plain-2")
    found: list[DeliveryStart] = []
    sent = statements_of(executions.store.engine, lambda: found.append(start(executions, one)))
    by_statement = found[0]
    by_transaction = executions.start_in_transaction(other, "holder-a", TTL_MS, CAP)
    assert len(sent) == 1, sent
    assert by_statement.kind is by_transaction.kind is StartKind.STARTED
    assert by_statement.execution.state is ExecutionState.RUNNING
    assert by_statement.execution.options == one.options  # the delivered message is kept

    def comparable(started: DeliveryStart) -> dict[str, Any]:
        values = asdict(started.execution)
        return {name: value for name, value in values.items() if name not in LEFT_OUT}

    assert comparable(by_statement) == comparable(by_transaction)
    assert by_statement.execution.started_at_ms == by_statement.execution.read_at_ms
    assert by_statement.grant is not None and by_transaction.grant is not None
    assert by_statement.grant.lease.token == by_transaction.grant.lease.token == 1
    assert by_statement.grant.expires_at_ms == by_statement.grant.db_now_ms + TTL_MS
    assert not by_statement.took_over and not by_statement.recorded_at_start


def _cancel_asked(executions: SQLAlchemyExecutionStore, execution_id: str) -> None:
    with executions.store.engine.begin() as conn:
        conn.execute(
            text("UPDATE agboss_executions SET cancel_requested = true WHERE id = :id"),
            {"id": execution_id},
        )


def _state(state: ExecutionState) -> Callable[[SQLAlchemyExecutionStore, str], None]:
    def set_state(executions: SQLAlchemyExecutionStore, execution_id: str) -> None:
        with executions.store.engine.begin() as conn:
            conn.execute(
                text("UPDATE agboss_executions SET state = :state WHERE id = :id"),
                {"id": execution_id, "state": state.value},
            )

    return set_state


def _released_lease(executions: SQLAlchemyExecutionStore, execution_id: str) -> None:
    grant = executions.store.acquire_lease(execution_id, "earlier", TTL_MS)
    assert grant is not None
    assert executions.store.release_lease(grant.lease)


def _retry_recorded(executions: SQLAlchemyExecutionStore, execution_id: str) -> None:
    assert not executions.record_requested(message(execution_id, options='{"retries": 1}'))


NOT_PLAIN: dict[str, Callable[[SQLAlchemyExecutionStore, str], None]] = {
    "cancel asked": _cancel_asked,
    "waiting": _state(ExecutionState.WAITING),
    "running (a take-over)": _state(ExecutionState.RUNNING),
    "compensating": _state(ExecutionState.COMPENSATING),
    "completed": _state(ExecutionState.COMPLETED),
    "a lease row already there": _released_lease,
    "a retry recorded": _retry_recorded,
}


@pytest.mark.parametrize("case", sorted(NOT_PLAIN))
def test_a_row_that_is_not_plain_is_left_untouched_for_the_transaction(
    executions: SQLAlchemyExecutionStore, case: str
) -> None:
    delivered = recorded(executions, "not-plain")
    NOT_PLAIN[case](executions, "not-plain")
    before = row_of(executions, "not-plain")
    assert plain(executions, delivered) is None
    assert row_of(executions, "not-plain") == before


def test_another_task_or_no_row_is_left_to_the_transaction(
    executions: SQLAlchemyExecutionStore,
) -> None:
    delivered = recorded(executions, "other-task")
    before = row_of(executions, "other-task")
    assert (
        plain(executions, ExecutionMessage("other-task", "shop.refund", "[]", "{}", "{}")) is None
    )
    assert row_of(executions, "other-task") == before
    assert plain(executions, message("never-recorded")) is None
    assert row_of(executions, "never-recorded") == {}
    # The transaction then decides as before: the unrecorded one starts, recorded now.
    started = start(executions, message("never-recorded"))
    assert started.kind is StartKind.STARTED and started.recorded_at_start
    assert start(executions, delivered).kind is StartKind.STARTED


def test_two_plain_starts_at_once_start_one_delivery(
    executions: SQLAlchemyExecutionStore,
) -> None:
    for round_number in range(8):
        execution_id = f"both-{round_number}"
        started = at_once(start, executions, recorded(executions, execution_id))
        kinds = [getattr(outcome, "kind", outcome) for outcome in started]
        assert sorted(map(str, kinds)) == sorted(
            map(str, [StartKind.STARTED, StartKind.DEFERRED])
        ), kinds
        assert row_of(executions, execution_id)["deliveries"] == 1


def _start_during_a_cancel(executions: SQLAlchemyExecutionStore) -> StartKind:
    """The start sent while a cancel request holds the execution's row; the cancel commits
    once the start waits for it. The kind of start the delivery got."""
    delivered = recorded(executions, "cancelled-meanwhile")
    found = during_a_change(
        executions.store.engine,
        "UPDATE agboss_executions SET cancel_requested = true, "
        "cancel_reason = 'customer asked' WHERE id = :id",
        {"id": delivered.execution_id},
        lambda: start(executions, delivered).kind,
    )
    assert isinstance(found, StartKind), found
    return found


def test_a_cancel_committed_during_the_starts_lock_wait_is_seen(
    executions: SQLAlchemyExecutionStore,
) -> None:
    assert _start_during_a_cancel(executions) is StartKind.TERMINAL
    record = executions.read_execution("cancelled-meanwhile")
    assert record is not None and record.state is ExecutionState.CANCELLED
    assert record.deliveries == 0


def test_checked_on_the_snapshot_the_cancelled_execution_runs(
    executions: SQLAlchemyExecutionStore,
) -> None:
    """Sabotage twin: the plain check reads the statement's snapshot, not the locked row."""
    with sabotage(ONE_STATEMENT_START_UNLOCKED):
        assert _start_during_a_cancel(executions) is StartKind.STARTED
    record = executions.read_execution("cancelled-meanwhile")
    assert record is not None and record.state is ExecutionState.RUNNING
    assert record.cancel_requested
