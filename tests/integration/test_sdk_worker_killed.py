"""PS5 through each gateway's official SDK: pool children SIGKILLed after the charge.

One prefork worker runs a charge through every adapter at once (``it.sdk_charge.<gw>``,
each against its own ``FakeGatewayServer`` speaking that gateway's dialect, set to the
capabilities its docs state). Once every gateway has processed its charge and holds
the answer, every pool child is killed; the redeliveries wait out the dead leases,
the sweep re-drives them, and each new delivery reconciles the way its adapter does
(a lookup, an order read, or a replay of the key): one payment per gateway.

Deployment speed-ups it relies on: the integration harness's (``-Q``, a 5 s lease, no
beat: tests/integration/harness.py).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from celery_agboss.core.protections import PENDING_RESENT_WITHOUT_RECONCILE, STRANDED_NOT_RECONCILED
from celery_agboss.testing import sabotage
from celery_agboss.testing.gateway import FakeGateway, GatewayRequestOutcome
from celery_agboss.testing.gateway_server import FakeGatewayServer, documented_capabilities
from tests.integration.gateway_http import wait_for
from tests.integration.harness import Shop, ShopFactory

pytestmark = [pytest.mark.worker, pytest.mark.redis, pytest.mark.slow]

GATEWAYS = ("stripe", "checkout", "adyen", "paypal")


@pytest.fixture
def sdk_servers() -> Iterator[dict[str, FakeGatewayServer]]:
    servers = {
        name: FakeGatewayServer(
            FakeGateway(capabilities=documented_capabilities(name), hold_timeout=60),
            dialect=name,
        ).start()
        for name in GATEWAYS
    }
    try:
        yield servers
    finally:
        for server in servers.values():
            server.stop()


def _kill_every_child_holding_its_answer(
    shop: Shop, sdk_servers: dict[str, FakeGatewayServer], *, sabotage: tuple[str, ...] = ()
) -> dict[str, str]:
    """Every gateway's charge processed, its answer held; then every pool child killed.
    The task id per gateway."""
    worker = shop.start_worker(concurrency=len(GATEWAYS), sabotage=sabotage)
    holds = {name: s.gateway.hold(operation="charge") for name, s in sdk_servers.items()}
    task_ids = {name: shop.publish(f"it.sdk_charge.{name}", f"o-{name}") for name in GATEWAYS}
    for hold in holds.values():
        hold.wait_reached(timeout=30)
    for child in shop.children(worker):
        shop.kill(child)
    for hold in holds.values():
        hold.release()
    return task_ids


def test_ps5_children_killed_after_each_sdk_charge_leave_one_payment_per_gateway(
    shop_factory: ShopFactory, sdk_servers: dict[str, FakeGatewayServer]
) -> None:
    shop = shop_factory(sdk_gateways={name: s.url for name, s in sdk_servers.items()})
    task_ids = _kill_every_child_holding_its_answer(shop, sdk_servers)
    with shop.sweeping():
        for task_id in task_ids.values():
            shop.wait_state(task_id, "COMPLETED", timeout=60)
    for name, server in sdk_servers.items():
        gateway = server.gateway
        processed = [
            r
            for r in gateway.requests
            if r.operation == "charge" and r.outcome is GatewayRequestOutcome.PROCESSED
        ]
        assert len(gateway.payments) == 1, f"{name}: {len(gateway.payments)} payments"
        assert len(processed) == 1, f"{name}: charged {len(processed)} times"
        result = shop.app.AsyncResult(task_ids[name])
        wait_for(lambda r=result: r.state == "SUCCESS", 30, f"{name}'s result")
        assert result.result["payment"], name


def test_ps5_sabotaged_resent_without_reconcile_after_the_keys_expired_pays_twice_everywhere(
    shop_factory: ShopFactory, sdk_servers: dict[str, FakeGatewayServer]
) -> None:
    """The twin: the gateways forgot the keys (their retention passed while the pending
    charges waited), and neither the new deliveries nor the sweep reconcile first."""
    shop = shop_factory(sdk_gateways={name: s.url for name, s in sdk_servers.items()})
    task_ids = _kill_every_child_holding_its_answer(
        shop, sdk_servers, sabotage=(PENDING_RESENT_WITHOUT_RECONCILE,)
    )
    for server in sdk_servers.values():
        server.gateway.forget_keys()
        forget_orders = getattr(server.dialect, "forget_keys", None)  # PayPal's order keys
        if forget_orders is not None:
            forget_orders()
    with sabotage(STRANDED_NOT_RECONCILED), shop.sweeping():
        for task_id in task_ids.values():
            shop.wait_state(task_id, "COMPLETED", timeout=60)
    paid = {name: len(server.gateway.payments) for name, server in sdk_servers.items()}
    assert paid == {name: 2 for name in GATEWAYS}
