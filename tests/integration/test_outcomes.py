"""In a real worker (design: what Celery records): what Celery records for each way a delivery ends.

An unknown outcome is a retry, never a failure, and the retry reconciles (design: PS1); an
outcome no lookup can settle waits for an operator (nothing sent, nothing failed);
an application error after the charge settled is FAILED once, and a late duplicate
re-raises the stored failure without running the body; a definite decline is FAILED
with no payment; a pause ends the delivery until it is answered, once.

Deployment speed-ups it relies on: the harness's (``-Q``, a 5 s lease, no beat:
tests/integration/harness.py).
"""

from __future__ import annotations

import pytest

from celery_agboss import answer_pause
from celery_agboss.errors import NotPausedError
from celery_agboss.operator import list_pauses
from celery_agboss.testing.gateway import FakeGatewayFault, GatewayCapabilities
from tests.integration.gateway_http import wait_for
from tests.integration.harness import ShopFactory

pytestmark = [pytest.mark.worker, pytest.mark.redis, pytest.mark.slow]


def test_an_answer_lost_on_the_way_back_is_retried_and_reconciled_into_one_payment(
    shop_factory: ShopFactory,
) -> None:
    shop = shop_factory()
    shop.gateway.gateway.inject_fault(FakeGatewayFault.ANSWER_THEN_DROP)
    shop.start_worker()
    task_id = shop.publish("it.charge_order", "o-8")
    record = shop.wait_state(task_id, "COMPLETED", timeout=30)
    shop.wait_backend(task_id, "SUCCESS")
    gateway = shop.gateway.gateway
    assert (len(gateway.payments), len(gateway.requests)) == (1, 1), "reconciled, not resent"
    shop.wait_logged("reason=OutboundCallOutcomeUnknownError")
    shop.wait_logged(f"it.charge_order[{task_id}] retry")
    assert record.deliveries == 2
    assert shop.app.AsyncResult(task_id).result["payment"] == gateway.payments[0]["id"]


def test_an_outcome_no_lookup_can_settle_waits_for_an_operator(
    shop_factory: ShopFactory,
) -> None:
    shop = shop_factory()
    gateway = shop.gateway.gateway
    gateway.capabilities = GatewayCapabilities.NO_LOOKUP
    gateway.inject_fault(FakeGatewayFault.ANSWER_THEN_DROP)
    shop.start_worker()
    task_id = shop.publish("it.charge_order", "o-9")
    record = shop.wait_state(task_id, "WAITING_OPERATOR", timeout=30)
    shop.wait_logged("execution.waiting-operator")
    assert (len(gateway.payments), len(gateway.requests)) == (1, 1), "nothing sent again"
    assert shop.backend_state(task_id) == "RETRY", "never a FAILURE"
    assert record.reason and "OutboundCallUnreconciledError" in record.reason
    # A duplicate finds it waiting for an answer: the body does not run.
    shop.app.signature("it.charge_order", args=("o-9",)).apply_async(task_id=task_id)
    wait_for(
        lambda: shop.worker_log().count(f"execution.waiting execution_id={task_id}") >= 1,
        20,
        "the duplicate to be turned away",
    )
    assert len(shop.gateway.notes_of("body-start", task_id)) == 2
    assert shop.backend_state(task_id) == "RETRY"


def test_an_application_error_fails_once_and_a_duplicate_reraises_it(
    shop_factory: ShopFactory,
) -> None:
    shop = shop_factory()
    shop.start_worker()
    task_id = shop.publish("it.failing_charge", "o-10")
    record = shop.wait_state(task_id, "FAILED", timeout=30)
    shop.wait_backend(task_id, "FAILURE")
    assert record.error and "cannot be fulfilled" in record.error
    shop.app.signature("it.failing_charge", args=("o-10",)).apply_async(task_id=task_id)
    wait_for(
        lambda: f"execution.replayed execution_id={task_id}" in shop.worker_log(),
        20,
        "the duplicate to replay the failure",
    )
    wait_for(
        lambda: shop.worker_log().count(f"it.failing_charge[{task_id}] raised") == 2,
        20,
        "the duplicate to raise it",
    )
    assert len(shop.gateway.notes_of("body-start", task_id)) == 1, "the body never ran again"
    assert len(shop.gateway.gateway.payments) == 1
    result = shop.app.AsyncResult(task_id).result
    assert isinstance(result, ValueError) and "cannot be fulfilled" in str(result)


def test_a_declined_charge_fails_the_execution_with_no_payment(
    shop_factory: ShopFactory,
) -> None:
    shop = shop_factory()
    shop.gateway.gateway.inject_fault(FakeGatewayFault.DECLINE)
    shop.start_worker()
    task_id = shop.publish("it.charge_order", "o-11")
    shop.wait_state(task_id, "FAILED", timeout=30)
    shop.wait_backend(task_id, "FAILURE")
    assert shop.gateway.gateway.payments == []
    assert "GatewayDeclined" in repr(shop.app.AsyncResult(task_id).result)


def test_a_paused_payment_waits_for_its_answer_and_then_charges_once(
    shop_factory: ShopFactory,
) -> None:
    shop = shop_factory()
    shop.start_worker()
    with shop.capturing_events() as events:
        task_id = shop.publish("it.approved_charge", "o-12")
        shop.wait_state(task_id, "PAUSED")
        wait_for(lambda: any(e["type"] == "task-paused" for e in events), 10, "the event")
    assert "PAUSED" in shop.flower_state(events, task_id)
    assert shop.gateway.gateway.payments == []
    assert [p for p, _, _ in list_pauses(shop.app)] == [f"{task_id}:approve"]
    answer_pause(shop.app, f"{task_id}:approve", {"approved": True, "by": "ops"})
    with pytest.raises(NotPausedError):
        answer_pause(shop.app, f"{task_id}:approve", {"approved": False})
    shop.wait_state(task_id, "COMPLETED")
    shop.wait_backend(task_id, "SUCCESS")
    assert shop.app.AsyncResult(task_id).result["by"] == "ops"
    assert len(shop.gateway.gateway.payments) == 1
