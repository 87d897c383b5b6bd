"""Per adapter (design: only the request's payment): a reconcile never adopts a payment that
is not this request's.

The case: another deployment on the same gateway account (its own store, the same
tenant) charged order 42 first, 1000, under the very key this one sends for its own
order 42 of 2500. What the gateway then shows under the key (reconcile), or answers
again to it (a resend), is the other shop's payment. Each adapter compares amount,
currency, reference and, where the gateway keeps it in metadata, our key with the
stored request (``celery_agboss.adapters.common.differences``): reconcile answers
``Unknown`` naming what differed, a resend's replayed answer is refused
(``AnotherRequestsAnswerError``, definite: nothing was processed for this request).
Each twin switches the comparison off (``adapter-adopts-any-payment``) and shows the
harm: the order marked paid with the other shop's payment, its customer never charged.

Through each gateway's official SDK against ``FakeGatewayServer`` set to what the
gateway documents; a real-worker version of the whole story (two shops, two stores,
one account) is tests/integration/test_two_deployments.py.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from celery_agboss.adapters.common import AnotherRequestsAnswerError
from celery_agboss.core.outbound import Completed, NotSent, Unknown
from celery_agboss.core.protections import ADOPTS_ANY_PAYMENT
from celery_agboss.errors import OutboundCallOutcomeUnknownError, OutboundCallUnreconciledError
from celery_agboss.testing import sabotage
from celery_agboss.testing.checklist import GatewayCheckStatus, gateway_checklist
from celery_agboss.testing.gateway_server import FakeGatewayServer
from tests.adapters.conftest import ServeFn
from tests.adapters.own_payment_support import (
    BUSINESS_KEY,
    GATEWAYS,
    ORDER,
    OURS,
    THEIR_AMOUNT,
    THEIRS,
    assert_names_their_amount,
    key_for,
    reconcile,
    send,
    served_adapter,
    support,
)
from tests.engine.helpers import Shop


def _their_charge_first(
    served: ServeFn, shop: Shop, gateway: str
) -> tuple[FakeGatewayServer, Any, str, dict[str, Any]]:
    """Shop A's charge of order 42 (1000) under the key shop B sends for its own order 42
    of 2500, made first: the server, the adapter, the shared key and shop A's payment."""
    server, adapter = served_adapter(served, gateway)
    key = key_for(shop, adapter.charge)
    theirs: dict[str, Any] = send(
        adapter.charge, key, support(gateway).charge_request(ORDER, THEIRS)
    )
    return server, adapter, key, theirs


def _reconcile_ours(adapter: Any, key: str, gateway: str) -> Any:
    """What this shop's reconcile answers for its own order 42 of 2500."""
    return reconcile(adapter.charge, key, support(gateway).charge_request(ORDER, OURS))


def _resend_ours(adapter: Any, key: str, gateway: str) -> Any:
    return send(adapter.charge, key, support(gateway).charge_request(ORDER, OURS), 2)


# --- reconcile, and the resend it allows ---------------------------------------------------


@pytest.mark.parametrize("gateway", GATEWAYS)
def test_reconcile_never_takes_another_deployments_payment_of_another_amount(
    gateway: str, served: ServeFn, shop: Shop
) -> None:
    server, adapter, key, _ = _their_charge_first(served, shop, gateway)
    answer = _reconcile_ours(adapter, key, gateway)
    if gateway == "adyen":  # no lookup: the resend's answer (the key's first) tells
        assert answer == NotSent()
        with pytest.raises(AnotherRequestsAnswerError, match=THEIR_AMOUNT):
            _resend_ours(adapter, key, gateway)
    else:
        assert_names_their_amount(answer)
    assert len(server.gateway.payments) == 1


@pytest.mark.parametrize("gateway", GATEWAYS)
def test_twin_a_reconcile_that_does_not_compare_takes_the_other_shop_s_payment(
    gateway: str, served: ServeFn, shop: Shop
) -> None:
    server, adapter, key, theirs = _their_charge_first(served, shop, gateway)
    with sabotage(ADOPTS_ANY_PAYMENT):
        answer = _reconcile_ours(adapter, key, gateway)
        taken = _resend_ours(adapter, key, gateway) if answer == NotSent() else answer.result
    assert isinstance(answer, (Completed, NotSent)), answer
    assert taken["id"] == theirs["id"] and taken["amount"] == THEIRS  # order 42 "paid"
    assert len(server.gateway.payments) == 1  # ... and its customer never charged


MISMATCHES = {
    # what differs: (the other shop's request under our key, what the answer names)
    "currency": ({"currency": "eur"}, r"currency '?eur'?, not '?usd'?"),
    "reference": ({"reference": "order-41"}, r"reference '?order-41'?, not '?order-42'?"),
}


@pytest.mark.parametrize("gateway", GATEWAYS)
@pytest.mark.parametrize("differs", sorted(MISMATCHES))
def test_a_payment_of_the_same_amount_that_differs_otherwise_is_not_taken(
    gateway: str, differs: str, served: ServeFn, shop: Shop
) -> None:
    """Amount alone is not the comparison: the same amount in another currency, or for
    another order, under our key is not this request's payment either."""
    server, adapter = served_adapter(served, gateway)
    key = key_for(shop, adapter.charge)
    change, named = MISMATCHES[differs]
    theirs = {**support(gateway).charge_request(ORDER, OURS), **change}
    send(adapter.charge, key, theirs)
    answer = _reconcile_ours(adapter, key, gateway)
    if answer == NotSent():
        # Nothing shown for this request (Adyen has no lookup; Checkout.com lists the
        # payments of our reference): the resend's replayed answer, the key's first, tells.
        assert gateway == "adyen" or (gateway, differs) == ("checkout", "reference"), answer
        with pytest.raises(AnotherRequestsAnswerError) as refused:
            _resend_ours(adapter, key, gateway)
        reason = str(refused.value)
    else:
        assert isinstance(answer, Unknown), answer
        reason = answer.reason
    assert re.search(named, reason, re.IGNORECASE), reason
    assert len(server.gateway.payments) == 1


@pytest.mark.parametrize("gateway", GATEWAYS)
@pytest.mark.parametrize("differs", sorted(MISMATCHES))
def test_twin_without_the_comparison_the_same_amount_is_taken_whatever_else_differs(
    gateway: str, differs: str, served: ServeFn, shop: Shop
) -> None:
    server, adapter = served_adapter(served, gateway)
    key = key_for(shop, adapter.charge)
    theirs = {**support(gateway).charge_request(ORDER, OURS), **MISMATCHES[differs][0]}
    made = send(adapter.charge, key, theirs)
    with sabotage(ADOPTS_ANY_PAYMENT):
        answer = _reconcile_ours(adapter, key, gateway)
        taken = _resend_ours(adapter, key, gateway) if answer == NotSent() else answer.result
    assert taken["id"] == made["id"]  # order 42 "paid" with their payment
    assert len(server.gateway.payments) == 1  # ... and its customer never charged


def test_a_listed_payment_without_our_key_is_not_taken_for_the_charge(
    served: ServeFn, shop: Shop
) -> None:
    """Checkout.com lists a charge's reference and keeps our key in metadata: a payment of
    the same reference, amount and currency that carries no key (a payment link, a
    manual charge) is not this call's."""
    server, adapter = served_adapter(served, "checkout")
    key = key_for(shop, adapter.charge)
    server.gateway.charge(OURS, "walk-in", currency="usd", reference=ORDER, metadata={})
    answer = _reconcile_ours(adapter, key, "checkout")
    assert isinstance(answer, Unknown) and "no key of ours" in answer.reason, answer
    with sabotage(ADOPTS_ANY_PAYMENT):
        adopted = _reconcile_ours(adapter, key, "checkout")
    assert isinstance(adopted, Completed), "the twin takes the walk-in payment for ours"


# --- the same, through deliveries ----------------------------------------------------------


def _deliver_ours(shop: Shop, adapter: Any, gateway: str, deliveries: int = 3) -> Any:
    """Up to ``deliveries`` deliveries of this shop's execution of order 42 (each a
    re-run after the last one stopped): the receipt the body got, or the last error."""
    request = support(gateway).charge_request(ORDER, OURS)
    last: BaseException | None = None
    for _ in range(deliveries):
        try:
            with shop.start("shop-b-order-42") as delivery:
                return delivery.outbound(adapter.charge, request, business_key=BUSINESS_KEY)
        except (OutboundCallOutcomeUnknownError, OutboundCallUnreconciledError) as exc:
            last = exc
            if isinstance(exc, OutboundCallUnreconciledError):
                return exc
        except AnotherRequestsAnswerError as exc:
            return exc
    return last


@pytest.mark.parametrize("gateway", GATEWAYS)
def test_an_order_is_never_marked_paid_with_another_deployments_payment(
    gateway: str, served: ServeFn, shop: Shop
) -> None:
    server, adapter, _, _ = _their_charge_first(served, shop, gateway)
    ended = _deliver_ours(shop, adapter, gateway)
    assert isinstance(ended, (OutboundCallUnreconciledError, AnotherRequestsAnswerError)), ended
    assert len(server.gateway.payments) == 1


@pytest.mark.parametrize("gateway", GATEWAYS)
def test_twin_without_the_comparison_the_order_is_marked_paid_with_their_payment(
    gateway: str, served: ServeFn, shop: Shop
) -> None:
    server, adapter, _, theirs = _their_charge_first(served, shop, gateway)
    with sabotage(ADOPTS_ANY_PAYMENT):
        receipt = _deliver_ours(shop, adapter, gateway)
    assert isinstance(receipt, dict) and receipt["id"] == theirs["id"], receipt
    assert len(server.gateway.payments) == 1


def test_stripe_s_case_of_issue_22_waits_for_an_operator_naming_the_amount(
    served: ServeFn, shop: Shop
) -> None:
    """Stripe refuses the key reused with another amount (``idempotency_error``, unknown);
    reconcile finds the other shop's PaymentIntent under the key and says it is not ours."""
    server, adapter, key, _ = _their_charge_first(served, shop, "stripe")
    ended = _deliver_ours(shop, adapter, "stripe")
    assert isinstance(ended, OutboundCallUnreconciledError), ended
    record = shop.store.read_intent(key)
    assert record is not None and record.needs_operator, record
    assert THEIR_AMOUNT in (record.operator_reason or ""), record
    assert len(server.gateway.payments) == 1


# --- the checklist's probe ---------------------------------------------------------------


@pytest.mark.parametrize("gateway", GATEWAYS)
def test_the_checklist_probes_that_the_adapter_takes_only_its_own_payment(
    gateway: str, served: ServeFn
) -> None:
    _, adapter = served_adapter(served, gateway)
    report = gateway_checklist(adapter.send, adapter.lookup, reconcile=adapter.reconcile)
    own = report.result("OWN")
    assert own.status is GatewayCheckStatus.PASSED, str(report)
    with sabotage(ADOPTS_ANY_PAYMENT):
        sabotaged = gateway_checklist(adapter.send, adapter.lookup, reconcile=adapter.reconcile)
    assert sabotaged.result("OWN").status is GatewayCheckStatus.FAILED, str(sabotaged)
