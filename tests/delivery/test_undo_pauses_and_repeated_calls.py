"""An undo that pauses for a person, and an undo that makes one call twice
(design: undo once, compensating).

A worker in a thread of this process, on both stores (tests/delivery/conftest.py).

- An undo's pause is part of its compensation, which a cancel never stops: answered
  despite the cancel request that started it, left alone by the sweep's cancel step, and
  an operator's cancel of it is refused as for ``COMPENSATING``. The customer is
  refunded once. The twin (``undo-pause-taken-for-the-bodys``) takes it for a pause of
  the body: the answer is refused, and the customer is never refunded.
- Two calls of one outbound call inside one undo, without business keys (two partial
  refunds), are two intents keyed by their position among the undo's calls of that
  name: two refunds, each once, also across a crash between them and the re-drive. The
  twin (``undo-calls-share-one-key``): one refund of 500 for a charge of 1000.
"""

from __future__ import annotations

from typing import Any

import pytest

from celery_agboss import NotPausedError, answer_pause
from celery_agboss.core.keys import business_key
from celery_agboss.core.outbound import CallContext, OutboundCall
from celery_agboss.core.protections import (
    UNDO_CALLS_SHARE_ONE_KEY,
    UNDO_PAUSE_TAKEN_FOR_THE_BODYS,
)
from celery_agboss.core.undo_steps import compensation_key
from celery_agboss.errors import OperatorRefusedError
from celery_agboss.operator import cancel
from celery_agboss.store.pauses import list_pauses
from celery_agboss.task import undo_function
from celery_agboss.testing import sabotage
from tests.delivery.conftest import PaymentShop
from tests.delivery.wallet_orders import released
from tests.engine.helpers import Crash
from tests.support.processes import wait_until

# --- a pause inside an undo ------------------------------------------------------------------


def _refund_after_approval(shop: PaymentShop) -> None:
    """The undo ``refund-after-approval``: it asks a person, then refunds if approved."""
    refund = shop.refund_call()

    @undo_function(shop.app, "refund-after-approval")
    def refund_after_approval(task: Any, undo: Any, payment: str) -> None:
        decision = task.pause("approve-refund", {"payment": payment})
        if decision.get("approved"):
            task.outbound(refund, {"payment": payment})


def _paused_in_the_cancels_undo(shop: PaymentShop) -> str:
    """Charge, declare the undo, be revoked: the cancel runs the undo, which pauses."""
    _refund_after_approval(shop)
    task_id = shop.pay_revoked_after_its_charge("refund-after-approval")("o-2")
    record = shop.wait_state(task_id, "PAUSED", "CANCELLED", "WAITING_OPERATOR")
    assert record.state.value == "PAUSED" and record.cancel_requested, record
    released(shop, task_id)
    return task_id


def _undo_pause(shop: PaymentShop, task_id: str) -> str:
    """The id of the undo's pending pause: ``approve-refund``, made the undo's own."""
    pending = shop.agboss.executions.read_pauses(execution_id=task_id)
    [pause_id] = [p.pause_id for p in pending if p.status == "PENDING"]
    assert pause_id.startswith(f"{task_id}:approve-refund@"), pause_id
    return pause_id


def test_a_pause_in_a_cancels_undo_is_answered_and_the_customer_refunded(
    shop: PaymentShop,
) -> None:
    with shop.worker():
        task_id = _paused_in_the_cancels_undo(shop)
        pause_id = _undo_pause(shop, task_id)
        shop.sweep()  # its cancel step leaves the undo's pause alone
        assert shop.execution(task_id).state.value == "PAUSED"
        assert task_id not in shop.agboss.executions.find_cancel_requested(100)
        assert (pause_id, task_id, "PENDING") in list_pauses(shop.agboss.store)
        answered = answer_pause(shop.app, pause_id, {"approved": True})
        assert answered, "back to its undos, published again at once, cancel or not"
        record = shop.wait_state(task_id, "CANCELLED", "WAITING_OPERATOR", "FAILED")
    assert record.state.value == "CANCELLED", record.reason
    [payment] = shop.gateway.payments
    assert [r["payment"] for r in shop.gateway.refunds] == [payment["id"]]


def test_twin_a_pause_in_a_cancels_undo_taken_for_the_bodys_never_refunds(
    shop: PaymentShop,
) -> None:
    with shop.worker(), sabotage(UNDO_PAUSE_TAKEN_FOR_THE_BODYS):
        task_id = _paused_in_the_cancels_undo(shop)
        with pytest.raises(NotPausedError, match="a cancel was requested"):
            answer_pause(shop.app, _undo_pause(shop, task_id), {"approved": True})
        assert task_id in shop.agboss.executions.find_cancel_requested(100)
        shop.sweep()  # the cancel step takes it back to COMPENSATING: it pauses again
        shop.wait_state(task_id, "COMPENSATING", "PAUSED")
    assert shop.gateway.refunds == []


def _paused_in_a_failures_undo(shop: PaymentShop) -> str:
    """Charge, declare the undo, fail: the failure's undo pauses."""
    _refund_after_approval(shop)

    pay = shop.pay_failing_after_its_charge("refund-after-approval")

    task_id = str(pay.delay("o-3").id)
    shop.wait_state(task_id, "PAUSED")
    released(shop, task_id)
    return task_id


def test_a_cancel_of_an_execution_paused_in_its_undo_is_refused(shop: PaymentShop) -> None:
    """As for ``COMPENSATING``: the undo goes on, answered, then ``FAILED``."""
    with shop.worker():
        task_id = _paused_in_a_failures_undo(shop)
        with pytest.raises(OperatorRefusedError, match=r"ends FAILED .* or CANCELLED"):
            cancel(shop.app, task_id, "the customer changed their mind")
        record = shop.execution(task_id)
        assert record.state.value == "PAUSED" and not record.cancel_requested
        answer_pause(shop.app, _undo_pause(shop, task_id), {"approved": True})
        record = shop.wait_state(task_id, "FAILED", "CANCELLED", "WAITING_OPERATOR")
    assert record.state.value == "FAILED" and "out of stock" in (record.error or ""), record
    assert len(shop.gateway.refunds) == 1


def test_twin_a_cancel_of_a_paused_undo_accepted_leaves_its_pause_unanswerable(
    shop: PaymentShop,
) -> None:
    with shop.worker(), sabotage(UNDO_PAUSE_TAKEN_FOR_THE_BODYS):
        task_id = _paused_in_a_failures_undo(shop)
        moved = cancel(shop.app, task_id, "the customer changed their mind")
        assert moved.state.value == "COMPENSATING"
        shop.sweep()  # the re-drive runs the undo again: it pauses again
        wait_until(
            lambda: (
                shop.execution(task_id).deliveries >= 2
                and shop.execution(task_id).state.value == "PAUSED"
            ),
            20,
            message="the re-driven undo to pause again",
        )
        with pytest.raises(NotPausedError, match="a cancel was requested"):
            answer_pause(shop.app, _undo_pause(shop, task_id), {"approved": True})
    assert shop.gateway.refunds == []


# --- one call twice inside an undo ----------------------------------------------------------


def _part_refund(shop: PaymentShop) -> OutboundCall:
    """Refunds ``request["amount"]`` of ``request["payment"]``, reconciled by a lookup."""
    gateway = shop.gateway

    def send(call: CallContext) -> Any:
        request = call.request
        return gateway.refund(request["payment"], call.idempotency_key, amount=request["amount"])

    return shop.looked_up_call("shop.part-refund", send)


def _two_part_refunds(shop: PaymentShop, amounts: tuple[int, int], crash: bool = False) -> str:
    """A charge of 1000 undone by two partial refunds of one call, made with no business
    key, then a failure; ``crash``: the first delivery dies between the two refunds, and
    the sweep re-drives it once its lease expired."""
    part = _part_refund(shop)
    crashed: list[str] = []

    @undo_function(shop.app, "refund-two")
    def refund_two(task: Any, undo: Any, payment: str) -> None:
        task.outbound(part, {"payment": payment, "amount": amounts[0]})
        if crash and not crashed:
            crashed.append(undo.key)
            raise Crash()
        task.outbound(part, {"payment": payment, "amount": amounts[1]})

    pay = shop.pay_failing_after_its_charge("refund-two")

    with shop.worker():
        task_id = str(pay.delay("o-5").id)
        if crash:
            wait_until(lambda: crashed, 10, message="the crash between the refunds")
            shop.redrive_after_crash(task_id)
        record = shop.wait_state(task_id, "FAILED", "WAITING_OPERATOR")
    assert record.state.value == "FAILED", record.reason
    return task_id


@pytest.mark.parametrize("amounts", [(500, 500), (500, 300)], ids=["same", "different"])
def test_two_calls_of_one_name_in_an_undo_are_two_refunds(
    shop: PaymentShop, amounts: tuple[int, int]
) -> None:
    task_id = _two_part_refunds(shop, amounts)
    [payment] = shop.gateway.payments
    assert shop.refunded() == sorted((payment["id"], amount) for amount in amounts)
    # The first keeps the key an undo's call always had: a refund in flight keeps it.
    tenant = shop.agboss.engine_settings.tenant
    charge_key = business_key(tenant, "order:o-5", "shop.charge")
    first = business_key(tenant, compensation_key(charge_key), "shop.part-refund")
    keys = {r["idempotency_key"] for r in shop.gateway.refunds}
    assert first in keys and len(keys) == 2, keys
    assert shop.execution(task_id).state.value == "FAILED"


def test_a_crash_between_the_two_refunds_sends_only_the_second_on_redrive(
    shop: PaymentShop,
) -> None:
    _two_part_refunds(shop, (500, 500), crash=True)
    [payment] = shop.gateway.payments
    assert shop.refunded() == [(payment["id"], 500), (payment["id"], 500)]
    assert len(shop.gateway.requests) == 3, "one charge, each refund sent once"


def test_twin_two_calls_of_one_name_sharing_the_undos_key_refund_once(shop: PaymentShop) -> None:
    with sabotage(UNDO_CALLS_SHARE_ONE_KEY):
        _two_part_refunds(shop, (500, 500))
    [payment] = shop.gateway.payments
    assert shop.refunded() == [(payment["id"], 500)]
