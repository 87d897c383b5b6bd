"""P1 and PS3: a pool child frozen (SIGSTOP) past its lease wakes up as a zombie.

Its lease expires, the sweep re-drives the execution, another child takes it over
(token + 1) and charges. When the frozen child is continued it goes on running the
body, but its next step checks the lease first: it sends nothing, writes nothing,
and Celery records nothing for it (``Ignore`` + ``task-fenced``) — never a FAILURE
over the holder that finished the payment. The twin is plain Celery, where the
Redis visibility timeout hands the frozen task to another child: two payments.

Deployment speed-ups it relies on: the harness's (``-Q``, a 5 s lease, no beat:
tests/integration/harness.py).
"""

from __future__ import annotations

import pytest

from celery_agboss.core.protections import FENCE_RECORDED_AS_FAILURE
from tests.integration.gateway_http import wait_for
from tests.integration.harness import Shop, ShopFactory

pytestmark = [pytest.mark.worker, pytest.mark.redis, pytest.mark.slow]


def freeze_the_child_at_the_gate(shop: Shop, name: str, order: str) -> tuple[str, int]:
    """Publish ``name(order)``, SIGSTOP the child waiting at the gate, open the gate."""
    signature = shop.app.signature(name, args=(order,), kwargs={"gate_name": order})
    result = signature.apply_async()
    waiters = wait_for(lambda: shop.gateway.gate_waiters(order), 20, "a body at the gate")
    pid = waiters[0]
    shop.stop(pid)
    shop.gateway.open_gate(order)
    return str(result.id), pid


def test_a_zombie_past_its_lease_sends_nothing_and_records_nothing(
    shop_factory: ShopFactory, database_url: str
) -> None:
    shop = shop_factory(database_url=database_url)
    shop.start_worker()
    with shop.sweeping(), shop.capturing_events() as events:
        task_id, zombie = freeze_the_child_at_the_gate(shop, "it.charge_order", "o-2")
        try:
            record = shop.wait_state(task_id, "COMPLETED", timeout=45)
            shop.wait_backend(task_id, "SUCCESS")
            result_before = shop.app.AsyncResult(task_id).result
        finally:
            shop.cont(zombie)
        wait_for(lambda: "execution.fenced" in shop.worker_log(), 20, "the zombie to be fenced")
        wait_for(
            lambda: f"it.charge_order[{task_id}] ignored" in shop.worker_log(),
            20,
            "the zombie's delivery to end",
        )
        wait_for(lambda: any(e["type"] == "task-fenced" for e in events), 10, "the event")
    assert record.recovery_count == 1
    assert not [e for e in events if e["type"] == "task-failed"], "never a failure"
    assert shop.flower_state(events, task_id)[-1] == "SUCCESS", "what Flower shows at the end"
    gateway = shop.gateway.gateway
    assert len(gateway.requests) == 1, "the zombie sent nothing"
    assert len(gateway.payments) == 1
    assert len(shop.gateway.notes_of("body-start", task_id)) == 2
    assert len(shop.gateway.notes_of("body-end", task_id)) == 1, "the zombie stopped"
    after = shop.execution(task_id)
    assert after is not None
    assert (after.state.value, after.result, after.error, after.deliveries) == (
        "COMPLETED",
        record.result,
        None,
        2,
    ), "the zombie wrote nothing"
    lease = shop.agboss.store.read_lease(task_id)
    assert lease is not None and lease.token == 2
    assert shop.backend_state(task_id) == "SUCCESS"
    assert shop.app.AsyncResult(task_id).result == result_before


def test_a_zombie_whose_fence_is_recorded_as_a_failure_shows_a_failed_payment(
    shop_factory: ShopFactory,
) -> None:
    shop = shop_factory()
    shop.start_worker(sabotage=(FENCE_RECORDED_AS_FAILURE,))
    with shop.sweeping(), shop.capturing_events() as events:
        task_id, zombie = freeze_the_child_at_the_gate(shop, "it.charge_order", "o-2")
        try:
            shop.wait_backend(task_id, "SUCCESS", timeout=45)
        finally:
            shop.cont(zombie)
        # Celery's Redis backend keeps the SUCCESS, but the failure goes out: the
        # task-failed event (monitoring pages on it), task_failure, the errbacks.
        failed = wait_for(
            lambda: [e for e in events if e["type"] == "task-failed"], 20, "a task-failed event"
        )
    assert failed[0]["uuid"] == task_id


def test_without_agboss_a_frozen_task_is_charged_twice(shop_factory: ShopFactory) -> None:
    shop = shop_factory(visibility_timeout=4)
    shop.start_worker()
    _, zombie = freeze_the_child_at_the_gate(shop, "it.plain_charge", "o-2")
    try:
        wait_for(lambda: len(shop.gateway.gateway.payments) == 1, 30, "the redelivered copy to pay")
    finally:
        shop.cont(zombie)
    wait_for(lambda: len(shop.gateway.gateway.payments) == 2, 30, "the zombie to pay again")
