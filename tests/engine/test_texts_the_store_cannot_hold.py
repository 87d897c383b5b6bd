"""Texts the store cannot hold never stop a payment being recorded, on both stores.

An error text with a lone surrogate once turned an unknown outcome (or a definite
failure) into a raw ``TypeError``, so the quarantine row could not be written (design: R25);
a gateway transaction id the database cannot hold made every settle and reconcile of
a payment that moved money fail.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from celery_agboss.core.outbound import CallContext, Outcome
from celery_agboss.core.store_protocol import IntentStatus
from tests.engine.helpers import Shop, step_intent_key

# --- error texts that are not storable text ---------------------------------------------


def test_an_unknown_outcome_whose_error_text_holds_a_lone_surrogate_stays_quarantined(
    shop: Shop,
) -> None:
    """The money moved, the SDK error is odd text; still PENDING, recorded, reconciled
    (design: R25)."""

    def charge_then_reset(call: CallContext) -> Any:
        shop.gateway.charge(100, call.idempotency_key)
        raise ConnectionError("reset by peer after b'\\xff' -> \udcff")

    charge = shop.charge_call(send=charge_then_reset)
    key = step_intent_key(shop.settings, "task-1", "fake.charge")
    shop.unknown("task-1", charge, {"amount": 100})
    record = shop.store.read_intent(key)
    assert record is not None and record.status is IntentStatus.PENDING
    assert shop.store.read_history(key)[-1].event == "outcome-unknown"
    shop.reconciled("task-1", charge, {"amount": 100})
    assert len(shop.gateway.payments) == 1


def test_a_definite_failure_whose_error_text_holds_a_lone_surrogate_is_recorded_failed(
    shop: Shop,
) -> None:
    class Declined(Exception):
        pass

    def decline(call: CallContext) -> Any:
        raise Declined("card declined \udcff")

    charge = shop.charge_call(send=decline, definite=lambda exc: isinstance(exc, Declined))
    with shop.start("task-1") as ctx, pytest.raises(Declined):
        ctx.outbound(charge, {"amount": 100})
    record = shop.store.read_intent(step_intent_key(shop.settings, "task-1", "fake.charge"))
    assert record is not None and record.status is IntentStatus.FAILED


# --- a gateway transaction id the store cannot hold ------------------------------------


@pytest.mark.parametrize("bad", ["\udcff", "\x00"], ids=["lone-surrogate", "nul"])
def test_a_gateway_id_the_store_cannot_hold_does_not_stop_the_payment_being_recorded(
    shop: Shop, bad: str
) -> None:
    charge = dataclasses.replace(
        shop.charge_call(), transaction_id=lambda result: f"{result['id']}{bad}"
    )
    with shop.start("task-1") as ctx:
        receipt = ctx.outbound(charge, {"amount": 100})
        assert ctx.last_outcome is Outcome.SENT
    record = shop.store.read_intent(step_intent_key(shop.settings, "task-1", "fake.charge"))
    assert record is not None and record.status is IntentStatus.COMPLETED
    assert record.result == receipt and record.gateway_transaction_id is None
    assert len(shop.gateway.payments) == 1
