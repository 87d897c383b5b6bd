"""P4/P5 as a user deploys the README: every order paid exactly once after a worker is
SIGKILLed mid-charge, after the broker lost every message, and without beat.

Each scenario runs on {Redis, RabbitMQ} × {SQLite, PostgreSQL}, with README.md's own
``shop.py`` and commands only. At the end, each checks at the gateway (which does not
deduplicate keys) one payment and one charge request per order's key and nothing else,
one ``shop_paid_orders`` row per order naming that payment, and every execution
COMPLETED in the store.

Speed-ups, all as the README's ``AGBOSS_<NAME>`` variables (defaults in brackets):
``AGBOSS_LEASE_TTL=5`` (30 s): the killed worker's lease expires in 5 s;
``AGBOSS_SWEEP_INTERVAL=2`` (30 s): beat sweeps every 2 s, the workers' own sweeps
begin after 6 s without one; ``AGBOSS_REQUESTED_GRACE=3`` (300 s): a message that
never started is re-published 3 s after it was published.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Callable, Mapping

import pytest

from celery_agboss.core.log_events import SWEEP_FINISHED, SWEEP_REPUBLISHED, SWEEP_STALE
from tests.deployment import brokers
from tests.deployment.conftest import DeployFactory
from tests.deployment.deployment import SPEEDUPS, Deployment
from tests.deployment.django_deploy import KILL_SECONDS as KILL_SECONDS  # the fault tests' too
from tests.deployment.django_deploy import kill_the_worker
from tests.support.processes import ManagedProcess, wait_until

pytestmark = [pytest.mark.worker, pytest.mark.slow]

ORDERS = tuple(range(1, 7))
TTL = float(SPEEDUPS["AGBOSS_LEASE_TTL"])
INTERVAL = float(SPEEDUPS["AGBOSS_SWEEP_INTERVAL"])
GRACE = float(SPEEDUPS["AGBOSS_REQUESTED_GRACE"])
STALE_INTERVALS = 3  # the workers sweep themselves after three intervals without a sweep
MARGIN = 25.0  # process start-up and the re-driven bodies, on a loaded 2-core machine
HELD_SECONDS = 30.0  # how long a charge may take to reach the gateway's hold


def recovery_deadline(*, workers_sweep: bool = False) -> float:
    """TTL + requested grace + two sweep intervals + the margin (+ three intervals when
    the workers, not beat, have to notice first that no sweep runs)."""
    stale = STALE_INTERVALS * INTERVAL if workers_sweep else 0.0
    return TTL + GRACE + 2 * INTERVAL + stale + MARGIN


def start_two_workers(deployment: Deployment) -> list[ManagedProcess]:
    """The README's worker line and its second worker on the same host, both ready,
    both running with the speed-ups read from the environment."""
    workers = [deployment.start_worker(), deployment.start_second_worker()]
    deployment.wait_ready(*workers)
    for worker in workers:
        assert_speedups_applied(worker)
    return workers


def assert_speedups_applied(worker: ManagedProcess) -> None:
    """The worker's start line shows the AGBOSS_* variables were read (runtime/settings.py)."""
    expected = f"(lease ttl {TTL:g} s, sweep every {INTERVAL:g} s)"
    assert expected in worker.output(), f"{expected!r} not in\n{worker.output()}"


def kill_the_worker_on_the_wire(
    deployment: Deployment, workers: list[ManagedProcess]
) -> tuple[dict[int, str], int, ManagedProcess]:
    """Publish the orders with the gateway holding the answer to the first charge
    (processed, answer not sent); SIGKILL the whole process group of the worker whose
    pool child sent it (main process and children); then release the hold. Returns the
    task ids, the held order and the killed worker."""
    fake = deployment.gateway.gateway
    hold = fake.hold(operation="charge")
    ids = deployment.publish(ORDERS)
    hold.wait_reached(timeout=HELD_SECONDS)
    held_key = fake.requests[0].idempotency_key  # the hold takes the first charge
    assert held_key is not None
    held_order = next(o for o in ORDERS if deployment.key_of(o) == held_key)
    pid = deployment.gateway.pid_of_charge(held_key)
    victims = [w for w in workers if pid in w.group_pids()]
    assert len(victims) == 1, f"pid {pid} is in no worker's (or several) process group"
    victim = victims[0]
    kill_the_worker(victim)
    hold.release()
    return ids, held_order, victim


def recover_a_killed_worker_under_beat(
    deployment: Deployment,
) -> tuple[dict[int, str], int, ManagedProcess, list[ManagedProcess]]:
    """Beat and the two workers; the worker on the wire killed (as above); every order
    settled and paid once. Returns the task ids, the held order, the killed worker and
    both workers."""
    beat = deployment.start_beat()
    workers = start_two_workers(deployment)
    deployment.wait_beat(beat)
    ids, held, victim = kill_the_worker_on_the_wire(deployment, workers)
    deployment.wait_settled(ids, recovery_deadline())
    deployment.assert_each_paid_once(ids)
    return ids, held, victim, workers


def assert_recovered_past_the_broker(
    deployment: Deployment, ids: Mapping[int, str], order: int, survivor: ManagedProcess
) -> None:
    """Redis: the killed worker's message of the held order is still hidden among the
    unacked (1 h visibility timeout), so the broker did not bring it back: the sweep did.
    RabbitMQ: the broker gave it back to the survivor at once, before any sweep
    re-published it (it then normally meets the dead worker's live lease, and is
    deferred until the sweep re-drives it)."""
    task_id = ids[order]
    if deployment.broker_url.startswith("redis"):
        hidden = brokers.unacked_task_ids(deployment.broker_url)
        assert task_id in hidden, f"{task_id} not among the unacked messages {hidden}"
        return
    lines = survivor.output().splitlines()
    received = [i for i, line in enumerate(lines) if f"[{task_id}] received" in line]
    republished = [
        i for i, line in enumerate(lines) if SWEEP_REPUBLISHED in line and task_id in line
    ]
    assert received, f"the survivor never received {task_id}:\n{survivor.tail()}"
    assert not republished or received[0] < republished[0], (
        f"{task_id} reached the survivor only through the sweep:\n{survivor.tail()}"
    )


def assert_reconciled_not_resent(
    deployment: Deployment, ids: Mapping[int, str], order: int
) -> None:
    """The killed charge was looked up at the gateway (reconcile first), never sent again
    (one request under its key, checked with the rest), by a delivery that took over."""
    key = deployment.key_of(order)
    assert any(lookup.value == key for lookup in deployment.gateway.gateway.lookups), (
        f"order {order}'s pending charge was never looked up"
    )
    record = deployment.execution(ids[order])
    assert record is not None and record.recovery_count >= 1, record


def test_a_worker_killed_mid_charge_is_recovered_into_one_payment_per_order(
    broker_url: str, database_url: str, deploy: DeployFactory
) -> None:
    """Two workers and beat; a whole worker SIGKILLed while the gateway holds the answer
    to its charge. On Redis its unacked messages stay hidden for the 1 h visibility
    timeout and only the sweep brings them back; on RabbitMQ they come back at once and
    meet the dead worker's live lease. All 6 orders settle, each paid once, within
    TTL + grace + two intervals + margin. Speed-ups: TTL 5 s (the dead lease expires),
    sweep interval 2 s (beat's sweep), grace 3 s (the killed worker's reserved, never
    started messages are re-published)."""
    deployment = deploy(broker_url, database_url)
    deployment.prepare()
    ids, held, victim, workers = recover_a_killed_worker_under_beat(deployment)
    assert_reconciled_not_resent(deployment, ids, held)
    assert victim.returncode == -signal.SIGKILL
    survivor = next(w for w in workers if w is not victim)
    assert_recovered_past_the_broker(deployment, ids, held, survivor)


def test_messages_lost_before_any_worker_started_are_republished_by_the_sweep(
    broker_url: str, database_url: str, deploy: DeployFactory
) -> None:
    """6 orders published with no worker running, then every message lost (Redis FLUSHDB
    of the broker database; RabbitMQ purge of the ``celery`` queue); one worker and beat
    start: the sweep re-publishes the REQUESTED executions once their grace passed, and
    each order is paid once. Speed-ups: grace 3 s (the re-publish), sweep interval 2 s
    (beat's sweep); TTL 5 s unused (nothing dies)."""
    deployment = deploy(broker_url, database_url)
    deployment.prepare()
    ids = deployment.publish(ORDERS)
    assert set(deployment.states(ids.values()).values()) == {"REQUESTED"}
    wait_until(
        lambda: brokers.queue_length(broker_url) == len(ORDERS),
        10,
        message=lambda: (
            f"{len(ORDERS)} messages in the queue (has {brokers.queue_length(broker_url)})"
        ),
    )
    assert brokers.lose_every_message(broker_url) == len(ORDERS)
    assert brokers.queue_length(broker_url) == 0

    beat = deployment.start_beat()
    worker = deployment.start_worker()
    deployment.wait_ready(worker)
    assert_speedups_applied(worker)
    deployment.wait_beat(beat)
    deployment.wait_settled(ids, recovery_deadline())

    deployment.assert_each_paid_once(ids)
    log = worker.output()
    assert SWEEP_REPUBLISHED in log, f"recovered, but the sweep re-published nothing?\n{log}"


def test_without_beat_the_workers_sweep_themselves_after_a_worker_was_killed(
    broker_url: str, database_url: str, deploy: DeployFactory
) -> None:
    """Two workers, no beat; a whole worker SIGKILLed mid-charge as in the first test:
    after three intervals without a finished sweep the surviving worker warns
    (``sweep.stale``) and sweeps itself, and all 6 orders are paid once. Speed-ups:
    TTL 5 s (the dead lease expires), sweep interval 2 s (the workers' own sweeps start
    after 6 s and run every 2 s), grace 3 s (reserved, never started messages)."""
    deployment = deploy(broker_url, database_url)
    deployment.prepare()
    workers = start_two_workers(deployment)

    ids, held, victim = kill_the_worker_on_the_wire(deployment, workers)
    deployment.wait_settled(ids, recovery_deadline(workers_sweep=True))

    deployment.assert_each_paid_once(ids)
    assert_reconciled_not_resent(deployment, ids, held)
    survivor = next(w for w in workers if w is not victim)
    assert_recovered_past_the_broker(deployment, ids, held, survivor)
    assert SWEEP_STALE in survivor.output(), "the surviving worker never warned that no sweep runs"
    # The sweep that re-published the last order logs its end after that order settled.
    survivor.wait_until(
        lambda: _own_sweeps(survivor.output()),
        15,
        message="the surviving worker's own sweep to finish",
    )


@pytest.mark.redis
@pytest.mark.sqlite
def test_the_workers_own_sweep_reconciles_the_stranded_charge_itself(
    redis_url_factory: Callable[[], str], sqlite_url: str, deploy: DeployFactory
) -> None:
    """The sweep's lookup (design: sweep reconciles) with the README's app and no beat: the
    surviving worker's own sweep looks the killed worker's pending charge up at the gateway
    itself (``reconciled=1``, never ``unknown_calls``), although that main process never ran
    a task: importing ``shop.py`` declared the call. One deployment (Redis, SQLite): what a
    process knows of its calls does not depend on the broker or the store. Speed-ups as in
    the test above (TTL 5 s, interval 2 s, grace 3 s)."""
    deployment = deploy(redis_url_factory(), sqlite_url)
    deployment.prepare()
    workers = start_two_workers(deployment)
    ids, _, victim = kill_the_worker_on_the_wire(deployment, workers)
    deployment.wait_settled(ids, recovery_deadline(workers_sweep=True))
    deployment.assert_each_paid_once(ids)
    survivor = next(w for w in workers if w is not victim)
    survivor.wait_until(
        lambda: [
            line
            for line in _own_sweeps(survivor.output())
            if re.search(r"\breconciled=[1-9]", line)
        ],
        15,
        message="the surviving worker's own sweep that reconciled the charge",
    )
    own_sweeps = _own_sweeps(survivor.output())
    assert not [line for line in own_sweeps if "unknown_calls=" in line], own_sweeps


def _own_sweeps(log: str) -> list[str]:
    """The ``sweep.finished by=worker`` lines of a worker's log."""
    return [line for line in log.splitlines() if SWEEP_FINISHED in line and "by=worker" in line]
