"""Trap 1 and trap 3: copies of a message delivered while its execution runs.

A ``self.retry()`` message is published before the original delivery ends, and a
Redis visibility timeout shorter than a task hands the running message to another
child. Either copy finds the lease live: it is deferred (``Ignore``, ``wake_requested``
set in the same transaction) and never runs the body beside the holder; the holder's
release re-publishes the execution if it is not finished. The twin is plain Celery:
the visibility timeout runs the long task twice, concurrently, and it pays twice.

Deployment speed-ups it relies on: the harness's (``-Q``, a 5 s lease, no beat:
tests/integration/harness.py).
"""

from __future__ import annotations

import pytest

from tests.integration.gateway_http import wait_for
from tests.integration.harness import ShopFactory

pytestmark = [pytest.mark.worker, pytest.mark.redis, pytest.mark.slow]


def test_a_retry_delivered_while_the_original_holds_the_lease_is_woken_on_release(
    shop_factory: ShopFactory,
) -> None:
    shop = shop_factory()
    shop.start_worker()
    with shop.capturing_events() as events:
        task_id = shop.publish("it.retrying_charge", "o-3")
        record = shop.wait_state(task_id, "COMPLETED", timeout=30)
        shop.wait_backend(task_id, "SUCCESS")
        wait_for(lambda: any(e["type"] == "task-deferred" for e in events), 10, "the event")
    assert "DEFERRED" in shop.flower_state(events, task_id), "Flower shows the deferral"
    shop.wait_logged("execution.deferred")  # the retry message met the original's lease
    shop.wait_logged("execution.republished")
    shop.wait_logged("reason=woken")
    starts = shop.gateway.notes_of("body-start", task_id)
    assert [note.fields["retries"] for note in starts] == [0, 1], "the deferred copy never ran"
    assert len(shop.gateway.notes_of("retry-deferred-seen", task_id)) == 1
    assert len(shop.gateway.gateway.payments) == 1
    assert record.deliveries == 2
    assert record.recovery_count == 0, "a wake is not a recovery"


def test_a_task_longer_than_the_visibility_timeout_runs_its_body_once(
    shop_factory: ShopFactory,
) -> None:
    shop = shop_factory(visibility_timeout=3)
    shop.start_worker()
    task_id = shop.publish("it.slow_charge", "o-4", 9.0)
    record = shop.wait_state(task_id, "COMPLETED", timeout=40)
    shop.wait_backend(task_id, "SUCCESS")
    shop.wait_logged("execution.deferred")
    assert len(shop.gateway.notes_of("body-start", task_id)) == 1, "no concurrent body"
    assert len(shop.gateway.gateway.payments) == 1
    assert record.deliveries == 1


def test_a_retry_whose_countdown_is_longer_than_the_visibility_timeout_runs_once(
    shop_factory: ShopFactory,
) -> None:
    """Trap 1: a message waiting in Redis longer than the visibility timeout is handed out
    again. The wait is kept in the store instead (WAITING, not_before) and the sweep
    publishes the task when it is due: the body runs once, not before its countdown."""
    shop = shop_factory(visibility_timeout=3)
    shop.start_worker()
    with shop.sweeping():
        task_id = shop.publish("it.waiting_charge", "o-4b", 8.0)
        waiting = shop.wait_state(task_id, "WAITING", timeout=20)
        assert waiting.not_before_ms is not None and waiting.reason == "retry"
        record = shop.wait_state(task_id, "COMPLETED", timeout=60)
    shop.wait_logged(f"execution.waiting delay=8.0 execution_id={task_id} reason=retry")
    shop.wait_backend(task_id, "SUCCESS")
    starts = shop.gateway.notes_of("body-start", task_id)
    after_wait = [n for n in starts if n.fields["retries"] == 1]
    assert len(after_wait) == 1, f"the body after the wait ran once (starts: {starts})"
    assert after_wait[0].at - starts[0].at >= 8.0 - 0.5, "not before its countdown"
    assert len(shop.gateway.gateway.payments) == 1
    payment = shop.gateway.gateway.payments[0]["id"]
    assert shop.app.AsyncResult(task_id).result == {"payment": payment, "order": "o-4b"}
    assert record.state.value == "COMPLETED"


def test_without_agboss_a_retry_longer_than_the_visibility_timeout_pays_twice(
    shop_factory: ShopFactory,
) -> None:
    shop = shop_factory(visibility_timeout=3)
    shop.start_worker()
    shop.app.signature("it.plain_waiting_charge", args=("o-4c", 8.0)).apply_async()
    wait_for(lambda: len(shop.gateway.gateway.payments) >= 2, 40, "a second payment")


def test_without_agboss_a_task_longer_than_the_visibility_timeout_pays_twice(
    shop_factory: ShopFactory,
) -> None:
    shop = shop_factory(visibility_timeout=3)
    shop.start_worker()
    signature = shop.app.signature("it.plain_charge", args=("o-4",), kwargs={"seconds": 6.0})
    task_id = str(signature.apply_async().id)
    wait_for(lambda: len(shop.gateway.gateway.payments) == 2, 30, "a second payment")
    starts = shop.gateway.notes_of("body-start", task_id)
    ends = shop.gateway.notes_of("body-end", task_id)
    assert starts[1].at < ends[0].at, "the copies ran at the same time"
