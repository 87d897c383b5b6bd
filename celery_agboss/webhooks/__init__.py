"""Webhook intake: verify a gateway's signature, then apply each event once (docs/webhooks.md).

``verify_stripe`` / ``verify_checkout`` / ``verify_adyen`` / ``verify_webhook`` refuse a
forged, modified or stale webhook (``WebhookSignatureError``) before anything of it is
read or recorded, and turn a genuine one into ``WebhookEvent``s; ``record_event`` applies
an event from a ``PaymentTask`` body under ``event:<gateway>:<event id>`` (once, on any
worker); ``answer_pause_with_event`` answers a pause with one, once. The gateways are
named only to identify their public webhook formats.
"""

from __future__ import annotations

from celery_agboss.webhooks.amounts import amount_in_iso_units
from celery_agboss.webhooks.events import (
    ADYEN,
    CHECKOUT,
    GATEWAYS,
    STRIPE,
    WebhookEvent,
    WebhookPayloadError,
    verify_adyen,
    verify_checkout,
    verify_stripe,
    verify_webhook,
)
from celery_agboss.webhooks.intake import (
    EVENT_EFFECT_NAME,
    RecordedEvent,
    answer_pause_with_event,
    event_answer,
    record_event,
)
from celery_agboss.webhooks.signatures import (
    ADYEN_PSP_REFERENCE,
    CHECKOUT_SIGNATURE_HEADER,
    DEFAULT_TOLERANCE_SECONDS,
    STRIPE_SIGNATURE_HEADER,
    SignatureFault,
    WebhookSignatureError,
    adyen_signing_text,
    check_adyen_item,
    check_checkout_signature,
    check_stripe_signature,
    sign_adyen_item,
    sign_checkout,
    sign_stripe,
)

__all__ = [
    "ADYEN",
    "ADYEN_PSP_REFERENCE",
    "CHECKOUT",
    "CHECKOUT_SIGNATURE_HEADER",
    "DEFAULT_TOLERANCE_SECONDS",
    "EVENT_EFFECT_NAME",
    "GATEWAYS",
    "STRIPE",
    "STRIPE_SIGNATURE_HEADER",
    "RecordedEvent",
    "SignatureFault",
    "WebhookEvent",
    "WebhookPayloadError",
    "WebhookSignatureError",
    "adyen_signing_text",
    "amount_in_iso_units",
    "answer_pause_with_event",
    "check_adyen_item",
    "check_checkout_signature",
    "check_stripe_signature",
    "event_answer",
    "record_event",
    "sign_adyen_item",
    "sign_checkout",
    "sign_stripe",
    "verify_adyen",
    "verify_checkout",
    "verify_stripe",
    "verify_webhook",
]
