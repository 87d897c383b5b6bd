"""What a body passes to ``self.undo_with()`` and ``self.retry()`` is checked where the
body calls them, so a mistake fails the execution there, with a message saying what to
fix, instead of being found later: an undo name with a typo only once the body failed
after its charge (the charge then waited for an operator, unrefunded), a countdown the
store cannot hold as an exception outside the delivery (the execution left ``RUNNING``
with a lease that only expires). And an operator's receipt refused because the call's
``transaction_id`` reader raised names that reader, not the receipt."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest

from celery_agboss import OutboundCall, Unknown, operator
from celery_agboss.core.compensation import UndoStep
from celery_agboss.errors import OperatorRefusedError
from celery_agboss.task import undo_function
from celery_agboss.testing.gateway import FakeGatewayFault
from celery_agboss.testing.gateway_types import is_definite_failure
from tests.delivery.conftest import PaymentShop

pytestmark = pytest.mark.parametrize("delivery_store_url", ["sqlite"], indirect=True)


def _error(record: Any) -> dict[str, Any]:
    error: dict[str, Any] = json.loads(record.error or "{}")
    return error


def test_an_undo_name_nobody_registered_is_refused_where_it_is_declared(
    shop: PaymentShop,
) -> None:
    charge, refund = shop.call(), shop.refund_call()
    refused: list[BaseException] = []

    shop.refund_undo(refund)

    @shop.task()
    def pay(self: Any, order: str) -> Any:
        receipt = self.outbound(charge, {"amount": 1000}, business_key=f"order:{order}")
        try:
            self.undo_with("refund_charge", payment=receipt["id"])  # '_' for '-'
        except Exception as exc:
            refused.append(exc)
            raise
        return receipt

    with shop.worker():
        tid = str(pay.delay("o-1").id)
        record = shop.wait_state(tid, "FAILED", "WAITING_OPERATOR", "COMPLETED")
    assert refused, f"undo_with('refund_charge') accepted: the execution ended {record.state}"
    message = str(refused[0])
    assert "refund_charge" in message and "undo_function" in message, message
    assert "shop.pay" in message, message
    assert record.state.value == "FAILED", (record.state, record.reason)
    assert _error(record)["type"].endswith("ConfigurationError"), record.error


def test_an_undo_registered_after_the_task_module_is_found_at_the_declaration(
    shop: PaymentShop,
) -> None:
    """Undo functions may be registered by a module imported after the task's: what
    counts is that they are registered before a body declares one."""
    refund = shop.refund_call()

    pay = shop.pay_failing_after_its_charge("refund-late")

    @undo_function(shop.app, "refund-late")
    def refund_late(task: Any, undo: UndoStep, payment: str) -> None:
        task.outbound(refund, {"payment": payment})

    with shop.worker():
        tid = str(pay.delay("o-2").id)
        record = shop.wait_state(tid, "FAILED", "WAITING_OPERATOR", "COMPLETED")
    assert record.state.value == "FAILED", (record.state, record.reason)
    assert len(shop.gateway.payments) == 1 and len(shop.gateway.refunds) == 1


@pytest.mark.parametrize(
    "countdown, says",
    [
        (float("inf"), "finite"),
        (float("nan"), "finite"),
        (1e20, "100 years"),
        ("10", "number"),
    ],
    ids=["inf", "nan", "1e20", "text"],
)
def test_a_retry_countdown_the_store_cannot_hold_fails_the_execution_where_it_was_asked(
    shop: PaymentShop, countdown: Any, says: str
) -> None:
    ran: list[int] = []

    @shop.task()
    def pay(self: Any) -> Any:
        ran.append(1)
        raise self.retry(countdown=countdown)

    with shop.worker():
        result = pay.delay()
        record = shop.wait_state(str(result.id), "FAILED", "WAITING", "COMPLETED", timeout=10)
        result.get(timeout=10, propagate=False)  # the FAILURE reached the result backend
    assert record.state.value == "FAILED", (record.state, record.reason)
    assert result.state == "FAILURE", result.state
    message = _error(record)["message"]
    assert "shop.pay" in message and "retry(countdown=" in message and says in message, message
    assert ran == [1]


def test_a_long_retry_countdown_the_store_can_hold_still_waits(shop: PaymentShop) -> None:
    @shop.task()
    def pay(self: Any) -> Any:
        raise self.retry(countdown=timedelta(days=365 * 50))

    tid = shop.run(pay, states=("WAITING", "FAILED"))
    record = shop.execution(tid)
    assert record.state.value == "WAITING", (record.state, record.reason, record.error)
    assert record.reason == "retry", record.reason  # kept in the store, not a failed publish


def test_a_receipt_refused_because_the_transaction_id_reader_raised_names_the_reader(
    shop: PaymentShop,
) -> None:
    gateway = shop.gateway
    call = OutboundCall(
        name="inputs.charge_reader",
        send=lambda ctx: gateway.charge(1000, ctx.idempotency_key, reference="o-t"),
        reconcile=lambda ctx, lookup: Unknown("gateway under review"),
        key_retention=timedelta(hours=24),
        is_definite_failure=is_definite_failure,
        transaction_id=lambda receipt: receipt.id,  # a dict has no .id: raises
    )
    shop.agboss.register(call)

    @shop.task()
    def pay(self: Any) -> Any:
        return self.outbound(call, {"amount": 1000}, business_key="order:o-t")

    gateway.inject_fault(FakeGatewayFault.ANSWER_THEN_DROP, operation="charge")
    tid = shop.run(pay, states=("WAITING_OPERATOR",))
    (intent,) = shop.intents(tid)
    (payment,) = gateway.payments
    with pytest.raises(OperatorRefusedError) as refused:
        operator.resolve(
            shop.app, intent.idempotency_key, reason="seen in dashboard", completed=dict(payment)
        )
    message = str(refused.value)
    assert "transaction_id" in message and "inputs.charge_reader" in message, message
    assert "AttributeError" in message, message
