"""A request's ``amount`` is ISO 4217 minor units on Stripe, Adyen and Checkout.com too,
in the currencies where a gateway counts otherwise.

ISO 4217 gives ISK and CLP no decimals, MGA, CVE and IDR two. Stripe writes ISK with two
decimals (100 is 1 króna) and MGA with none; Adyen writes CLP and ISK with two, CVE and
IDR with none; Checkout.com writes CLP with two (÷100, as every currency it does not
list). So ``{"amount": 1000, "currency": "isk"}`` is 1,000 ISK on every gateway: Stripe's
wire carries 100000. An amount a gateway cannot write exactly (a fraction of a whole
MGA, CVE or IDR; a three-decimal amount whose last digit is not 0 on Stripe or
Checkout.com) is refused before anything is sent, never rounded.

The fake reads and writes each gateway's wire as the gateway does
(``celery_agboss.testing.dialects.wire_units``) and keeps ISO 4217 minor units, so its
``payments`` and ``refunds`` count what the merchant meant: an adapter sending ISO units
as they are would show here as a payment 100 times too small or too large.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import pytest

from celery_agboss.adapters.adyen import TEST_CARD, AdyenRequestError
from celery_agboss.adapters.checkout import CheckoutRequestError
from celery_agboss.adapters.stripe import TEST_PAYMENT_METHOD, InvalidStripeRequestError
from celery_agboss.core.outbound import CallContext, OutboundCall, Outcome
from celery_agboss.testing.clock import VirtualClock
from celery_agboss.testing.gateway_handler import GatewayCall, Reply
from celery_agboss.testing.gateway_server import FakeGatewayServer
from tests.adapters import adyen_support, checkout_support, stripe_support
from tests.adapters.checkout_support import TEST_TOKEN
from tests.adapters.conftest import ServeFn
from tests.engine.helpers import Shop


@dataclass(frozen=True)
class Gateway:
    """What differs between the three gateways for these tests."""

    name: str
    adapter_for: Callable[[str], Any]
    source: Callable[[], Any]
    refused: type[Exception]
    wire_field: Callable[[str, dict[str, Any]], Any]  # a POST's amount, by its kind
    actions_name_currency: bool = False  # Adyen's captures and refunds carry one
    captured_field: str = "amount"  # a capture's result: what it took

    def charge(self, reference: str, currency: str, amount: int) -> dict[str, Any]:
        source = self.source()
        return {"amount": amount, "currency": currency, "reference": reference, "source": source}

    def action(self, payment_id: str, currency: str, amount: int | None) -> dict[str, Any]:
        request: dict[str, Any] = {"payment_id": payment_id}
        if amount is not None:
            request["amount"] = amount
        if self.actions_name_currency:
            request["currency"] = currency
        return request


def _stripe_amount(kind: str, body: dict[str, Any]) -> Any:
    return int(body["amount_to_capture" if kind == "capture" else "amount"])


GATEWAYS = {
    "stripe": Gateway(
        "stripe",
        stripe_support.adapter_for,
        lambda: TEST_PAYMENT_METHOD,
        InvalidStripeRequestError,
        _stripe_amount,
        captured_field="amount_received",  # the PaymentIntent's "amount" is what it held
    ),
    "adyen": Gateway(
        "adyen",
        adyen_support.adapter_for,
        lambda: dict(TEST_CARD),
        AdyenRequestError,
        lambda kind, body: body["amount"]["value"],
        actions_name_currency=True,
    ),
    "checkout": Gateway(
        "checkout",
        checkout_support.adapter_for,
        lambda: TEST_TOKEN,
        CheckoutRequestError,
        lambda kind, body: body["amount"],
    ),
}


class Converted(NamedTuple):
    """A gateway, a currency, ISO 4217 minor units, what the gateway's wire carries."""

    name: str
    currency: str
    amount: int
    wire: int


CONVERTED = [
    Converted("stripe", "isk", 1000, 100000),  # 1,000 ISK: Stripe's ISK has two decimals
    Converted("stripe", "mga", 10000, 100),  # 100.00 MGA: a zero-decimal currency on Stripe
    Converted("adyen", "clp", 1000, 100000),  # 1,000 CLP: two decimals on Adyen
    Converted("adyen", "cve", 10000, 100),  # 100.00 CVE: none on Adyen
    Converted("adyen", "idr", 1500000, 15000),  # 15,000.00 IDR: none on Adyen
    Converted("adyen", "isk", 1000, 100000),  # 1,000 ISK: two decimals on Adyen
    Converted("checkout", "clp", 1000, 100000),  # 1,000 CLP: ÷100 on Checkout.com
]
# Each case's id as its values read ("stripe-isk-1000-100000").
each_conversion = pytest.mark.parametrize("case", CONVERTED, ids=lambda c: "-".join(map(str, c)))

REFUSED = [
    # gateway, currency, an ISO amount the gateway cannot write, the nearest it can
    ("stripe", "mga", 10050, "10000 or 10100"),
    ("stripe", "kwd", 1234, "1230 or 1240"),  # three decimals: the last one 0
    ("stripe", "bhd", 5, "(10 here)"),
    ("adyen", "cve", 10050, "10000 or 10100"),
    ("adyen", "idr", 150050, "150000 or 150100"),
    ("checkout", "kwd", 1234, "1230 or 1240"),
    ("checkout", "omr", 1001, "1000 or 1010"),
]


def _kind(path: str) -> str:
    if path.endswith(("/capture", "/captures")):
        return "capture"
    return "refund" if path.endswith(("/refunds", "/refund")) else "charge"


def _wire(monkeypatch: pytest.MonkeyPatch, server: FakeGatewayServer) -> list[GatewayCall]:
    """Every POST that reaches the fake, as it arrived (before any dialect reads it)."""
    seen: list[GatewayCall] = []
    handle = server.handle

    def spy(call: GatewayCall) -> Reply:
        if call.method == "POST":
            seen.append(call)
        return handle(call)

    monkeypatch.setattr(server, "handle", spy)
    return seen


def _wire_amounts(gateway: Gateway, seen: list[GatewayCall], kind: str) -> list[Any]:
    found = [c for c in seen if _kind(c.path) == kind]
    return [gateway.wire_field(kind, c.body) for c in found]


def _assert_refused(gateway: Gateway, call: OutboundCall, request: Any, *named: str) -> None:
    """``call``'s send of ``request`` is refused as a definite failure whose message names
    each of ``named`` (the amount, the currency, the nearest amounts it could write)."""
    with pytest.raises(gateway.refused) as refused:
        call.send(CallContext(f"default:t:{call.name}", request, 1, call.name))
    message = str(refused.value)
    assert all(part in message for part in named), (named, message)
    assert call.is_definite_failure(refused.value) is True


Wired = tuple[Gateway, FakeGatewayServer, Any, list[GatewayCall]]


@pytest.fixture
def wired(served: ServeFn, monkeypatch: pytest.MonkeyPatch) -> Callable[[str], Wired]:
    """``wired(name)``: the gateway's table row, its server, its adapter, and every POST
    that reaches the server as it arrived."""

    def wire(name: str) -> Wired:
        server = served(name)
        adapter = GATEWAYS[name].adapter_for(server.url)
        return GATEWAYS[name], server, adapter, _wire(monkeypatch, server)

    return wire


@each_conversion
def test_a_charge_goes_out_in_the_gateway_s_units_and_comes_back_in_iso_units(
    wired: Callable[[str], Wired], shop: Shop, case: Converted
) -> None:
    gateway, server, adapter, seen = wired(case.name)
    with shop.start("pay") as ctx:
        receipt = ctx.outbound(
            adapter.charge, gateway.charge("order-u1", case.currency, case.amount)
        )
    assert _wire_amounts(gateway, seen, "charge") == [case.wire]
    assert (receipt["amount"], receipt["currency"]) == (case.amount, case.currency)
    [paid] = server.gateway.payments
    assert (paid["amount"], paid["currency"].lower()) == (case.amount, case.currency), (
        "the merchant's money"
    )


@each_conversion
def test_a_partial_capture_and_a_partial_refund_go_out_in_the_gateway_s_units(
    wired: Callable[[str], Wired], shop: Shop, case: Converted
) -> None:
    gateway, server, adapter, seen = wired(case.name)
    half = case.amount // 2
    with shop.start("ship") as ctx:
        held = ctx.outbound(
            adapter.authorize, gateway.charge("order-u2", case.currency, case.amount)
        )
        captured = ctx.outbound(adapter.capture, gateway.action(held["id"], case.currency, half))
        refunded = ctx.outbound(
            adapter.refund, gateway.action(held["id"], case.currency, half // 2)
        )
    assert _wire_amounts(gateway, seen, "capture") == [half * case.wire // case.amount]
    assert _wire_amounts(gateway, seen, "refund") == [half // 2 * case.wire // case.amount]
    assert (captured[gateway.captured_field], refunded["amount"]) == (half, half // 2)
    assert server.gateway.retrieve(server.gateway.payments[0]["id"])["amount_captured"] == half
    assert [r["amount"] for r in server.gateway.refunds] == [half // 2]


@each_conversion
def test_a_lost_answer_is_settled_with_the_converted_amount_not_as_a_mismatch(
    wired: Callable[[str], Wired], shop: Shop, case: Converted
) -> None:
    """Stripe and Checkout.com find the payment and compare it with the request in ISO
    units (adopted, not ``Unknown``); Adyen has no lookup, and the resend's replay is
    compared the same way (taken, not ``AnotherRequestsAnswerError``)."""
    gateway, server, adapter, seen = wired(case.name)
    request = gateway.charge("order-u3", case.currency, case.amount)
    shop.lose_the_answer("pay", adapter.charge, request, gateway=server.gateway)
    with shop.start("pay") as retry:
        receipt = retry.outbound(adapter.charge, request)
        settled = Outcome.SENT if case.name == "adyen" else Outcome.RECONCILED
        assert retry.last_outcome is settled
    assert (receipt["amount"], receipt["currency"]) == (case.amount, case.currency)
    assert [p["amount"] for p in server.gateway.payments] == [case.amount]
    assert set(_wire_amounts(gateway, seen, "charge")) == {case.wire}


@pytest.mark.parametrize(
    ("name", "currency", "amount"), [("stripe", "isk", 1000), ("checkout", "clp", 1000)]
)
def test_a_lost_refund_of_all_that_is_left_is_adopted_in_iso_units(
    wired: Callable[[str], Wired],
    shop: Shop,
    db_clock: VirtualClock,
    name: str,
    currency: str,
    amount: int,
) -> None:
    """A refund without an amount takes what is left: reconcile compares the refund found
    under the key with the payment's total less the earlier refunds, all in ISO units."""
    gateway, server, adapter, _ = wired(name)
    with shop.start("pay") as ctx:
        paid = ctx.outbound(adapter.charge, gateway.charge("order-u4", currency, amount))
        ctx.outbound(adapter.refund, gateway.action(paid["id"], currency, 400))
    db_clock.advance(5)
    rest = gateway.action(paid["id"], currency, None)
    gw = server.gateway
    shop.lose_the_answer("undo", adapter.refund, rest, gateway=gw, operation="refund")
    refunded = shop.reconciled("undo", adapter.refund, rest)
    assert refunded["amount"] == amount - 400
    assert [r["amount"] for r in server.gateway.refunds] == [400, amount - 400]


@pytest.mark.parametrize(("name", "currency", "amount", "nearest"), REFUSED)
def test_an_amount_the_gateway_cannot_write_is_refused_before_anything_is_sent(
    wired: Callable[[str], Wired],
    name: str,
    currency: str,
    amount: int,
    nearest: str,
) -> None:
    gateway, server, adapter, seen = wired(name)
    request = gateway.charge("order-u5", currency, amount)
    _assert_refused(gateway, adapter.charge, request, str(amount), currency.upper(), nearest)
    assert seen == [] and server.gateway.requests == []


@pytest.mark.parametrize(
    ("name", "currency", "amount", "refund", "nearest"),
    [
        ("stripe", "mga", 10000, 5050, "5000 or 5100"),
        ("stripe", "kwd", 10000, 1235, "1230 or 1240"),
        ("adyen", "cve", 10000, 5050, "5000 or 5100"),
        ("adyen", "idr", 1500000, 5050, "5000 or 5100"),
        ("checkout", "kwd", 10000, 1235, "1230 or 1240"),
    ],
)
def test_a_refund_the_gateway_cannot_write_is_refused_before_the_refund(
    wired: Callable[[str], Wired],
    shop: Shop,
    name: str,
    currency: str,
    amount: int,
    refund: int,
    nearest: str,
) -> None:
    """Stripe's and Checkout.com's refunds name no currency: it is read from the payment
    first (a read, nothing moved), and the refund is refused before it is sent."""
    gateway, server, adapter, seen = wired(name)
    with shop.start("pay") as ctx:
        paid = ctx.outbound(adapter.charge, gateway.charge("order-u6", currency, amount))
    request = gateway.action(paid["id"], currency, refund)
    _assert_refused(gateway, adapter.refund, request, str(refund), currency.upper(), nearest)
    assert [_kind(c.path) for c in seen] == ["charge"]
    assert server.gateway.refunds == []
    assert [r.operation for r in server.gateway.requests] == ["charge"]
