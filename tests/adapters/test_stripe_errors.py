"""How the Stripe adapter classifies what Stripe answers, one row per documented answer.

Each row makes the fake answer one way (Stripe's own error shape and status, a dropped
connection, a timeout), sends a charge through the official SDK, and asserts the
exception the SDK raised and the adapter's verdict: definite (nothing processed: the
intent may fail and be sent again) or unknown (reconcile asks Stripe first). Then the
declarations a double charge would hide behind: the retention, the key limit, the
SDK's retries and timeout.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import stripe

from celery_agboss.adapters.stripe import (
    MAX_KEY_LENGTH,
    InvalidStripeRequestError,
    StripeAdapter,
)
from celery_agboss.core.outbound import CallContext
from celery_agboss.testing.dialects.stripe import stripe_error
from celery_agboss.testing.gateway import FakeGatewayFault, GatewayRequestOutcome
from celery_agboss.testing.gateway_server import DECLINED_CARD, FakeGatewayServer, Reply
from tests.adapters.stripe_support import (  # noqa: F401 - the fixtures, used by name
    API_KEY,
    adapter_for,
    charge_request,
    dialect_of,
    stripe_fake_fixture,
    stripe_server_fixture,
)
from tests.engine.helpers import Background

DROP = FakeGatewayFault.ANSWER_THEN_DROP


def _canned(reply: Reply) -> Callable[[FakeGatewayServer], None]:
    return lambda server: dialect_of(server).answer_next(reply)


def _fault(fault: FakeGatewayFault) -> Callable[[FakeGatewayServer], None]:
    return lambda server: server.gateway.inject_fault(fault)


def _nothing(server: FakeGatewayServer) -> None:
    """The request itself makes the answer (its card, its key)."""


def _held(server: FakeGatewayServer) -> None:
    server.gateway.hold(timeout=5)  # processed; the answer waits past the SDK's timeout


@dataclass(frozen=True)
class Row:
    answer: str
    arrange: Callable[[FakeGatewayServer], None]
    raised: type[BaseException]
    definite: bool
    source: str = "pm_card_visa"
    api_key: str = API_KEY
    timeout: float = 2.0


_INVALID = stripe_error(
    400, "invalid_request_error", "Invalid integer", code="parameter_invalid_integer"
)
_REUSED = stripe_error(400, "idempotency_error", "Keys can only be used with the same parameters")
_FORBIDDEN = stripe_error(403, "invalid_request_error", "The key does not have access")
_MISSING = stripe_error(
    404, "invalid_request_error", "No such payment_method", code="resource_missing"
)
_IN_USE = stripe_error(409, "invalid_request_error", "in use", code="idempotency_key_in_use")
_RATE = stripe_error(429, "invalid_request_error", "Too many requests", code="rate_limit")
_LOCKED = stripe_error(429, "invalid_request_error", "Locked", code="lock_timeout")
_UNAVAILABLE = stripe_error(503, "api_error", "Service unavailable")

ROWS = [
    Row(
        "402 Stripe's declining test card",
        _nothing,
        stripe.CardError,
        True,
        source="pm_card_chargeDeclined",
    ),
    Row("402 the server's declined card", _nothing, stripe.CardError, True, source=DECLINED_CARD),
    Row("402 an injected decline", _fault(FakeGatewayFault.DECLINE), stripe.CardError, True),
    Row("400 invalid_request_error", _canned(_INVALID), stripe.InvalidRequestError, True),
    # the key's first request may have moved money: reconcile, never fail
    Row("400 idempotency_error", _canned(_REUSED), stripe.IdempotencyError, False),
    Row(
        "401 a live key at the fake",
        _nothing,
        stripe.AuthenticationError,
        True,
        api_key="sk_live_x",
    ),
    Row("403 permission", _canned(_FORBIDDEN), stripe.PermissionError, True),
    Row("404 resource_missing", _canned(_MISSING), stripe.InvalidRequestError, True),
    Row("409 idempotency_key_in_use", _canned(_IN_USE), stripe.APIError, False),
    Row("429 rate_limit", _canned(_RATE), stripe.RateLimitError, False),
    Row("429 lock_timeout", _canned(_LOCKED), stripe.RateLimitError, False),
    Row("500 api_error", _fault(FakeGatewayFault.FAIL_BEFORE_PROCESSING), stripe.APIError, False),
    Row("502 not Stripe's body", _canned(Reply(502, "Bad Gateway")), stripe.APIError, False),
    Row("503 api_error", _canned(_UNAVAILABLE), stripe.APIError, False),
    Row("answer dropped after processing", _fault(DROP), stripe.APIConnectionError, False),
    Row(
        "connection closed unanswered",
        _canned(Reply(0, drop=True)),
        stripe.APIConnectionError,
        False,
    ),
    Row("timeout, processed", _held, stripe.APIConnectionError, False, timeout=0.3),
]


def _charge_context(source: str) -> CallContext:
    request = charge_request(f"order-{uuid.uuid4().hex[:8]}")
    request["source"] = source
    return CallContext(f"default:t:{uuid.uuid4().hex}:stripe.charge", request, 1, "stripe.charge")


@pytest.mark.parametrize("row", ROWS, ids=[row.answer for row in ROWS])
def test_each_answer_stripe_documents_is_classified(
    stripe_fake: FakeGatewayServer, row: Row
) -> None:
    adapter = StripeAdapter(
        row.api_key, base_url=stripe_fake.url, timeout=row.timeout, attempt_timeout=5
    )
    row.arrange(stripe_fake)
    with pytest.raises(stripe.StripeError) as raised:
        adapter.charge.send(_charge_context(row.source))
    assert type(raised.value) is row.raised, repr(raised.value)
    assert adapter.charge.is_definite_failure(raised.value) is row.definite


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        ({"amount": 0, "currency": "usd", "reference": "o", "source": "pm_card_visa"}, "amount"),
        ({"amount": True, "currency": "usd", "reference": "o", "source": "pm_x"}, "amount"),
        ({"amount": 100, "currency": "dollars", "reference": "o", "source": "pm_x"}, "currency"),
        ({"amount": 100, "currency": "usd", "source": "pm_card_visa"}, "reference"),
        ({"amount": 100, "currency": "usd", "reference": "o"}, "source"),
        ({**charge_request("o"), "capture_method": "manual"}, "capture_method"),
        ({**charge_request("o"), "metadata": {"agboss_key": "mine"}}, "metadata"),
        ("not a dict", "dict"),
    ],
)
def test_a_malformed_request_is_refused_naming_the_field_and_never_sent(
    stripe_fake: FakeGatewayServer, request_: Any, field: str
) -> None:
    adapter = adapter_for(stripe_fake.url)
    context = CallContext("default:t:t-1:stripe.charge", request_, 1, "stripe.charge")
    with pytest.raises(ValueError, match=field) as raised:
        adapter.charge.send(context)
    assert isinstance(raised.value, InvalidStripeRequestError)
    assert adapter.charge.is_definite_failure(raised.value)  # nothing reached Stripe
    assert stripe_fake.gateway.requests == []


@pytest.mark.parametrize(
    ("request_", "raised"),
    [
        ({"payment_id": "pi_000000000000000000000000", "amount": None}, "No such payment_intent"),
        (None, "cannot capture 5000"),  # more than was authorised
    ],
)
def test_a_capture_stripe_refuses_is_definite(
    stripe_fake: FakeGatewayServer, request_: Any, raised: str
) -> None:
    adapter = adapter_for(stripe_fake.url)
    if request_ is None:
        authorised = adapter.authorize.send(_charge_context("pm_card_visa"))
        request_ = {"payment_id": authorised["id"], "amount": 5000}
    context = CallContext("default:t:t-2:stripe.capture", request_, 1, "stripe.capture")
    with pytest.raises(stripe.InvalidRequestError, match=raised) as error:
        adapter.capture.send(context)
    assert adapter.capture.is_definite_failure(error.value)


def test_a_request_under_a_key_still_in_flight_gets_stripe_s_409_and_is_unknown(
    stripe_fake: FakeGatewayServer,
) -> None:
    adapter = adapter_for(stripe_fake.url)
    context = _charge_context("pm_card_visa")
    hold = stripe_fake.gateway.hold(before_processing=True)
    first = Background(lambda: adapter.charge.send(context), name="first-send")
    hold.wait_reached()
    with pytest.raises(stripe.APIError) as raised:
        adapter.charge.send(context)
    assert raised.value.http_status == 409
    assert not adapter.charge.is_definite_failure(raised.value)
    hold.release()
    assert first.join()["status"] == "succeeded"
    assert len(stripe_fake.gateway.payments) == 1


def test_a_500_is_saved_under_its_key_and_replayed_to_every_repeat(
    stripe_fake: FakeGatewayServer,
) -> None:
    adapter = adapter_for(stripe_fake.url)
    context = _charge_context("pm_card_visa")
    stripe_fake.gateway.inject_fault(FakeGatewayFault.FAIL_BEFORE_PROCESSING)
    errors = []
    for _ in range(2):
        with pytest.raises(stripe.APIError) as raised:
            adapter.charge.send(context)
        errors.append(raised.value)
    assert [e.http_status for e in errors] == [500, 500]
    assert [e.headers.get("idempotent-replayed") for e in errors] == [None, "true"]
    outcomes = [r.outcome for r in stripe_fake.gateway.requests]
    assert outcomes == [GatewayRequestOutcome.NOT_PROCESSED, GatewayRequestOutcome.REPLAYED]
    assert stripe_fake.gateway.payments == []


def test_a_repeat_is_answered_with_idempotent_replayed(stripe_fake: FakeGatewayServer) -> None:
    adapter = adapter_for(stripe_fake.url)
    params: Any = {**charge_request("o-r"), "confirm": True, "payment_method": "pm_card_visa"}
    del params["reference"], params["source"]
    options: Any = {"idempotency_key": "replayed-key"}
    first = adapter.client.v1.payment_intents.create(params=params, options=options)
    again = adapter.client.v1.payment_intents.create(params=params, options=options)
    assert again.to_dict() == first.to_dict()
    assert "idempotent-replayed" not in first.last_response.headers
    assert again.last_response.headers["idempotent-replayed"] == "true"


def test_the_adapter_declares_stripe_s_retention_and_key_limit_on_every_call() -> None:
    adapter = adapter_for("http://127.0.0.1:9")
    assert [call.name for call in adapter.calls] == [
        "stripe.charge",
        "stripe.authorize",
        "stripe.capture",
        "stripe.refund",
        "stripe.void",
    ]
    for call in adapter.calls:
        assert call.key_retention_seconds == 24 * 3600
        assert call.max_key_length == MAX_KEY_LENGTH == 255
        assert not call.lookup_proves_absence
        assert call.transaction_id is not None and call.transaction_id({"id": "pi_1"}) == "pi_1"


def test_the_sdk_client_has_no_retries_of_its_own_and_the_adapter_s_timeout() -> None:
    adapter = StripeAdapter(API_KEY, base_url="http://127.0.0.1:9", timeout=7, attempt_timeout=60)
    requestor = adapter.client._requestor
    assert requestor._options.max_network_retries == 0
    assert isinstance(requestor._client, stripe.RequestsClient)
    assert requestor._client._timeout == adapter.http_timeout == 7.0
    assert requestor._options.base_addresses["api"] == "http://127.0.0.1:9"


@pytest.mark.parametrize(("timeout", "attempt_timeout"), [(120, 120), (0, 120), (30, 20)])
def test_an_sdk_timeout_not_below_the_attempt_s_bound_is_refused(
    timeout: float, attempt_timeout: float
) -> None:
    with pytest.raises(ValueError, match="timeout"):
        StripeAdapter(API_KEY, timeout=timeout, attempt_timeout=attempt_timeout)


def test_without_base_url_the_sdk_keeps_its_own_address() -> None:
    adapter = StripeAdapter(API_KEY)
    assert adapter.client._requestor._options.base_addresses["api"] == stripe.DEFAULT_API_BASE
