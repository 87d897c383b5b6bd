"""The sweep next to real workers on Redis: what the broker alone never brings back.

P4 (nothing lost) and P3 (never sent twice), through traps 5 and 9: a whole worker
SIGKILLed while its charges were at the gateway (a 1-hour visibility timeout keeps
their messages unacked), and messages lost before any worker started them.

Deployment speed-ups it relies on: the harness's (``-Q``, a 5 s lease, no beat:
tests/integration/harness.py).
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

import pytest
import redis

from tests.integration.gateway_http import wait_for
from tests.integration.harness import ShopFactory
from tests.operations.workers.sweeping import sweeping

pytestmark = [pytest.mark.worker, pytest.mark.redis, pytest.mark.slow]

TTL = 5.0
INTERVAL = 1.0
RUN_ALLOWANCE = 4.0
"""Seconds for a re-published message to be fetched and its body (two HTTP calls and a few
transactions) to run: the part of the bound that is not the sweep's."""


def test_a_whole_worker_killed_on_redis_is_finished_by_the_sweep_within_ttl_and_two_intervals(
    shop_factory: ShopFactory, database_url: str
) -> None:
    shop = shop_factory(database_url=database_url, visibility_timeout=3600)
    first = shop.start_worker(concurrency=2)
    gateway = shop.gateway.gateway
    hold = gateway.hold(times=2, operation="charge")  # charged; answers held back
    ids = [
        str(shop.app.signature("it.charge_order", args=(f"o-{n}",)).apply_async().id)
        for n in range(2)
    ]
    wait_for(lambda: len(gateway.payments) == 2, 20, "both charges to be made")
    first.kill()  # the whole worker, main process and pool, at once
    killed_at = time.monotonic()
    hold.release()
    shop.start_worker(concurrency=2)
    with sweeping(shop, interval=INTERVAL):
        for task_id in ids:
            shop.wait_state(task_id, "COMPLETED", timeout=TTL + 2 * INTERVAL + 30)
    elapsed = time.monotonic() - killed_at
    assert elapsed <= TTL + 2 * INTERVAL + RUN_ALLOWANCE, elapsed
    assert len(gateway.payments) == 2, "one payment per order"
    assert len(gateway.requests) == 2, "reconciled, never sent again"
    for task_id in ids:
        result = shop.app.AsyncResult(task_id).get(timeout=10)
        assert result["payment"] in {p["id"] for p in gateway.payments}
    client = redis.Redis.from_url(shop.config["broker_url"])
    try:
        # The broker never gave the killed worker's messages back: they are still unacked.
        assert client.hlen("unacked") >= 2
    finally:
        client.close()


def test_messages_lost_before_any_worker_started_are_republished_from_the_store(
    shop_factory: ShopFactory, database_url: str
) -> None:
    """Trap 9: the plain one runs, the ETA one not before its ETA, the expired one never
    (EXPIRED), the revoked one never (CANCELLED)."""
    shop = shop_factory(database_url=database_url)

    def publish(order: str, **options: object) -> str:
        return str(shop.app.signature("it.charge_order", args=(order,)).apply_async(**options).id)

    plain = publish("o-plain")
    eta = datetime.now(timezone.utc) + timedelta(seconds=6)
    later = publish("o-eta", eta=eta)
    expiring = publish("o-expiring", expires=1)
    revoked = publish("o-revoked")
    shop.app.control.revoke(revoked)  # no worker hears this broadcast; the store does
    client = redis.Redis.from_url(shop.config["broker_url"])
    try:
        client.flushdb()  # Redis restarted without persistence: every message is gone
    finally:
        client.close()
    shop.start_worker()
    shop.assert_stays(lambda: shop.execution(plain).state.value == "REQUESTED", 2)  # lost
    with sweeping(shop, interval=0.5, grace=2):
        shop.wait_state(plain, "COMPLETED", timeout=30)
        shop.wait_state(later, "COMPLETED", timeout=30)
    started = shop.gateway.notes_of("body-start", later)
    assert started and min(n.at for n in started) >= eta.timestamp() - 0.5
    assert shop.execution(expiring).state.value == "EXPIRED"
    assert shop.execution(revoked).state.value == "CANCELLED"
    assert shop.gateway.notes_of("body-start", expiring) == []
    assert shop.gateway.notes_of("body-start", revoked) == []
    assert len(shop.gateway.gateway.payments) == 2


def test_without_the_sweep_a_killed_workers_orders_stay_unfinished(
    shop_factory: ShopFactory,
) -> None:
    """The twin of the first test: the broker alone brings nothing back within the hour."""
    shop = shop_factory(visibility_timeout=3600)
    first = shop.start_worker(concurrency=1)
    gateway = shop.gateway.gateway
    hold = gateway.hold(operation="charge")
    task_id = str(shop.app.signature("it.charge_order", args=("o-1",)).apply_async().id)
    wait_for(lambda: len(gateway.payments) == 1, 20, "the charge to be made")
    first.kill()
    hold.release()
    shop.start_worker(concurrency=1)
    shop.assert_stays(
        lambda: shop.execution(task_id).state.value == "RUNNING", TTL + 2 * INTERVAL + RUN_ALLOWANCE
    )
