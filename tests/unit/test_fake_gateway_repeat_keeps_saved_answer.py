"""A fault armed for a repeat never replaces what its key saved: a real gateway answers
a key it holds from what it saved (design: G4), so a decline or a failure injected on
the repeat of a paid key must not make the payment look lost or declined."""

from __future__ import annotations

import pytest

from celery_agboss.testing import (
    FakeGateway,
    FakeGatewayError,
    FakeGatewayErrorKind,
    FakeGatewayFault,
    FakeGatewayTimeout,
    GatewayRequestOutcome,
    VirtualClock,
)
from celery_agboss.testing.gateway_server import documented_capabilities


def _paid_with_its_answer_lost(gateway: FakeGateway, key: str) -> str:
    gateway.inject_fault(FakeGatewayFault.ANSWER_THEN_DROP)
    with pytest.raises(FakeGatewayTimeout):
        gateway.charge(1000, key)  # charged; the answer was lost
    [paid] = gateway.payments
    return str(paid["id"])


def test_a_failure_on_a_repeat_does_not_replace_the_keys_saved_payment() -> None:
    gateway = FakeGateway(VirtualClock(), documented_capabilities("stripe"))
    assert gateway.replays_failures, "Stripe replays its 500s: the case that overwrote"
    paid = _paid_with_its_answer_lost(gateway, "k-1")
    gateway.inject_fault(FakeGatewayFault.FAIL_BEFORE_PROCESSING)
    with pytest.raises(FakeGatewayError) as failed:
        gateway.charge(1000, "k-1")  # one 5xx on the retry: the fault
    assert failed.value.kind is FakeGatewayErrorKind.NOT_PROCESSED
    assert gateway.charge(1000, "k-1")["id"] == paid, "the next retry: the key's payment"
    outcomes = [r.outcome for r in gateway.requests_for("k-1")]
    assert outcomes == [
        GatewayRequestOutcome.PROCESSED,
        GatewayRequestOutcome.NOT_PROCESSED,
        GatewayRequestOutcome.REPLAYED,
    ]
    assert len(gateway.payments) == 1


def test_a_decline_on_a_repeat_of_a_paid_key_is_answered_from_the_key() -> None:
    gateway = FakeGateway(VirtualClock())
    paid = _paid_with_its_answer_lost(gateway, "k-2")
    gateway.inject_fault(FakeGatewayFault.DECLINE)
    assert gateway.charge(1000, "k-2")["id"] == paid  # not a definite decline
    repeat = gateway.requests_for("k-2")[1]
    assert (repeat.outcome, repeat.fault) == (
        GatewayRequestOutcome.REPLAYED,
        FakeGatewayFault.DECLINE,
    )


def test_a_decline_on_a_first_send_still_declines() -> None:
    """The guard is the key's saved answer: a key that holds none is declined as before."""
    gateway = FakeGateway(VirtualClock())
    gateway.inject_fault(FakeGatewayFault.DECLINE)
    with pytest.raises(FakeGatewayError) as declined:
        gateway.charge(1000, "k-3")
    assert declined.value.kind is FakeGatewayErrorKind.DECLINED
    assert gateway.payments == []
