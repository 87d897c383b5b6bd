"""Trap 4 on RabbitMQ: the killed child's message comes back (``reject_on_worker_lost``),
and the execution is reconciled into one payment, as on Redis.

Deployment speed-ups it relies on: the harness's (``-Q``, a 5 s lease, no beat:
tests/integration/harness.py).
"""

from __future__ import annotations

import pytest

from tests.integration.harness import ShopFactory

pytestmark = [pytest.mark.worker, pytest.mark.rabbitmq, pytest.mark.slow]


def test_on_rabbitmq_a_killed_child_is_reconciled_into_one_payment(
    shop_factory: ShopFactory, rabbitmq_url: str
) -> None:
    shop = shop_factory(broker_url=rabbitmq_url)
    shop.start_worker()
    with shop.sweeping():
        task_id = shop.kill_the_child_holding_the_answer("it.charge_order", "o-7")
        record = shop.wait_state(task_id, "COMPLETED", timeout=45)
    shop.wait_backend(task_id, "SUCCESS")
    gateway = shop.gateway.gateway
    assert len(gateway.payments) == 1
    assert len(gateway.requests) == 1, "reconciled by a lookup, never sent again"
    assert record.recovery_count >= 1


def test_on_rabbitmq_without_agboss_a_redelivered_charge_pays_twice(
    shop_factory: ShopFactory, rabbitmq_url: str
) -> None:
    shop = shop_factory(broker_url=rabbitmq_url)
    shop.start_worker()
    task_id = shop.kill_the_child_holding_the_answer("it.plain_charge", "o-7")
    shop.wait_backend(task_id, "SUCCESS")
    assert len(shop.gateway.gateway.payments) == 2
