"""Building the PayPal adapter against ``FakeGatewayServer`` (also used by the lead's
real-worker test, which imports exactly ``adapter_for`` and ``charge_request``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from celery_agboss.adapters.paypal import PayPalAdapter
from celery_agboss.testing.dialects.paypal import PayPalDialect
from celery_agboss.testing.gateway_server import DECLINED_CARD, FakeGatewayServer

if TYPE_CHECKING:
    from tests.engine.helpers import Shop

CLIENT_ID = "test-client-id-not-a-secret"
CLIENT_SECRET = "test-client-secret-not-a-secret"
VAULT_ID = "test-vault-card-visa"
"""A vaulted card the fake accepts; ``DECLINED_CARD`` is one it always declines."""


def adapter_for(url: str, **options: Any) -> PayPalAdapter:
    """The adapter on the fake at ``url``, with short timeouts (2 s HTTP, 5 s attempt);
    a longer ``timeout`` alone gets an attempt bound above it (twice it)."""
    options.setdefault("timeout", 2)
    options.setdefault("attempt_timeout", max(5, 2 * options["timeout"]))
    return PayPalAdapter(CLIENT_ID, CLIENT_SECRET, base_url=url, **options)


def charge_request(reference: str, amount: int = 1000) -> dict[str, Any]:
    """A charge of ``amount`` cents for order ``reference``, paid with a vaulted card."""
    return {"amount": amount, "currency": "usd", "reference": reference, "source": VAULT_ID}


def declined_request(reference: str, amount: int = 1000) -> dict[str, Any]:
    """A charge the fake declines (422 INSTRUMENT_DECLINED): its card always declines."""
    return {**charge_request(reference, amount), "source": DECLINED_CARD}


def dialect_of(server: FakeGatewayServer) -> PayPalDialect:
    dialect = server.dialect
    assert isinstance(dialect, PayPalDialect), "the server does not speak PayPal"
    return dialect


__all__ = [
    "CLIENT_ID",
    "CLIENT_SECRET",
    "VAULT_ID",
    "adapter_for",
    "charge_request",
    "declined_request",
    "dialect_of",
]


def a_refund_of_a_charged_order(
    shop: Shop, adapter: PayPalAdapter, order: str
) -> tuple[Any, dict[str, Any], str]:
    """``order`` charged through ``adapter`` in a delivery of its own; the capture's id,
    the request of a 400 refund of it, and that refund's business key."""
    with shop.start("pay") as paying:
        capture_id = paying.outbound(adapter.charge, charge_request(order))["id"]
    return capture_id, {"payment_id": capture_id, "amount": 400}, f"refund:{capture_id}:1"
