"""A Checkout.com payment answered 202 ``Pending`` is a result, never "nothing processed".

Checkout.com answers a payment that needs 3-D Secure (or an asynchronous method) with
HTTP 202 and its ``PaymentAcceptedResponse``: ``id``, ``status: "Pending"``,
``reference``, ``3ds`` and ``_links``, no amount, currency or ``approved``. The adapter
compared that answer's amount and currency with the request's and raised
``AnotherRequestsAnswerError`` (definite): the intent FAILED while the order's payment
was Pending at Checkout.com, a resend under the key got the same 202 (a 2xx is kept) and
failed the same way, and the app's retry under a new business key paid again. Send now
compares the reference the 202 carries, reads the payment it names and returns it,
status ``Pending``; reconcile takes a listed Pending payment as found, the same result.
The fake answers as Checkout.com does (``CheckoutDialect.pend_next``): the tests go
through the engine and count the payments at the fake.

The documented tasks of docs/gateways.md (Checkout.com's and PayPal's) are run as
written: they mark an order paid only on a final paid status (``Captured`` and approved;
``COMPLETED``) for the order's amount and currency, never on a Pending receipt.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import celery_agboss.testing.dialects.paypal_payments as paypal_payments
from celery_agboss.adapters.checkout import CheckoutNoAnswerError
from celery_agboss.adapters.common import AnotherRequestsAnswerError
from celery_agboss.core.outbound import CallContext, Completed, Lookup
from celery_agboss.core.store_protocol import IntentStatus
from celery_agboss.errors import OutboundCallOutcomeUnknownError
from celery_agboss.testing.dialects.checkout import checkout_id
from celery_agboss.testing.gateway_server import FakeGatewayServer
from celery_agboss.testing.gateway_types import GatewayRequestOutcome
from tests.adapters import paypal_support
from tests.adapters.checkout_support import TEST_TOKEN, adapter_for, charge_request, dialect_of
from tests.adapters.conftest import AdapterOn, ServeFn
from tests.engine.helpers import Shop, business_intent_key

PROCESSED = GatewayRequestOutcome.PROCESSED
REPLAYED = GatewayRequestOutcome.REPLAYED
DOCS = Path(__file__).resolve().parents[2] / "docs" / "gateways.md"


def _pending_server(served: ServeFn) -> FakeGatewayServer:
    server = served("checkout")
    dialect_of(server).pend_next()
    return server


def _key(shop: Shop, business_key: str) -> str:
    return business_intent_key(shop.settings, business_key, "checkout.charge")


def test_a_charge_answered_202_pending_is_a_pending_result_not_a_failure(
    served: ServeFn, shop: Shop
) -> None:
    server = _pending_server(served)
    adapter = adapter_for(server.url)
    with shop.start("order-3ds") as ctx:
        receipt = ctx.outbound(adapter.charge, charge_request("order-3ds"), business_key="o:3ds")

    [payment] = server.gateway.payments
    assert receipt == {
        "id": checkout_id(payment["id"]),
        "status": "Pending",
        "reference": "order-3ds",
        "approved": False,  # the fake's reading of a payment not approved yet
        "amount": 1000,
        "currency": "usd",
    }
    intent = shop.store.read_intent(_key(shop, "o:3ds"))
    assert intent is not None and intent.status is IntentStatus.COMPLETED
    assert [r.outcome for r in server.gateway.requests_for(_key(shop, "o:3ds"))] == [PROCESSED]


def test_a_pending_charge_resent_under_its_key_gets_the_same_payment(
    served: ServeFn, shop: Shop
) -> None:
    server = _pending_server(served)
    adapter = adapter_for(server.url)
    key, request = "default:t:o-p:checkout.charge", charge_request("order-p")
    first = adapter.charge.send(CallContext(key, request, 1, adapter.charge.name))
    again = adapter.charge.send(CallContext(key, request, 2, adapter.charge.name, True))

    assert first == again and first["status"] == "Pending"
    assert len(server.gateway.payments) == 1
    assert [r.outcome for r in server.gateway.requests_for(key)] == [PROCESSED, REPLAYED]


def test_a_pending_charge_whose_answer_was_lost_is_reconciled_as_pending(
    served: ServeFn, shop: Shop
) -> None:
    """Reconcile lists the reference and takes the Pending payment (``approved: false``
    as the fake reads it) as this call's: never skipped as declined, never resent."""
    server = _pending_server(served)
    adapter = adapter_for(server.url)
    request = charge_request("order-lost")
    server.hold_next_answer(timeout=0.2, reference="order-lost")  # made, answer dropped
    shop.unknown("order-lost", adapter.charge, request, business_key="o:lost")
    receipt = shop.reconciled("order-lost", adapter.charge, request, business_key="o:lost")

    [payment] = server.gateway.payments
    assert receipt["id"] == checkout_id(payment["id"]) and receipt["status"] == "Pending"
    assert (receipt["amount"], receipt["currency"]) == (1000, "usd")
    assert [r.outcome for r in server.gateway.requests_for(_key(shop, "o:lost"))] == [PROCESSED]
    # Once the customer completes 3-D Secure, the same payment reads as captured.
    dialect_of(server).complete_pending(receipt["id"])
    key = _key(shop, "o:lost")
    context = CallContext(key, request, 2, adapter.charge.name)
    answer = adapter.charge.reconcile(context, Lookup(key, request, 2, None, timedelta(0)))
    assert answer == Completed({**receipt, "status": "Captured", "approved": True})


def test_a_202_naming_another_requests_payment_is_refused(
    adapter_on: AdapterOn, shop: Shop
) -> None:
    """What tells a 202 from another request's: its reference, then the payment it names
    (its amount, currency and key); both refusals are definite."""
    server, adapter = adapter_on("checkout")
    dialect = dialect_of(server)
    with shop.start("other") as ctx:
        other = ctx.outbound(adapter.charge, charge_request("order-x", 500), business_key="x")
    links = {"self": {"href": f"{server.url}/payments/{other['id']}"}}
    for reference in ("order-y", "order-x"):  # another reference; the same, another payment
        accepted = {"id": other["id"], "status": "Pending", "reference": reference}
        dialect.answer_next(202, {**accepted, "_links": links}, operation="payment")
        key = f"default:t:{reference}:checkout.charge"
        context = CallContext(key, charge_request("order-x"), 1, adapter.charge.name)
        with pytest.raises(AnotherRequestsAnswerError) as refused:
            adapter.charge.send(context)
        assert adapter.charge.is_definite_failure(refused.value) is True
    assert len(server.gateway.payments) == 1


def test_a_202_whose_payment_cannot_be_read_leaves_the_outcome_unknown(
    adapter_on: AdapterOn, shop: Shop
) -> None:
    server, adapter = adapter_on("checkout")
    accepted = {"id": "pay_notreadable", "status": "Pending", "reference": "order-u"}
    dialect_of(server).answer_next(202, accepted, operation="payment")
    key = "default:t:order-u:checkout.charge"
    with pytest.raises(CheckoutNoAnswerError) as unread:
        adapter.charge.send(CallContext(key, charge_request("order-u"), 1, adapter.charge.name))
    assert adapter.charge.is_definite_failure(unread.value) is False
    with shop.start("order-u") as ctx, pytest.raises(OutboundCallOutcomeUnknownError):
        dialect_of(server).answer_next(202, accepted, operation="payment")
        ctx.outbound(adapter.charge, charge_request("order-u"), business_key="o:u")
    intent = shop.store.read_intent(_key(shop, "o:u"))
    assert intent is not None and intent.status is IntentStatus.PENDING


# --- the documented tasks ------------------------------------------------------------------


class _App:
    """Celery's ``app`` as the documented task needs it: ``@app.task(...)`` keeps the
    function, which the test calls with a delivery as ``self``."""

    def task(self, **options: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        return lambda fn: fn


def _documented_task(section: str, heading: str, adapter_name: str, adapter: Any) -> Any:
    """``charge_order`` as docs/gateways.md writes it (from ``@app.task`` to the end of the
    block), and the payment ids its ``mark_paid`` was given."""
    text = DOCS.read_text(encoding="utf-8")
    part = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    part = part.split(f"\n### {heading}\n", 1)[1]
    block = part.split("```python\n", 1)[1].split("\n```", 1)[0]
    marked: list[str] = []

    def mark_paid(conn: Any, order_id: Any, payment_id: str) -> None:
        marked.append(payment_id)

    namespace: dict[str, Any] = {"app": _App(), "PaymentTask": object, "mark_paid": mark_paid}
    namespace[adapter_name] = adapter
    exec(compile(block[block.index("@app.task") :], str(DOCS), "exec"), namespace)
    return namespace["charge_order"], marked


def _run(shop: Shop, execution_id: str, task: Any, *args: Any) -> Any:
    with shop.start(execution_id) as ctx:
        return task(ctx, *args)


def test_the_documented_checkout_task_marks_paid_only_a_captured_payment(
    served: ServeFn, shop: Shop
) -> None:
    server = _pending_server(served)
    adapter = adapter_for(server.url)
    task, marked = _documented_task("Checkout.com", "Example", "checkout", adapter)

    pending = _run(shop, "order-3ds", task, "order-3ds", TEST_TOKEN)
    assert pending["status"] == "Pending" and marked == [], "marked paid on a Pending payment"
    paid = _run(shop, "order-card", task, "order-card", TEST_TOKEN)
    assert paid["status"] == "Captured" and marked == [paid["id"]]
    assert len(server.gateway.payments) == 2


def test_the_documented_paypal_task_marks_paid_only_a_completed_capture(
    served: ServeFn, shop: Shop, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An order's capture PENDING (an eCheck, ``PENDING_REVIEW``) is credited to nobody
    yet; the documented task marked the order paid on it."""
    server = served("paypal")
    adapter = paypal_support.adapter_for(server.url)
    task, marked = _documented_task("PayPal", "Usage", "paypal", adapter)
    shown = paypal_payments.PayPalPayments.capture_body
    pending_orders: set[str] = set()

    def capture_body(self: Any, payment: Any, part: Any) -> Any:
        body = shown(self, payment, part)
        if part is None and payment.get("reference") in pending_orders:
            body = {**body, "status": "PENDING", "status_details": {"reason": "PENDING_REVIEW"}}
        return body

    monkeypatch.setattr(paypal_payments.PayPalPayments, "capture_body", capture_body)
    pending_orders.add("order-7")
    pending = _run(shop, "order-7", task, 7, paypal_support.VAULT_ID)
    assert pending["status"] == "PENDING" and marked == [], "marked paid on a PENDING capture"
    paid = _run(shop, "order-8", task, 8, paypal_support.VAULT_ID)
    assert paid["status"] == "COMPLETED" and marked == [paid["id"]]
