"""Which of Adyen's answers the adapter calls definite ("nothing was processed").

Each row makes the fake answer one status and body in Adyen's error shape, through the
official SDK, and asserts the exception the SDK (or the adapter) raised and its
verdict. A definite verdict on an answer after which money may have moved is a double
charge on the next attempt; so only refusals, validation, authentication, permission
and unknown routes are definite, and Adyen's idempotency codes 704 and 703 are
unknown even on a 422.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import requests
from Adyen import exceptions as sdk
from Adyen.httpclient import HTTPClient

from celery_agboss.adapters.adyen import (
    KEY_RETENTION,
    MAX_KEY_LENGTH,
    AdyenAdapter,
    AdyenLookupUnsupported,
    AdyenPaymentRefused,
    AdyenRequestError,
    AdyenUnexpectedAnswer,
)
from celery_agboss.adapters.common import GatewayAdapter
from celery_agboss.core.outbound import CallContext
from celery_agboss.core.protections import EVERY_ERROR_DEFINITE
from celery_agboss.testing import sabotage
from celery_agboss.testing.dialects.adyen import adyen_error, psp_reference_of
from celery_agboss.testing.gateway_server import (
    DECLINED_CARD,
    FakeGatewayServer,
    GatewayCall,
    Reply,
)
from celery_agboss.testing.gateway_types import FakeGatewayFault, GatewayRequestOutcome
from tests.adapters.adyen_support import adapter_for, charge_request, declined_request
from tests.adapters.conftest import AdapterOn, ServeFn
from tests.engine.helpers import Background

PAYMENT = "PSP0000000000001"
AUTHORISED = {"pspReference": PAYMENT, "resultCode": "Authorised"}


class Canned:
    """One server for every row: each test routes the answer it wants, and ``seen``
    holds what reached the canned routes during that test."""

    def __init__(self, server: FakeGatewayServer) -> None:
        self.server = server
        self.url = server.url
        self.seen: list[GatewayCall] = []

    def answer(self, path: str, status: int, body: Any) -> None:
        def endpoint(call: GatewayCall) -> Reply:
            self.seen.append(call)
            return Reply(status, body, drop=status == 0)  # 0: the connection closes unanswered

        self.server.route("POST", path, endpoint)


@pytest.fixture(scope="module")
def canned_server() -> Iterator[FakeGatewayServer]:
    """Module-wide: a server's shutdown costs half a second, and rows share nothing."""
    with FakeGatewayServer(dialect="adyen") as server:
        yield server


@pytest.fixture
def canned(canned_server: FakeGatewayServer) -> Canned:
    found = Canned(canned_server)
    found.answer("/v72/payments", 200, AUTHORISED)
    found.seen.clear()
    return found


def _charge(adapter: AdyenAdapter, request: Any, key: str = "order-1:adyen.charge") -> Any:
    return adapter.charge.send(CallContext(key, request, 1, adapter.charge.name))


def _raised(send: Any) -> BaseException:
    with pytest.raises(Exception) as caught:
        send()
    return caught.value


@dataclass(frozen=True)
class Row:
    status: int
    body: Any
    raised: type[BaseException]
    definite: bool


def _error(status: int, code: str, kind: str = "validation") -> Any:
    return adyen_error(status, code, f"test answer {code}", kind).payload


ROWS = {
    "400 validation": Row(400, _error(400, "702"), sdk.AdyenAPIValidationError, True),
    "401 unauthorised": Row(
        401, _error(401, "000", "security"), sdk.AdyenAPIAuthenticationError, True
    ),
    "403 not allowed": Row(
        403, _error(403, "010", "security"), sdk.AdyenAPIInvalidPermission, True
    ),
    "403 invalid merchant": Row(
        403, _error(403, "901", "security"), sdk.AdyenAPIInvalidPermission, True
    ),
    "404 no such route": Row(404, _error(404, "000"), sdk.AdyenAPICommunicationError, True),
    "422 validation": Row(422, _error(422, "100"), sdk.AdyenAPIUnprocessableEntity, True),
    "422 704 in progress": Row(422, _error(422, "704"), sdk.AdyenAPIUnprocessableEntity, False),
    "422 703 idempotency down": Row(
        422, _error(422, "703"), sdk.AdyenAPIUnprocessableEntity, False
    ),
    "500 703 idempotency down": Row(
        500, _error(500, "703", "internal"), sdk.AdyenAPICommunicationError, False
    ),
    "409 conflict": Row(409, _error(409, "000"), sdk.AdyenAPIResponseError, False),
    "429 too many requests": Row(429, _error(429, "000"), sdk.AdyenAPIResponseError, False),
    "500 internal": Row(500, _error(500, "701", "internal"), sdk.AdyenAPICommunicationError, False),
    "502 bad gateway": Row(502, {"message": "bad gateway"}, sdk.AdyenAPIResponseError, False),
    "503 unavailable": Row(503, _error(503, "000", "internal"), sdk.AdyenAPIResponseError, False),
    "200 Refused": Row(
        200,
        {"pspReference": PAYMENT, "resultCode": "Refused", "refusalReason": "Not enough balance"},
        AdyenPaymentRefused,
        True,
    ),
    "200 Error": Row(
        200, {"pspReference": PAYMENT, "resultCode": "Error"}, AdyenUnexpectedAnswer, False
    ),
    "200 Pending": Row(
        200, {"pspReference": PAYMENT, "resultCode": "Pending"}, AdyenUnexpectedAnswer, False
    ),
    "200 no pspReference": Row(200, {"resultCode": "Authorised"}, AdyenUnexpectedAnswer, False),
    "connection closed unanswered": Row(0, None, requests.ConnectionError, False),
    # The SDK itself fails on it (AttributeError), after the answer: unknown.
    "200 not an object": Row(200, ["Authorised"], AttributeError, False),
}


@pytest.mark.parametrize("row", ROWS.values(), ids=ROWS.keys())
def test_each_payment_answer_raises_its_exception_with_its_verdict(
    canned: Canned, row: Row
) -> None:
    canned.answer("/v72/payments", row.status, row.body)
    adapter = adapter_for(canned.url)
    error = _raised(lambda: _charge(adapter, charge_request("order-1")))
    assert type(error) is row.raised, error
    assert adapter.charge.is_definite_failure(error) is row.definite


MODIFICATION_ROWS = {
    "capture 422": ("captures", 422, _error(422, "167"), sdk.AdyenAPIUnprocessableEntity, True),
    "capture 422 704": (
        "captures",
        422,
        _error(422, "704"),
        sdk.AdyenAPIUnprocessableEntity,
        False,
    ),
    "refund 500": (
        "refunds",
        500,
        _error(500, "701", "internal"),
        sdk.AdyenAPICommunicationError,
        False,
    ),
    "refund 201 not received": (
        "refunds",
        201,
        {"pspReference": "R1", "status": "failed"},
        AdyenUnexpectedAnswer,
        False,
    ),
    "cancel 403": (
        "cancels",
        403,
        _error(403, "010", "security"),
        sdk.AdyenAPIInvalidPermission,
        True,
    ),
    "cancel 503": (
        "cancels",
        503,
        _error(503, "000", "internal"),
        sdk.AdyenAPIResponseError,
        False,
    ),
}


@pytest.mark.parametrize("row", MODIFICATION_ROWS.values(), ids=MODIFICATION_ROWS.keys())
def test_each_modification_answer_raises_its_exception_with_its_verdict(
    canned: Canned, row: tuple[str, int, Any, type[BaseException], bool]
) -> None:
    path, status, body, raised, definite = row
    canned.answer(f"/v72/payments/{PAYMENT}/{path}", status, body)
    adapter = adapter_for(canned.url)
    call = {"captures": adapter.capture, "refunds": adapter.refund, "cancels": adapter.void}[path]
    request = {"payment_id": PAYMENT, "amount": 500, "currency": "usd"}
    error = _raised(lambda: call.send(CallContext("k:adyen.x", request, 1, call.name)))
    assert type(error) is raised, error
    assert call.is_definite_failure(error) is definite


# --- the fake's own failures, through the dialect ---------------------------------------


def test_a_refusal_by_the_declined_test_card_is_definite_and_charges_nothing(
    adapter_on: AdapterOn,
) -> None:
    server, adapter = adapter_on("adyen")
    by_holder = _raised(lambda: _charge(adapter, declined_request("order-1")))
    stored = {**charge_request("order-2"), "source": DECLINED_CARD, "shopper_reference": "s-1"}
    by_token = _raised(lambda: _charge(adapter, stored, key="order-2:adyen.charge"))
    for error in (by_holder, by_token):
        assert isinstance(error, AdyenPaymentRefused)
        assert adapter.charge.is_definite_failure(error) is True
    assert len(server.declines) == 2 and server.gateway.payments == []


def test_a_failure_before_processing_is_a_500_of_unknown_outcome(served: ServeFn) -> None:
    server = served("adyen")
    server.gateway.inject_fault(FakeGatewayFault.FAIL_BEFORE_PROCESSING)
    adapter = adapter_for(server.url)
    error = _raised(lambda: _charge(adapter, charge_request("order-1")))
    assert isinstance(error, sdk.AdyenAPICommunicationError) and error.status_code == 500
    assert adapter.charge.is_definite_failure(error) is False  # Adyen never says "nothing"
    assert server.gateway.payments == []


def test_a_dropped_answer_is_unknown_and_the_sdk_does_not_retry_it(served: ServeFn) -> None:
    server = served("adyen")
    server.gateway.inject_fault(FakeGatewayFault.ANSWER_THEN_DROP)
    adapter = adapter_for(server.url)
    error = _raised(lambda: _charge(adapter, charge_request("order-1")))
    assert isinstance(error, requests.ConnectionError)
    assert adapter.charge.is_definite_failure(error) is False
    assert len(server.gateway.requests) == 1, "the SDK sent it once: no retry of its own"
    assert len(server.gateway.payments) == 1  # charged, and the answer was lost


def test_a_timeout_is_unknown(served: ServeFn) -> None:
    server = served("adyen")
    adapter = adapter_for(server.url, timeout=0.3)
    with server.gateway.hold(before_processing=True, timeout=5):
        error = _raised(lambda: _charge(adapter, charge_request("order-1")))
    assert isinstance(error, requests.Timeout)
    assert adapter.charge.is_definite_failure(error) is False


def test_a_repeat_while_the_first_is_in_flight_gets_704_of_unknown_outcome(
    adapter_on: AdapterOn,
) -> None:
    server, adapter = adapter_on("adyen")
    hold = server.gateway.hold(before_processing=True, timeout=10)
    first = Background(lambda: _charge(adapter, charge_request("order-1")), name="first")
    try:
        hold.wait_reached()
        error = _raised(lambda: _charge(adapter, charge_request("order-1")))
    finally:
        hold.release()
    assert first.join()["id"] == psp_reference_of(server.gateway.payments[0]["id"])
    assert isinstance(error, sdk.AdyenAPIUnprocessableEntity)
    assert (error.status_code, error.error_code) == (422, "704")
    assert adapter.charge.is_definite_failure(error) is False
    outcomes = [r.outcome for r in server.gateway.requests]
    assert outcomes == [GatewayRequestOutcome.PROCESSED, GatewayRequestOutcome.IN_PROGRESS]


def test_a_key_over_64_characters_is_refused_by_the_dialect(adapter_on: AdapterOn) -> None:
    """What the core's digest (max_key_length) saves a call from: Adyen refuses the key."""
    server, adapter = adapter_on("adyen")
    error = _raised(lambda: _charge(adapter, charge_request("order-1"), key="k" * 65))
    assert isinstance(error, sdk.AdyenAPIUnprocessableEntity)
    refused = [r.outcome for r in server.gateway.requests]  # it reached Adyen: a request
    assert refused == [GatewayRequestOutcome.INVALID] and server.gateway.payments == []
    assert adapter.send(100, "k" * 65)["status"] == "authorised"  # send() digests it


# --- refused before anything is sent -------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"amount": 0}, "amount"),
        ({"amount": "10"}, "amount"),
        ({"currency": "dollars"}, "currency"),
        ({"reference": ""}, "reference"),
        ({"source": None}, "source"),
        ({"source": "stored-card-1"}, "shopper_reference"),
    ],
)
def test_a_malformed_request_is_refused_naming_its_field_before_anything_is_sent(
    canned: Canned, change: dict[str, Any], field: str
) -> None:
    adapter = adapter_for(canned.url)
    error = _raised(lambda: _charge(adapter, {**charge_request("order-1"), **change}))
    assert isinstance(error, AdyenRequestError) and isinstance(error, ValueError)
    assert f"'{field}'" in str(error)
    assert adapter.charge.is_definite_failure(error) is True
    assert canned.seen == []


@pytest.mark.parametrize("operation", ["capture", "refund"])
@pytest.mark.parametrize(
    ("request_", "field"),
    [
        ({"payment_id": PAYMENT, "amount": None}, "amount"),
        ({"payment_id": PAYMENT, "amount": 5}, "currency"),
    ],
)
def test_a_capture_or_refund_needs_its_amount_and_currency(
    canned: Canned, operation: str, request_: dict[str, Any], field: str
) -> None:
    call = getattr(adapter_for(canned.url), operation)
    error = _raised(lambda: call.send(CallContext("k:x.y", request_, 1, call.name)))
    assert isinstance(error, AdyenRequestError) and f"'{field}'" in str(error)
    assert canned.seen == []


def test_a_void_needs_its_payment_id(canned: Canned) -> None:
    void = adapter_for(canned.url).void
    error = _raised(lambda: void.send(CallContext("k:x.y", {}, 1, void.name)))
    assert isinstance(error, AdyenRequestError) and "'payment_id'" in str(error)


def test_the_sdk_s_own_refusals_before_sending_are_definite() -> None:
    adapter = AdyenAdapter("key", "Merchant")
    verdict = adapter.charge.is_definite_failure
    assert verdict(sdk.AdyenInvalidRequestError("Please set your webservice username")) is True
    assert verdict(sdk.AdyenEndpointInvalidFormat("Please set your live suffix")) is True
    assert verdict(requests.ConnectionError("reset by peer")) is False
    assert verdict(ValueError("not ours: raised after the answer")) is False


def test_under_the_sabotage_every_error_is_definite() -> None:
    verdict = AdyenAdapter("key", "Merchant").charge.is_definite_failure
    with sabotage(EVERY_ERROR_DEFINITE):
        assert verdict(requests.Timeout("read timed out")) is True
    assert verdict(requests.Timeout("read timed out")) is False


# --- what the adapter declares, and the SDK client it built ---------------------------------


def test_every_call_declares_seven_days_64_characters_and_its_name() -> None:
    adapter = AdyenAdapter("key", "Merchant", name="adyen-eu")
    assert [c.name for c in adapter.calls] == [
        f"adyen-eu.{op}" for op in ("charge", "authorize", "capture", "refund", "void")
    ]
    for call in adapter.calls:
        assert call.key_retention_seconds == 7 * 86400 == KEY_RETENTION.total_seconds()
        assert call.max_key_length == MAX_KEY_LENGTH == 64
        assert call.lookup_proves_absence is False
        assert call.transaction_id is not None and call.transaction_id({"id": "P1"}) == "P1"


def test_the_sdk_client_has_the_timeout_set_and_never_retries(canned: Canned) -> None:
    adapter = adapter_for(canned.url)
    _charge(adapter, charge_request("order-1"))  # the SDK makes its HTTP client lazily
    client = adapter.client
    assert client.http_timeout == 2.0 and client.http_client.timeout == 2.0
    # The requests backend: a fresh session per call, whose adapter retries 0 times.
    assert client.http_force == "requests"
    assert client.http_client.request.__func__ is HTTPClient._requests_request
    assert requests.adapters.DEFAULT_RETRIES == 0
    assert requests.adapters.HTTPAdapter().max_retries.total == 0
    for api in (adapter.payments_api, adapter.modifications_api):
        assert api.baseUrl == f"{canned.url}/v72"


def test_the_base_url_hook_and_the_timeout_bound() -> None:
    default = AdyenAdapter("key", "Merchant")
    assert default.payments_api.baseUrl == "https://checkout-test.adyen.com/v72"
    versioned = AdyenAdapter("key", "Merchant", base_url="http://127.0.0.1:9/v72/")
    assert versioned.modifications_api.baseUrl == "http://127.0.0.1:9/v72"
    with pytest.raises(ValueError, match="attempt_timeout"):
        AdyenAdapter("key", "Merchant", timeout=120, attempt_timeout=120)
    with pytest.raises(ValueError, match="live_endpoint_prefix"):
        AdyenAdapter("key", "Merchant", platform="live")


def test_lookup_says_adyen_has_no_payment_lookup() -> None:
    adapter = AdyenAdapter("key", "Merchant")
    with pytest.raises(AdyenLookupUnsupported, match="no payment lookup"):
        adapter.lookup("any-key")
    assert isinstance(adapter, GatewayAdapter)
