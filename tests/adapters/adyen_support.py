"""Building the Adyen adapter against ``FakeGatewayServer`` (also used by the lead's
real-worker test, which imports exactly ``adapter_for`` and ``charge_request``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from celery_agboss.adapters.adyen import TEST_CARD, AdyenAdapter

if TYPE_CHECKING:
    from tests.engine.helpers import Shop

API_KEY = "test-api-key-not-a-secret"
MERCHANT_ACCOUNT = "AgbossTestMerchant"


def adapter_for(url: str, **options: Any) -> AdyenAdapter:
    """The adapter on the fake at ``url``, with short timeouts (2 s HTTP, 5 s attempt)."""
    options.setdefault("timeout", 2)
    options.setdefault("attempt_timeout", 5)
    return AdyenAdapter(API_KEY, MERCHANT_ACCOUNT, base_url=url, **options)


def charge_request(reference: str, amount: int = 1000) -> dict[str, Any]:
    """A charge of ``amount`` cents for order ``reference``, paid with Adyen's test card."""
    return {"amount": amount, "currency": "usd", "reference": reference, "source": dict(TEST_CARD)}


def declined_request(reference: str, amount: int = 1000) -> dict[str, Any]:
    """A charge Adyen refuses: its test trigger, the holder name "DECLINED"."""
    source = {**TEST_CARD, "holderName": "DECLINED"}
    return {"amount": amount, "currency": "usd", "reference": reference, "source": source}


__all__ = ["API_KEY", "MERCHANT_ACCOUNT", "adapter_for", "charge_request", "declined_request"]


def a_refund_of_a_charged_order(
    shop: Shop, adapter: AdyenAdapter, order: str
) -> tuple[str, dict[str, Any], str]:
    """``order`` charged through ``adapter`` in a delivery of its own; the payment, the
    request of a 400 refund of it, and that refund's business key."""
    with shop.start("checkout") as ctx:
        payment = str(ctx.outbound(adapter.charge, charge_request(order))["id"])
    return payment, {"payment_id": payment, "amount": 400, "currency": "usd"}, f"refund:{payment}:1"
