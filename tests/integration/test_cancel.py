"""Revoked (design: cancel request): a cancel request, a reconcile-only delivery, then
``CANCELLED``.

A revoke (with or without ``terminate``) is recorded as a cancel request. An
execution that never started becomes ``CANCELLED`` and its message never runs
the body. One revoked mid-send (``terminate=True`` kills the pool child while
the charge is on the wire) is left with a PENDING intent: the next delivery does
not run the body — it looks the intent up (never sends) and settles it; at most one
payment. A lookup's "not found" settles the
intent ``FAILED`` only when the call's lookup proves absence; otherwise a person
decides (``WAITING_OPERATOR``, never "failed"); one whose payment went through is
never silently ``CANCELLED`` either: it waits for a person. The twin ignores the cancel request
and runs the body: the lookup finds nothing, so the charge is sent again and a
cancelled order is paid.

Deployment speed-ups it relies on: the harness's (``-Q``, a 5 s lease, no beat:
tests/integration/harness.py).
"""

from __future__ import annotations

import pytest

from celery_agboss.core.executions import CANCELLED_AFTER_PAYMENT
from celery_agboss.core.protections import CANCEL_REQUEST_IGNORED
from celery_agboss.core.store_protocol import IntentStatus
from celery_agboss.operator import cancel, list_waits
from celery_agboss.testing.gateway_types import GatewayRequestOutcome
from tests.integration.gateway_http import wait_for
from tests.integration.harness import Shop, ShopFactory

pytestmark = [pytest.mark.worker, pytest.mark.redis, pytest.mark.slow]


def revoke_with_terminate_mid_send(shop: Shop, order: str, *, processed: bool) -> str:
    """Publish ``it.charge_order(order)``; revoke it with ``terminate=True`` while its
    charge is held at the gateway (``processed``: after the gateway charged, with the
    answer held; else before, and the gateway then gives up without charging). Returns
    once the killed delivery's lease is dead, with the gateway's hold over."""
    gateway = shop.gateway.gateway
    gateway.hold(operation="charge", before_processing=not processed, timeout=3)
    task_id = shop.publish("it.charge_order", order)
    wait_for(lambda: gateway.requests, 20, "the charge on the wire")
    shop.app.control.revoke(task_id, terminate=True)
    record = shop.wait_cancel_requested(task_id)
    assert record.state.value == "RUNNING"
    wait_for(
        lambda: f"Terminating {task_id}" in shop.worker_log(),
        10,
        "the worker to terminate the delivery",
    )
    shop.wait_lease_dead(task_id, timeout=20)
    wait_for(
        lambda: gateway.requests[0].outcome is not GatewayRequestOutcome.ON_THE_WIRE,
        10,
        "the gateway to give up holding the request",
    )
    return task_id


def redeliver(shop: Shop, task_id: str, *, sabotage: tuple[str, ...] = ()) -> None:
    """The next delivery of the execution — the same message again — on a worker that
    did not hear the revoke (one that did discards the id from memory; a restarted
    worker, or another host's, does not)."""
    for worker in shop.workers:
        worker.close()
    shop.start_worker(sabotage=sabotage)
    record = shop.execution(task_id)
    assert record is not None
    shop.agboss.republish(record, reason="test: next delivery", honour_not_before=False)


def test_a_payment_revoked_before_it_started_never_runs(shop_factory: ShopFactory) -> None:
    shop = shop_factory()
    task_id = shop.publish("it.charge_order", "o-41")
    shop.app.control.revoke(task_id)  # no worker hears it: only the store knows
    record = shop.wait_state(task_id, "CANCELLED", timeout=5)
    assert record.cancel_requested
    shop.start_worker()
    wait_for(
        lambda: f"execution.replayed execution_id={task_id}" in shop.worker_log(),
        20,
        "the worker to turn the message away",
    )
    assert shop.gateway.notes_of("body-start", task_id) == [], "the body never ran"
    assert shop.gateway.gateway.requests == []
    assert shop.execution(task_id).state.value == "CANCELLED"  # type: ignore[union-attr]


def test_a_charge_revoked_mid_send_with_its_answer_lost_is_reconciled_and_waits_for_a_person(
    shop_factory: ShopFactory,
) -> None:
    """The lookup finds the payment: money moved, so the cancel never ends it silently
    ``CANCELLED``; it waits for an operator ("cancelled after a completed payment"),
    listed by ``agboss pending`` with the command that ends it."""
    shop = shop_factory()
    shop.start_worker()
    gateway = shop.gateway.gateway
    task_id = revoke_with_terminate_mid_send(shop, "o-42", processed=True)
    assert len(gateway.payments) == 1, "the gateway charged before the delivery was killed"
    redeliver(shop, task_id)
    record = shop.wait_state(task_id, "WAITING_OPERATOR", timeout=30)
    assert record.reason and record.reason.startswith(CANCELLED_AFTER_PAYMENT)
    assert len(shop.gateway.notes_of("body-start", task_id)) == 1, "the body never ran again"
    assert (len(gateway.requests), len(gateway.payments)) == (1, 1), "looked up, never resent"
    assert gateway.lookups, "the intent was reconciled first"
    (intent,) = shop.intents_of(task_id)
    assert intent.status is IntentStatus.COMPLETED, "the payment is recorded, not lost"
    (wait,) = [w for w in list_waits(shop.app) if w.execution.id == task_id]
    assert "--payments-handled" in wait.ends_with
    ended = cancel(shop.app, task_id, "refunded by hand", payments_handled=True)
    assert ended.state.value == "CANCELLED" and ended.terminal_at_ms is not None


def test_a_charge_revoked_before_the_gateway_processed_it_is_cancelled_with_nothing_paid(
    shop_factory: ShopFactory,
) -> None:
    shop = shop_factory(lookup_proves_absence=True)
    shop.start_worker()
    gateway = shop.gateway.gateway
    task_id = revoke_with_terminate_mid_send(shop, "o-43", processed=False)
    redeliver(shop, task_id)
    shop.wait_state(task_id, "CANCELLED", timeout=30)
    assert len(shop.gateway.notes_of("body-start", task_id)) == 1
    assert len(gateway.requests) == 1, "nothing sent again"
    assert gateway.payments == []
    (intent,) = shop.intents_of(task_id)
    assert intent.status is IntentStatus.FAILED, "reconcile proved it was never processed"


def test_a_cancel_whose_lookup_proves_nothing_waits_for_an_operator_never_failed(
    shop_factory: ShopFactory,
) -> None:
    shop = shop_factory()  # a replay-only NotSent: "a resend would be deduplicated"
    shop.start_worker()
    gateway = shop.gateway.gateway
    task_id = revoke_with_terminate_mid_send(shop, "o-44", processed=False)
    redeliver(shop, task_id)
    record = shop.wait_state(task_id, "WAITING_OPERATOR", timeout=30)
    assert record.cancel_requested
    (intent,) = shop.intents_of(task_id)
    assert intent.status is IntentStatus.PENDING and intent.needs_operator
    assert len(gateway.requests) == 1 and gateway.payments == [], "nothing sent again"
    assert len(shop.gateway.notes_of("body-start", task_id)) == 1


def test_a_delivery_that_ignores_the_cancel_request_pays_a_cancelled_order(
    shop_factory: ShopFactory,
) -> None:
    shop = shop_factory()
    shop.start_worker()
    gateway = shop.gateway.gateway
    task_id = revoke_with_terminate_mid_send(shop, "o-43", processed=False)
    redeliver(shop, task_id, sabotage=(CANCEL_REQUEST_IGNORED,))
    shop.wait_state(task_id, "COMPLETED", timeout=30)
    assert len(shop.gateway.notes_of("body-start", task_id)) == 2, "the body ran again"
    assert len(gateway.requests) == 2 and len(gateway.payments) == 1, "the order was paid"
