"""Issue 22 as two shops meet it: one gateway account, two deployments, their own stores.

Shop A (a SQLite store) and shop B (a PostgreSQL store), each with its own Celery app,
broker database, queue and ``celery worker`` process, charge orders 41, 42 and 43
through the Stripe adapter and its official SDK against ONE ``FakeGatewayServer``
Stripe account, then mark each order paid in their own table with the payment they
were told of (``it.sdk_pay_order.stripe``). Shop A's orders are paid first.

- Each store's deployment id makes the keys differ: every customer is charged once,
  their own shop's amount, and every order is marked paid with its own payment, for
  other amounts and for equal ones.
- Twins: both shops set one ``agboss_tenant`` (sharing keys on purpose). With equal
  amounts Stripe replays shop A's answer to shop B's charge and shop B marks its
  orders paid with shop A's payments: its customers are never charged (the lost
  payment of the issue). With other amounts Stripe refuses the reused key and shop B's
  reconcile finds shop A's payment under it: the adapter's comparison turns that into
  a wait for an operator naming the amount; with the comparison switched off
  (``adapter-adopts-any-payment``, shop B's worker only) shop B is paid with shop A's
  payments again.

Counted at the gateway (its payments, by key and amount) and in each shop's table.
Deployment speed-ups it relies on: the integration harness's (``-Q``, a 5 s lease, a
1 s retry delay, no beat: tests/integration/harness.py); ``agboss_tenant`` is set only
by the twins, as docs/keys.md says to share keys on purpose.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import text

from celery_agboss.core.keys import business_key
from celery_agboss.core.protections import ADOPTS_ANY_PAYMENT
from celery_agboss.testing.gateway import FakeGateway
from celery_agboss.testing.gateway_server import FakeGatewayServer, documented_capabilities
from tests.integration.apps.shop import PAID_ORDERS_DDL
from tests.integration.harness import Shop, ShopFactory

pytestmark = [pytest.mark.worker, pytest.mark.redis, pytest.mark.postgres, pytest.mark.slow]

ORDERS = ("41", "42", "43")
SHARED_TENANT = "marketplace"
TASK = "it.sdk_pay_order.stripe"
SETTLED_SECONDS = 60.0


@pytest.fixture
def stripe_account() -> Iterator[FakeGatewayServer]:
    """The one Stripe account both shops use (search consistent, as the dialect's default)."""
    gateway = FakeGateway(capabilities=documented_capabilities("stripe"), hold_timeout=60)
    with FakeGatewayServer(gateway, dialect="stripe") as server:
        yield server


def _shop(
    shop_factory: ShopFactory, database_url: str, stripe: FakeGatewayServer, **config: Any
) -> Shop:
    shop = shop_factory(database_url=database_url, sdk_gateways={"stripe": stripe.url}, **config)
    with shop.agboss.store.engine.begin() as conn:
        conn.execute(text(PAID_ORDERS_DDL))
    return shop


TwoShops = Callable[..., tuple[Shop, Shop]]


@pytest.fixture
def two_shops(
    shop_factory: ShopFactory,
    sqlite_database_url: str,
    postgres_database_url: str,
    stripe_account: FakeGatewayServer,
) -> TwoShops:
    """``two_shops(**config) -> (a, b)``: shop A on SQLite, shop B on PostgreSQL, one
    Stripe account; ``config`` (e.g. ``tenant=``) set on both."""

    def build(**config: Any) -> tuple[Shop, Shop]:
        return (
            _shop(shop_factory, sqlite_database_url, stripe_account, **config),
            _shop(shop_factory, postgres_database_url, stripe_account, **config),
        )

    return build


def _run(shop: Shop, amount: int, state: str, *, sabotage: tuple[str, ...] = ()) -> None:
    """Start the shop's worker, pay every order of ``amount``, wait until each is ``state``."""
    shop.start_worker(sabotage=sabotage)
    ids = [shop.publish(TASK, o, amount) for o in ORDERS]
    for task_id in ids:
        shop.wait_state(task_id, state, timeout=SETTLED_SECONDS)


def _shared_tenant_a_then_b(
    two_shops: TwoShops, b_amount: int, b_state: str, *, sabotage: tuple[str, ...] = ()
) -> tuple[Shop, Shop]:
    """Both shops on ``SHARED_TENANT``: shop A pays every order 1000 first, then shop B
    pays them ``b_amount`` until each is ``b_state``."""
    a, b = two_shops(tenant=SHARED_TENANT)
    _run(a, 1000, "COMPLETED")
    _run(b, b_amount, b_state, sabotage=sabotage)
    return a, b


def _paid(shop: Shop) -> dict[str, dict[str, Any]]:
    """The shop's table: order -> the amount it asked and the receipt it was told of."""
    with shop.agboss.store.engine.connect() as conn:
        rows = conn.execute(text("SELECT order_id, amount, receipt FROM it_paid_orders")).all()
    return {str(o): {"amount": int(a), "receipt": json.loads(r)} for o, a, r in rows}


def _payments_of(stripe: FakeGatewayServer, shop: Shop, order: str) -> list[dict[str, Any]]:
    """The payments the gateway made under the shop's key for ``order``."""
    key = business_key(shop.agboss.tenant, f"order:{order}", "stripe.charge")
    return list(stripe.gateway.payments_for(key))


def _each_paid_its_own(stripe: FakeGatewayServer, shops: list[tuple[Shop, int]]) -> None:
    """One payment per shop and order, of the shop's amount; each order marked paid with
    its own payment; nothing else at the gateway."""
    assert len(stripe.gateway.payments) == len(shops) * len(ORDERS), stripe.gateway.payments
    for shop, amount in shops:
        paid = _paid(shop)
        assert sorted(paid) == list(ORDERS), paid
        for order in ORDERS:
            (payment,) = _payments_of(stripe, shop, order)
            assert payment["amount"] == amount, payment
            assert paid[order]["receipt"]["latest_charge"] == payment["id"], (order, paid)
            assert paid[order]["receipt"]["amount"] == amount


def _b_paid_with_a_s_payments(stripe: FakeGatewayServer, a: Shop, b: Shop) -> None:
    """The lost payment: shop B's orders marked paid, each with shop A's payment of it;
    only shop A's customers were charged."""
    assert len(stripe.gateway.payments) == len(ORDERS), stripe.gateway.payments
    a_paid, b_paid = _paid(a), _paid(b)
    assert sorted(b_paid) == list(ORDERS), b_paid
    for order in ORDERS:
        assert b_paid[order]["receipt"] == a_paid[order]["receipt"], order


# --- keys of their own -------------------------------------------------------------------


@pytest.mark.parametrize("b_amount", [2500, 1000], ids=["other-amounts", "equal-amounts"])
def test_two_shops_on_one_account_each_charge_their_own_customers_their_own_amounts(
    two_shops: TwoShops, stripe_account: FakeGatewayServer, b_amount: int
) -> None:
    """Shop A charges 1000; shop B another amount, or the same (then nothing but the keys
    tells their payments apart)."""
    a, b = two_shops()
    assert a.agboss.tenant != b.agboss.tenant, "each store has a deployment id of its own"
    _run(a, 1000, "COMPLETED")
    _run(b, b_amount, "COMPLETED")
    _each_paid_its_own(stripe_account, [(a, 1000), (b, b_amount)])


# --- a shared tenant, other amounts ------------------------------------------------------


def test_shops_sharing_a_tenant_wait_for_an_operator_rather_than_take_the_other_s_payment(
    two_shops: TwoShops, stripe_account: FakeGatewayServer
) -> None:
    _, b = _shared_tenant_a_then_b(two_shops, 2500, "WAITING_OPERATOR")
    assert _paid(b) == {}, "shop B marked an order paid"
    assert len(stripe_account.gateway.payments) == len(ORDERS)
    for order in ORDERS:
        key = business_key(SHARED_TENANT, f"order:{order}", "stripe.charge")
        intent = b.agboss.store.read_intent(key)
        assert intent is not None and intent.needs_operator, intent
        assert "amount 1000, not 2500" in (intent.operator_reason or ""), intent


def test_twin_shops_sharing_a_tenant_without_the_comparison_mark_b_paid_with_a_s_payments(
    two_shops: TwoShops, stripe_account: FakeGatewayServer
) -> None:
    a, b = _shared_tenant_a_then_b(two_shops, 2500, "COMPLETED", sabotage=(ADOPTS_ANY_PAYMENT,))
    _b_paid_with_a_s_payments(stripe_account, a, b)


# --- a shared tenant, equal amounts ------------------------------------------------------


def test_twin_shops_sharing_a_tenant_with_equal_amounts_lose_shop_b_s_payments(
    two_shops: TwoShops, stripe_account: FakeGatewayServer
) -> None:
    """Nothing differs for a comparison to see: only keys of their own tell them apart."""
    a, b = _shared_tenant_a_then_b(two_shops, 1000, "COMPLETED")
    _b_paid_with_a_s_payments(stripe_account, a, b)
