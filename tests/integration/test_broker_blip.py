"""Trap 2: a broker connection blip hands a running task to the same worker again.

When a worker loses its Redis connection, kombu puts back every message it held
unacknowledged — the running ones too — and the reconnected worker fetches them
again: a second copy of a task that is still charging, on the same worker, in
the next free pool child. The holder is a uuid4 minted per delivery and acquire
is never re-entrant, so that copy meets a live lease and is deferred
(``execution.deferred`` / ``task-deferred``), never run beside the holder: one
request at the gateway. The twin is plain Celery: the copy runs, and pays again.

Deployment speed-ups it relies on: the harness's (``-Q``, a 5 s lease, no beat:
tests/integration/harness.py).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.broker_proxy import BrokerProxy
from tests.integration.gateway_http import wait_for
from tests.integration.harness import Shop, ShopFactory

pytestmark = [pytest.mark.worker, pytest.mark.redis, pytest.mark.slow]


@pytest.fixture
def proxied_shop(shop_factory: ShopFactory) -> Iterator[tuple[Shop, BrokerProxy]]:
    """A shop whose worker reaches Redis through a proxy the test can cut."""
    shop = shop_factory()
    with BrokerProxy.for_url(shop.config["broker_url"]) as proxy:
        shop.start_worker(config={"broker_url": proxy.url_for(shop.config["broker_url"])})
        yield shop, proxy


def test_a_broker_blip_under_a_running_charge_defers_the_restored_copy(
    proxied_shop: tuple[Shop, BrokerProxy],
) -> None:
    shop, proxy = proxied_shop
    gateway = shop.gateway.gateway
    with shop.capturing_events() as events:
        task_id, record = shop.cut_under_a_running_charge(proxy, "o-21", timeout=20)
        shop.wait_backend(task_id, "SUCCESS")
        wait_for(lambda: any(e["type"] == "task-deferred" for e in events), 10, "the event")
    starts = shop.gateway.notes_of("body-start", task_id)
    assert len(starts) == 1, "the restored copy never ran the body"
    assert (len(gateway.requests), len(gateway.payments)) == (1, 1)
    assert record.deliveries == 1 and record.recovery_count == 0
    lease = shop.lease_of(task_id)
    assert lease is not None and lease.token == 1, "nobody took the lease over"


def test_without_agboss_a_broker_blip_runs_a_running_charge_twice(
    proxied_shop: tuple[Shop, BrokerProxy],
) -> None:
    shop, proxy = proxied_shop
    task_id, waiters = shop.cut_under_a_plain_charge(proxy, "o-21", timeout=20)
    assert len(shop.gateway.notes_of("body-start", task_id)) == 2
    assert waiters[0] != waiters[1], "the copy ran in the other child of the same worker"
