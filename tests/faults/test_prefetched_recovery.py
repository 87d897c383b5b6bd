"""A whole worker SIGKILLed on Redis with payment messages it had fetched and not started.

Celery prefetches: while the worker's one pool child charges the first order (the
gateway holds the answer), the main process holds the next orders' messages unstarted.
Killed, the worker leaves them among Redis's unacked for the visibility timeout (an
hour); their executions are ``REQUESTED``, so no lease speaks for them, and the sweep
would re-publish them only ``agboss_requested_grace`` (5 minutes) after they were
published. The worker's row of held messages (``celery_agboss.worker.held_messages``) lets
the sweep re-publish them once the row is older than a lease TTL: every order settles
within TTL + two sweep intervals + margin, each paid once.

The twin (sabotage ``held-messages-not-reported``, the worker writes no row): once the
row would be older than a lease TTL and two more sweeps have finished, the prefetched
orders are still ``REQUESTED``, hidden among the unacked.

Speed-ups, all README ``AGBOSS_<NAME>`` variables: those of tests/faults/scenario.py
(lease TTL 5 s, sweep every 2 s, retry after 1 s) but the requested grace left at its
default, 300 s: it is what this test measures against. Not in the README: ``-c 1`` on
the worker line (one pool child, so that the other orders wait prefetched: Celery
prefetches four messages per child).
"""

from __future__ import annotations

import time

import pytest

from celery_agboss.core.log_events import SWEEP_FINISHED
from celery_agboss.core.protections import HELD_NOT_REPORTED
from celery_agboss.store.held_messages import read_held
from tests.deployment import brokers
from tests.deployment.conftest import DeployFactory
from tests.deployment.deployment import Deployment
from tests.deployment.test_recovery import HELD_SECONDS, kill_the_worker
from tests.faults.scenario import (
    FAULT_SPEEDUPS,
    POSTGRES_REDIS,
    SQLITE_REDIS,
    Stack,
    deployed,
    sabotaged,
)
from tests.support.processes import ManagedProcess, wait_until

pytestmark = [pytest.mark.worker, pytest.mark.slow]

ORDERS = (41, 42, 43)
TTL = float(FAULT_SPEEDUPS["AGBOSS_LEASE_TTL"])
INTERVAL = float(FAULT_SPEEDUPS["AGBOSS_SWEEP_INTERVAL"])
DEFAULT_GRACE = {"AGBOSS_REQUESTED_GRACE": "300"}
MARGIN = 25.0
DEADLINE = TTL + 2 * INTERVAL + MARGIN
"""Far below the 300 s grace: only the held-messages row can meet it."""


def _killed_with_orders_prefetched(
    deployment: Deployment,
) -> tuple[dict[int, str], list[int], float, ManagedProcess]:
    """Beat and one single-child worker; the first charge held at the gateway (processed,
    answer not sent) while the other orders wait prefetched; the whole worker SIGKILLed,
    the hold released, the README's worker line started. Returns the task ids, the
    orders that never started, when the worker was killed (monotonic) and the new worker."""
    beat = deployment.start_beat()
    worker = deployment.start_worker([*deployment.commands.worker, "-c", "1"])
    deployment.wait_ready(worker)
    deployment.wait_beat(beat)
    fake = deployment.gateway.gateway
    hold = fake.hold(operation="charge")
    ids = deployment.publish(ORDERS)
    hold.wait_reached(timeout=HELD_SECONDS)
    charged = next(o for o in ORDERS if deployment.key_of(o) == fake.requests[0].idempotency_key)
    waiting = [o for o in ORDERS if o != charged]
    wait_until(
        lambda: (
            set(deployment.states([ids[o] for o in waiting]).values()) == {"REQUESTED"}
            and all(ids[o] in brokers.unacked_task_ids(deployment.broker_url) for o in waiting)
        ),
        HELD_SECONDS,
        message="the other orders prefetched by the worker, unstarted",
    )
    wait_until(
        lambda: _listed(deployment) >= {ids[o] for o in waiting} or _sabotaged(deployment),
        HELD_SECONDS,
        message="the worker's row of held messages",
    )
    killed_at = time.monotonic()
    kill_the_worker(worker)
    hold.release()
    new = deployment.start_worker(name="worker-new")
    deployment.wait_ready(new)
    return ids, waiting, killed_at, new


def _listed(deployment: Deployment) -> set[str]:
    return {found for row in read_held(deployment.store) for found in row.execution_ids}


def _sabotaged(deployment: Deployment) -> bool:
    return "AGBOSS_SABOTAGE" in deployment.speedups


@pytest.mark.parametrize("stack", [SQLITE_REDIS, POSTGRES_REDIS], indirect=True)
def test_orders_a_killed_worker_had_prefetched_are_recovered_within_a_ttl_and_two_sweeps(
    stack: Stack, deploy: DeployFactory
) -> None:
    deployment = deployed(deploy, stack, DEFAULT_GRACE)
    ids, waiting, killed_at, _ = _killed_with_orders_prefetched(deployment)
    deployment.wait_settled(ids, killed_at + DEADLINE - time.monotonic())
    deployment.assert_each_paid_once(ids)
    hidden = brokers.unacked_task_ids(deployment.broker_url)
    for order in waiting:
        assert ids[order] in hidden, "Redis still hides the dead worker's copy: the sweep did it"
        record = deployment.execution(ids[order])
        assert record is not None and record.recovery_count == 1, record
    wait_until(lambda: _listed(deployment) == set(), 30, message="every held row forgotten")


@pytest.mark.parametrize("stack", [SQLITE_REDIS], indirect=True)
def test_without_the_held_messages_row_they_wait_for_the_requested_grace(
    stack: Stack, deploy: DeployFactory
) -> None:
    deployment = deployed(deploy, stack, {**DEFAULT_GRACE, **sabotaged(HELD_NOT_REPORTED)})
    ids, waiting, killed_at, new = _killed_with_orders_prefetched(deployment)
    unstarted = [ids[o] for o in waiting]
    row_stale = killed_at + TTL  # a row written before the kill is older than a TTL here
    new.wait_until(lambda: time.monotonic() >= row_stale, TTL + 1, message="a lease TTL")
    swept = new.output().count(SWEEP_FINISHED)
    new.wait_until(
        lambda: new.output().count(SWEEP_FINISHED) >= swept + 2,
        max(1.0, killed_at + DEADLINE - time.monotonic()),
        message="two sweeps of the new worker after the row would be stale",
    )
    still = deployment.states(unstarted)
    assert set(still.values()) == {"REQUESTED"}, still
    assert all(task_id in brokers.unacked_task_ids(deployment.broker_url) for task_id in unstarted)
    assert _listed(deployment) == set()
