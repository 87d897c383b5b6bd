"""A body that swallows what stops its delivery (``except BaseException``, a bare
``except:``) still stops there, whatever it does next (design: signals and errors).

- A pause it swallowed: the charge after it is not sent, and a body that returns ends
  ``PAUSED``, not ``COMPLETED``; once the pause is answered, the next delivery charges
  once. Without the protection the order was charged before anyone approved it.
- A cancel it swallowed: a body that returns, or raises ``Ignore``, ends ``CANCELLED``
  with its undo (the refund) run once, not ``COMPLETED`` with the charge kept.

Twin: ``caught-signal-does-not-stop-delivery`` (the switch that lets a caught signal go,
the same one tests/engine/test_caught_signals.py uses for a caught unknown outcome).
Counted at the fake gateway. Deliveries run on the delivery suite's in-process worker.
"""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from celery.exceptions import Ignore

from celery_agboss import AGBoss, answer_pause
from celery_agboss.core.executions import ExecutionState
from celery_agboss.core.protections import CAUGHT_SIGNAL_DOES_NOT_STOP_DELIVERY
from celery_agboss.errors import StoreUnavailableError
from celery_agboss.testing import sabotage
from tests.delivery.conftest import PaymentShop, lease_lapses_in_real_time

# --- a swallowed pause --------------------------------------------------------------------


@pytest.fixture
def shop_config() -> dict[str, Any]:
    return lease_lapses_in_real_time()


def _approve_then_pay(shop: PaymentShop) -> Any:
    charge = shop.call()

    @shop.task()
    def approve_then_pay(task: Any, order: str) -> Any:
        with contextlib.suppress(BaseException):  # the mistake under test
            task.pause("approve", {"order": order})
        return task.outbound(charge, {"amount": 1000}, business_key=f"order:{order}")

    return approve_then_pay


def test_a_swallowed_pause_sends_nothing_until_it_is_answered(shop: PaymentShop) -> None:
    pay = _approve_then_pay(shop)
    with shop.worker():
        task_id = shop.deliver(pay, "o-1", states=("PAUSED", "COMPLETED"))
        assert shop.execution(task_id).state is ExecutionState.PAUSED
        assert shop.gateway.requests == []
        answer_pause(shop.app, f"{task_id}:approve", {"approved": True})
        shop.wait_state(task_id, "COMPLETED")
    assert len(shop.gateway.payments) == 1
    assert len(shop.gateway.requests) == 1


def test_twin_a_swallowed_pause_charges_before_anyone_approved(shop: PaymentShop) -> None:
    pay = _approve_then_pay(shop)
    with sabotage(CAUGHT_SIGNAL_DOES_NOT_STOP_DELIVERY):
        task_id = shop.run(pay, "o-1", states=("PAUSED", "COMPLETED"))
    assert shop.execution(task_id).state is ExecutionState.COMPLETED
    assert len(shop.gateway.payments) == 1, "charged with its approval still unanswered"


def test_a_body_that_swallows_its_pause_and_returns_stays_paused(shop: PaymentShop) -> None:
    @shop.task()
    def ask(task: Any, order: str) -> Any:
        try:
            task.pause("approve", {"order": order})
        except BaseException:  # the mistake under test
            return "approved"  # it was not
        return "answered"

    task_id = shop.run(ask, "o-2", states=("PAUSED", "COMPLETED"))
    assert shop.execution(task_id).state is ExecutionState.PAUSED


# --- a swallowed cancel -------------------------------------------------------------------


def _pay_swallowing_its_cancel(shop: PaymentShop, then: str) -> Any:
    """``pay_revoked_after_its_charge``'s task, but the body swallows the cancel its fenced
    effect raises, then returns (``then="return"``) or raises ``Ignore``."""
    charge, refund = shop.call(), shop.refund_call()

    shop.refund_undo(refund)

    @shop.task()
    def pay(task: Any, order: str) -> Any:
        receipt = task.outbound(charge, {"amount": 1000}, business_key=f"order:{order}")
        task.undo_with("refund-charge", payment=receipt["id"])
        task.app.control.revoke(task.request.id)  # recorded in the store before it returns
        try:
            task.fenced_effect("mark-paid", lambda conn: None)
        except BaseException:  # the mistake under test
            if then == "ignore":
                raise Ignore() from None
        return receipt

    return pay


@pytest.mark.parametrize("then", ["return", "ignore"])
def test_a_body_that_swallows_its_cancel_is_cancelled_and_refunded(
    shop: PaymentShop, then: str
) -> None:
    pay = _pay_swallowing_its_cancel(shop, then)
    task_id = shop.run(pay, "o-1", states=("CANCELLED", "COMPLETED", "FAILED"))
    assert shop.execution(task_id).state is ExecutionState.CANCELLED
    assert len(shop.gateway.payments) == 1
    assert len(shop.gateway.refunds) == 1
    assert shop.times_sent("shop.refund") == 1


def test_twin_a_swallowed_cancel_keeps_the_charge(shop: PaymentShop) -> None:
    pay = _pay_swallowing_its_cancel(shop, "return")
    with sabotage(CAUGHT_SIGNAL_DOES_NOT_STOP_DELIVERY):
        task_id = shop.run(pay, "o-1", states=("CANCELLED", "COMPLETED", "FAILED"))
    assert shop.execution(task_id).state is ExecutionState.COMPLETED
    assert len(shop.gateway.payments) == 1 and shop.gateway.refunds == []


# --- a pause whose store write failed, swallowed --------------------------------------------


def _pause_write_fails_once(monkeypatch: pytest.MonkeyPatch, shop: PaymentShop) -> list[str]:
    """The store fails once as ``pause()`` records the pause (a SQLite lock timeout, a
    fail-over): what the failure was raised for."""
    executions = type(AGBoss.of(shop.app).executions)
    real, failed = executions.pause_in, []

    def pause_in(*args: Any, **kwargs: Any) -> Any:
        if not failed:
            failed.append("pause")
            raise StoreUnavailableError("test: the store failed as the pause was recorded")
        return real(*args, **kwargs)

    monkeypatch.setattr(executions, "pause_in", staticmethod(pause_in))
    return failed


def test_a_swallowed_store_failure_at_a_pause_sends_nothing(
    shop: PaymentShop, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A body that swallows the store's failure as its pause is recorded still stops there:
    the order is never charged before anyone approved it; the delivery is tried again and
    pauses."""
    failed = _pause_write_fails_once(monkeypatch, shop)
    pay = _approve_then_pay(shop)
    with shop.worker():
        task_id = shop.deliver(pay, "o-3", states=("PAUSED", "COMPLETED"))
    assert failed == ["pause"]
    assert shop.gateway.requests == [], "charged with its approval never asked"
    assert shop.execution(task_id).state is ExecutionState.PAUSED


def test_twin_a_swallowed_store_failure_at_a_pause_charges_unapproved(
    shop: PaymentShop, monkeypatch: pytest.MonkeyPatch
) -> None:
    _pause_write_fails_once(monkeypatch, shop)
    pay = _approve_then_pay(shop)
    with sabotage(CAUGHT_SIGNAL_DOES_NOT_STOP_DELIVERY):
        task_id = shop.run(pay, "o-3", states=("PAUSED", "COMPLETED"))
    assert shop.execution(task_id).state is ExecutionState.COMPLETED
    assert len(shop.gateway.payments) == 1, "charged with its approval never asked"
