"""A revoke is a cancel request the store keeps (design: cancel request), whoever sends it
and however long the worker remembers it.

A worker in a thread of this process (tests/delivery/conftest.py): it hears the revoke's
broadcast and keeps the id in its revoked set, as every Celery worker does for hours
(and hands it to new workers through mingle).

- A revoked execution owes its undo: the order was charged, the revoke stopped the body,
  the first refund was refused and an operator re-drove it. Celery would drop the
  re-drive's message as revoked, on every worker that heard the revoke, and the refund
  would never be sent; the store decides instead (``PaymentRequest.revoked``). Twin
  ``revoked-id-drops-later-messages``: never refunded.
- ``celery -A proj control revoke ID`` broadcasts without ``app.control.revoke``; the
  broadcast itself is recorded, so a body it revoked stops before its charge. Twin
  ``revoke-broadcast-not-recorded``: the revoked order is charged.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from celery import signals as celery_signals
from celery.worker import state as worker_state

from celery_agboss.core.protections import (
    REVOKE_BROADCAST_NOT_RECORDED,
    REVOKED_ID_DROPS_LATER_MESSAGES,
)
from celery_agboss.operator import redrive
from celery_agboss.testing import sabotage
from celery_agboss.testing.gateway import FakeGatewayFault
from tests.delivery.conftest import PaymentShop, assert_waits_for_an_operator
from tests.support.processes import wait_until

pytestmark = pytest.mark.parametrize("delivery_store_url", ["sqlite"], indirect=True)
"""The store's part is the engine suite's (both stores); these check the worker's."""


@contextmanager
def _revoked_ids_forgotten(*task_ids: list[str]) -> Iterator[None]:
    """The worker's revoked set is this process's: cleaned whatever the test did."""
    try:
        yield
    finally:
        for ids in task_ids:
            for task_id in ids:
                worker_state.revoked.discard(task_id)


def _dropped_as_revoked(task_id: str) -> threading.Event:
    """Set when a worker drops a message of ``task_id`` as revoked."""
    dropped = threading.Event()

    def on_revoked(request: Any = None, **_: Any) -> None:
        if getattr(request, "id", None) == task_id:
            dropped.set()

    celery_signals.task_revoked.connect(on_revoked, weak=False)
    dropped.disconnect = lambda: celery_signals.task_revoked.disconnect(on_revoked)  # type: ignore[attr-defined]
    return dropped


def _swept(shop: PaymentShop) -> bool:
    """One sweep, the clock past any wait it could see: it re-publishes what is due."""
    shop.clock.advance(120)
    shop.sweep(claim_tick=False)
    return True


def _revoked_then_refund_refused_then_redriven(shop: PaymentShop, ids: list[str]) -> str:
    """Charged, its refund undo declared, revoked mid-body: the refund is refused
    definitively (nothing moved), the execution waits for an operator, who re-drives
    it; the re-drive's message reaches the worker that heard the revoke."""
    refund = shop.refund_call("shop.refusable-refund", refusable=True)

    shop.refund_undo(refund)

    pay_and_revoke = shop.pay_revoked_after_its_charge("refund-charge")
    shop.gateway.inject_fault(FakeGatewayFault.DECLINE, operation="refund")
    with shop.worker():
        task_id = pay_and_revoke("o-1")
        ids.append(task_id)
        record = shop.wait_state(task_id, "WAITING_OPERATOR", "CANCELLED")
        assert_waits_for_an_operator(record, "undo refund-charge failed")
        assert task_id in worker_state.revoked, "the worker heard the revoke"
        dropped = _dropped_as_revoked(task_id)
        try:
            redrive(shop.app, task_id, "balance topped up", actor="test")  # the sweep sends it
            wait_until(
                lambda: (
                    _swept(shop)
                    and (dropped.is_set() or shop.execution(task_id).state.value == "CANCELLED")
                ),
                20,
                interval=0.5,
                message="the re-drive to be delivered or dropped",
            )
        finally:
            dropped.disconnect()  # type: ignore[attr-defined]
    return task_id


def test_a_revoked_execution_s_redriven_undo_reaches_the_worker_that_heard_the_revoke(
    shop: PaymentShop,
) -> None:
    ids: list[str] = []
    with _revoked_ids_forgotten(ids):
        task_id = _revoked_then_refund_refused_then_redriven(shop, ids)
    assert shop.execution(task_id).state.value == "CANCELLED"
    assert len(shop.gateway.payments) == 1
    assert len(shop.gateway.refunds) == 1, "the revoked order's charge refunded once"


def test_twin_the_revoked_set_drops_the_redrive_and_the_customer_is_never_refunded(
    shop: PaymentShop,
) -> None:
    ids: list[str] = []
    with _revoked_ids_forgotten(ids), sabotage(REVOKED_ID_DROPS_LATER_MESSAGES):
        task_id = _revoked_then_refund_refused_then_redriven(shop, ids)
    assert shop.execution(task_id).state.value != "CANCELLED"
    assert shop.gateway.refunds == []
    assert len(shop.gateway.payments) == 1


def _revoked_by_broadcast_before_the_charge(shop: PaymentShop, ids: list[str]) -> str:
    """The body waits before its charge; the revoke comes as ``celery control revoke ID``
    sends it (a broadcast, not ``app.control.revoke``); once the worker heard it, the
    body goes on."""
    charge = shop.call()
    at_the_step, go_on = threading.Event(), threading.Event()

    @shop.task()
    def pay(self: Any, order: str) -> Any:
        at_the_step.set()
        assert go_on.wait(20)
        return self.outbound(charge, {"amount": 1000}, business_key=f"order:{order}")

    with shop.worker():
        task_id = str(pay.delay("o-2").id)
        ids.append(task_id)
        assert at_the_step.wait(20)
        shop.app.control.broadcast("revoke", arguments={"task_id": [task_id]})
        wait_until(lambda: task_id in worker_state.revoked, 10, message="the worker to hear it")
        go_on.set()
        shop.wait_state(task_id, "CANCELLED", "COMPLETED")
    return task_id


def test_a_revoke_broadcast_from_the_command_line_stops_the_body_before_its_charge(
    shop: PaymentShop,
) -> None:
    ids: list[str] = []
    with _revoked_ids_forgotten(ids):
        task_id = _revoked_by_broadcast_before_the_charge(shop, ids)
    assert shop.execution(task_id).state.value == "CANCELLED"
    assert shop.gateway.payments == []


def test_twin_a_revoke_broadcast_not_recorded_lets_the_revoked_order_be_charged(
    shop: PaymentShop,
) -> None:
    ids: list[str] = []
    with _revoked_ids_forgotten(ids), sabotage(REVOKE_BROADCAST_NOT_RECORDED):
        task_id = _revoked_by_broadcast_before_the_charge(shop, ids)
    assert shop.execution(task_id).state.value == "COMPLETED"
    assert len(shop.gateway.payments) == 1
