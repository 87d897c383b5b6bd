"""The webhook tests' signing secrets (test values in each gateway's own format) and a
genuine Adyen item: one home for the signature, malformed-input and intake tests."""

from __future__ import annotations

from typing import Any

STRIPE_SECRET = "whsec_test_0123456789abcdef"
CHECKOUT_SECRET = "cko-webhook-signature-key"
ADYEN_KEY = "44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056"
"""An HMAC key as Adyen's Customer Area shows it: 64 hex digits."""


def adyen_item(**changes: Any) -> dict[str, Any]:
    """An Adyen ``NotificationRequestItem`` for the account ``ShopAccount``, unsigned;
    ``changes`` replace its fields."""
    item: dict[str, Any] = {
        "additionalData": {},
        "amount": {"currency": "EUR", "value": 1130},
        "eventCode": "AUTHORISATION",
        "eventDate": "2024-01-01T10:00:00+01:00",
        "merchantAccountCode": "ShopAccount",
        "merchantReference": "order-7",
        "pspReference": "7914073381342284",
        "success": "true",
    }
    item.update(changes)
    return item
