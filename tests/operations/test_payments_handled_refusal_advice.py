"""The refusal of ``cancel --payments-handled`` while another waiting click uses the charge
names a way out that works: two waiting clicks on one order that declared the same refund
would each be refused naming the other if the advice were "cancel that one with
``--payments-handled``". Told to cancel the waiting one plainly first, an operator who
runs the commands the messages name, in order, ends both, with the one refund they made
by hand and none sent by the undos (design: cancel request, operator decisions). Real
worker, both stores, counted at the fake gateway.
"""

from __future__ import annotations

import re

import pytest

from celery_agboss.core.executions import ExecutionRecord
from celery_agboss.errors import OperatorRefusedError
from celery_agboss.operator import cancel
from tests.delivery.conftest import PaymentShop
from tests.delivery.wallet_orders import (
    HANDLED,
    our_refund_requests,
    placed_and_waiting,
    refund_by_hand,
)
from tests.operations.handled_orders import card_only_order

_COMMAND = re.compile(r"`celery -A proj agboss (cancel \S+(?: --payments-handled)?) --reason TEXT`")


def _two_waiting_clicks(shop: PaymentShop) -> tuple[str, str]:
    """Two clicks on one order's card step, each declaring the refund, both waiting."""
    click = card_only_order(shop, name="click")
    with shop.worker():
        return placed_and_waiting(shop, click), placed_and_waiting(shop, click)


def _run(shop: PaymentShop, command: str) -> ExecutionRecord:
    """An operator's ``cancel ID [--payments-handled]`` as the message names it."""
    _, execution_id, *flags = command.split()
    return cancel(shop.app, execution_id, HANDLED, payments_handled=bool(flags))


def _advice(refusal: OperatorRefusedError) -> list[str]:
    return _COMMAND.findall(str(refusal))


def test_the_refusals_advice_followed_literally_ends_both_clicks(shop: PaymentShop) -> None:
    first, second = _two_waiting_clicks(shop)
    refund_by_hand(shop)
    with pytest.raises(OperatorRefusedError) as refused:
        cancel(shop.app, first, HANDLED, payments_handled=True)
    assert refused.value.code == "wrong-state" and second in str(refused.value)
    advice = _advice(refused.value)
    assert advice == [f"cancel {second}", f"cancel {first} --payments-handled"], str(refused.value)
    for command in advice:
        _run(shop, command)
    assert shop.execution(first).state.value == "CANCELLED"
    shop.sweep()  # the plain cancel's end, once the first is no longer live
    waiting = shop.wait_state(second, "WAITING_OPERATOR", "CANCELLED")
    assert waiting.state.value == "WAITING_OPERATOR", waiting.reason
    assert "cancelled after a completed payment" in str(waiting.reason), "listed to you"
    _run(shop, f"cancel {second} --payments-handled")
    assert shop.execution(second).state.value == "CANCELLED"
    assert len(shop.gateway.payments) == 1 and len(shop.gateway.refunds) == 1
    assert our_refund_requests(shop) == [], "the one refund is the operator's by hand"
