"""What the own-payment tests share (design: only the request's payment): the case's
amounts and keys, each adapter on ``FakeGatewayServer``, and the other shop's capture or
refund made first under the key this shop sends.

test_own_payment.py (the charge), test_own_payment_actions.py and
test_own_payment_replays.py (capture, refund, void) build their cases from these, so a
twin and its guarantee always start from the very same gateway state.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest

from celery_agboss.core.keys import fit_key
from celery_agboss.core.outbound import CallContext, Lookup, OutboundCall, ReconcileAnswer, Unknown
from celery_agboss.core.transitions import policy_of
from celery_agboss.testing.gateway_server import FakeGatewayServer
from tests.adapters.stripe_support import dialect_of as stripe_dialect
from tests.engine.helpers import Shop, business_intent_key

if TYPE_CHECKING:  # the conftest imports this module for its fixture
    from tests.adapters.conftest import ServeFn

GATEWAYS = ["stripe", "checkout", "adyen", "paypal"]
THEIRS, OURS = 1000, 2500
ORDER = "order-42"
BUSINESS_KEY = "order:42"
RECENT = timedelta(minutes=1)
THEIR_AMOUNT = f"amount {THEIRS}, not {OURS}"


def support(gateway: str) -> Any:
    """``tests.adapters.<gateway>_support``: the gateway's adapter and requests."""
    return importlib.import_module(f"tests.adapters.{gateway}_support")


def served_adapter(served: ServeFn, gateway: str) -> tuple[FakeGatewayServer, Any]:
    """The gateway's server and its adapter; Stripe's search made consistent, so what the
    answer shows is what the search finds."""
    server = served(gateway)
    if gateway == "stripe":
        stripe_dialect(server).search_lag = 0.0
    return server, support(gateway).adapter_for(server.url)


def key_for(shop: Shop, call: OutboundCall, business_key: str = BUSINESS_KEY) -> str:
    """The key this shop's ``outbound(call, …, business_key=business_key)`` sends."""
    raw = business_intent_key(shop.settings, business_key, call.name)
    return fit_key(raw, call.max_key_length)


def send(call: OutboundCall, key: str, request: Any, attempt: int = 1) -> Any:
    """``call``'s send of ``attempt``; a later attempt is a resend after one that may have
    been processed (a reconcile's ``NotSent``), as the engine sends it."""
    return call.send(CallContext(key, request, attempt, call.name, attempt > 1))


def reconcile(call: OutboundCall, key: str, request: Any) -> ReconcileAnswer:
    """``call``'s reconcile of ``request`` under ``key``, handed the request as the store
    keeps it (masked by the adapter's policy)."""
    stored = policy_of(call).mask_request(request)
    return call.reconcile(
        CallContext(key, request, 1, call.name), Lookup(key, stored, 1, None, RECENT)
    )


def assert_names_their_amount(answer: ReconcileAnswer) -> None:
    """Reconcile's refusal: ``Unknown`` (an operator decides), naming their amount and ours."""
    assert isinstance(answer, Unknown), answer
    assert THEIR_AMOUNT in answer.reason, answer.reason


def make_payment(gateway: str, adapter: Any, *, captured: bool, order: str = ORDER) -> str:
    """The order's payment of 2500 (captured, or only authorised), made before either
    shop acts on it; its id."""
    call = adapter.charge if captured else adapter.authorize
    made = send(call, f"setup-{order}-{call.name}", support(gateway).charge_request(order, OURS))
    return str(made["id"])


def action_request(gateway: str, payment_id: str, amount: int | None) -> dict[str, Any]:
    """A capture's or refund's request (a void's: no amount); Adyen takes the currency too."""
    request: dict[str, Any] = {"payment_id": payment_id}
    if amount is not None:
        request["amount"] = amount
        if gateway == "adyen":
            request["currency"] = "usd"
    return request


def action_id(gateway: str, result: dict[str, Any]) -> Any:
    """Which capture or refund a result is: Checkout.com's action, else the result's id."""
    return result["action_id"] if gateway == "checkout" else result["id"]


def moved(gateway: str, kind: str, result: dict[str, Any]) -> Any:
    """How much a capture's or refund's result says moved (a Stripe capture answers the
    PaymentIntent: what it received)."""
    field = "amount_received" if (gateway, kind) == ("stripe", "capture") else "amount"
    return result[field]


def held_by(server: FakeGatewayServer, kind: str) -> int:
    """What the gateway holds of the kind: refunds made, or the amount captured."""
    if kind == "refund":
        return len(server.gateway.refunds)
    return int(server.gateway.payments[0]["amount_captured"])


@dataclass(frozen=True)
class TheirAction:
    """Shop A's capture or refund of 1000 of order 42's payment, made first under the key
    shop B sends for its own of 2500; ``held`` is what the gateway held right after it."""

    server: FakeGatewayServer
    gateway: str
    kind: str
    call: OutboundCall
    key: str
    payment_id: str
    result: dict[str, Any]
    held: int

    def ours(self, amount: int | None = OURS) -> dict[str, Any]:
        """Shop B's own request on the same payment (``None``: all of it)."""
        return action_request(self.gateway, self.payment_id, amount)

    def nothing_more_moved(self) -> bool:
        return held_by(self.server, self.kind) == self.held

    def assert_taken_for_ours(self, taken: dict[str, Any]) -> None:
        """A twin's harm: their action (their 1000) answered as ours, ours never made."""
        ids = action_id(self.gateway, taken), action_id(self.gateway, self.result)
        assert ids[0] == ids[1], f"not their action: {ids}"
        amount = moved(self.gateway, self.kind, taken)
        assert amount == THEIRS, f"moved {amount}, not their {THEIRS}"
        assert self.nothing_more_moved(), "our 2500 moved after all"


def their_action_first(served: ServeFn, shop: Shop, gateway: str, kind: str) -> TheirAction:
    """The gateway after shop A's capture or refund (``kind``) of 1000 under our key."""
    server, adapter = served_adapter(served, gateway)
    call = getattr(adapter, kind)
    key = key_for(shop, call)
    payment_id = make_payment(gateway, adapter, captured=kind == "refund")
    theirs: dict[str, Any] = send(call, key, action_request(gateway, payment_id, THEIRS))
    return TheirAction(server, gateway, kind, call, key, payment_id, theirs, held_by(server, kind))


def each(*cases: str) -> pytest.MarkDecorator:
    """Runs a test once per ``"gateway kind"`` case with ``theirs`` (the fixture) made
    first for it; each case's id is ``gateway-kind``."""
    return pytest.mark.parametrize(
        "theirs",
        [tuple(case.split()) for case in cases],
        ids=[case.replace(" ", "-") for case in cases],
        indirect=True,
    )


@pytest.fixture
def theirs(request: pytest.FixtureRequest, served: ServeFn, shop: Shop) -> TheirAction:
    """The gateway after the other shop's capture or refund of 1000 under our key, for
    the case :func:`each` hands it."""
    gateway, kind = request.param
    return their_action_first(served, shop, gateway, kind)
