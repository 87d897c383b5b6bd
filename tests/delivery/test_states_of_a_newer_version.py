"""A delivery, by a worker of this version, of an execution whose state a newer version
of the package wrote (a rolling upgrade: the newer workers run beside the old ones).

The start's read of the row raised ValueError: Celery acknowledged the message as a
failed task, so the message was gone, the row left in a state only the newer version
reads. Now the delivery runs no body, writes nothing and charges nothing: it logs
``execution.store-failed`` naming the state and what to do, and hands the message back
to the broker (as a store that cannot be used hands it back), for a worker that knows
the state; nothing is lost.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from sqlalchemy import select

from celery_agboss.store.schema import outbound_calls
from celery_agboss.store.schema_executions import executions
from tests.delivery.conftest import PaymentShop
from tests.support.newer_states import FUTURE_STATE, write_raw_state
from tests.support.processes import wait_until


def _rows(shop: PaymentShop) -> dict[str, list[tuple[Any, ...]]]:
    with shop.agboss.store.engine.connect() as conn:
        return {
            table.name: sorted(tuple(row) for row in conn.execute(select(table)).all())
            for table in (executions, outbound_calls)
        }


def test_a_delivery_of_a_newer_versions_state_runs_nothing_and_hands_the_message_back(
    shop: PaymentShop, caplog: pytest.LogCaptureFixture
) -> None:
    pay, ran = shop.pay_noting_each_run()

    task_id = str(pay.delay("o-1").id)  # recorded; no worker runs yet
    write_raw_state(shop.agboss.store.engine, task_id, FUTURE_STATE)
    before = _rows(shop)

    def handed_back(times: int) -> bool:
        lines = [
            r.getMessage()
            for r in caplog.records
            if "execution.store-failed" in r.getMessage() and task_id in r.getMessage()
        ]
        return len(lines) >= times

    with caplog.at_level(logging.ERROR, logger="celery_agboss"), shop.worker():
        # Delivered again after each hand-back: the broker still has the message.
        wait_until(lambda: handed_back(2), 20, message="the message handed back twice")
        assert ran == [] and shop.gateway.requests == []
        assert _rows(shop) == before
        # The newer version's worker would take it from here; as a stand-in, a state
        # this version knows: the same message, handed back again, now runs once.
        write_raw_state(shop.agboss.store.engine, task_id, "REQUESTED")
        shop.wait_state(task_id, "COMPLETED")
    line = next(r.getMessage() for r in caplog.records if "store-failed" in r.getMessage())
    assert f"state={FUTURE_STATE}" in line and "newer version" in line
    assert ran == ["o-1"] and len(shop.gateway.requests) == 1
