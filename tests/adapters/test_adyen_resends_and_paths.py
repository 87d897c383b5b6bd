"""Resends after a ``NotSent`` nothing proved, payment ids in the URL path, and the fake's
Adyen dialect answering as Adyen does.

Adyen has no lookup, so after a lost answer the next attempt resends under the same key.
A refusal Adyen gives before it reads the key (401, 403, 404, a validation) says nothing
of the first attempt, which may have charged: it leaves the intent pending, and once the
cause is fixed the key's replay settles it with the one payment. Only answers under the
key (a ``Refused``, replayed or fresh) stay definite on a resend. Stripe's charge (its
search lags) and PayPal's refund (replayed by key, nothing read) have the same rule.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import pytest
import stripe
from Adyen import exceptions as sdk

from celery_agboss.adapters.adyen import (
    MAX_KEY_LENGTH,
    AdyenAdapter,
    AdyenPaymentRefused,
    AdyenRequestError,
    AdyenUnexpectedAnswer,
)
from celery_agboss.adapters.common import AnotherRequestsAnswerError
from celery_agboss.adapters.resends import ResendRefusedError
from celery_agboss.core.keys import fit_key
from celery_agboss.core.outbound import CallContext
from celery_agboss.core.store_protocol import IntentStatus
from celery_agboss.errors import OutboundCallOutcomeUnknownError
from celery_agboss.testing.dialects.adyen import (
    CURRENCY_MISMATCH,
    AdyenDialect,
    adyen_error,
    psp_reference_of,
)
from celery_agboss.testing.dialects.stripe_wire import stripe_error
from celery_agboss.testing.gateway_server import FakeGatewayServer, GatewayCall, Reply
from celery_agboss.testing.gateway_types import FakeGatewayFault, GatewayRequestOutcome
from celery_agboss.webhooks import ADYEN_PSP_REFERENCE
from tests.adapters import paypal_support, stripe_support
from tests.adapters.adyen_support import (
    a_refund_of_a_charged_order,
    adapter_for,
    charge_request,
    declined_request,
)
from tests.adapters.conftest import AdapterOn, ServeFn
from tests.adapters.deliveries import lose_at_the_gateway, raised_then_retry_asked
from tests.engine.helpers import Shop, business_intent_key, step_intent_key

BLOCKED = "/blocked"
"""Where a worker refused by Adyen points: a route prefix that refuses as Adyen would."""

REFUSALS: dict[str, tuple[int, str, str, str] | None] = {
    # Adyen's error shape for what it refuses before reading the key.
    "401 key rotated": (401, "000", "HTTP Status Response - Unauthorized", "security"),
    "403 ip not allowed": (403, "010", "Not allowed", "security"),
    "404 wrong live prefix": None,  # nothing is served there
    "422 validation": (
        422,
        "702",
        "Required field 'merchantAccount' is not provided.",
        "validation",
    ),
}


def _refused_from_now_on(server: FakeGatewayServer, adapter: AdyenAdapter, refusal: str) -> str:
    """Point ``adapter`` (the next delivery's worker) where Adyen refuses every request;
    returns where it pointed before (to point it back once the worker is fixed)."""
    answer = REFUSALS[refusal]
    if answer is not None:
        status, code, message, kind = answer

        def refuse(call: GatewayCall) -> Reply:
            return adyen_error(status, code, message, kind)

        for path in ("/payments", "/payments/{psp}/refunds", "/payments/{psp}/captures"):
            server.route("POST", f"{BLOCKED}/v72{path}", refuse)
    before = adapter.payments_api.baseUrl
    _point(adapter, f"{server.url}{BLOCKED}/v72")
    return before


def _point(adapter: AdyenAdapter, root: str) -> None:
    """The SDK's documented hook ("Customizing Base URL"), as the adapter sets it."""
    adapter.payments_api.baseUrl = root
    adapter.modifications_api.baseUrl = root


def _status(shop: Shop, key: str) -> IntentStatus:
    intent = shop.store.read_intent(key)
    assert intent is not None
    return intent.status


def _dialect(server: FakeGatewayServer) -> AdyenDialect:
    assert isinstance(server.dialect, AdyenDialect), server.dialect
    return server.dialect


# --- F1: a resend refused before the key is read is never "nothing processed" -----------------


@pytest.mark.parametrize("refusal", sorted(REFUSALS))
def test_a_charge_resent_after_a_lost_answer_and_refused_before_the_key_stays_pending(
    refusal: str, served: ServeFn, shop: Shop
) -> None:
    server = served("adyen")
    adapter, gateway = adapter_for(server.url), server.gateway
    request, order_key = charge_request("order-1"), "order:1:attempt:1"
    gateway.inject_fault(FakeGatewayFault.ANSWER_THEN_DROP)
    shop.unknown("click-1", adapter.charge, request, business_key=order_key)
    [charged] = gateway.payments  # attempt 1 charged; its answer was lost
    key = business_intent_key(shop.settings, order_key, "adyen.charge")

    # The retry runs on a worker Adyen refuses: reconcile says NotSent (no lookup), it resends.
    fixed = _refused_from_now_on(server, adapter, refusal)
    with shop.start("click-1") as second, pytest.raises(OutboundCallOutcomeUnknownError) as raised:
        second.outbound(adapter.charge, request, business_key=order_key)
    assert isinstance(raised.value.__cause__, ResendRefusedError), raised.value.__cause__
    assert "may have been processed" in str(raised.value.__cause__)
    assert _status(shop, key) is IntentStatus.PENDING  # never FAILED: the app never pays again

    # Once the worker is fixed the key's replay settles it with the first payment.
    _point(adapter, fixed)
    with shop.start("click-1") as third:
        receipt = third.outbound(adapter.charge, request, business_key=order_key)
    assert receipt["id"] == psp_reference_of(charged["id"])
    assert _status(shop, key) is IntentStatus.COMPLETED
    assert len(gateway.payments) == 1


def _lost_refund_resent_and_refused(
    shop: Shop,
    server: FakeGatewayServer,
    adapter: Any,
    refund: tuple[Any, dict[str, Any], str],
    refuse: Callable[[], object],
) -> BaseException:
    """``refund`` (a charge's id, a refund request, its business key) lost at the gateway;
    ``refuse`` then makes the gateway refuse, and the resend stays pending (unknown, one
    refund made). Returns what the resend raised."""
    _, request, business_key = refund
    key = lose_at_the_gateway(shop, server, "undo", adapter.refund, request, business_key)
    refuse()
    with shop.start("undo") as second, pytest.raises(OutboundCallOutcomeUnknownError) as raised:
        second.outbound(adapter.refund, request, business_key=business_key)
    assert _status(shop, key) is IntentStatus.PENDING
    assert len(server.gateway.refunds) == 1
    return raised.value


def test_a_refund_resent_after_a_lost_answer_and_refused_403_stays_pending(
    adapter_on: AdapterOn, shop: Shop
) -> None:
    server, adapter = adapter_on("adyen")
    refund = a_refund_of_a_charged_order(shop, adapter, "order-2")
    refused = partial(_refused_from_now_on, server, adapter, "403 ip not allowed")
    _lost_refund_resent_and_refused(shop, server, adapter, refund, refused)


def test_on_the_first_attempt_a_refusal_is_still_definite(
    adapter_on: AdapterOn, shop: Shop
) -> None:
    server, adapter = adapter_on("adyen")
    _refused_from_now_on(server, adapter, "403 ip not allowed")
    with shop.start("task-1") as first, pytest.raises(sdk.AdyenAPIInvalidPermission):
        first.outbound(adapter.charge, charge_request("order-3"))
    key = step_intent_key(shop.settings, "task-1", "adyen.charge")
    assert _status(shop, key) is IntentStatus.FAILED
    assert server.gateway.payments == []


def test_a_refusal_whose_answer_was_lost_is_replayed_to_the_resend_and_stays_definite(
    served: ServeFn, shop: Shop
) -> None:
    """Adyen keeps a ``Refused`` under its key: the resend gets it back (definite), even
    once the card would pay."""
    server = served("adyen")
    adapter, gateway = adapter_for(server.url), server.gateway
    request = declined_request("order-4")
    shop.lose_the_answer("task-4", adapter.charge, request, gateway=gateway)
    server.declined_cards = frozenset()  # the card would pay a new request now
    with shop.start("task-4") as second, pytest.raises(AdyenPaymentRefused):
        second.outbound(adapter.charge, request)
    assert _status(shop, step_intent_key(shop.settings, "task-4", "adyen.charge")) is (
        IntentStatus.FAILED
    )
    assert gateway.payments == [] and len(gateway.declined_payments) == 1
    assert [r.outcome for r in gateway.requests] == [
        GatewayRequestOutcome.DECLINED,
        GatewayRequestOutcome.REPLAYED,
    ]


def test_stripe_a_charge_resent_after_a_lagging_search_and_refused_401_stays_pending(
    served: ServeFn, shop: Shop
) -> None:
    server = served("stripe")
    stripe_support.dialect_of(server).search_lag = 600  # reconcile's search finds nothing
    adapter, gateway = stripe_support.adapter_for(server.url), server.gateway
    request = stripe_support.charge_request("order-5")
    shop.lose_the_answer("task-5", adapter.charge, request, gateway=gateway)

    def rotated(call: GatewayCall) -> Reply:  # the key was rolled; this worker has the old one
        return stripe_error(401, "invalid_request_error", "Invalid API Key provided: sk_t****")

    server.route("POST", "/v1/payment_intents", rotated)
    with shop.start("task-5") as second, pytest.raises(OutboundCallOutcomeUnknownError) as raised:
        second.outbound(adapter.charge, request)
    assert isinstance(raised.value.__cause__, ResendRefusedError), raised.value.__cause__
    key = step_intent_key(shop.settings, "task-5", "stripe.charge")
    assert _status(shop, key) is IntentStatus.PENDING
    assert len(gateway.payments) == 1


def test_paypal_a_refund_resent_by_replay_and_refused_403_stays_pending(
    adapter_on: AdapterOn, shop: Shop
) -> None:
    server, adapter = adapter_on("paypal")
    refund = paypal_support.a_refund_of_a_charged_order(shop, adapter, "order-6")
    dialect = paypal_support.dialect_of(server)
    refused = partial(dialect.answer_next, 403, path="/refund")  # NOT_AUTHORIZED
    raised = _lost_refund_resent_and_refused(shop, server, adapter, refund, refused)
    assert isinstance(raised.__cause__, ResendRefusedError), raised.__cause__


# --- F2: a payment_id is a pspReference, and another payment named is not ours ---------------


@pytest.mark.parametrize(
    "payment_id",
    [
        "{psp}/captures?x=",  # the refund would go to /payments/{psp}/captures
        "../{psp}",
        "{psp}#",
        "4111 1111 1111 1111",  # card data put where the payment goes: never echoed
        "{psp}0",  # 17 characters
    ],
)
def test_a_payment_id_that_is_not_a_psp_reference_is_refused_before_anything_is_sent(
    payment_id: str, served: ServeFn, shop: Shop
) -> None:
    server = served("adyen")
    adapter, gateway = adapter_for(server.url), server.gateway
    with shop.start("checkout") as ctx:
        psp = ctx.outbound(adapter.authorize, charge_request("order-7", 900))["id"]
    refund = {"payment_id": payment_id.format(psp=psp), "amount": 900, "currency": "usd"}
    with shop.start("refund-7") as ctx, pytest.raises(AdyenRequestError) as raised:
        ctx.outbound(adapter.refund, refund, business_key=f"refund:{psp}:1")
    assert "pspReference" in str(raised.value) and "4111" not in str(raised.value)
    assert [r.operation for r in gateway.requests] == ["charge"]  # nothing else sent
    assert gateway.payments[0]["amount_captured"] == 0


def test_a_modification_answer_naming_another_payment_is_unknown_on_the_first_attempt(
    adapter_on: AdapterOn,
) -> None:
    server, adapter = adapter_on("adyen")
    ours, theirs = "PSP0000000000042", "PSP0000000000043"

    def answer(call: GatewayCall) -> Reply:
        body = {"paymentPspReference": theirs, "pspReference": "RFND000000000001"}
        return Reply(201, {**body, "status": "received", "amount": call.body["amount"]})

    server.route("POST", f"/v72/payments/{ours}/refunds", answer)
    request = {"payment_id": ours, "amount": 500, "currency": "usd"}
    first = CallContext("refund-42:adyen.refund", request, 1, adapter.refund.name)
    with pytest.raises(AdyenUnexpectedAnswer, match=theirs) as raised:
        adapter.refund.send(first)
    assert adapter.refund.is_definite_failure(raised.value) is False
    # A resend's answer is the key's first: another request's, definite as before.
    again = CallContext(
        "refund-42:adyen.refund", request, 2, adapter.refund.name, after_possible_send=True
    )
    with pytest.raises(AnotherRequestsAnswerError) as replayed:
        adapter.refund.send(again)
    assert adapter.refund.is_definite_failure(replayed.value) is True


# --- the fake: Adyen's pspReferences, a Refused kept under its key, currencies ---------------


def test_every_psp_reference_the_fake_answers_is_adyen_s_16_letters_and_digits(
    adapter_on: AdapterOn, shop: Shop
) -> None:
    server, adapter = adapter_on("adyen")
    with shop.start("checkout") as ctx:
        held = ctx.outbound(adapter.authorize, charge_request("order-8", 900))
        captured = ctx.outbound(adapter.capture, {**_action(held), "amount": 900})
        refunded = ctx.outbound(adapter.refund, {**_action(held), "amount": 100})
        other = ctx.outbound(adapter.authorize, charge_request("order-9", 300))
        voided = ctx.outbound(adapter.void, {"payment_id": other["id"]})
    answered = [held["id"], captured["capture_id"], refunded["id"], voided["cancel_id"]]
    # The shape the webhooks check (celery_agboss.webhooks) and the adapter sends.
    assert all(ADYEN_PSP_REFERENCE.fullmatch(psp) for psp in answered), answered
    assert server.gateway.payments[0]["amount_captured"] == 900


def _action(payment: dict[str, Any]) -> dict[str, Any]:
    return {"payment_id": payment["id"], "currency": "usd"}


def test_a_refused_charge_resent_under_its_key_is_replayed_refused(adapter_on: AdapterOn) -> None:
    """Adyen: "If the Adyen payments platform already processed the request, the response
    to the first attempt will be returned" (API idempotency): a 200 Refused is that."""
    server, adapter = adapter_on("adyen")
    request = declined_request("order-10")
    with pytest.raises(AdyenPaymentRefused) as first:
        adapter.charge.send(CallContext("order-10:adyen.charge", request, 1, "adyen.charge"))
    server.declined_cards = frozenset()  # the card would pay a new request now
    with pytest.raises(AdyenPaymentRefused) as again:
        adapter.charge.send(CallContext("order-10:adyen.charge", request, 2, "adyen.charge"))
    assert again.value.psp_reference == first.value.psp_reference
    assert adapter.charge.is_definite_failure(again.value) is True
    assert server.gateway.payments == [] and len(server.declines) == 1


@pytest.mark.parametrize("kind", ["capture", "refund"])
def test_a_modification_in_another_currency_is_received_and_moves_nothing(
    kind: str, served: ServeFn, shop: Shop
) -> None:
    """Adyen: the currency "must match the currency used in authorisation"; it answers
    "received" and fails the modification by webhook ("Modification in different currency
    than authorisation")."""
    server = served("adyen")
    adapter, gateway = adapter_for(server.url), server.gateway
    paying = adapter.authorize if kind == "capture" else adapter.charge
    with shop.start("checkout") as ctx:
        payment = ctx.outbound(paying, charge_request("order-11"))["id"]
    call = getattr(adapter, kind)
    request = {"payment_id": payment, "amount": 1000, "currency": "eur"}  # a USD payment
    with shop.start(f"{kind}-11") as ctx:
        received = ctx.outbound(call, request)
    assert received["status"] == "received"
    assert gateway.refunds == [] and gateway.payments[0]["amount_captured"] == (
        0 if kind == "capture" else 1000
    )
    [failed] = _dialect(server).failed_modifications
    assert (failed.payment, failed.kind, failed.reason) == (payment, kind, CURRENCY_MISMATCH)
    assert failed.psp_reference == received["psp_reference"]
    # Its key's repeat is answered the same, and still moves nothing.
    key = fit_key(step_intent_key(shop.settings, f"{kind}-11", f"adyen.{kind}"), MAX_KEY_LENGTH)
    again = call.send(CallContext(key, request, 2, call.name))
    assert again["psp_reference"] == received["psp_reference"]
    assert gateway.refunds == [] and len(_dialect(server).failed_modifications) == 1


# --- a retry after a definite failure: nothing was processed, so its refusal is definite ---


def _retried_after_a_definite_refusal(
    shop: Shop, task_id: str, call: Any, request: dict[str, Any], refused: type[BaseException]
) -> list[BaseException]:
    """Attempt 1 refused definitely and the body retries (``autoretry_for``); three more
    deliveries send the same request and are refused the same way: what each body saw."""
    raised_then_retry_asked(shop, task_id, call, request, refused)
    key = step_intent_key(shop.settings, task_id, call.name)
    assert shop.store.read_intent(key).status is IntentStatus.FAILED
    seen: list[BaseException] = []
    for _ in range(3):
        shop.expire_leases()
        with shop.start(task_id) as again:
            try:
                again.outbound(call, request)
            except BaseException as exc:  # what the body sees, whatever it is
                seen.append(exc)
    return seen


def test_adyen_a_retry_after_a_definite_refusal_is_refused_definitely_again(
    adapter_on: AdapterOn, shop: Shop
) -> None:
    """Not a resend after a lost answer: the first attempt was refused (403) before anything
    was processed, so the retry's same refusal is definite too, and the body sees it."""
    server, adapter = adapter_on("adyen")
    _refused_from_now_on(server, adapter, "403 ip not allowed")
    seen = _retried_after_a_definite_refusal(
        shop, "task-r1", adapter.charge, charge_request("order-r1"), sdk.AdyenAPIInvalidPermission
    )
    assert [type(exc) for exc in seen] == [sdk.AdyenAPIInvalidPermission] * 3
    key = step_intent_key(shop.settings, "task-r1", adapter.charge.name)
    assert shop.store.read_intent(key).status is IntentStatus.FAILED
    assert server.gateway.payments == []


def test_stripe_a_retry_after_a_definite_400_is_refused_definitely_again(
    served: ServeFn, shop: Shop
) -> None:
    server = served("stripe")
    adapter = stripe_support.adapter_for(server.url)

    def invalid(call: GatewayCall) -> Reply:  # a validation Stripe gives every time
        return stripe_error(400, "invalid_request_error", "Amount must be at least $0.50 usd")

    server.route("POST", "/v1/payment_intents", invalid)
    seen = _retried_after_a_definite_refusal(
        shop,
        "task-s1",
        adapter.charge,
        stripe_support.charge_request("order-s1"),
        stripe.InvalidRequestError,
    )
    # The retry's refusal is definite (FAILED), and each later delivery is handed that
    # failure, never a resend (this error type is not rebuilt: an operator is asked).
    assert type(seen[0]) is stripe.InvalidRequestError
    key = step_intent_key(shop.settings, "task-s1", adapter.charge.name)
    assert shop.store.read_intent(key).status is IntentStatus.FAILED
    assert not [exc for exc in seen if isinstance(exc, OutboundCallOutcomeUnknownError)]
    assert server.gateway.payments == []
