"""R21: keys are built from escaped components, so two calls never share one key (design: P3).

Unescaped, a tenant holding ':' makes a step-keyed call of one tenant and a
business-keyed call of another the same idempotency key: the second call is
"replayed" from the first's receipt and its own payment is never made.
"""

from __future__ import annotations

from dataclasses import replace

from celery_agboss.core.execution_context import ExecutionContext
from celery_agboss.core.keys import business_key, step_key
from celery_agboss.core.protections import KEY_COMPONENTS_NOT_ESCAPED
from celery_agboss.testing import sabotage
from tests.engine.helpers import Shop


def _charge_for_two_tenants(shop: Shop) -> list[str]:
    charge = shop.charge_call("fake.charge")
    step_tenant = replace(shop.settings, tenant="shop:b")
    business_tenant = replace(shop.settings, tenant="shop")
    keys = [
        step_key("shop:b", "t1", "fake.charge", 1),
        business_key("shop", "t:t1", "fake.charge"),
    ]
    with ExecutionContext.start(shop.store, "t1", step_tenant) as first:
        first.outbound(charge, {"amount": 1000})
    with ExecutionContext.start(shop.store, "t2", business_tenant) as second:
        second.outbound(charge, {"amount": 1000}, business_key="t:t1")
    return keys


def test_r21_two_tenants_calls_get_two_keys_and_two_payments(shop: Shop) -> None:
    keys = _charge_for_two_tenants(shop)
    assert keys[0] != keys[1]
    assert len(shop.gateway.payments) == 2


def test_r21_twin_unescaped_components_make_two_calls_one_payment(shop: Shop) -> None:
    with sabotage(KEY_COMPONENTS_NOT_ESCAPED):
        keys = _charge_for_two_tenants(shop)
    assert keys[0] == keys[1]
    assert len(shop.gateway.payments) == 1  # the second order was never charged
