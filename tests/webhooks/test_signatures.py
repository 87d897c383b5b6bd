"""The signature checks of celery_agboss.webhooks, gateway by gateway.

Each gateway's genuine webhook passes and turns into an event; a forged signature, a
modified body, a missing header, a stale or far-future timestamp are refused with a
``WebhookSignatureError`` that names the gateway and the fault. The signatures are built
here from the published formats with hashlib (not with the package's ``sign_*``), so a
mistake in the package's HMAC cannot be hidden by the same mistake in the test.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from typing import Any

import pytest

from celery_agboss.errors import AGBossError, ConfigurationError
from celery_agboss.webhooks import (
    SignatureFault,
    WebhookEvent,
    WebhookPayloadError,
    WebhookSignatureError,
    adyen_signing_text,
    check_stripe_signature,
    sign_adyen_item,
    sign_checkout,
    sign_stripe,
    verify_adyen,
    verify_checkout,
    verify_stripe,
    verify_webhook,
)
from tests.webhooks.signing_keys import ADYEN_KEY, CHECKOUT_SECRET, STRIPE_SECRET, adyen_item

ACCOUNTS = ["ShopAccount"]
NOW = 1_700_000_000


def _hex_hmac(key: bytes, message: bytes) -> str:
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def stripe_body(event_id: str = "evt_1", object_id: str = "pi_1") -> bytes:
    # Spacing a serialiser would not reproduce: the check must use these bytes.
    data = '"data":{"object":{"id":"' + object_id + '"}}'
    return ('{"id": "' + event_id + '",  "type":"payment_intent.succeeded",' + data + "}").encode()


def stripe_header(body: bytes, at: int = NOW, secret: str = STRIPE_SECRET) -> str:
    digest = _hex_hmac(secret.encode(), f"{at}.".encode() + body)
    return f"t={at},v1={digest}"


def refusal(excinfo: pytest.ExceptionInfo[WebhookSignatureError]) -> tuple[str, str]:
    return excinfo.value.gateway, excinfo.value.reason


# --- Stripe -------------------------------------------------------------------------------


def test_a_genuine_stripe_webhook_is_an_event_keyed_by_its_id() -> None:
    body = stripe_body()
    event = verify_stripe(body, stripe_header(body), STRIPE_SECRET, now=NOW + 10)
    assert (event.gateway, event.event_id, event.type, event.object_id) == (
        "stripe",
        "evt_1",
        "payment_intent.succeeded",
        "pi_1",
    )
    assert event.business_key == "event:stripe:evt_1"
    assert event.payload["data"]["object"]["id"] == "pi_1"


def test_any_of_several_v1_signatures_may_match_and_other_schemes_are_ignored() -> None:
    """During a secret's rotation the header carries one v1 per secret."""
    body = stripe_body()
    genuine = stripe_header(body).split(",")[1]
    header = f"t={NOW},v1={'0' * 64},v0=abc,{genuine}"
    assert check_stripe_signature(body, header, STRIPE_SECRET, now=NOW) == NOW


def test_the_package_signs_what_it_checks() -> None:
    body = stripe_body()
    assert sign_stripe(body, STRIPE_SECRET, NOW) == stripe_header(body)


@pytest.mark.parametrize(
    ("header", "fault"),
    [
        (None, SignatureFault.MISSING),
        ("", SignatureFault.MISSING),
        (f"t={NOW}", SignatureFault.MISSING),
        ("v1=abc", SignatureFault.MALFORMED),
        (f"t={NOW},t={NOW},v1=abc", SignatureFault.MALFORMED),
        ("t=soon,v1=abc", SignatureFault.MALFORMED),
        ("garbage", SignatureFault.MALFORMED),
        (f"t={NOW},v1={'0' * 64}", SignatureFault.MISMATCH),
        (f"t={NOW},v1=é", SignatureFault.MISMATCH),
    ],
)
def test_a_missing_malformed_or_forged_stripe_header_is_refused(
    header: str | None, fault: SignatureFault
) -> None:
    with pytest.raises(WebhookSignatureError) as excinfo:
        verify_stripe(stripe_body(), header, STRIPE_SECRET, now=NOW)
    assert refusal(excinfo) == ("stripe", fault.value)
    assert "nothing was recorded" in str(excinfo.value)


def test_a_modified_body_is_refused() -> None:
    body = stripe_body()
    header = stripe_header(body)
    tampered = body.replace(b"pi_1", b"pi_2")
    with pytest.raises(WebhookSignatureError) as excinfo:
        verify_stripe(tampered, header, STRIPE_SECRET, now=NOW)
    assert refusal(excinfo) == ("stripe", "mismatch")


def test_the_same_json_serialised_again_is_not_the_signed_body() -> None:
    """Verified against the raw bytes: a re-serialised body is refused, never believed."""
    body = stripe_body()
    again = json.dumps(json.loads(body)).encode()
    assert again != body
    with pytest.raises(WebhookSignatureError):
        verify_stripe(again, stripe_header(body), STRIPE_SECRET, now=NOW)


def test_a_signature_made_with_another_secret_is_refused() -> None:
    body = stripe_body()
    with pytest.raises(WebhookSignatureError) as excinfo:
        verify_stripe(body, stripe_header(body, secret="whsec_other"), STRIPE_SECRET, now=NOW)
    assert refusal(excinfo) == ("stripe", "mismatch")


@pytest.mark.parametrize(
    ("signed_at", "fault"),
    [(NOW - 301, SignatureFault.STALE), (NOW + 301, SignatureFault.FUTURE)],
)
def test_a_timestamp_beyond_the_tolerance_either_way_is_refused(
    signed_at: int, fault: SignatureFault
) -> None:
    body = stripe_body()
    with pytest.raises(WebhookSignatureError) as excinfo:
        verify_stripe(body, stripe_header(body, at=signed_at), STRIPE_SECRET, now=NOW)
    assert refusal(excinfo) == ("stripe", fault.value)


@pytest.mark.parametrize("signed_at", [NOW - 300, NOW + 300])
def test_a_timestamp_at_the_tolerance_passes(signed_at: int) -> None:
    body = stripe_body()
    verify_stripe(body, stripe_header(body, at=signed_at), STRIPE_SECRET, now=NOW)


def test_the_tolerance_is_the_callers_and_cannot_be_switched_off() -> None:
    body = stripe_body()
    header = stripe_header(body, at=NOW - 60)
    with pytest.raises(WebhookSignatureError):
        verify_stripe(body, header, STRIPE_SECRET, tolerance=30, now=NOW)
    for tolerance in (0, -1, float("nan")):
        with pytest.raises(ConfigurationError):
            verify_stripe(body, header, STRIPE_SECRET, tolerance=tolerance, now=NOW)


def test_a_forged_stale_webhook_is_refused_as_forged() -> None:
    """The signature is checked first: a forger learns nothing about the clock."""
    with pytest.raises(WebhookSignatureError) as excinfo:
        verify_stripe(stripe_body(), f"t={NOW - 9999},v1={'0' * 64}", STRIPE_SECRET, now=NOW)
    assert refusal(excinfo) == ("stripe", "mismatch")


def test_a_missing_secret_is_the_applications_configuration_error() -> None:
    body = stripe_body()
    with pytest.raises(ConfigurationError):
        verify_stripe(body, stripe_header(body), "", now=NOW)


def test_a_signed_body_that_is_not_an_event_is_refused_after_the_signature() -> None:
    body = b'{"type": "payment_intent.succeeded"}'
    with pytest.raises(WebhookPayloadError) as excinfo:
        verify_stripe(body, stripe_header(body), STRIPE_SECRET, now=NOW)
    assert excinfo.value.reason == "missing-field"
    not_json = b"\xff not json"
    with pytest.raises(WebhookPayloadError):
        verify_stripe(not_json, stripe_header(not_json), STRIPE_SECRET, now=NOW)


def test_an_event_id_that_cannot_be_a_business_key_is_refused() -> None:
    body = stripe_body(event_id="evt_\u200b1")  # a zero-width space: two ids that look one
    with pytest.raises(WebhookPayloadError) as excinfo:
        verify_stripe(body, stripe_header(body), STRIPE_SECRET, now=NOW)
    assert excinfo.value.reason == "bad-event-id"


def test_every_refusal_is_an_agboss_error() -> None:
    assert issubclass(WebhookSignatureError, AGBossError)
    assert issubclass(WebhookPayloadError, AGBossError)


# --- Checkout.com -------------------------------------------------------------------------

CHECKOUT_BODY = b'{"id":"evt_c1","type":"payment_captured","data":{"id":"pay_1","amount":100}}'


def test_a_genuine_checkout_webhook_is_an_event() -> None:
    signature = _hex_hmac(CHECKOUT_SECRET.encode(), CHECKOUT_BODY)
    assert sign_checkout(CHECKOUT_BODY, CHECKOUT_SECRET) == signature
    event = verify_checkout(CHECKOUT_BODY, signature, CHECKOUT_SECRET)
    assert (event.event_id, event.type, event.object_id) == ("evt_c1", "payment_captured", "pay_1")
    assert event.business_key == "event:checkout:evt_c1"
    assert verify_checkout(CHECKOUT_BODY, signature.upper(), CHECKOUT_SECRET) == event


@pytest.mark.parametrize(
    ("body", "header", "fault"),
    [
        (CHECKOUT_BODY, None, "missing"),
        (CHECKOUT_BODY, "0" * 64, "mismatch"),
        (CHECKOUT_BODY.replace(b"100", b"999"), "sign", "mismatch"),
    ],
)
def test_a_missing_forged_or_modified_checkout_webhook_is_refused(
    body: bytes, header: str | None, fault: str
) -> None:
    if header == "sign":
        header = _hex_hmac(CHECKOUT_SECRET.encode(), CHECKOUT_BODY)
    with pytest.raises(WebhookSignatureError) as excinfo:
        verify_checkout(body, header, CHECKOUT_SECRET)
    assert refusal(excinfo) == ("checkout", fault)


# --- Adyen --------------------------------------------------------------------------------


def adyen_signed(item: dict[str, Any]) -> dict[str, Any]:
    def as_text(value: Any) -> str:
        return "" if value is None else str(value)

    fields = [
        item.get("pspReference"),
        item.get("originalReference"),
        item["merchantAccountCode"],
        item["merchantReference"],
        item["amount"]["value"],
        item["amount"]["currency"],
        item["eventCode"],
        item["success"],
    ]
    text = ":".join(as_text(value) for value in fields)
    digest = hmac.new(bytes.fromhex(ADYEN_KEY), text.encode(), hashlib.sha256).digest()
    signed = dict(item)
    signed["additionalData"] = {
        **item["additionalData"],
        "hmacSignature": base64.b64encode(digest).decode(),
    }
    return signed


def adyen_body(*items: dict[str, Any]) -> bytes:
    wrapped = [{"NotificationRequestItem": item} for item in items]
    return json.dumps({"live": "false", "notificationItems": wrapped}).encode()


def test_a_genuine_adyen_notification_is_one_event_per_item() -> None:
    capture = adyen_signed(
        adyen_item(
            eventCode="CAPTURE",
            pspReference="8814073381349981",
            originalReference="7914073381342284",
        )
    )
    body = adyen_body(adyen_signed(adyen_item()), capture)
    first, second = verify_adyen(body, ADYEN_KEY, merchant_accounts=ACCOUNTS)
    assert (first.event_id, first.type, first.object_id) == (
        "7914073381342284:AUTHORISATION:true",
        "AUTHORISATION",
        "7914073381342284",
    )
    assert second.object_id == "7914073381342284", "a modification is about the payment"
    assert second.business_key == "event:adyen:8814073381349981:CAPTURE:true"
    assert (
        sign_adyen_item(adyen_item(), ADYEN_KEY)
        == (adyen_signed(adyen_item())["additionalData"]["hmacSignature"])
    )


def test_a_refusal_and_a_success_of_one_payment_are_two_events() -> None:
    refused = verify_adyen(
        adyen_body(adyen_signed(adyen_item(success="false"))), ADYEN_KEY, merchant_accounts=ACCOUNTS
    )
    accepted = verify_adyen(
        adyen_body(adyen_signed(adyen_item())), ADYEN_KEY, merchant_accounts=ACCOUNTS
    )
    assert refused[0].business_key != accepted[0].business_key


@pytest.mark.parametrize(
    ("change", "fault"),
    [
        ({"amount": {"currency": "EUR", "value": 1}}, "mismatch"),
        ({"success": "false"}, "mismatch"),
        ({"merchantReference": "order-8"}, "mismatch"),
    ],
)
def test_a_modified_adyen_item_is_refused(change: dict[str, Any], fault: str) -> None:
    tampered = {**adyen_signed(adyen_item()), **change}
    with pytest.raises(WebhookSignatureError) as excinfo:
        verify_adyen(adyen_body(tampered), ADYEN_KEY, merchant_accounts=ACCOUNTS)
    assert refusal(excinfo) == ("adyen", fault)


def test_an_unsigned_or_garbled_adyen_item_is_refused() -> None:
    with pytest.raises(WebhookSignatureError) as excinfo:
        verify_adyen(adyen_body(adyen_item()), ADYEN_KEY, merchant_accounts=ACCOUNTS)
    assert refusal(excinfo) == ("adyen", "missing")
    garbled = adyen_item(additionalData={"hmacSignature": "***"})
    with pytest.raises(WebhookSignatureError) as excinfo:
        verify_adyen(adyen_body(garbled), ADYEN_KEY, merchant_accounts=ACCOUNTS)
    assert refusal(excinfo) == ("adyen", "malformed")


def test_one_forged_item_refuses_the_whole_notification() -> None:
    forged = adyen_item(pspReference="9999073381349981", additionalData={"hmacSignature": "AAAA"})
    with pytest.raises(WebhookSignatureError):
        verify_adyen(
            adyen_body(adyen_signed(adyen_item()), forged), ADYEN_KEY, merchant_accounts=ACCOUNTS
        )


def test_an_adyen_key_that_is_not_hex_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError):
        verify_adyen(adyen_body(adyen_signed(adyen_item())), "not hex", merchant_accounts=ACCOUNTS)


# A merchant whose references hold a colon: Adyen signs "psp:orig:account:ref:…" without
# escaping, so "order:42" can be read as another split of the same signed text.
GENUINE_WITH_A_COLON = adyen_signed(adyen_item(merchantReference="order:42"))
RE_SPLIT = {
    **GENUINE_WITH_A_COLON,
    "pspReference": GENUINE_WITH_A_COLON["pspReference"] + ":",
    "originalReference": "ShopAccount",
    "merchantAccountCode": "order",
    "merchantReference": "42",
}


def test_one_signed_text_can_be_split_into_two_items_which_is_why_colons_are_refused() -> None:
    """The attack the refusals below close: the same signature over two readings."""
    assert adyen_signing_text(RE_SPLIT) == adyen_signing_text(GENUINE_WITH_A_COLON)
    assert RE_SPLIT["additionalData"] == GENUINE_WITH_A_COLON["additionalData"]


@pytest.mark.parametrize("item", [GENUINE_WITH_A_COLON, RE_SPLIT], ids=["genuine", "re-split"])
def test_an_adyen_item_with_a_colon_in_a_signed_field_is_refused(item: dict[str, Any]) -> None:
    with pytest.raises(WebhookSignatureError, match="contains ':'") as excinfo:
        verify_adyen(adyen_body(item), ADYEN_KEY, merchant_accounts=ACCOUNTS)
    assert refusal(excinfo) == ("adyen", "malformed")


@pytest.mark.parametrize(
    "change",
    [
        {"pspReference": "8814"},
        {"pspReference": "7914073381342284X"},
        {"pspReference": "79140733813422-4"},
        {"pspReference": 7914073381342284},
        {"pspReference": None},
        {"originalReference": "ShopAccount"},
    ],
)
def test_an_adyen_reference_not_of_adyens_shape_is_refused_though_signed(
    change: dict[str, Any],
) -> None:
    item = adyen_signed(adyen_item(**change))
    with pytest.raises(WebhookSignatureError, match="not an Adyen reference") as excinfo:
        verify_adyen(adyen_body(item), ADYEN_KEY, merchant_accounts=ACCOUNTS)
    assert refusal(excinfo) == ("adyen", "malformed")


def test_an_adyen_notification_for_another_merchant_account_is_refused() -> None:
    other = adyen_signed(adyen_item(merchantAccountCode="OtherAccount"))
    body = adyen_body(adyen_signed(adyen_item()), other)
    with pytest.raises(WebhookPayloadError, match="OtherAccount") as excinfo:
        verify_adyen(body, ADYEN_KEY, merchant_accounts=ACCOUNTS)
    assert (excinfo.value.gateway, excinfo.value.reason) == ("adyen", "merchant-account")
    both = verify_adyen(body, ADYEN_KEY, merchant_accounts=["ShopAccount", "OtherAccount"])
    assert len(both) == 2
    assert verify_adyen(adyen_body(other), ADYEN_KEY, merchant_accounts="OtherAccount")


@pytest.mark.parametrize("accounts", [[], "", [""], ["  "]])
def test_verify_adyen_needs_the_merchant_accounts_it_receives(accounts: Any) -> None:
    with pytest.raises(ConfigurationError, match="merchant_accounts"):
        verify_adyen(adyen_body(adyen_signed(adyen_item())), ADYEN_KEY, merchant_accounts=accounts)


# --- one endpoint for all -----------------------------------------------------------------


def test_verify_webhook_picks_the_gateway_and_reads_headers_in_any_case() -> None:
    body = stripe_body()
    headers = {"stripe-signature": stripe_header(body)}
    assert verify_webhook("stripe", body, headers, STRIPE_SECRET, now=NOW)[0].event_id == "evt_1"
    cko = {"CKO-SIGNATURE": sign_checkout(CHECKOUT_BODY, CHECKOUT_SECRET)}
    assert verify_webhook("checkout", CHECKOUT_BODY, cko, CHECKOUT_SECRET)[0].type == (
        "payment_captured"
    )
    adyen = adyen_body(adyen_signed(adyen_item()))
    assert len(verify_webhook("adyen", adyen, {}, ADYEN_KEY, merchant_accounts=ACCOUNTS)) == 1
    with pytest.raises(ConfigurationError, match="merchant_accounts"):
        verify_webhook("adyen", adyen, {}, ADYEN_KEY)
    with pytest.raises(WebhookSignatureError):
        verify_webhook("stripe", body, {}, STRIPE_SECRET, now=NOW)
    with pytest.raises(ValueError, match="unknown webhook gateway"):
        verify_webhook("paypal", body, headers, STRIPE_SECRET)


def test_an_event_travels_in_a_celery_message_and_back() -> None:
    body = stripe_body()
    event = verify_stripe(body, stripe_header(body), STRIPE_SECRET, now=NOW)
    message = json.loads(json.dumps(event.to_message()))
    assert WebhookEvent.from_message(message) == event
    assert WebhookEvent.from_message(message).payload == event.payload
