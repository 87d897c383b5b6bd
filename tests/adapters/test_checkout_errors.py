"""What the Checkout.com adapter calls definite (nothing processed) and unknown, for each
answer the gateway documents, as the official SDK raises it; and what the adapter
declares (retention, key length) and builds (no retries, a timeout on every request)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from checkout_sdk.exception import CheckoutApiException, CheckoutException

from celery_agboss.adapters.checkout import (
    BoundedHTTPAdapter,
    CheckoutAdapter,
    CheckoutDeclinedError,
    CheckoutNoAnswerError,
    CheckoutRefusedError,
    CheckoutRequestError,
)
from celery_agboss.core.failures import encode_failure, rebuild_failure
from celery_agboss.core.outbound import CallContext
from celery_agboss.core.protections import EVERY_ERROR_DEFINITE
from celery_agboss.testing import sabotage
from celery_agboss.testing.dialects.checkout import error_body
from celery_agboss.testing.gateway_server import FakeGatewayServer
from celery_agboss.testing.gateway_types import FakeGatewayFault
from tests.adapters.checkout_support import (
    DECLINED_TOKEN,
    HTTP_TIMEOUT_S,
    SECRET_KEY,
    adapter_for,
    charge_request,
    dialect_of,
)
from tests.adapters.conftest import AdapterOn, ServeFn
from tests.engine.helpers import Background

DEFINITE, UNKNOWN = True, False

# status, body, verdict: Checkout.com's answers to POST /payments, as its SDK raises them.
ANSWERS = [
    pytest.param(400, error_body("request_invalid", "json_invalid"), DEFINITE, id="400"),
    pytest.param(401, {}, DEFINITE, id="401-unauthorized"),
    pytest.param(403, error_body("forbidden"), DEFINITE, id="403-forbidden"),
    pytest.param(404, {}, DEFINITE, id="404"),
    pytest.param(
        422, error_body("request_invalid", "amount_invalid"), DEFINITE, id="422-request_invalid"
    ),
    pytest.param(409, error_body("idempotency_key_conflict"), UNKNOWN, id="409-conflict"),
    pytest.param(429, error_body("too_many_requests"), UNKNOWN, id="429-key-in-flight"),
    pytest.param(500, error_body("internal_error"), UNKNOWN, id="500"),
    pytest.param(502, error_body("bad_gateway"), UNKNOWN, id="502"),
    pytest.param(503, error_body("service_unavailable"), UNKNOWN, id="503"),
]


def _charge(adapter: CheckoutAdapter, key: str = "k-1", **changes: Any) -> BaseException:
    request = {**charge_request("order-e"), **changes}
    with pytest.raises(Exception) as caught:  # each test asserts the type
        adapter.charge.send(CallContext(key, request, 1, adapter.charge.name))
    return caught.value


def _sdk_status(exc: BaseException) -> int | None:
    """The status of the SDK's ``CheckoutApiException`` behind ``exc`` (or ``exc`` itself)."""
    api = exc if isinstance(exc, CheckoutApiException) else exc.__cause__
    assert isinstance(api, CheckoutApiException), repr(exc)
    return int(api.http_metadata.status_code)


@pytest.mark.parametrize(("status", "body", "definite"), ANSWERS)
def test_each_documented_answer_is_classified(
    adapter_on: AdapterOn, status: int, body: dict[str, Any], definite: bool
) -> None:
    server, adapter = adapter_on("checkout")
    dialect_of(server).answer_next(status, body, operation="payment")
    error = _charge(adapter)
    assert _sdk_status(error) == status
    assert isinstance(error, CheckoutRefusedError) is definite
    assert adapter.charge.is_definite_failure(error) is definite
    with sabotage(EVERY_ERROR_DEFINITE):
        assert adapter.charge.is_definite_failure(error) is True
    assert server.gateway.payments == []


def test_a_refusal_keeps_checkout_s_error_body_and_is_raised_again_as_it_was(
    adapter_on: AdapterOn,
) -> None:
    server, adapter = adapter_on("checkout")
    dialect_of(server).answer_next(422, error_body("request_invalid", "amount_invalid"))
    error = _charge(adapter)
    assert isinstance(error, CheckoutRefusedError)
    assert error.details["error_type"] == "request_invalid"
    assert error.details["error_codes"] == ["amount_invalid"]
    again = rebuild_failure(encode_failure(error, str))
    assert type(again) is CheckoutRefusedError and str(again) == str(error)
    assert again.details == error.details


@pytest.mark.parametrize("how", ["declined card", "declined by the gateway"])
def test_a_decline_answered_201_is_definite(adapter_on: AdapterOn, how: str) -> None:
    server, adapter = adapter_on("checkout")
    if how == "declined card":
        error = _charge(adapter, source=DECLINED_TOKEN)
    else:
        server.gateway.inject_fault(FakeGatewayFault.DECLINE)
        error = _charge(adapter)
    assert isinstance(error, CheckoutDeclinedError), repr(error)
    assert error.details["payment_id"].startswith("pay_")
    assert adapter.charge.is_definite_failure(error) is True
    assert server.gateway.payments == []


def test_nothing_processed_at_the_gateway_is_a_502_and_unknown(adapter_on: AdapterOn) -> None:
    server, adapter = adapter_on("checkout")
    server.gateway.inject_fault(FakeGatewayFault.FAIL_BEFORE_PROCESSING)
    error = _charge(adapter)
    assert isinstance(error, CheckoutApiException) and _sdk_status(error) == 502
    assert adapter.charge.is_definite_failure(error) is False
    assert len(server.gateway.requests) == 1, "the SDK did not retry the 502"


def test_a_dropped_answer_is_unknown_and_never_retried_by_the_http_stack(
    adapter_on: AdapterOn,
) -> None:
    server, adapter = adapter_on("checkout")
    server.gateway.inject_fault(FakeGatewayFault.ANSWER_THEN_DROP)
    error = _charge(adapter)
    assert isinstance(error, CheckoutNoAnswerError)
    assert isinstance(error.__cause__, CheckoutException)
    assert adapter.charge.is_definite_failure(error) is False
    assert len(server.gateway.requests) == 1 and len(server.gateway.payments) == 1


def test_a_timeout_is_unknown(served: ServeFn) -> None:
    server = served("checkout")
    adapter = adapter_for(server.url, timeout=0.3)
    with server.gateway.hold(before_processing=True, timeout=10):
        error = _charge(adapter)
    assert isinstance(error, CheckoutNoAnswerError) and "Timeout" in str(error)
    assert adapter.charge.is_definite_failure(error) is False


def test_a_key_still_in_flight_is_checkout_s_429_and_unknown(adapter_on: AdapterOn) -> None:
    server, adapter = adapter_on("checkout")
    hold = server.gateway.hold(before_processing=True, timeout=10)
    first = Background(lambda: adapter.charge.send(CallContext("k-1", charge_request("o"), 1, "x")))
    try:
        hold.wait_reached()
        error = _charge(adapter, reference="o")
    finally:
        hold.release()
    assert first.join()["status"] == "Captured"
    assert _sdk_status(error) == 429 and adapter.charge.is_definite_failure(error) is False
    assert len(server.gateway.payments) == 1


def test_a_refused_action_is_definite_only_when_none_was_made_under_its_key(
    adapter_on: AdapterOn,
) -> None:
    server, adapter = adapter_on("checkout")
    paid = adapter.charge.send(CallContext("k-p", charge_request("order-v"), 1, "x"))
    void = CallContext("k-v", {"payment_id": paid["id"]}, 1, adapter.void.name)
    with pytest.raises(CheckoutRefusedError) as refused:  # a captured payment: no void
        adapter.void.send(void)
    assert _sdk_status(refused.value) == 422
    assert adapter.void.is_definite_failure(refused.value) is True
    refund = CallContext("k-r", {"payment_id": paid["id"]}, 1, adapter.refund.name)
    made = adapter.refund.send(refund)
    # Checkout.com answers 422 to a repeat of an action already done: the key finds it.
    dialect_of(server).answer_next(422, error_body("request_invalid"), operation="refund")
    assert adapter.refund.send(refund) == made
    assert len(server.gateway.refunds) == 1


def test_an_accepted_action_whose_outcome_cannot_be_read_is_unknown(adapter_on: AdapterOn) -> None:
    server, adapter = adapter_on("checkout")
    held = adapter.authorize.send(CallContext("k-a", charge_request("order-c"), 1, "x"))
    dialect_of(server).answer_next(401, {}, operation="actions")  # definite on its own
    with pytest.raises(CheckoutNoAnswerError) as caught:
        adapter.capture.send(CallContext("k-c", {"payment_id": held["id"]}, 1, "x"))
    assert adapter.capture.is_definite_failure(caught.value) is False
    assert server.gateway.payments[0]["status"] == "succeeded", "the capture was made"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"amount": "10"}, "amount"),
        ({"currency": "dollars"}, "currency"),
        ({"source": None}, "source"),
    ],
)
def test_a_malformed_request_is_refused_before_sending(
    adapter_on: AdapterOn, change: dict[str, Any], field: str
) -> None:
    server, adapter = adapter_on("checkout")
    error = _charge(adapter, **change)
    assert isinstance(error, CheckoutRequestError) and isinstance(error, ValueError)
    assert field in str(error) and adapter.charge.is_definite_failure(error) is True
    assert server.gateway.requests == []


def test_the_adapter_declares_the_account_s_retention_and_no_key_limit() -> None:
    adapter = CheckoutAdapter(SECRET_KEY, base_url="http://127.0.0.1:9", timeout=2)
    names = ["charge", "authorize", "capture", "refund", "void"]
    assert [call.name for call in adapter.calls] == [f"checkout.{n}" for n in names]
    assert {call.key_retention_seconds for call in adapter.calls} == {86400.0}
    assert {call.max_key_length for call in adapter.calls} == {None}
    shorter = CheckoutAdapter(
        SECRET_KEY, base_url="http://127.0.0.1:9", key_retention=timedelta(hours=6), name="cko2"
    )
    assert {call.key_retention_seconds for call in shorter.calls} == {6 * 3600.0}
    assert shorter.charge.name == "cko2.charge"
    with pytest.raises(ValueError, match="key_retention"):
        CheckoutAdapter(SECRET_KEY, base_url="http://127.0.0.1:9", key_retention=0)
    with pytest.raises(ValueError, match="attempt_timeout"):
        CheckoutAdapter(SECRET_KEY, base_url="http://127.0.0.1:9", timeout=120)


def test_the_sdk_it_built_has_no_retries_and_a_timeout_on_every_request(
    served: ServeFn,
) -> None:
    server: FakeGatewayServer = served("checkout")
    adapter = adapter_for(server.url)
    configuration = adapter.sdk.payments._configuration  # the SDK keeps it per client
    assert configuration.http_client is adapter.http_client
    assert configuration.environment.base_uri == server.url + "/"
    for scheme in ("http://", "https://"):
        transport = adapter.http_client.get_adapter(scheme + "127.0.0.1")
        assert isinstance(transport, BoundedHTTPAdapter)
        assert transport.timeout == HTTP_TIMEOUT_S
        assert transport.max_retries.total == 0 and transport.max_retries.read is False
