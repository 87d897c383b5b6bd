"""PS12: a rolling deploy stops a worker while a charge is on the wire.

A warm shutdown (SIGTERM) waits for the running body: the charge's answer arrives, the
verdict is stored and the lease released by the delivery itself. When the platform's
grace is shorter than the body (SIGKILL after it), the lease is never released: it
expires, and the next worker (through the sweep) reconciles — one payment, one request.

Deployment speed-ups it relies on: the harness's (``-Q``, a 5 s lease, no beat:
tests/integration/harness.py).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from tests.integration.gateway_http import wait_for
from tests.integration.harness import Shop, ShopFactory
from tests.operations.workers.sweeping import sweeping
from tests.support.processes import ManagedProcess

pytestmark = [pytest.mark.worker, pytest.mark.redis, pytest.mark.slow]

PLATFORM_GRACE_SECONDS = 1.0


@contextmanager
def _warm_shutdown_mid_charge(shop: Shop) -> Iterator[tuple[ManagedProcess, str]]:
    """A one-child worker whose charge the gateway has made, its answer held, then
    SIGTERMed (its warm shutdown begun); (the worker, the task id). The answer is let
    go when the block ends."""
    worker = shop.start_worker(concurrency=1)
    gateway = shop.gateway.gateway
    hold = gateway.hold(operation="charge")
    task_id = str(shop.app.signature("it.charge_order", args=("o-1",)).apply_async().id)
    try:
        wait_for(lambda: len(gateway.payments) == 1, 20, "the charge to be made")
        worker.signal_leader(signal.SIGTERM)
        worker.wait_for_output("Warm shutdown", 10)
        yield worker, task_id
    finally:
        hold.release()


def test_a_warm_shutdown_mid_payment_drains_the_body_and_releases_the_lease(
    shop_factory: ShopFactory,
) -> None:
    shop = shop_factory()
    gateway = shop.gateway.gateway
    with _warm_shutdown_mid_charge(shop) as (worker, task_id):
        time.sleep(0.5)
        assert worker.running, "a warm shutdown waits for the running body"
    assert worker.wait(30) == 0, worker.describe()
    record = shop.execution(task_id)
    assert record is not None and record.state.value == "COMPLETED"
    lease = shop.agboss.store.read_lease(task_id)
    assert lease is not None and lease.released
    assert len(gateway.payments) == 1 and len(gateway.requests) == 1


def test_a_grace_shorter_than_the_body_leaves_the_lease_to_expire_and_the_next_worker_reconciles(
    shop_factory: ShopFactory,
) -> None:
    shop = shop_factory()
    gateway = shop.gateway.gateway
    with _warm_shutdown_mid_charge(shop) as (worker, task_id):
        time.sleep(PLATFORM_GRACE_SECONDS)
        worker.kill()  # the platform's grace is over
    lease = shop.agboss.store.read_lease(task_id)
    assert lease is not None and not lease.released, "never released under an unsettled send"
    shop.start_worker(concurrency=1)
    with sweeping(shop, interval=1.0):
        shop.wait_state(task_id, "COMPLETED", timeout=30)
    assert len(gateway.payments) == 1
    assert len(gateway.requests) == 1, "reconciled by a lookup, not sent again"
    assert gateway.lookups
