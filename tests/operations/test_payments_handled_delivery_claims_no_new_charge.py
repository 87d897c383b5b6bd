"""What ``cancel --payments-handled`` covers is decided when the word is accepted: the
delivery that ends the cancel once its fenced effects' undos ran claims nothing more — not
a charge it only relied on whose sender was live then (left out: that one's own word or
undo accounts for it) and is undoing now, not yet claimed. Taken then, the sender's own
refund would be skipped (``NOT_COVERED``) and it would wait for a person, told a person
dealt with a payment nobody dealt with (design: cancel request, operator decisions).
Real worker, both stores, counted at the fake gateway.

The sender's order charged the card (undo: a refund) and waits. A second order was handed
that charge (no undo of it), debited the wallet (undo: a credit) and waits. The operator
cancels the second with ``--payments-handled`` (``COMPENSATING``: the credit first), then
the sender plainly (``COMPENSATING``: its refund first). The second's delivery runs its
credit and ends, then the sender's: its refund is sent, ``CANCELLED``. Twin
``payments-handled-delivery-claims-new-charges``: the second's delivery claims the charge,
the sender waits for a person, no refund sent.
"""

from __future__ import annotations

from typing import Any

from celery_agboss.core.protections import PAYMENTS_HANDLED_DELIVERY_CLAIMS_NEW_CHARGES
from celery_agboss.core.shared_steps import HANDLED_NOTE
from celery_agboss.operator import cancel
from celery_agboss.testing import sabotage
from tests.delivery.conftest import PaymentShop
from tests.delivery.wallet_orders import (
    charge_the_card,
    debit_the_wallet,
    our_refund_requests,
    placed_and_waiting,
    refund_charge_undo,
    wallet_with_credit_undo,
)
from tests.operations.handled_orders import delivered_again

WORD = "the wallet order's payments are dealt with (it paid nothing at the gateway)"
_ENDS = ("CANCELLED", "WAITING_OPERATOR", "FAILED")


def _orders(shop: PaymentShop) -> tuple[Any, Any]:
    """The sender (charges the card, undo: a refund) and the wallet order (handed that
    charge, no undo of it; debits the wallet, undo: a credit); both wait an hour."""
    charge = shop.call()
    refund_charge_undo(shop, shop.refund_call())
    wallet_with_credit_undo(shop, ledger_up=True)

    @shop.task()
    def sender(self: Any, customer: str) -> Any:
        receipt = charge_the_card(self, charge, customer)
        self.undo_with("refund-charge", payment=receipt["id"])
        raise self.retry(countdown=3600)

    @shop.task()
    def wallet_order(self: Any, customer: str) -> Any:
        charge_the_card(self, charge, customer)
        debit_the_wallet(self, customer)
        raise self.retry(countdown=3600)

    return sender, wallet_order


def _redelivered(shop: PaymentShop, task: Any, task_id: str) -> str:
    return delivered_again(shop, task, task_id, *_ENDS).state.value


def _both_cancelled_in_turn(shop: PaymentShop) -> str:
    """The scenario of the module docstring; the sender's id once both deliveries ended."""
    sender, wallet_order = _orders(shop)
    with shop.worker():
        sender_id = placed_and_waiting(shop, sender)
        order_id = placed_and_waiting(shop, wallet_order)
    moved = cancel(shop.app, order_id, WORD, payments_handled=True)
    assert moved.state.value == "COMPENSATING", moved.reason
    undoing = cancel(shop.app, sender_id, "the customer cancelled the order")
    assert undoing.state.value == "COMPENSATING", undoing.reason
    with shop.worker():
        assert _redelivered(shop, wallet_order, order_id) == "CANCELLED"
        _redelivered(shop, sender, sender_id)
    assert len(shop.gateway.payments) == 1
    return sender_id


def test_the_senders_refund_runs_after_the_handled_orders_delivery(shop: PaymentShop) -> None:
    sender_id = _both_cancelled_in_turn(shop)
    ended = shop.execution(sender_id)
    assert ended.state.value == "CANCELLED", ended.reason
    assert len(our_refund_requests(shop)) == 1 and len(shop.gateway.refunds) == 1


def test_twin_delivery_claims_the_relied_charge_and_nobody_refunds(shop: PaymentShop) -> None:
    with sabotage(PAYMENTS_HANDLED_DELIVERY_CLAIMS_NEW_CHARGES):
        sender_id = _both_cancelled_in_turn(shop)
    waiting = shop.execution(sender_id)
    assert waiting.state.value == "WAITING_OPERATOR", waiting.reason
    assert HANDLED_NOTE.split(":")[0] in str(waiting.reason), "told a person dealt with it"
    assert our_refund_requests(shop) == [] and shop.gateway.refunds == []
