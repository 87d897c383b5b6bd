"""The outbound call's plain paths (design: P3): sent once, replayed, keyed as the grammar says."""

from __future__ import annotations

import pytest

from celery_agboss.core.history import verify_history
from celery_agboss.core.outbound import Outcome
from celery_agboss.core.store_protocol import IntentStatus
from celery_agboss.errors import LeaseNotHeldError
from tests.engine.helpers import PSEUDONYM_KEY, Shop, business_intent_key, step_intent_key


def test_a_call_is_sent_once_and_its_intent_completed(shop: Shop) -> None:
    charge = shop.charge_call()
    with shop.start("task-1") as ctx:
        receipt = ctx.outbound(charge, {"amount": 1000})
        assert ctx.last_outcome is Outcome.SENT
    assert receipt["amount"] == 1000
    assert len(shop.gateway.payments) == 1
    key = step_intent_key(shop.settings, "task-1", "fake.charge")
    record = shop.store.read_intent(key)
    assert record is not None
    assert record.status is IntentStatus.COMPLETED
    assert record.gateway_transaction_id == receipt["id"]
    history = shop.store.read_history(key)
    assert [row.event for row in history] == ["claimed", "completed"]
    assert verify_history(PSEUDONYM_KEY, history, expected_last_status="COMPLETED").ok


def test_a_second_delivery_replays_the_stored_result_and_sends_nothing(shop: Shop) -> None:
    charge = shop.charge_call()
    with shop.start("task-1") as first:
        receipt = first.outbound(charge, {"amount": 1000})
    with shop.start("task-1") as second:
        again = second.outbound(charge, {"amount": 1000})
        assert second.last_outcome is Outcome.REPLAYED
    assert again == receipt
    assert len(shop.gateway.requests) == 1


def test_each_call_of_one_name_in_a_run_gets_its_own_step_key(shop: Shop) -> None:
    charge = shop.charge_call()
    with shop.start("task-1") as ctx:
        ctx.outbound(charge, {"amount": 100})
        ctx.outbound(charge, {"amount": 200})
    keys = [request.idempotency_key for request in shop.gateway.requests]
    assert keys == [
        step_intent_key(shop.settings, "task-1", "fake.charge", 1),
        step_intent_key(shop.settings, "task-1", "fake.charge", 2),
    ]
    assert str(keys[1]).endswith("fake.charge#2")


def test_a_business_keyed_call_uses_the_business_key_grammar(shop: Shop) -> None:
    charge = shop.charge_call()
    with shop.start("task-1") as ctx:
        ctx.outbound(charge, {"amount": 100}, business_key="order:42")
    assert [r.idempotency_key for r in shop.gateway.requests] == [
        business_intent_key(shop.settings, "order:42", "fake.charge")
    ]


def test_a_live_lease_held_elsewhere_refuses_a_second_delivery(shop: Shop) -> None:
    with shop.start("task-1"), pytest.raises(LeaseNotHeldError):
        shop.start("task-1")
