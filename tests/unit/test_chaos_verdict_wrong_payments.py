"""The chaos verdict on one payment that is not the order's, whatever the execution says.

docs/reliability.md: "paid once" is one payment that moved the order's money (its
amount, the shop's currency, ``succeeded`` and captured in full); any other single
payment is lost, and an execution that waits for a person does not make it "waiting
for an operator". The payments are made by the explorer's own gateway class
(``FakeGateway`` with the explorer's ``STRICT`` capabilities), so their fields are
exactly what ``gateway.payments`` lists in a run; the witnesses are constructed (no
process, no database).
"""

from __future__ import annotations

from typing import Any

import pytest

from celery_agboss.chaos import EXIT_MONEY_WRONG, EXIT_OK
from celery_agboss.chaos.run import STRICT, exit_code
from celery_agboss.chaos.shop import CURRENCY, amount_of
from celery_agboss.chaos.verdict import (
    LOST,
    PAID_ONCE,
    WAITING,
    Execution,
    OrderOutcome,
    classify,
    summarise,
)
from celery_agboss.testing.gateway import FakeGateway
from tests.unit.test_chaos_verdict import verdict

WAITS = ("WAITING_OPERATOR", "PARKED")


def judged(order: int, gateway: FakeGateway, state: str = "COMPLETED") -> OrderOutcome:
    """The order judged as a run judges it: the gateway's payments, the shop's row
    marked paid with the payment, the execution in ``state``."""
    [payment] = gateway.payments
    [outcome] = summarise(
        {order: f"task-{order}"},
        gateway.payments,
        [],
        {str(order): ("paid", payment["id"])},
        {f"task-{order}": Execution(state, "a person decides")},
    )
    return outcome


def charged(order: int, amount: int | None = None, **options: Any) -> FakeGateway:
    gateway = FakeGateway(capabilities=STRICT)
    amount = amount_of(order) if amount is None else amount
    gateway.charge(amount, f"k-{order}", reference=f"order:{order}", attempt=1, **options)
    return gateway


def assert_money_wrong(outcome: OrderOutcome, *said: str) -> None:
    assert outcome.verdict == LOST, outcome
    assert all(part in outcome.detail for part in said), outcome.detail
    assert exit_code(verdict([outcome])) == EXIT_MONEY_WRONG


@pytest.mark.parametrize("state", WAITS)
def test_a_waiting_order_charged_another_amount_is_lost(state: str) -> None:
    wrong = amount_of(5) + 500
    outcome = judged(5, charged(5, wrong), state)
    assert_money_wrong(outcome, str(wrong), str(amount_of(5)))


@pytest.mark.parametrize("state", WAITS)
def test_a_waiting_order_with_its_own_payment_or_none_waits(state: str) -> None:
    outcome = judged(5, charged(5), state)
    assert (outcome.verdict, outcome.detail) == (WAITING, "a person decides")
    nothing = classify(5, "task-5", [], 0, None, Execution(state, None))
    assert nothing.verdict == WAITING
    assert exit_code(verdict([outcome, nothing])) == EXIT_OK


def test_a_payment_in_another_currency_is_lost() -> None:
    other = "eur" if CURRENCY != "eur" else "gbp"
    outcome = judged(3, charged(3, currency=other))
    assert_money_wrong(outcome, other, CURRENCY)


@pytest.mark.parametrize("state", ("COMPLETED", *WAITS))
def test_an_authorisation_never_captured_is_lost(state: str) -> None:
    outcome = judged(2, charged(2, capture=False), state)
    assert_money_wrong(outcome, "requires_capture", "0 of")


def test_a_partially_captured_payment_is_lost() -> None:
    gateway = charged(6, capture=False)
    [authorised] = gateway.payments
    gateway.capture(authorised["id"], "cap-6", amount=10)  # final: succeeded, 10 taken
    [payment] = gateway.payments
    assert (payment["status"], payment["amount_captured"]) == ("succeeded", 10)
    assert_money_wrong(judged(6, gateway), f"10 of {amount_of(6)}")


def test_a_payment_captured_in_full_later_is_paid_once() -> None:
    gateway = charged(6, capture=False)
    [authorised] = gateway.payments
    gateway.capture(authorised["id"], "cap-6")
    assert judged(6, gateway).verdict == PAID_ONCE


def test_the_shops_own_payment_is_paid_once() -> None:
    outcome = judged(8, charged(8))
    assert outcome.verdict == PAID_ONCE
    assert exit_code(verdict([outcome])) == EXIT_OK
