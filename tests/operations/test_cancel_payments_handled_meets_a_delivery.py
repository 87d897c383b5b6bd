"""``cancel --payments-handled`` that meets a delivery between the verb's checks and the
store's lock (docs/operators.md: Cancelling). The verb saw the execution idle (no live
lease, nothing pending); a delivery took its lease before the store's transaction locked
the row. The flag is never dropped: the cancel is refused with nothing written, naming
why, and the operator cancels again once the delivery ended. Kept with the request, the
operator's word would also cover a payment that delivery makes after it (never refunded);
dropped, the request's end runs the refund's undo the operator made by hand.

A waiting order (the wallet debited, the card charged, both with undos), refunded by hand
at the gateway; the interleaving is forced by taking the execution's lease through the
store's API right after the verb's checks. Real worker, both stores.

Twin ``payments-handled-dropped-while-running`` (the store keeps the cancel request and
drops the flag, as before): the sweep ends the request without it, the refund's undo runs,
and a second refund request reaches the gateway after the operator's.
"""

from __future__ import annotations

from typing import Any

import pytest

from celery_agboss.core.executions import ExecutionRecord
from celery_agboss.core.protections import PAYMENTS_HANDLED_DROPPED_WHILE_RUNNING
from celery_agboss.core.store_protocol import LeaseGrant
from celery_agboss.errors import OperatorRefusedError
from celery_agboss.operator import acting, cancel
from celery_agboss.runtime.app_runtime import Runtime
from celery_agboss.testing import sabotage
from tests.delivery.conftest import PaymentShop
from tests.delivery.wallet_orders import (
    HANDLED,
    credited_back_once,
    debit_kept,
    our_refund_requests,
    placed_and_waiting,
    refund_by_hand,
    wallet_and_card_order,
)
from tests.support.processes import wait_until

ENDS = ("CANCELLED", "WAITING_OPERATOR", "FAILED")


def _taken_after_the_checks(
    shop: PaymentShop, monkeypatch: pytest.MonkeyPatch, task_id: str
) -> list[LeaseGrant]:
    """Once the verb's checks passed, a delivery takes the execution's lease (as a
    re-delivery would), before the store's transaction; the grants taken."""
    grants: list[LeaseGrant] = []
    checks = acting._refuse_a_cancel_now

    def checked_then_taken(runtime: Runtime, record: ExecutionRecord) -> None:
        checks(runtime, record)
        grant = shop.agboss.store.acquire_lease(task_id, "a-redelivery", 30_000)
        assert grant is not None, "the lease was free when the checks passed"
        grants.append(grant)

    monkeypatch.setattr(acting, "_refuse_a_cancel_now", checked_then_taken)
    return grants


def _swept_to_an_end(shop: PaymentShop, task_id: str) -> ExecutionRecord:
    """The sweep runs until the execution ends or waits for an operator."""

    def ended() -> ExecutionRecord | None:
        shop.sweep()
        record = shop.execution(task_id)
        return record if record.state.value in ENDS else None

    found: ExecutionRecord = wait_until(ended, 20, interval=0.2, message=f"{task_id} to end")
    return found


def _handled_cancel_meets_a_delivery(
    shop: PaymentShop, monkeypatch: pytest.MonkeyPatch
) -> tuple[OperatorRefusedError | None, ExecutionRecord, ExecutionRecord, list[Any]]:
    """The operator refunds the waiting order's card by hand and cancels with
    ``--payments-handled``; a delivery takes the lease in between, then ends (its lease
    released). A refused operator looks again and cancels once more. What the first
    cancel was told (None: accepted), the row right after it, the end, the credits."""
    pay, credited = wallet_and_card_order(shop)
    with shop.worker():
        task_id = placed_and_waiting(shop, pay)
        refund_by_hand(shop)
        grants = _taken_after_the_checks(shop, monkeypatch, task_id)
        refused: OperatorRefusedError | None = None
        try:
            cancel(shop.app, task_id, HANDLED, payments_handled=True)
        except OperatorRefusedError as exc:
            refused = exc
        monkeypatch.undo()
        after = shop.execution(task_id)
        (grant,) = grants
        assert shop.agboss.store.release_lease(grant.lease), "the delivery ends"
        if refused is not None:
            cancel(shop.app, task_id, HANDLED, payments_handled=True)  # looked again
        ended = _swept_to_an_end(shop, task_id)
    assert len(shop.gateway.payments) == 1
    return refused, after, ended, credited


def test_payments_handled_cancel_that_meets_a_delivery_is_refused_and_refunds_nothing(
    shop: PaymentShop, monkeypatch: pytest.MonkeyPatch
) -> None:
    refused, after, ended, credited = _handled_cancel_meets_a_delivery(shop, monkeypatch)
    assert our_refund_requests(shop) == [], "no refund sent after the operator's"
    assert len(shop.gateway.refunds) == 1, "the operator's, by hand"
    assert refused is not None, "told, not 'cancel requested' with the flag dropped"
    assert refused.code == "lease-live", refused.code
    assert "nothing was recorded" in str(refused), str(refused)
    assert not after.cancel_requested and after.payments_handled_at_ms is None, "nothing written"
    assert after.state.value == "WAITING"
    assert [e.action for e in shop.agboss.executions.list_audit(after.id)] == [
        "cancel:payments-handled"
    ], "the audit row of the second cancel only"
    assert ended.state.value == "CANCELLED", ended.reason
    credited_back_once(shop, credited, "cancel")
    assert ended.payments_handled_at_ms is not None


def test_twin_payments_handled_dropped_while_running_refunds_again(
    shop: PaymentShop, monkeypatch: pytest.MonkeyPatch
) -> None:
    with sabotage(PAYMENTS_HANDLED_DROPPED_WHILE_RUNNING):
        refused, after, ended, credited = _handled_cancel_meets_a_delivery(shop, monkeypatch)
    assert refused is None and after.cancel_requested, "reported 'cancel requested'"
    assert after.payments_handled_at_ms is None, "the operator's word dropped"
    requests = our_refund_requests(shop)
    assert len(requests) == 1, "a second refund request, after the operator's"
    assert ended.state.value == "WAITING_OPERATOR", ended.reason
    debit_kept(shop, credited)
