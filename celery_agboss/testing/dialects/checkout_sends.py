"""What each money-moving request of the fake's checkout dialect is, read from the request:
how the server records one the dialect answered itself (a canned reply, a refusal before
the key is read), so that a send is counted at the gateway however it was answered.
"""

from __future__ import annotations

from typing import Any

from celery_agboss.testing.dialects.checkout_wire import fake_id
from celery_agboss.testing.dialects.wire_units import CHECKOUT
from celery_agboss.testing.gateway_server import FakeGatewayServer, GatewayCall, Sends
from celery_agboss.testing.gateway_types import FakeGatewayError, MoneyRequest

KEY_HEADER = "Cko-Idempotency-Key"


def _iso(amount: Any, currency: Any) -> int | None:
    """A wire amount in ISO 4217 minor units; None when it is not one the fake can take."""
    whole = isinstance(amount, int) and not isinstance(amount, bool) and amount > 0
    if not whole or not (isinstance(currency, str) and len(currency) == 3):
        return None
    return CHECKOUT.from_wire(amount, currency)


def sent(server: FakeGatewayServer, operation: str) -> Sends:
    """``payment`` (a charge), or an action on a payment: ``capture``, ``refund``, ``void``."""

    def read(call: GatewayCall) -> MoneyRequest:
        body, key = call.body, call.header(KEY_HEADER)
        if operation == "payment":
            return MoneyRequest("charge", key, _iso(body.get("amount"), body.get("currency")))
        payment_id = fake_id(call.params.get("id", ""))
        if operation == "void":
            return MoneyRequest(operation, key, None, payment_id)
        try:
            currency = server.gateway.retrieve(payment_id)["currency"]
        except FakeGatewayError:
            currency = None
        return MoneyRequest(operation, key, _iso(body.get("amount"), currency), payment_id)

    return read


__all__ = ["sent"]
