"""Every answer PayPal documents, as the SDK raises it, classified definite or unknown.

Definite means "nothing was processed": the core marks the intent FAILED and may send it
again under the same key. Each row makes the fake answer one status and body (the
dialect's ``answer_next``, a fault, a hold, a declined card), sends through the SDK and
holds the exception against the adapter's verdict; a definite row also shows that no
payment exists at the gateway.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest

from celery_agboss.adapters.paypal import (
    MAX_REQUEST_ID_LENGTH,
    ORDER_KEY_RETENTION,
    PAYMENTS_KEY_RETENTION,
    PayPalAdapter,
    issues_of,
)
from celery_agboss.core.outbound import CallContext
from celery_agboss.testing.gateway_server import FakeGatewayServer
from celery_agboss.testing.gateway_types import FakeGatewayFault
from tests.adapters.conftest import AdapterOn, ServeFn
from tests.adapters.paypal_support import (
    CLIENT_ID,
    CLIENT_SECRET,
    adapter_for,
    charge_request,
    declined_request,
    dialect_of,
)

ORDERS, CAPTURE, REFUND = "/v2/checkout/orders", "/capture", "/refund"
TOKEN = "/v1/oauth2/token"


def _error(status: int, name: str, issue: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"name": name, "message": name.lower(), "debug_id": "f00d2b1e"}
    if issue is not None:
        body["details"] = [{"issue": issue, "description": issue.lower()}]
    return body


@dataclass(frozen=True)
class Row:
    """One documented answer: how to make the fake give it, what the SDK must raise."""

    arm: Callable[[FakeGatewayServer], Any]
    raises: str  # the exception's class name
    definite: bool
    operation: str = "charge"  # or "refund" (on a capture made first)
    request: Callable[[str], dict[str, Any]] = charge_request
    issues: frozenset[str] = field(default_factory=frozenset)


def _canned(status: int, body: Any, path: str) -> Callable[[FakeGatewayServer], Any]:
    return lambda server: dialect_of(server).answer_next(status, body, path=path)


def _paypal(status: int, name: str, issue: str | None, path: str, **row: Any) -> Row:
    found = frozenset({issue}) if issue else frozenset()
    raises = row.pop("raises", "ErrorException")
    return Row(_canned(status, _error(status, name, issue), path), raises, issues=found, **row)


def _fault(fault: FakeGatewayFault) -> Callable[[FakeGatewayServer], Any]:
    return lambda server: server.gateway.inject_fault(fault)


def _nothing(server: FakeGatewayServer) -> None:
    """The request itself carries what PayPal refuses."""


_DECLINED_CAPTURE = {
    "id": "ORDER-DECLINED",
    "status": "COMPLETED",
    "purchase_units": [
        {
            "amount": {"currency_code": "USD", "value": "10.00"},
            "payments": {
                "captures": [
                    {
                        "id": "CAP-1",
                        "status": "DECLINED",
                        "amount": {"currency_code": "USD", "value": "10.00"},
                    }
                ]
            },
        }
    ],
}

ROWS: dict[str, Row] = {
    "422 INSTRUMENT_DECLINED (a declined card)": Row(
        _nothing,
        "ErrorException",
        True,
        request=declined_request,
        issues=frozenset({"INSTRUMENT_DECLINED"}),
    ),
    "201 with the capture DECLINED": Row(
        _canned(201, _DECLINED_CAPTURE, CAPTURE), "PayPalDeclinedError", True
    ),
    "400 INVALID_REQUEST": _paypal(
        400, "INVALID_REQUEST", "INVALID_PARAMETER_SYNTAX", ORDERS, definite=True
    ),
    "401 AUTHENTICATION_FAILURE": _paypal(
        401, "AUTHENTICATION_FAILURE", None, ORDERS, definite=True
    ),
    "401 from the token endpoint": Row(
        _canned(
            401,
            {"error": "invalid_client", "error_description": "Client Authentication failed"},
            TOKEN,
        ),
        "AuthValidationException",
        True,
    ),
    "403 NOT_AUTHORIZED": _paypal(
        403, "NOT_AUTHORIZED", "PERMISSION_DENIED", CAPTURE, definite=True
    ),
    "404 RESOURCE_NOT_FOUND": _paypal(
        404, "RESOURCE_NOT_FOUND", "INVALID_RESOURCE_ID", CAPTURE, definite=True
    ),
    "422 ORDER_NOT_APPROVED": _paypal(
        422, "UNPROCESSABLE_ENTITY", "ORDER_NOT_APPROVED", CAPTURE, definite=True
    ),
    "422 ORDER_ALREADY_CAPTURED": _paypal(
        422, "UNPROCESSABLE_ENTITY", "ORDER_ALREADY_CAPTURED", CAPTURE, definite=False
    ),
    "422 DUPLICATE_INVOICE_ID": _paypal(
        422, "UNPROCESSABLE_ENTITY", "DUPLICATE_INVOICE_ID", CAPTURE, definite=False
    ),
    "422 CAPTURE_FULLY_REFUNDED (refund)": _paypal(
        422,
        "UNPROCESSABLE_ENTITY",
        "CAPTURE_FULLY_REFUNDED",
        REFUND,
        definite=False,
        operation="refund",
    ),
    "422 REFUND_AMOUNT_EXCEEDED (refund)": _paypal(
        422,
        "UNPROCESSABLE_ENTITY",
        "REFUND_AMOUNT_EXCEEDED",
        REFUND,
        definite=True,
        operation="refund",
    ),
    "409 PREVIOUS_REQUEST_IN_PROGRESS": _paypal(
        409, "RESOURCE_CONFLICT", "PREVIOUS_REQUEST_IN_PROGRESS", CAPTURE, definite=False
    ),
    "429 RATE_LIMIT_REACHED": _paypal(429, "RATE_LIMIT_REACHED", None, CAPTURE, definite=False),
    "500 INTERNAL_SERVER_ERROR (orders)": _paypal(
        500, "INTERNAL_SERVER_ERROR", None, CAPTURE, definite=False
    ),
    "500 INTERNAL_SERVER_ERROR (payments)": _paypal(
        500,
        "INTERNAL_SERVER_ERROR",
        None,
        REFUND,
        definite=False,
        operation="refund",
        raises="ApiException",
    ),
    "502 bad gateway": Row(_canned(502, "Bad Gateway", CAPTURE), "ErrorException", False),
    "503 SERVICE_UNAVAILABLE (failed before processing)": Row(
        _fault(FakeGatewayFault.FAIL_BEFORE_PROCESSING), "ErrorException", False
    ),
    "connection dropped after processing": Row(
        _fault(FakeGatewayFault.ANSWER_THEN_DROP), "ConnectionError", False
    ),
    "a malformed request (no source)": Row(
        _nothing,
        "PayPalRequestError",
        True,
        request=lambda ref: {k: v for k, v in charge_request(ref).items() if k != "source"},
    ),
}


def _send(adapter: PayPalAdapter, row: Row, server: FakeGatewayServer) -> BaseException:
    call = adapter.charge
    request: dict[str, Any] = row.request("order-err")
    if row.operation == "refund":
        paid = adapter.charge.send(CallContext("pay:paypal.charge", request, 1, call.name))
        call, request = adapter.refund, {"payment_id": paid["id"], "amount": 300}
    row.arm(server)
    with pytest.raises(Exception) as raised:
        call.send(CallContext(f"err:{call.name}", request, 1, call.name))
    exc = raised.value
    assert call.is_definite_failure(exc) is row.definite, f"{type(exc).__name__}: {exc}"
    return exc


@pytest.mark.parametrize("label", list(ROWS))
def test_each_documented_answer_is_classified(served: ServeFn, label: str) -> None:
    row = ROWS[label]
    server = served("paypal")
    exc = _send(adapter_for(server.url), row, server)
    assert type(exc).__name__ == row.raises, f"{type(exc).__name__}: {exc}"
    assert issues_of(exc) == row.issues
    moved = server.gateway.refunds if row.operation == "refund" else server.gateway.payments
    if row.definite:
        assert moved == [], "a definite failure processed something"


def test_a_timeout_is_unknown(served: ServeFn) -> None:
    server = served("paypal")
    adapter = adapter_for(server.url, timeout=0.5)
    call = adapter.charge
    with (
        server.gateway.hold(before_processing=True, timeout=10),
        pytest.raises(Exception) as raised,
    ):
        call.send(CallContext("slow:paypal.charge", charge_request("slow"), 1, call.name))
    assert type(raised.value).__name__ == "ReadTimeout"
    assert call.is_definite_failure(raised.value) is False


def test_the_adapter_declares_paypal_s_retention_and_builds_the_sdk_without_retries(
    adapter_on: AdapterOn,
) -> None:
    server, adapter = adapter_on("paypal")
    retention = {call.name: call.key_retention for call in adapter.calls}
    assert retention == {
        "paypal.charge": timedelta(hours=6),  # the order's key: what finds the capture
        "paypal.authorize": timedelta(hours=6),
        "paypal.capture": timedelta(days=45),
        "paypal.refund": timedelta(days=45),
        "paypal.void": timedelta(days=45),
    }
    assert {c.key_retention_seconds for c in adapter.calls} == {
        ORDER_KEY_RETENTION.total_seconds(),
        PAYMENTS_KEY_RETENTION.total_seconds(),
    }
    assert {call.max_key_length for call in adapter.calls} == {MAX_REQUEST_ID_LENGTH} == {108}
    config = adapter.client.config
    assert (config.timeout, config.max_retries, config.retry_statuses) == (2, 0, [])
    assert config.get_base_uri() == server.url
    for transport in config.http_client.session.adapters.values():
        assert transport.max_retries.total == 0 and not transport.max_retries.status_forcelist
    assert config.http_client.timeout == 2


def test_the_http_timeout_must_stay_below_the_attempt_timeout() -> None:
    with pytest.raises(ValueError, match="below agboss_attempt_timeout"):
        PayPalAdapter(CLIENT_ID, CLIENT_SECRET, timeout=120, attempt_timeout=120)
    live = PayPalAdapter(CLIENT_ID, CLIENT_SECRET, environment="production")
    assert live.client.config.get_base_uri() == "https://api-m.paypal.com"
    assert PayPalAdapter(CLIENT_ID, CLIENT_SECRET).client.config.get_base_uri() == (
        "https://api-m.sandbox.paypal.com"
    )
