"""``--payments-handled`` (the cancel or the verb) also claims a charge the execution only
relied on, sent by another execution that ended without claiming it (nobody completed on
it, none live): once the operator refunded it by hand and said so, a later click on the
same order is told the charge was claimed, never handed it as paid
(``core.handled_steps.handled_steps``; design: cancel request, operator decisions). Real
worker, both stores, counted at the fake gateway.

The order charged the card (no undo declared) and failed. A click on the same order was
handed the charge and then failed (``payments-handled``) or waits (``cancel
--payments-handled``). The operator refunds the card by hand and gives the word on the
click. A new click is told "claimed for undo" by the first click: nothing shipped. Twin
``payments-handled-skips-relied-charges``: the new click ships on the refunded charge.
"""

from __future__ import annotations

from celery_agboss.core.protections import PAYMENTS_HANDLED_SKIPS_RELIED_CHARGES
from celery_agboss.testing import sabotage
from tests.delivery.conftest import PaymentShop
from tests.operations.handled_orders import cancel_of_a_relying_click, verb_on_a_relying_click


def test_payments_handled_verb_claims_a_relied_charge(shop: PaymentShop) -> None:
    click_id, told, shipped = verb_on_a_relying_click(shop)
    assert [(t.undone, t.undo_by) for t in told] == [(False, click_id)] and shipped == []
    assert len(shop.gateway.payments) == 1 and len(shop.gateway.refunds) == 1


def test_twin_verb_skips_a_relied_charge_and_ships_on_the_refund(shop: PaymentShop) -> None:
    with sabotage(PAYMENTS_HANDLED_SKIPS_RELIED_CHARGES):
        _, told, shipped = verb_on_a_relying_click(shop)
    assert told == [] and len(shipped) == 1, "shipped on the charge refunded by hand"


def test_cancel_payments_handled_claims_a_relied_charge(shop: PaymentShop) -> None:
    click_id, told, shipped = cancel_of_a_relying_click(shop)
    assert [(t.undone, t.undo_by) for t in told] == [(False, click_id)] and shipped == []
    assert len(shop.gateway.payments) == 1 and len(shop.gateway.refunds) == 1


def test_twin_cancel_skips_a_relied_charge_and_ships_on_the_refund(shop: PaymentShop) -> None:
    with sabotage(PAYMENTS_HANDLED_SKIPS_RELIED_CHARGES):
        _, told, shipped = cancel_of_a_relying_click(shop)
    assert told == [] and len(shipped) == 1, "shipped on the charge refunded by hand"
