"""The webhook tests' signing secrets: test values in each gateway's own format, one home
for the signature, malformed-input and intake tests."""

from __future__ import annotations

STRIPE_SECRET = "whsec_test_0123456789abcdef"
CHECKOUT_SECRET = "cko-webhook-signature-key"
ADYEN_KEY = "44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056"
"""An HMAC key as Adyen's Customer Area shows it: 64 hex digits."""
