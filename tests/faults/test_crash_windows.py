"""Crash windows of the payment scenarios (design: scenarios), each test named by its own
``s<nn>`` label, on real workers deployed as README.md says: the wheel in a fresh venv, the
README's ``shop.py``, its ``celery -A shop worker`` and ``celery -A shop beat`` lines,
nothing else.

Each guarantee is counted at the gateway, which does not deduplicate keys (a second
send under one key is a second payment): payments and requests per order's key, the
app's ``shop_paid_orders`` rows, and the executions' states in the store. Each has a
sabotage run on PostgreSQL + Redis that switches its protection off in the workers
(``AGBOSS_SABOTAGE``, refused outside a test run) and shows the harm.

- s03, a pool child SIGKILLed after the gateway charged, before its answer came
  back: SQLite+Redis, PostgreSQL+Redis, PostgreSQL+RabbitMQ;
- s09, a whole worker SIGKILLed with the answer in flight: its guarantee runs in
  tests/deployment/test_recovery.py on all four; its sabotage run is here;
- s10, one order, two executions at once: SQLite+Redis, PostgreSQL+Redis,
  PostgreSQL+RabbitMQ;
- s14, the gateway charged and the answer was lost (an error after processing):
  SQLite+Redis, PostgreSQL+Redis.

Speed-ups: those of tests/faults/scenario.py (lease TTL 5 s, sweep every 2 s,
requested grace 3 s, retry after 1 s), all README ``AGBOSS_<NAME>`` variables.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping

import pytest

from celery_agboss.core.protections import (
    LIVE_OWNER_TAKEN_OVER,
    UNKNOWN_ERRORS_ARE_DEFINITE,
)
from celery_agboss.testing.gateway_types import FakeGatewayFault
from tests.deployment.conftest import DeployFactory
from tests.deployment.deployment import Deployment
from tests.deployment.test_recovery import (
    HELD_SECONDS,
    kill_the_worker_on_the_wire,
    recovery_deadline,
    start_two_workers,
)
from tests.faults.scenario import (
    NOT_RECONCILED,
    POSTGRES_RABBITMQ,
    POSTGRES_REDIS,
    SQLITE_REDIS,
    Stack,
    charges_of,
    deployed,
    kill_the_child,
    looked_up,
    sabotaged,
    wait_for_a_second_payment,
    worker_and_beat,
)
from tests.support.processes import ManagedProcess, wait_until

pytestmark = [pytest.mark.worker, pytest.mark.slow]

ORDERS = (1, 2, 3)


# --- s03: a pool child killed after the charge ----------------------------------------


def kill_the_child_on_the_wire(
    deployment: Deployment, worker: ManagedProcess
) -> tuple[dict[int, str], int]:
    """Publish the orders with the gateway holding the answer to the first charge (it is
    processed: the money moved); SIGKILL the pool child that sent it, and only that
    process (the worker's main process lives on and starts a new child); then release
    the hold. Returns the task ids and the held order."""
    fake = deployment.gateway.gateway
    hold = fake.hold(operation="charge")
    ids = deployment.publish(ORDERS)
    hold.wait_reached(timeout=HELD_SECONDS)
    held_key = fake.requests[0].idempotency_key
    held = next(o for o in ORDERS if deployment.key_of(o) == held_key)
    child = deployment.gateway.pid_of_charge(deployment.key_of(held))
    kill_the_child(worker, child)
    hold.release()
    assert worker.running, f"the worker's main process died with its child\n{worker.tail()}"
    return ids, held


@pytest.mark.parametrize("stack", [SQLITE_REDIS, POSTGRES_REDIS, POSTGRES_RABBITMQ], indirect=True)
def test_s03_a_child_killed_after_the_charge_leaves_one_payment(
    stack: Stack, deploy: DeployFactory
) -> None:
    """The charge went through, its child died before the answer came back: its lease
    expires, the sweep re-drives the execution, and the next delivery looks the charge
    up first (reconcile) instead of sending it again. One payment per order."""
    deployment = deployed(deploy, stack)
    worker = worker_and_beat(deployment)
    ids, held = kill_the_child_on_the_wire(deployment, worker)
    deployment.wait_settled(ids, recovery_deadline())
    deployment.assert_each_paid_once(ids)
    assert looked_up(deployment, held), "the killed child's charge was never looked up"


def test_s03_sabotaged_a_resend_without_reconcile_pays_the_order_twice(
    sabotage_stack: Stack, deploy: DeployFactory
) -> None:
    deployment = deployed(deploy, sabotage_stack, NOT_RECONCILED)
    worker = worker_and_beat(deployment)
    ids, held = kill_the_child_on_the_wire(deployment, worker)
    wait_for_a_second_payment(deployment, held, ids)


# --- s09: the whole worker killed (its guarantee: tests/deployment/test_recovery.py) ---


def test_s09_sabotaged_a_killed_workers_charge_resent_without_reconcile_pays_twice(
    sabotage_stack: Stack, deploy: DeployFactory
) -> None:
    deployment = deployed(deploy, sabotage_stack, NOT_RECONCILED)
    beat = deployment.start_beat()
    workers = start_two_workers(deployment)
    deployment.wait_beat(beat)
    ids, held, _ = kill_the_worker_on_the_wire(deployment, workers)
    wait_for_a_second_payment(deployment, held, ids)


# --- s10: one order, two executions -----------------------------------------------------

PUBLISH_TWICE = (
    "import json, sys\n"
    "from shop import charge_order\n"
    "order = int(sys.argv[1])\n"
    "print('published-task-ids', json.dumps([charge_order.delay(order).id for _ in '12']))\n"
)


def _publish_one_order_twice(deployment: Deployment, order: int) -> list[str]:
    """A double click: ``charge_order.delay(order)`` twice, two executions of one order."""
    output = deployment.run(
        [str(deployment.venv.python), "-c", PUBLISH_TWICE, str(order)], "publish-twice"
    )
    for line in output.splitlines():
        if line.startswith("published-task-ids "):
            ids: list[str] = json.loads(line.split(" ", 1)[1])
            return ids
    raise AssertionError(f"the publisher printed no task ids:\n{output}")


@pytest.mark.parametrize("stack", [SQLITE_REDIS, POSTGRES_REDIS, POSTGRES_RABBITMQ], indirect=True)
def test_s10_one_order_published_twice_is_paid_once(stack: Stack, deploy: DeployFactory) -> None:
    """Both executions run at once on the worker's two children; the first charge is held
    at the gateway before it is processed, so they overlap and a lookup would find
    nothing. The business key makes them one intent: the second
    finds it in flight, retries, and replays the first one's receipt. One payment, one
    request, one row; both executions COMPLETED with the same receipt."""
    deployment = deployed(deploy, stack)
    worker = worker_and_beat(deployment)
    fake = deployment.gateway.gateway
    hold = fake.hold(operation="charge", before_processing=True)
    first, second = _publish_one_order_twice(deployment, 7)
    hold.wait_reached(timeout=HELD_SECONDS)
    wait_until(
        lambda: "in flight" in worker.output() or "OutboundCallInFlight" in worker.output(),
        HELD_SECONDS,
        message=lambda: f"the second execution to find the charge in flight\n{worker.tail()}",
    )
    hold.release()
    deployment.wait_settled({7: first}, recovery_deadline())
    wait_until(
        lambda: deployment.states([second]) == {second: "COMPLETED"},
        recovery_deadline(),
        message=lambda: f"the second execution to complete: {deployment.states([second])}",
    )
    deployment.assert_each_paid_once({7: first})
    a, b = deployment.execution(first), deployment.execution(second)
    assert a is not None and b is not None and a.result and b.result
    assert json.loads(a.result) == json.loads(b.result), "the second replayed the first's receipt"


def test_s10_sabotaged_a_live_owners_charge_taken_over_pays_the_order_twice(
    sabotage_stack: Stack, deploy: DeployFactory
) -> None:
    """The second execution treats the first one's pending charge as abandoned although
    its owner's lease is live: it takes the intent, looks the charge up while the first
    send is still on the wire (held before the gateway processed it), finds nothing and
    sends again. Both requests are processed: two payments under the order's key."""
    deployment = deployed(deploy, sabotage_stack, sabotaged(LIVE_OWNER_TAKEN_OVER))
    worker_and_beat(deployment)
    fake = deployment.gateway.gateway
    hold = fake.hold(operation="charge", before_processing=True)
    first, _ = _publish_one_order_twice(deployment, 7)
    hold.wait_reached(timeout=HELD_SECONDS)
    wait_until(
        lambda: charges_of(deployment, 7)[0] >= 1,
        recovery_deadline(),
        message=lambda: f"the second execution's own charge\n{deployment.progress({7: first})}",
    )
    hold.release()
    wait_for_a_second_payment(deployment, 7, {7: first})


# --- s14: the answer lost after the charge -----------------------------------------------


def _an_answer_lost_after_the_charge(
    deployment: Deployment, order: int
) -> tuple[Mapping[int, str], Callable[[], str]]:
    deployment.gateway.gateway.inject_fault(
        FakeGatewayFault.ANSWER_THEN_DROP, operation="charge", times=1
    )
    ids = deployment.publish([order])
    return ids, lambda: deployment.progress(ids)


@pytest.mark.parametrize("stack", [SQLITE_REDIS, POSTGRES_REDIS], indirect=True)
def test_s14_an_answer_lost_after_the_charge_is_reconciled_into_one_payment(
    stack: Stack, deploy: DeployFactory
) -> None:
    """The gateway charged, then the worker got an error instead of the answer: the
    outcome is unknown, never a failure. The retry looks the charge up and finds it:
    one payment, the order marked paid with it."""
    deployment = deployed(deploy, stack)
    worker_and_beat(deployment)
    ids, _ = _an_answer_lost_after_the_charge(deployment, 4)
    deployment.wait_settled(ids, recovery_deadline())
    deployment.assert_each_paid_once(ids)
    assert looked_up(deployment, 4)


def test_s14_sabotaged_an_error_taken_as_definite_fails_a_paid_order(
    sabotage_stack: Stack, deploy: DeployFactory
) -> None:
    """Every error read as "nothing processed": the execution ends FAILED while the
    gateway holds the customer's payment (a plain Celery shop then pays again on the
    application's retry)."""
    deployment = deployed(deploy, sabotage_stack, sabotaged(UNKNOWN_ERRORS_ARE_DEFINITE))
    worker_and_beat(deployment)
    ids, progress = _an_answer_lost_after_the_charge(deployment, 4)
    task_id = ids[4]
    wait_until(
        lambda: deployment.states([task_id])[task_id] == "FAILED",
        recovery_deadline(),
        message=lambda: f"the order to be recorded failed\n{progress()}",
    )
    assert charges_of(deployment, 4)[0] == 1, "charged, and the order says it failed"
    assert deployment.paid_rows() == {}
