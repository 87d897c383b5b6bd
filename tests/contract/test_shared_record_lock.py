"""The lock the two ends of a shared step's undo take on its record (``lock_shared``):
they judge each other's marks one after the other, while a later click's read of the
record never waits for them (design: compensated step). docs/store.md says where this
lock sits in the store's one lock order.

A row lock ``FOR NO KEY UPDATE`` conflicts with another such lock (and with the plain
``UPDATE`` of ``mark_compensated``), not with the ``FOR KEY SHARE`` a replay's read
takes. ``FOR UPDATE`` would make every replay of a charge wait behind an undo's end.
"""

from __future__ import annotations

from typing import Any

import pytest

from celery_agboss.core.store_protocol import INTENT_RECORD
from celery_agboss.store import shared_records
from celery_agboss.store.execution_store import SQLAlchemyExecutionStore
from tests.contract.one_statement_world import charge_key, claimed_settle, started
from tests.support.lock_waits import in_thread, waiting_backends
from tests.support.processes import wait_until

pytestmark = pytest.mark.postgres


def _charge_recorded(executions: SQLAlchemyExecutionStore) -> str:
    """The key of a recorded charge (its intent row), as a shared step's record."""
    lease = started(executions, "shared")
    claimed_settle(executions.store, lease)
    return charge_key(lease)


def test_a_replays_read_does_not_wait_for_an_undos_end(
    executions: SQLAlchemyExecutionStore,
) -> None:
    store = executions.store
    key = _charge_recorded(executions)
    outcome: dict[str, Any] = {}
    with store.engine.connect() as end:  # an undo's end, judging the step's marks
        shared_records.lock_shared_txn(end, INTENT_RECORD, key)

        def replay() -> Any:
            with store.transaction() as tx:
                return tx.read_intent(key)  # FOR KEY SHARE, as a later click's replay

        reader = in_thread(replay, outcome, "replay")
        reader.join(5)
        assert not reader.is_alive(), "a replay's read waited for an undo's end"
        end.rollback()
    found = outcome["replay"]
    assert not isinstance(found, BaseException) and found is not None
    assert found.idempotency_key == key


def test_two_ends_of_one_step_judge_one_after_the_other(
    executions: SQLAlchemyExecutionStore,
) -> None:
    engine = executions.store.engine
    key = _charge_recorded(executions)
    outcome: dict[str, Any] = {}
    with engine.connect() as first, engine.connect() as second:
        shared_records.lock_shared_txn(first, INTENT_RECORD, key)
        waiter = in_thread(
            lambda: shared_records.lock_shared_txn(second, INTENT_RECORD, key), outcome, "second"
        )
        wait_until(lambda: waiting_backends(engine) >= 1, 10, message="the second end's wait")
        assert waiter.is_alive(), "the second end did not wait for the first"
        first.rollback()
        waiter.join(10)
        assert not waiter.is_alive() and "second" in outcome
        second.rollback()
    assert not isinstance(outcome["second"], BaseException), outcome["second"]
