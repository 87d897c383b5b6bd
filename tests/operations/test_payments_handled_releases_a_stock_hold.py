"""``cancel --payments-handled`` stands for the execution's payments, not for a call that
moves no money: a stock hold placed through an inventory service's API, declared
``OutboundCall(moves_money=False)``, is still released (docs/operators.md: Cancelling).
Real workers on both stores; the hold and its release counted in the inventory fake, the
refund at the fake gateway.

A body charges the card (undo: refund it), holds the stock (undo: release it), then waits
an hour for a retry. The operator refunds the card by hand and cancels with
``--payments-handled``: ``COMPENSATING``, the sweep re-drives it, the stock is released
once, no refund is sent by us, ``CANCELLED``.

Twin ``payments-handled-skips-moneyless-undos`` (every outbound step read as a payment):
the cancel ends ``CANCELLED`` at once and the stock stays held. The same body with the
hold declared as a payment (the default) is the control: held, as before.
"""

from __future__ import annotations

import itertools
from datetime import timedelta
from typing import Any

from celery_agboss import Completed, NotSent, OutboundCall
from celery_agboss.core.compensation import UndoStep
from celery_agboss.core.outbound import CallContext, Lookup
from celery_agboss.core.protections import PAYMENTS_HANDLED_SKIPS_MONEYLESS_UNDOS
from celery_agboss.operator import cancel
from celery_agboss.task import undo_function
from celery_agboss.testing import sabotage
from tests.delivery.conftest import PaymentShop
from tests.delivery.wallet_orders import (
    HANDLED,
    charge_the_card,
    ended_after_a_sweep,
    our_refund_requests,
    placed_and_waiting,
    refund_by_hand,
    refund_charge_undo,
)


class Inventory:
    """The stock service: holds by idempotency key, and the holds released."""

    def __init__(self) -> None:
        self.holds: dict[str, str] = {}
        self.released: list[str] = []
        self._ids = itertools.count(1)

    def hold(self, call: CallContext) -> dict[str, str]:
        found = self.holds.get(call.idempotency_key)
        if found is None:
            found = self.holds[call.idempotency_key] = f"hold-{next(self._ids)}"
        return {"hold": found}

    def reconcile(self, call: CallContext, lookup: Lookup) -> Any:
        found = self.holds.get(lookup.idempotency_key)
        return NotSent() if found is None else Completed({"hold": found})


def _held_order(shop: PaymentShop, *, moves_money: bool) -> tuple[Any, Inventory]:
    """The order's task (charge, hold, wait an hour), with its two undos registered."""
    inventory = Inventory()
    hold_stock = shop.agboss.register(
        OutboundCall(
            name="shop.hold-stock",
            send=inventory.hold,
            reconcile=inventory.reconcile,
            key_retention=timedelta(days=1),
            moves_money=moves_money,
        )
    )
    charge = shop.call()
    refund_charge_undo(shop, shop.refund_call())

    @undo_function(shop.app, "release-stock")
    def release_stock(task: Any, undo: UndoStep, hold: str) -> None:
        inventory.released.append(hold)

    @shop.task()
    def charge_and_hold(self: Any, customer: str) -> Any:
        payment = charge_the_card(self, charge, customer)
        self.undo_with("refund-charge", payment=payment["id"])
        held = self.outbound(hold_stock, {"sku": "book"}, business_key=f"order:{customer}:sku")
        self.undo_with("release-stock", hold=held["hold"])
        raise self.retry(countdown=3600)  # waits in the store

    return charge_and_hold, inventory


def _handled_cancel(shop: PaymentShop, *, moves_money: bool) -> tuple[str, str, Inventory]:
    """The order placed and waiting; the card refunded by hand; ``cancel
    --payments-handled``; the sweep. The state the cancel moved it to, the state it ended
    in, and the inventory."""
    task, inventory = _held_order(shop, moves_money=moves_money)
    with shop.worker():
        task_id = placed_and_waiting(shop, task)
        assert list(inventory.holds.values()) == ["hold-1"]
        refund_by_hand(shop)
        moved = cancel(shop.app, task_id, HANDLED, payments_handled=True)
        ended = ended_after_a_sweep(shop, task_id)
    assert len(shop.gateway.payments) == 1
    assert our_refund_requests(shop) == [], "the operator refunded it: we send none"
    return moved.state.value, ended.state.value, inventory


def test_payments_handled_still_releases_a_hold_that_moves_no_money(shop: PaymentShop) -> None:
    moved, ended, inventory = _handled_cancel(shop, moves_money=False)
    assert moved == "COMPENSATING", "the release runs before the cancel ends"
    assert ended == "CANCELLED"
    assert inventory.released == ["hold-1"]


def test_twin_every_outbound_step_read_as_a_payment_keeps_the_stock_held(
    shop: PaymentShop,
) -> None:
    with sabotage(PAYMENTS_HANDLED_SKIPS_MONEYLESS_UNDOS):
        moved, ended, inventory = _handled_cancel(shop, moves_money=False)
    assert moved == ended == "CANCELLED"
    assert inventory.released == []


def test_a_hold_declared_as_a_payment_is_left_to_the_operator(shop: PaymentShop) -> None:
    """The default (``moves_money=True``): the operator's word stands for it too."""
    moved, ended, inventory = _handled_cancel(shop, moves_money=True)
    assert moved == ended == "CANCELLED"
    assert inventory.released == []
