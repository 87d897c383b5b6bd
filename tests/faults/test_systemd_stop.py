"""``systemctl stop`` of the README's worker, under the two kill modes that matter.

systemd's default, ``KillMode=control-group``, sends SIGTERM to every process of the
unit at once; ``KillMode=mixed`` (docs/systemd/shop-worker.service) sends it to the
main process alone and SIGKILLs the rest only when ``TimeoutStopSec`` is over. The test
plays systemd on the README's deployment (the wheel in a fresh venv, its ``shop.py``,
``celery -A shop worker -l INFO`` and beat) while the worker's charge is held at the
gateway before it was processed:

- mixed: Celery's warm shutdown waits; the held charge's answer comes back to the body
  that sent it, which completes the execution and releases its lease; the worker exits
  by itself. Nothing is recovered, nothing looked up.
- control-group (what the unit file prevents): the pool child dies in the middle of
  the body; the stopped worker ends with the execution still RUNNING under a lease
  nobody renews, and only a new worker's sweep finishes the payment, as a recovery.
  Money stays right either way: one payment.

Counted at the gateway (no deduplication of keys). Speed-ups, all README
``AGBOSS_<NAME>`` variables: those of tests/faults/scenario.py (lease TTL 5 s, sweep
every 2 s, requested grace 3 s, retry after 1 s).
"""

from __future__ import annotations

import signal
from collections.abc import Mapping

import pytest

from celery_agboss.testing.gateway_types import GatewayHold
from tests.deployment.conftest import DeployFactory
from tests.deployment.deployment import Deployment
from tests.deployment.test_recovery import HELD_SECONDS, KILL_SECONDS, recovery_deadline
from tests.faults.scenario import SQLITE_REDIS, Stack, charges_of, deployed, worker_and_beat
from tests.support.processes import ManagedProcess, wait_until

pytestmark = [pytest.mark.worker, pytest.mark.slow]

ORDER = 31
WARM_SHUTDOWN_LINE = "Warm shutdown"
DRAINED_SECONDS = 30.0


def _a_charge_held_before_processing(
    deploy: DeployFactory, stack: Stack
) -> tuple[Deployment, ManagedProcess, GatewayHold, Mapping[int, str], int]:
    """The README's shop deployed with its worker and beat; the order's charge held at the
    gateway before it is processed. The deployment, the worker, the hold, the task ids
    and the pid of the charging child."""
    deployment = deployed(deploy, stack)
    worker = worker_and_beat(deployment)
    hold = deployment.gateway.gateway.hold(operation="charge", before_processing=True)
    ids = deployment.publish([ORDER])
    hold.wait_reached(timeout=HELD_SECONDS)
    child = deployment.gateway.pid_of_charge(deployment.key_of(ORDER))
    return deployment, worker, hold, ids, child


@pytest.mark.parametrize("stack", [SQLITE_REDIS], indirect=True)
def test_a_stop_with_kill_mode_mixed_lets_the_body_finish_its_payment(
    stack: Stack, deploy: DeployFactory
) -> None:
    deployment, worker, hold, ids, child = _a_charge_held_before_processing(deploy, stack)
    worker.signal_leader(signal.SIGTERM)  # KillMode=mixed: the main process alone
    worker.wait_until(
        lambda: WARM_SHUTDOWN_LINE in worker.output(), KILL_SECONDS, message="warm shutdown"
    )
    assert child in worker.group_pids(), "the body's process lives on"
    hold.release()
    assert worker.wait(DRAINED_SECONDS) == 0, worker.describe()
    deployment.wait_settled(ids, recovery_deadline())
    deployment.assert_each_paid_once(ids)
    record = deployment.execution(ids[ORDER])
    assert record is not None and record.recovery_count == 0, record
    assert not deployment.gateway.gateway.lookups, "finished by its own body"


@pytest.mark.parametrize("stack", [SQLITE_REDIS], indirect=True)
def test_a_stop_with_the_default_kill_mode_kills_the_body_and_leaves_it_to_the_sweep(
    stack: Stack, deploy: DeployFactory
) -> None:
    """The twin: SIGTERM to every process, as ``KillMode=control-group`` sends it."""
    deployment, worker, hold, ids, child = _a_charge_held_before_processing(deploy, stack)
    worker.send_signal(signal.SIGTERM)  # KillMode=control-group: every process at once
    wait_until(
        lambda: child not in worker.group_pids(),
        KILL_SECONDS,
        message=lambda: f"the pool child to die of its SIGTERM\n{worker.tail()}",
    )
    worker.wait(DRAINED_SECONDS)
    assert deployment.states([ids[ORDER]]) == {ids[ORDER]: "RUNNING"}, "left mid-body"
    hold.release()
    new = deployment.start_worker(name="worker-new")
    deployment.wait_ready(new)
    deployment.wait_settled(ids, recovery_deadline())
    deployment.assert_each_paid_once(ids)
    assert charges_of(deployment, ORDER)[0] == 1
    record = deployment.execution(ids[ORDER])
    assert record is not None and record.recovery_count >= 1, record
