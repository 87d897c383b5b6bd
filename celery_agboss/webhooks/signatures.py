"""Signature checks of incoming webhooks: nothing of a webhook is believed before one passes.

Each check works on the raw request body exactly as it arrived (bytes): a body parsed
and serialised again may differ by one space or one escaped character, and then a
genuine webhook is refused, or, worse, a check written to be lenient accepts a forged
one. Every comparison is ``hmac.compare_digest`` (constant time), so the time a refusal
takes says nothing about how much of a forged signature was right.

A refusal is a ``WebhookSignatureError`` naming the gateway and the reason; a missing
or unusable secret is the application's ``ConfigurationError``, not the sender's fault.
The gateways are named only to identify their public webhook formats.

The ``sign_*`` functions make what a gateway would send, for tests and fake gateways.
"""

from __future__ import annotations

import base64
import binascii
import enum
import hashlib
import hmac
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

from celery_agboss.adapters.common import ADYEN_PSP_REFERENCE
from celery_agboss.core import sabotage
from celery_agboss.core.protections import ADYEN_FIELDS_UNCHECKED
from celery_agboss.errors import AGBossError, ConfigurationError

STRIPE_SIGNATURE_HEADER = "Stripe-Signature"
CHECKOUT_SIGNATURE_HEADER = "Cko-Signature"
DEFAULT_TOLERANCE_SECONDS = 300.0
"""How far a Stripe-style timestamp may be from this clock, either way (replay window)."""
_MAX_TOLERANCE_SECONDS = 3600.0
"""The widest replay window a caller may ask for. Stripe signs every retry afresh, so the
window only has to cover clock skew and transit; a wider one only lets a captured request
be replayed for longer (and ``inf`` would let it be replayed forever)."""

ADYEN_SIGNED_FIELDS = (
    "pspReference",
    "originalReference",
    "merchantAccountCode",
    "merchantReference",
    "value",
    "currency",
    "eventCode",
    "success",
)
"""The notification item's fields Adyen signs, in order (``value`` and ``currency``
come from the item's ``amount``)."""

_STRIPE_SCHEME = "v1"
_STRIPE_TIMESTAMP = re.compile(r"[0-9]{1,15}")
"""Unix seconds in ASCII digits: ``str.isdigit`` also takes "²" and other digits ``int``
refuses, and ``int`` refuses more than 4300 digits; either would escape as a bare
``ValueError`` (an anonymous request's 500) instead of a refusal."""


class SignatureFault(str, enum.Enum):
    """Stable ids of what was wrong (``WebhookSignatureError.reason``)."""

    MISSING = "missing"  # no signature at all
    MALFORMED = "malformed"  # a signature that cannot be read
    MISMATCH = "mismatch"  # no signature matches the body: forged or modified
    STALE = "stale"  # the timestamp is older than the tolerance
    FUTURE = "future"  # the timestamp is further ahead than the tolerance


class WebhookSignatureError(AGBossError):
    """The webhook's signature was refused; nothing of it was recorded."""

    # Typed fields (set per instance; defaults only for bare construction).
    gateway: str = ""
    reason: str = ""


def _refuse(gateway: str, fault: SignatureFault, detail: str) -> WebhookSignatureError:
    return WebhookSignatureError(
        f"{gateway} webhook refused ({fault.value}): {detail}; nothing was recorded",
        gateway=gateway,
        reason=fault.value,
    )


def _secret_bytes(gateway: str, secret: str | bytes) -> bytes:
    raw = secret.encode("utf-8") if isinstance(secret, str) else bytes(secret)
    if not raw.strip():
        raise ConfigurationError(
            f"no {gateway} webhook secret was given: every webhook would be refused "
            "(or, checked without one, believed)",
            gateway=gateway,
        )
    return raw


def _hmac_sha256(key: bytes, message: bytes) -> bytes:
    return hmac.new(key, message, hashlib.sha256).digest()


def _same(expected: str, given: str) -> bool:
    """Constant time, whatever ``given`` holds (compare_digest refuses non-ASCII str)."""
    return hmac.compare_digest(expected.encode("ascii"), given.encode("utf-8", "replace"))


# --- Stripe: Stripe-Signature: t=<unix seconds>,v1=<hex>[,v1=<hex>…] --------------------


def _parse_stripe_header(header: str) -> tuple[int, list[str]]:
    timestamps: list[str] = []
    signatures: list[str] = []
    for item in header.split(","):
        name, sep, value = item.strip().partition("=")
        if not sep:
            raise _refuse("stripe", SignatureFault.MALFORMED, f"header item {name!r} has no '='")
        if name == "t":
            timestamps.append(value.strip())
        elif name == _STRIPE_SCHEME:
            signatures.append(value.strip())
        # other schemes (v0, …) are not what the endpoint secret signs: ignored
    if len(timestamps) != 1 or not _STRIPE_TIMESTAMP.fullmatch(timestamps[0]):
        raise _refuse(
            "stripe", SignatureFault.MALFORMED, "the header needs exactly one t=<seconds>"
        )
    if not signatures:
        raise _refuse("stripe", SignatureFault.MISSING, f"the header has no {_STRIPE_SCHEME}=")
    return int(timestamps[0]), signatures


def stripe_signature(body: bytes, secret: str | bytes, timestamp: int) -> str:
    """The v1 signature of ``body`` sent at ``timestamp``: hex HMAC-SHA256 of ``"{t}.{body}"``."""
    signed = str(int(timestamp)).encode("ascii") + b"." + bytes(body)
    return _hmac_sha256(_secret_bytes("stripe", secret), signed).hex()


def sign_stripe(body: bytes, secret: str | bytes, timestamp: int | None = None) -> str:
    """A ``Stripe-Signature`` header value for ``body`` (tests, fake gateways)."""
    at = int(time.time()) if timestamp is None else int(timestamp)
    return f"t={at},{_STRIPE_SCHEME}={stripe_signature(body, secret, at)}"


def _check_tolerance(tolerance: float) -> None:
    """The replay window cannot be switched off: ``0 < tolerance <= 3600`` seconds, a
    number (``inf`` and ``nan`` are refused)."""
    if (
        isinstance(tolerance, bool)
        or not isinstance(tolerance, int | float)
        or not 0 < tolerance <= _MAX_TOLERANCE_SECONDS
    ):
        raise ConfigurationError(
            f"the Stripe webhook tolerance must be a number of seconds above 0 and at most "
            f"{_MAX_TOLERANCE_SECONDS:g}, not {tolerance!r}: a wider window (or none) lets a "
            f"recorded webhook be replayed; Stripe signs every retry afresh, so the default "
            f"{DEFAULT_TOLERANCE_SECONDS:g} s is enough",
            gateway="stripe",
        )


def check_stripe_signature(
    body: bytes,
    header: str | None,
    secret: str | bytes,
    *,
    tolerance: float = DEFAULT_TOLERANCE_SECONDS,
    now: float | None = None,
) -> int:
    """Refuse unless one of the header's v1 signatures matches and its timestamp is
    within ``tolerance`` seconds of ``now``, either way; the timestamp. ``tolerance``
    outside ``(0, 3600]`` is the application's ``ConfigurationError``.

    The signature is checked before the timestamp, so a forger learns nothing about
    the clock. A far-future timestamp is refused too: it would stay "fresh" for as
    long as it is ahead, a replay window the tolerance was meant to close.
    """
    _check_tolerance(tolerance)
    key = _secret_bytes("stripe", secret)
    if not header or not header.strip():
        raise _refuse("stripe", SignatureFault.MISSING, f"no {STRIPE_SIGNATURE_HEADER} header")
    timestamp, given = _parse_stripe_header(header)
    expected = _hmac_sha256(key, str(timestamp).encode("ascii") + b"." + bytes(body)).hex()
    matches = [_same(expected, candidate) for candidate in given]  # every one, no early exit
    if not any(matches):
        raise _refuse("stripe", SignatureFault.MISMATCH, "no v1 signature matches the body")
    clock = time.time() if now is None else now
    if timestamp < clock - tolerance:
        raise _refuse(
            "stripe",
            SignatureFault.STALE,
            f"signed {clock - timestamp:.0f} s ago, beyond the {tolerance:g} s tolerance",
        )
    if timestamp > clock + tolerance:
        raise _refuse(
            "stripe",
            SignatureFault.FUTURE,
            f"signed {timestamp - clock:.0f} s ahead of this clock, beyond the "
            f"{tolerance:g} s tolerance",
        )
    return timestamp


# --- Checkout.com: Cko-Signature: <hex HMAC-SHA256 of the body> --------------------------


def sign_checkout(body: bytes, secret: str | bytes) -> str:
    """A ``Cko-Signature`` header value for ``body`` (tests, fake gateways)."""
    return _hmac_sha256(_secret_bytes("checkout", secret), bytes(body)).hex()


def check_checkout_signature(body: bytes, header: str | None, secret: str | bytes) -> None:
    """Refuse unless the header is the hex HMAC-SHA256 of the raw body under ``secret``
    (the key the webhook was configured with)."""
    expected = sign_checkout(body, secret)
    if not header or not header.strip():
        raise _refuse("checkout", SignatureFault.MISSING, f"no {CHECKOUT_SIGNATURE_HEADER} header")
    if not _same(expected, header.strip().lower()):
        raise _refuse("checkout", SignatureFault.MISMATCH, "the signature does not match the body")


# --- Adyen: additionalData.hmacSignature, base64 HMAC-SHA256 of the item's fields ----------

_ADYEN_PAYMENT_EVENTS = frozenset(
    {
        "AUTHORISATION",
        "AUTHORISATION_ADJUSTMENT",
        "CANCELLATION",
        "CANCEL_OR_REFUND",
        "CAPTURE",
        "CAPTURE_FAILED",
        "CHARGEBACK",
        "CHARGEBACK_REVERSED",
        "MANUAL_REVIEW_ACCEPT",
        "MANUAL_REVIEW_REJECT",
        "NOTIFICATION_OF_CHARGEBACK",
        "OFFER_CLOSED",
        "POSTPONED_REFUND",
        "PREARBITRATION_LOST",
        "PREARBITRATION_WON",
        "REFUND",
        "REFUNDED_REVERSED",
        "REFUND_FAILED",
        "REFUND_WITH_DATA",
        "REQUEST_FOR_INFORMATION",
        "SECOND_CHARGEBACK",
        "TECHNICAL_CANCEL",
        "VOID_PENDING_REFUND",
    }
)
"""Adyen's event codes about a payment or a modification of one: their references are
payment references. Other notifications carry something else there (``REPORT_AVAILABLE``:
the report's file name); they are not held to the shape, and a genuine one refused would
hold every notification Adyen queues behind it."""


def _adyen_key(hmac_key_hex: Any) -> bytes:
    try:
        key = bytes.fromhex(hmac_key_hex.strip())
    except (ValueError, AttributeError, TypeError):
        raise ConfigurationError(
            "the Adyen HMAC key must be the hex string the webhook was configured with",
            gateway="adyen",
        ) from None
    if not key:
        raise ConfigurationError("no Adyen HMAC key was given", gateway="adyen")
    return key


def _adyen_keys(hmac_key_hex: str | Sequence[str]) -> list[bytes]:
    """One key, or several while a key is rotated: Adyen may go on signing with the
    previous key for a while after a new one is generated."""
    given: Any = hmac_key_hex  # whatever the application passed, checked here
    if isinstance(given, str):
        return [_adyen_key(given)]
    if isinstance(given, bytes | bytearray) or not isinstance(given, Sequence):
        raise ConfigurationError(
            "the Adyen HMAC key must be a hex string, or a list of them while a key is rotated",
            gateway="adyen",
        )
    keys = [_adyen_key(key) for key in given]
    if not keys:
        raise ConfigurationError("no Adyen HMAC key was given", gateway="adyen")
    return keys


def _signing_field(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):  # sent as the strings "true"/"false"; a bool reads the same
        return "true" if value else "false"
    return str(value)


def _adyen_signed_values(item: Mapping[str, Any]) -> list[tuple[str, str]]:
    amount = item.get("amount")
    amount = amount if isinstance(amount, Mapping) else {}
    fields = {**item, "value": amount.get("value"), "currency": amount.get("currency")}
    return [(name, _signing_field(fields.get(name))) for name in ADYEN_SIGNED_FIELDS]


def adyen_signing_text(item: Mapping[str, Any]) -> str:
    """The text Adyen signs for one notification item: its fields joined by ``:``, a
    missing one as empty."""
    return ":".join(value for _, value in _adyen_signed_values(item))


def sign_adyen_item(item: Mapping[str, Any], hmac_key_hex: str) -> str:
    """The base64 ``hmacSignature`` of one notification item (tests, fake gateways)."""
    text = adyen_signing_text(item).encode("utf-8")
    return base64.b64encode(_hmac_sha256(_adyen_key(hmac_key_hex), text)).decode("ascii")


def _check_adyen_fields(item: Mapping[str, Any]) -> None:
    """Refuse an item whose signed text could be split into other fields.

    Adyen joins the fields with ``:`` without escaping, so a field holding a colon signs
    the same text as other fields split elsewhere: one genuine notification, re-split,
    would verify as another event (another ``pspReference``, another id) and be applied
    again. No field may hold a colon, which leaves one way to split the text; a payment's
    references must also have Adyen's shape (other notifications put other things there).
    """
    for name, value in _adyen_signed_values(item):
        if ":" in value:
            raise _refuse(
                "adyen",
                SignatureFault.MALFORMED,
                f"{name} contains ':', so the signed text does not say where it ends",
            )
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise _refuse("adyen", SignatureFault.MALFORMED, f"{name} is not text") from None
    code = item.get("eventCode")
    if not (isinstance(code, str) and code in _ADYEN_PAYMENT_EVENTS):
        return
    for name in ("pspReference", "originalReference"):
        reference = item.get(name)
        if (name == "pspReference" or reference not in (None, "")) and not (
            isinstance(reference, str) and ADYEN_PSP_REFERENCE.fullmatch(reference)
        ):
            raise _refuse(
                "adyen",
                SignatureFault.MALFORMED,
                f"{name} is not an Adyen reference (16 letters and digits), which every "
                f"{code} notification carries",
            )


def check_adyen_item(item: Mapping[str, Any], hmac_key_hex: str | Sequence[str]) -> None:
    """Refuse unless the item's ``additionalData.hmacSignature`` signs its fields under
    the key (or any one of the keys given while a key is rotated), and its signed fields
    can be read one way only (no ``:`` in any; a payment's references of Adyen's shape)."""
    keys = _adyen_keys(hmac_key_hex)
    additional = item.get("additionalData")
    given = additional.get("hmacSignature") if isinstance(additional, Mapping) else None
    if not isinstance(given, str) or not given.strip():
        raise _refuse("adyen", SignatureFault.MISSING, "no additionalData.hmacSignature")
    try:
        base64.b64decode(given.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise _refuse("adyen", SignatureFault.MALFORMED, "hmacSignature is not base64") from None
    if not sabotage.active(ADYEN_FIELDS_UNCHECKED):
        _check_adyen_fields(item)
    text = adyen_signing_text(item).encode("utf-8", "surrogatepass")
    expected = [base64.b64encode(_hmac_sha256(key, text)).decode("ascii") for key in keys]
    matches = [_same(signature, given.strip()) for signature in expected]  # no early exit
    if not any(matches):
        raise _refuse("adyen", SignatureFault.MISMATCH, "the signature does not match the item")


__all__ = [
    "ADYEN_PSP_REFERENCE",
    "CHECKOUT_SIGNATURE_HEADER",
    "DEFAULT_TOLERANCE_SECONDS",
    "STRIPE_SIGNATURE_HEADER",
    "SignatureFault",
    "WebhookSignatureError",
    "adyen_signing_text",
    "check_adyen_item",
    "check_checkout_signature",
    "check_stripe_signature",
    "sign_adyen_item",
    "sign_checkout",
    "sign_stripe",
]
