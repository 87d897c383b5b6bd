"""Whatever an anonymous sender puts in a webhook, the verifiers answer with a refusal.

The endpoint catches ``WebhookSignatureError`` and ``WebhookPayloadError`` and answers
400 (docs/webhooks.md); any other exception is a 500 that anyone can provoke, and a
check that crashes is one an attacker can probe. Each property feeds one verifier
arbitrary headers and bodies, and bodies signed with the right secret (what a
misbehaving gateway could send), and accepts only a verified event or one of the two
documented refusals.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from celery_agboss.webhooks import (
    WebhookEvent,
    WebhookPayloadError,
    WebhookSignatureError,
    sign_adyen_item,
    sign_checkout,
    sign_stripe,
    verify_adyen,
    verify_checkout,
    verify_stripe,
)
from tests.webhooks.signing_keys import ADYEN_KEY, CHECKOUT_SECRET, STRIPE_SECRET

NOW = 1_700_000_000
DOCUMENTED = (WebhookSignatureError, WebhookPayloadError)

# Every code point, lone surrogates included (a framework may hand any str on).
any_text = st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=60)
digits = st.sampled_from(["0", "1", "9", "²", "٣", "߁", "𝟗", "¹", "⁰", "１"])
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | any_text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(any_text, inner, max_size=4),
    max_leaves=12,
)


def _json_bytes(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass")


bodies = st.one_of(
    st.binary(max_size=200),
    json_values.map(_json_bytes),
    st.integers(1, 50_000).map(lambda depth: b"[" * depth + b"]" * depth),
    st.integers(4_000, 6_000).map(lambda n: b'{"id": ' + b"7" * n + b"}"),
)

stripe_headers = st.one_of(
    any_text,
    st.builds(lambda t, v: f"t={t},v1={v}", any_text, any_text),
    st.builds(lambda t: f"t={t},v1={'0' * 64}", st.text(digits, min_size=1, max_size=20)),
    st.integers(4_000, 6_000).map(lambda n: f"t={'1' * n},v1={'0' * 64}"),
    st.lists(any_text, max_size=6).map(",".join),
)


def _only_documented_errors(verify: Any) -> Any:
    try:
        return verify()
    except DOCUMENTED:
        return None


@settings(max_examples=300, deadline=None)
@given(body=bodies, header=st.none() | stripe_headers)
@example(body=b"{}", header=f"t=²,v1={'0' * 64}")
@example(body=b"{}", header=f"t={'1' * 4301},v1={'0' * 64}")
@example(body=b"{}", header="t=1\u0663,v1=00")
def test_verify_stripe_raises_only_the_documented_errors(body: bytes, header: str | None) -> None:
    _only_documented_errors(lambda: verify_stripe(body, header, STRIPE_SECRET, now=NOW))


@settings(max_examples=200, deadline=None)
@given(body=bodies)
def test_verify_stripe_reads_any_signed_body_or_refuses_it(body: bytes) -> None:
    header = sign_stripe(body, STRIPE_SECRET, NOW)
    event = _only_documented_errors(lambda: verify_stripe(body, header, STRIPE_SECRET, now=NOW))
    assert event is None or isinstance(event, WebhookEvent)


@settings(max_examples=300, deadline=None)
@given(body=bodies, header=st.none() | any_text, signed=st.booleans())
def test_verify_checkout_raises_only_the_documented_errors(
    body: bytes, header: str | None, signed: bool
) -> None:
    given_header = sign_checkout(body, CHECKOUT_SECRET) if signed else header
    _only_documented_errors(lambda: verify_checkout(body, given_header, CHECKOUT_SECRET))


adyen_fields = st.fixed_dictionaries(
    {},
    optional={
        name: json_values
        for name in (
            "pspReference",
            "originalReference",
            "merchantAccountCode",
            "merchantReference",
            "amount",
            "eventCode",
            "success",
            "additionalData",
        )
    },
)


def _adyen_body(items: list[dict[str, Any]], sign: bool) -> bytes:
    signed = []
    for item in items:
        if sign:
            try:
                signature = sign_adyen_item(item, ADYEN_KEY)
            except UnicodeEncodeError:
                signature = "AAAA"  # a lone surrogate cannot be signed: forged, then
            item = {**item, "additionalData": {"hmacSignature": signature}}
        signed.append({"NotificationRequestItem": item})
    return _json_bytes({"live": "false", "notificationItems": signed})


@settings(max_examples=300, deadline=None)
@given(body=bodies)
@example(body=b"[" * 100_000)
def test_verify_adyen_raises_only_the_documented_errors_for_any_body(body: bytes) -> None:
    _only_documented_errors(lambda: verify_adyen(body, ADYEN_KEY, merchant_accounts="Shop"))


@settings(max_examples=300, deadline=None)
@given(items=st.lists(adyen_fields, min_size=1, max_size=3), sign=st.booleans())
@example(items=[{"pspReference": "\ud800", "merchantAccountCode": "Shop"}], sign=False)
def test_verify_adyen_raises_only_the_documented_errors_for_any_item(
    items: list[dict[str, Any]], sign: bool
) -> None:
    body = _adyen_body(items, sign)
    events = _only_documented_errors(
        lambda: verify_adyen(body, ADYEN_KEY, merchant_accounts="Shop")
    )
    assert events is None or all(isinstance(event, WebhookEvent) for event in events)


@pytest.mark.parametrize("timestamp", ["²", "1" * 4301, "１２３", "-5", "+5", "5.0"])
def test_a_stripe_timestamp_that_is_not_ascii_seconds_is_a_malformed_header(
    timestamp: str,
) -> None:
    """The two the review found (a superscript digit, more digits than ``int`` reads)
    and their neighbours: a refusal naming the fault, never a bare ``ValueError``."""
    with pytest.raises(WebhookSignatureError) as excinfo:
        verify_stripe(b"{}", f"t={timestamp},v1={'0' * 64}", STRIPE_SECRET, now=NOW)
    assert (excinfo.value.gateway, excinfo.value.reason) == ("stripe", "malformed")
