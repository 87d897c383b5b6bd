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
    _, record = shop.a_killed_child_reconciled("o-7")
    assert record.recovery_count >= 1


def test_on_rabbitmq_without_agboss_a_redelivered_charge_pays_twice(
    shop_factory: ShopFactory, rabbitmq_url: str
) -> None:
    shop_factory(broker_url=rabbitmq_url).a_killed_child_without_agboss_pays_twice("o-7")
