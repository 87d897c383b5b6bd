"""P4/P5 and trap 4: a pool child SIGKILLed after the gateway charged, before the answer.

``reject_on_worker_lost`` gives the message back; its redelivery finds the dead
child's lease still live and is deferred; once that lease expired the sweep
re-drives the execution, and the new delivery reconciles the pending intent
(a lookup), never sending again: one payment. The twins are what plain Celery does.

Deployment speed-ups it relies on: the harness's (``-Q``, a 5 s lease, no beat:
tests/integration/harness.py).
"""

from __future__ import annotations

import pytest

from tests.integration.gateway_http import wait_for
from tests.integration.harness import ShopFactory

pytestmark = [pytest.mark.worker, pytest.mark.redis, pytest.mark.slow]


def test_a_child_killed_before_the_charge_answer_is_reconciled_into_one_payment(
    shop_factory: ShopFactory, database_url: str
) -> None:
    shop = shop_factory(database_url=database_url)
    task_id, record = shop.a_killed_child_reconciled("o-1")
    gateway = shop.gateway.gateway
    assert gateway.lookups, "the new delivery asked the gateway"
    assert shop.app.AsyncResult(task_id).result["payment"] == gateway.payments[0]["id"]
    assert record.recovery_count >= 1
    shop.wait_logged("execution.taken-over")


def test_without_agboss_a_redelivered_charge_pays_twice(shop_factory: ShopFactory) -> None:
    shop_factory().a_killed_child_without_agboss_pays_twice("o-1")


def test_without_reject_on_worker_lost_the_killed_charge_is_never_finished(
    shop_factory: ShopFactory,
) -> None:
    shop = shop_factory()
    shop.start_worker()
    task_id = shop.kill_the_child_holding_the_answer("it.plain_charge_acks_late", "o-1")
    shop.wait_backend(task_id, "FAILURE")
    assert "WorkerLostError" in repr(shop.app.AsyncResult(task_id).result)
    # Acknowledged as failed: not in the queue, not among the unacked (so no visibility
    # timeout brings it back): nothing will ever run it again.
    wait_for(shop.broker_holds_nothing, 10, "the message to be acknowledged")
    assert len(shop.gateway.notes_of("body-end", task_id)) == 0, "the order is never marked paid"
    assert len(shop.gateway.gateway.payments) == 1, "yet the customer paid"
