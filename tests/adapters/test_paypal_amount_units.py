"""A request's ``amount`` is ISO 4217 minor units on PayPal too, HUF and TWD included.

ISO 4217 gives HUF and TWD two decimals (Stripe takes them in hundredths), JPY none;
PayPal takes all three in whole units only ("Decimal amounts cause an error"). So
``{"amount": 150000, "currency": "huf"}`` is 1,500.00 HUF on every gateway: PayPal's
wire carries "1500", and an amount that is not a whole number of forints (of TWD) is
refused before anything is sent, never rounded. The fake writes PayPal's wire the same
way and keeps the money in minor units, as it does for every dialect, so its
``payments`` count what the merchant meant.
"""

from __future__ import annotations

from typing import Any

import pytest
from paypalserversdk.exceptions.error_exception import ErrorException
from paypalserversdk.models.amount_with_breakdown import AmountWithBreakdown
from paypalserversdk.models.checkout_payment_intent import CheckoutPaymentIntent
from paypalserversdk.models.order_request import OrderRequest
from paypalserversdk.models.purchase_unit_request import PurchaseUnitRequest

from celery_agboss.adapters.paypal import PayPalRequestError, issues_of
from celery_agboss.adapters.paypal_requests import body_of, decimal_value, minor_units
from celery_agboss.core.outbound import CallContext, Outcome
from celery_agboss.testing.gateway_server import FakeGatewayServer
from tests.adapters.conftest import AdapterOn
from tests.adapters.paypal_support import adapter_for, charge_request, dialect_of
from tests.engine.helpers import Shop

WIRE = [
    ("usd", 1000, "10.00"),
    ("usd", 5, "0.05"),
    ("huf", 150000, "1500"),  # 1,500.00 HUF: PayPal's whole forints
    ("twd", 1200, "12"),
    ("jpy", 1000, "1000"),  # ISO 4217 exponent 0: minor units ARE yen
]


def _request(currency: str, amount: int, reference: str = "order-u1") -> dict[str, Any]:
    return {**charge_request(reference, amount), "currency": currency}


def _order_value(server: FakeGatewayServer, order_id: str) -> dict[str, Any]:
    """The order's amount as PayPal's wire writes it (the fake's GET of the order)."""
    adapter = adapter_for(server.url)
    order = body_of(adapter.client.orders.get_order({"id": order_id}))
    money: dict[str, Any] = order["purchase_units"][0]["amount"]
    return money


@pytest.mark.parametrize(("currency", "amount", "value"), WIRE)
def test_minor_units_and_paypal_s_value_are_one_conversion_both_ways(
    currency: str, amount: int, value: str
) -> None:
    assert decimal_value(amount, currency) == value
    assert minor_units({"value": value, "currency_code": currency.upper()}) == amount


@pytest.mark.parametrize(("currency", "amount", "value"), WIRE)
def test_a_charge_moves_the_request_s_minor_units_and_says_so_on_the_wire(
    adapter_on: AdapterOn, shop: Shop, currency: str, amount: int, value: str
) -> None:
    server, adapter = adapter_on("paypal")
    with shop.start("pay") as ctx:
        receipt = ctx.outbound(adapter.charge, _request(currency, amount))
    [paid] = server.gateway.payments
    assert (paid["amount"], paid["currency"]) == (amount, currency), "minor units, as Stripe's"
    assert (receipt["amount"], receipt["currency"]) == (amount, currency)
    [order] = dialect_of(server).orders
    assert _order_value(server, order.id) == {"currency_code": currency.upper(), "value": value}
    assert len(server.gateway.requests) == 1


def test_a_huf_charge_whose_answer_was_lost_is_reconciled_in_the_same_units(
    adapter_on: AdapterOn, shop: Shop
) -> None:
    server, adapter = adapter_on("paypal")
    request = _request("huf", 150000)
    shop.lose_the_answer("pay", adapter.charge, request, gateway=server.gateway)
    receipt = shop.reconciled("pay", adapter.charge, request)
    assert (receipt["amount"], receipt["currency"]) == (150000, "huf")
    assert [p["amount"] for p in server.gateway.payments] == [150000]


def test_a_partial_huf_refund_is_the_request_s_forints(adapter_on: AdapterOn, shop: Shop) -> None:
    server, adapter = adapter_on("paypal")
    with shop.start("pay") as ctx:
        paid = ctx.outbound(adapter.charge, _request("huf", 150000))
        refund = ctx.outbound(adapter.refund, {"payment_id": paid["id"], "amount": 50000})
    assert (refund["amount"], refund["currency"]) == (50000, "huf")
    assert [r["amount"] for r in server.gateway.refunds] == [50000], "500.00 HUF, not 50,000"


@pytest.mark.parametrize("currency", ["huf", "twd"])
def test_a_fraction_of_a_whole_unit_is_refused_before_anything_is_sent(
    adapter_on: AdapterOn, currency: str
) -> None:
    server, adapter = adapter_on("paypal")
    call = CallContext("default:t:pay:paypal.charge", _request(currency, 150050), 1, "x")
    with pytest.raises(PayPalRequestError) as refused:
        adapter.charge.send(call)
    message = str(refused.value)
    assert "150050" in message and currency.upper() in message and "multiple of 100" in message
    assert adapter.charge.is_definite_failure(refused.value) is True
    assert server.gateway.requests == [] and dialect_of(server).orders == []


def test_a_partial_capture_in_a_fraction_of_a_forint_is_refused_before_the_capture(
    adapter_on: AdapterOn, shop: Shop
) -> None:
    """Named with its currency it is refused at once; without one, after the read that
    tells the authorization's currency, and still before the capture."""
    server, adapter = adapter_on("paypal")
    with shop.start("hold") as ctx:
        held = ctx.outbound(adapter.authorize, _request("huf", 150000))
    for request in ({"currency": "huf"}, {}):
        capture = {"payment_id": held["id"], "amount": 50050, **request}
        call = CallContext("default:t:ship:paypal.capture", capture, 1, adapter.capture.name)
        with pytest.raises(PayPalRequestError, match="multiple of 100"):
            adapter.capture.send(call)
    assert [r.operation for r in server.gateway.requests] == ["charge"]
    with shop.start("ship") as ctx:
        captured = ctx.outbound(adapter.capture, {"payment_id": held["id"], "amount": 50000})
        assert ctx.last_outcome is Outcome.SENT
    assert captured["amount"] == 50000
    assert server.gateway.retrieve(held["id"])["amount_captured"] == 50000


def test_the_fake_refuses_decimals_in_a_whole_unit_currency_as_paypal_does(
    adapter_on: AdapterOn,
) -> None:
    server, adapter = adapter_on("paypal")
    unit = PurchaseUnitRequest(amount=AmountWithBreakdown("HUF", "1500.50"), custom_id="o-1")
    body = OrderRequest(intent=CheckoutPaymentIntent.CAPTURE, purchase_units=[unit])
    with pytest.raises(ErrorException) as refused:
        adapter.client.orders.create_order({"body": body, "paypal_request_id": "k-1"})
    assert refused.value.response_code == 422
    assert issues_of(refused.value) == {"DECIMALS_NOT_SUPPORTED"}
    assert dialect_of(server).orders == []
