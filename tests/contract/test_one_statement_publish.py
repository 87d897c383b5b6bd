"""A new execution's publish record as one PostgreSQL statement
(design: one round trip per state change).

The transaction it replaces made no check before its insert: it inserted the row
``REQUESTED`` unless it was there, and decided only when it was. So the statement is
that insert in autocommit, and every other case is still the transaction's: a retry's
message replaces the recorded one, another task under the same id is refused, and two
publishes of one id at once record one row. No protection moved into the statement,
so it has no sabotage twin of its own; the publish's own (a publish that records
nothing) is in the integration suite.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import pytest

from celery_agboss.core.executions import ExecutionMessage
from celery_agboss.errors import ExecutionIdConflictError
from celery_agboss.store.execution_rows import insert_requested_txn
from celery_agboss.store.execution_start import record_requested_in_one
from celery_agboss.store.execution_store import SQLAlchemyExecutionStore
from tests.support.lock_waits import at_once, sent_statements

pytestmark = pytest.mark.postgres

TASK = "shop.charge"


def message(execution_id: str, *, options: str = "{}", task: str = TASK) -> ExecutionMessage:
    return ExecutionMessage(execution_id, task, "[42]", '{"order": 7}', options, None, None)


def test_a_new_execution_is_recorded_in_one_statement_as_the_transaction_records_it(
    executions: SQLAlchemyExecutionStore,
) -> None:
    recorded: list[bool] = []
    sent = sent_statements(
        executions.store.engine,
        lambda: recorded.append(executions.record_requested(message("pub-1"))),
    )
    assert recorded == [True]
    assert [(text.split()[0], autocommit) for text, autocommit in sent] == [("INSERT", True)]
    with executions.store.transaction() as tx:
        assert insert_requested_txn(tx, message("pub-2"))
    one, other = executions.read_execution("pub-1"), executions.read_execution("pub-2")
    assert one is not None and other is not None
    left_out = {"id", "requested_at_ms", "updated_at_ms", "read_at_ms"}

    def comparable(values: dict[str, Any]) -> dict[str, Any]:
        return {name: value for name, value in values.items() if name not in left_out}

    assert comparable(asdict(one)) == comparable(asdict(other))
    assert one.requested_at_ms == one.updated_at_ms


def test_a_row_that_is_there_is_left_to_the_transaction(
    executions: SQLAlchemyExecutionStore,
) -> None:
    assert executions.record_requested(message("again"))
    store = executions.store
    retry = message("again", options='{"retries": 1}')
    assert not record_requested_in_one(store.engine, retry, store.offset_ms())
    found = executions.read_execution("again")
    assert found is not None and found.options == "{}"  # the statement wrote nothing
    # The transaction decides as it always did: the retry's message is the newer one.
    assert not executions.record_requested(retry)
    found = executions.read_execution("again")
    assert found is not None and found.options == retry.options
    with pytest.raises(ExecutionIdConflictError):
        executions.record_requested(message("again", task="shop.refund"))


def test_two_publishes_of_one_id_at_once_record_one_row(
    executions: SQLAlchemyExecutionStore,
) -> None:
    for round_number in range(8):
        execution_id = f"twice-{round_number}"
        answers = at_once(executions.record_requested, message(execution_id))
        assert sorted(map(str, answers)) == ["False", "True"], answers
        found = executions.read_execution(execution_id)
        assert found is not None and found.deliveries == 0
