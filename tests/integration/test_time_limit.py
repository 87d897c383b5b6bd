"""In a real prefork worker (design: what Celery records): a hard time limit is not a failed
payment.

Celery kills the pool child that overran ``time_limit`` and, from the worker's main
process, writes FAILURE and fires the errbacks. The child may have charged a moment
before: here it did. A PaymentTask's message is given back instead; the next delivery
(the sweep's, once the dead child's lease expired) replays the recorded charge and completes. The
result backend never holds FAILURE, the errback that would refund the order never
runs, and there is one payment.

Deployment speed-ups it relies on: the harness's (``-Q``, a 5 s lease, no beat:
tests/integration/harness.py) and a 2 s ``time_limit`` on the publish.
"""

from __future__ import annotations

import pytest

from celery_agboss.core.log_events import EXECUTION_TIME_LIMIT
from celery_agboss.core.protections import (
    FAILURE_FOR_AN_UNFINISHED_EXECUTION,
    TIME_LIMIT_FAILS_THE_TASK,
)
from tests.integration.gateway_http import wait_for
from tests.integration.harness import Shop, ShopFactory

pytestmark = [pytest.mark.worker, pytest.mark.redis, pytest.mark.slow]

TIME_LIMIT_SECONDS = 2


def _charge_then_overrun(shop: Shop, order: str) -> tuple[str, list[str]]:
    """Publishes the task with an errback; returns its id and every result-backend state
    seen until the execution ended."""
    refund = shop.app.signature("it.refund_on_error")
    task_id = str(
        shop.app.signature("it.charge_then_overrun", args=(order, 60))
        .apply_async(time_limit=TIME_LIMIT_SECONDS, link_error=refund)
        .id
    )
    seen: list[str] = []

    def ended() -> bool:
        state = shop.backend_state(task_id)
        seen.append(state)
        return state in ("SUCCESS", "FAILURE")

    with shop.sweeping():  # the beat's sweep re-drives it once the dead child's lease expired
        wait_for(ended, 60, "the execution to end")
    return task_id, seen


def test_a_hard_time_limit_after_the_charge_continues_the_execution_never_failure(
    shop_factory: ShopFactory,
) -> None:
    shop = shop_factory()
    shop.start_worker()
    task_id, seen = _charge_then_overrun(shop, "o-tl1")
    assert "FAILURE" not in seen, seen
    assert shop.wait_state(task_id, "COMPLETED", timeout=30).deliveries == 2
    shop.wait_backend(task_id, "SUCCESS")
    shop.wait_logged(f"{EXECUTION_TIME_LIMIT} execution_id={task_id}")
    assert len(shop.gateway.notes_of("overrunning", task_id)) == 1
    assert shop.gateway.notes_of("refund") == [], "no errback for a paid order"
    assert len(shop.gateway.gateway.payments) == 1
    result = shop.app.AsyncResult(task_id).result
    assert result["payment"] == shop.gateway.gateway.payments[0]["id"]


def test_as_celery_handles_it_the_order_is_refunded_although_it_was_paid(
    shop_factory: ShopFactory,
) -> None:
    shop = shop_factory()
    shop.start_worker(sabotage=(TIME_LIMIT_FAILS_THE_TASK, FAILURE_FOR_AN_UNFINISHED_EXECUTION))
    _, seen = _charge_then_overrun(shop, "o-tl2")
    assert "FAILURE" in seen
    wait_for(lambda: shop.gateway.notes_of("refund"), 20, "the errback")
    assert len(shop.gateway.gateway.payments) == 1, "paid, and refunded as failed"
