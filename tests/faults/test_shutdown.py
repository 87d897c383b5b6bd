"""A rolling deploy mid-payment (design: PS12), tests s01, s01b, s11, s11b: a deploy or a
graceful stop sends SIGTERM to a worker of the README's deployment (the wheel in a fresh
venv, its ``shop.py``, its ``celery -A shop worker -l INFO`` and ``celery -A shop beat``
lines) while the worker's charge is held at the gateway. The test plays the platform:
SIGTERM to the worker's main process (Celery's warm shutdown), then, when its grace is
over, SIGKILL to the worker's whole process group.

- s01, the grace is long enough: the stopping worker finishes the body itself while the
  new version's worker is already up, and keeps its lease until then, so the new worker
  never re-runs the step. SQLite+Redis, PostgreSQL+Redis. Sabotage (PostgreSQL+Redis):
  the stopping worker hands its running leases over at SIGTERM; the new worker re-runs
  the step while the first charge is still on the wire, and the order is paid twice.
- s01b, the grace is longer than a lease TTL but shorter than the step: the draining
  worker keeps renewing its lease past its TTL, is SIGKILLed mid-charge, and the worker
  started after it (with beat running) reconciles the charge. SQLite+Redis,
  PostgreSQL+Redis. Sabotage (PostgreSQL+Redis): reconcile-first off, paid twice.
- s11, a short grace, far below the lease TTL, with the new worker up before the stop:
  the worker dies with its lease live; on RabbitMQ its message comes back to the new
  worker at once and meets that lease, on Redis it stays hidden and the sweep brings the
  execution back once the lease expired. Either way the charge is reconciled.
  SQLite+Redis, PostgreSQL+Redis, PostgreSQL+RabbitMQ. Sabotage (PostgreSQL+Redis):
  reconcile-first off, paid twice.
- s11b, the worker's own shutdown timeout above the grace: Celery's soft shutdown
  (``REMAP_SIGTERM=SIGQUIT`` and ``worker_soft_shutdown_timeout=60`` on the README's
  worker line, neither in the README yet) is still waiting for the body when SIGKILL
  lands; the worker started after it reconciles. SQLite+Redis, PostgreSQL+Redis.
  Sabotage (PostgreSQL+Redis): reconcile-first off, paid twice.

Each counts at the gateway, which does not deduplicate keys: payments and charge
requests under the order's key, the app's ``shop_paid_orders`` row, the execution's
state. Speed-ups, all README ``AGBOSS_<NAME>`` variables: those of
tests/faults/scenario.py (lease TTL 5 s, sweep every 2 s, requested grace
3 s, retry after 1 s).
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Mapping

import pytest

from celery_agboss.core.log_events import SWEEP_FINISHED
from celery_agboss.core.protections import SHUTDOWN_HANDS_OVER_RUNNING_LEASES
from celery_agboss.core.store_protocol import LeaseState
from celery_agboss.testing.gateway_types import GatewayHold
from tests.deployment.conftest import DeployFactory
from tests.deployment.deployment import Deployment
from tests.deployment.test_recovery import (
    HELD_SECONDS,
    KILL_SECONDS,
    assert_reconciled_not_resent,
    assert_recovered_past_the_broker,
    kill_the_worker,
    recovery_deadline,
    start_two_workers,
)
from tests.faults.scenario import (
    FAULT_SPEEDUPS,
    NOT_RECONCILED,
    POSTGRES_RABBITMQ,
    POSTGRES_REDIS,
    SQLITE_REDIS,
    Stack,
    charges_of,
    deployed,
    sabotaged,
    wait_for_a_second_payment,
    worker_and_beat,
)
from tests.support.processes import ManagedProcess, wait_until

pytestmark = [pytest.mark.worker, pytest.mark.slow]

ORDER = 12
TTL = float(FAULT_SPEEDUPS["AGBOSS_LEASE_TTL"])
WARM_SHUTDOWN_LINE = "Warm shutdown"
DRAINED_SECONDS = 30.0
"""How long a drained worker may take to exit once its last body returned."""
SWEEPS_DURING_THE_DRAIN = 2
"""s01: sweeps the new worker finishes while the old one drains (one would do; the
second makes sure a whole sweep ran after the SIGTERM)."""
HANDED_OVER = sabotaged(SHUTDOWN_HANDS_OVER_RUNNING_LEASES)


# --- what the platform does ------------------------------------------------------------


def _sigterm(worker: ManagedProcess) -> None:
    """The platform's stop: SIGTERM to the worker's main process (as Kubernetes or
    ``docker stop`` send it), and Celery's warm shutdown under way. When its grace is
    over: ``kill_the_worker``."""
    worker.signal_leader(signal.SIGTERM)
    worker.wait_until(
        lambda: WARM_SHUTDOWN_LINE in worker.output(),
        KILL_SECONDS,
        message="the worker's warm shutdown",
    )


def _killed_mid_body_then_replaced(
    deployment: Deployment, task_id: str, old: ManagedProcess, hold: GatewayHold
) -> ManagedProcess:
    """``old``'s grace ends (SIGKILL) with ``task_id``'s body still running; the held
    answer is let go and a new worker takes the old one's place. The new worker."""
    assert deployment.states([task_id]) == {task_id: "RUNNING"}, "the body is still running"
    kill_the_worker(old)
    hold.release()
    new = deployment.start_worker(name="worker-new")
    deployment.wait_ready(new)
    return new


def _lease(deployment: Deployment, task_id: str) -> LeaseState:
    found = deployment.store.read_lease(task_id)
    assert found is not None, f"no lease for {task_id}"
    return found


def _sweeps(worker: ManagedProcess) -> int:
    return worker.output().count(SWEEP_FINISHED)


# --- s01: the grace is long enough ----------------------------------------------------


Scenario = Callable[[Deployment], tuple[Mapping[int, str], ManagedProcess]]
"""A way the platform stops the worker mid-charge: the task ids and the worker left."""


def _reconciled_into_one_payment(
    deployment: Deployment, scenario: Scenario
) -> tuple[Mapping[int, str], ManagedProcess]:
    """``scenario`` on ``deployment``; then every order settles, each paid once, the
    killed charge looked up and never sent again. What the scenario returned."""
    ids, survivor = scenario(deployment)
    deployment.wait_settled(ids, recovery_deadline())
    deployment.assert_each_paid_once(ids)
    assert_reconciled_not_resent(deployment, ids, ORDER)
    return ids, survivor


def _paid_twice(deploy: DeployFactory, stack: Stack, scenario: Scenario) -> None:
    """The twin: ``scenario`` on a deployment whose workers resend without a lookup
    pays the order a second time."""
    deployment = deployed(deploy, stack, NOT_RECONCILED)
    ids, _ = scenario(deployment)
    wait_for_a_second_payment(deployment, ORDER, ids)


def _stopped_with_the_new_worker_up(
    deployment: Deployment,
) -> tuple[GatewayHold, Mapping[int, str], ManagedProcess, ManagedProcess]:
    """The old worker runs the order, its charge held before the gateway processed it;
    the new version's worker comes up (the README's second worker line); SIGTERM to the
    old one. Returns the hold, the task ids, the old and the new worker."""
    beat = deployment.start_beat()
    old = deployment.start_worker()
    deployment.wait_ready(old)
    deployment.wait_beat(beat)
    fake = deployment.gateway.gateway
    hold = fake.hold(operation="charge", before_processing=True)
    ids = deployment.publish([ORDER])
    hold.wait_reached(timeout=HELD_SECONDS)
    new = deployment.start_second_worker()
    deployment.wait_ready(new)
    _sigterm(old)
    return hold, ids, old, new


@pytest.mark.parametrize("stack", [SQLITE_REDIS, POSTGRES_REDIS], indirect=True)
def test_s01_sigterm_drains_the_charge_and_pays_once(stack: Stack, deploy: DeployFactory) -> None:
    """The stopping worker keeps its lease while its body runs: the new worker's sweeps
    during the drain leave the execution alone, the held charge's answer comes back to
    the worker that sent it, which completes the execution and exits by itself. One
    payment, one request, nothing looked up, the lease released by its holder."""
    deployment = deployed(deploy, stack)
    hold, ids, old, new = _stopped_with_the_new_worker_up(deployment)
    task_id = ids[ORDER]
    swept = _sweeps(new)
    new.wait_until(
        lambda: _sweeps(new) >= swept + SWEEPS_DURING_THE_DRAIN,
        recovery_deadline(),
        message="the new worker's sweeps during the drain",
    )
    assert old.running, f"a warm shutdown waits for the running body\n{old.tail()}"
    assert charges_of(deployment, ORDER) == (0, 1), "the step ran again during the drain"
    hold.release()
    assert old.wait(DRAINED_SECONDS) == 0, old.describe()
    deployment.wait_settled(ids, recovery_deadline())
    deployment.assert_each_paid_once(ids)
    assert not deployment.gateway.gateway.lookups, "drained, so nothing needed a lookup"
    lease = _lease(deployment, task_id)
    assert lease.released, lease
    record = deployment.execution(task_id)
    assert record is not None and record.recovery_count == 0, record


def test_s01_sabotaged_leases_handed_over_at_sigterm_pay_the_order_twice(
    sabotage_stack: Stack, deploy: DeployFactory
) -> None:
    """The stopping worker releases its running lease at SIGTERM: the new worker's sweep
    re-drives the execution, the re-run looks the charge up (not processed yet: nothing
    found) and sends it again; then the first charge, still on the wire, goes through."""
    deployment = deployed(deploy, sabotage_stack, HANDED_OVER)
    hold, ids, _, _ = _stopped_with_the_new_worker_up(deployment)
    wait_until(
        lambda: charges_of(deployment, ORDER)[1] >= 2,
        recovery_deadline(),
        message=lambda: f"the step re-run by the new worker\n{deployment.progress(ids)}",
    )
    hold.release()
    wait_until(
        lambda: charges_of(deployment, ORDER)[0] >= 2,
        DRAINED_SECONDS,
        message=lambda: f"the second payment\n{deployment.progress(ids)}",
    )
    assert charges_of(deployment, ORDER) == (2, 2)


# --- s01b: the grace is shorter than the step -----------------------------------------


def _killed_after_a_grace_longer_than_the_ttl(
    deployment: Deployment,
) -> tuple[Mapping[int, str], ManagedProcess]:
    """SIGTERM while the charge is held (processed, answer not sent); the grace lasts
    until the draining worker's lease has outlived the expiry it had at SIGTERM (it was
    renewed during the drain, by the same holder) while the body has not finished; then
    SIGKILL, the hold released (the answer reaches nobody) and a new worker started
    with the README's worker line. Returns the task ids and the new worker."""
    old = worker_and_beat(deployment)
    fake = deployment.gateway.gateway
    hold = fake.hold(operation="charge")
    ids = deployment.publish([ORDER])
    hold.wait_reached(timeout=HELD_SECONDS)
    task_id = ids[ORDER]
    at_sigterm = _lease(deployment, task_id)
    _sigterm(old)

    def outlived() -> bool:
        now = _lease(deployment, task_id)
        return (
            now.live
            and now.holder == at_sigterm.holder
            and now.db_now_ms > at_sigterm.expires_at_ms
        )

    old.wait_until(outlived, TTL + KILL_SECONDS, message="the drain to outlive a lease TTL")
    return ids, _killed_mid_body_then_replaced(deployment, task_id, old, hold)


@pytest.mark.parametrize("stack", [SQLITE_REDIS, POSTGRES_REDIS], indirect=True)
def test_s01b_sigterm_shorter_than_the_step_is_reconciled_into_one_payment(
    stack: Stack, deploy: DeployFactory
) -> None:
    """Killed mid-charge after a drain longer than the lease TTL: the lease was never
    released under the unsettled charge, it expires, the sweep re-drives the execution
    on the new worker, which looks the charge up instead of sending it again."""
    _reconciled_into_one_payment(deployed(deploy, stack), _killed_after_a_grace_longer_than_the_ttl)


def test_s01b_sabotaged_a_resend_without_reconcile_pays_the_order_twice(
    sabotage_stack: Stack, deploy: DeployFactory
) -> None:
    _paid_twice(deploy, sabotage_stack, _killed_after_a_grace_longer_than_the_ttl)


# --- s11: a short grace ---------------------------------------------------------------


def _killed_right_after_sigterm(
    deployment: Deployment,
) -> tuple[Mapping[int, str], ManagedProcess]:
    """Two workers (the old and the new version) and beat; SIGTERM to the worker whose
    child holds the charge (processed, answer not sent), and SIGKILL as soon as its warm
    shutdown began, its lease still live; the hold released. Returns the task ids and
    the surviving worker."""
    beat = deployment.start_beat()
    workers = start_two_workers(deployment)
    deployment.wait_beat(beat)
    fake = deployment.gateway.gateway
    hold = fake.hold(operation="charge")
    ids = deployment.publish([ORDER])
    hold.wait_reached(timeout=HELD_SECONDS)
    pid = deployment.gateway.pid_of_charge(deployment.key_of(ORDER))
    (old,) = [w for w in workers if pid in w.group_pids()]
    (new,) = [w for w in workers if w is not old]
    _sigterm(old)
    kill_the_worker(old)  # the platform's grace is over
    lease = _lease(deployment, ids[ORDER])
    assert lease.live and not lease.released, f"the grace was meant to end first: {lease}"
    hold.release()
    return ids, new


@pytest.mark.parametrize("stack", [SQLITE_REDIS, POSTGRES_REDIS, POSTGRES_RABBITMQ], indirect=True)
def test_s11_a_short_grace_leaves_a_live_lease_and_one_reconciled_payment(
    stack: Stack, deploy: DeployFactory
) -> None:
    """The worker died with a live lease: whatever brings the execution back (RabbitMQ's
    redelivery at once, deferred by that lease; on Redis the sweep after it expired) the
    next delivery looks the charge up and sends nothing: one payment."""
    deployment = deployed(deploy, stack)
    ids, survivor = _reconciled_into_one_payment(deployment, _killed_right_after_sigterm)
    assert_recovered_past_the_broker(deployment, ids, ORDER, survivor)


def test_s11_sabotaged_a_resend_without_reconcile_pays_the_order_twice(
    sabotage_stack: Stack, deploy: DeployFactory
) -> None:
    _paid_twice(deploy, sabotage_stack, _killed_right_after_sigterm)


# --- s11b: the worker's own shutdown timeout above the grace --------------------------

SOFT_SHUTDOWN_SECONDS = 60
"""The worker's own bound on its shutdown, far above the platform's grace here."""
SOFT_SHUTDOWN_LINE = "Initiating Soft Shutdown"


def _soft_shutdown_worker(deployment: Deployment) -> ManagedProcess:
    """The README's worker line with Celery's own soft shutdown: SIGTERM remapped to a
    cold shutdown (``REMAP_SIGTERM=SIGQUIT``) that first waits
    ``worker_soft_shutdown_timeout`` seconds for the running bodies (Celery's documented
    extra ``key=value`` configuration after the command)."""
    argv = [*deployment.commands.worker, f"worker_soft_shutdown_timeout={SOFT_SHUTDOWN_SECONDS}"]
    worker = deployment.start_process(
        argv,
        name="worker-soft-shutdown",
        env={**deployment.env, "REMAP_SIGTERM": "SIGQUIT"},
        cwd=deployment.app_dir,
    )
    deployment.processes.append(worker)
    return worker


def _killed_while_the_worker_still_drains(
    deployment: Deployment,
) -> tuple[Mapping[int, str], ManagedProcess]:
    """SIGTERM while the charge is held (processed, answer not sent): the worker starts
    its soft shutdown and waits for the body; the grace ends first (SIGKILL as soon as
    the soft shutdown's wait began, the body still running); the hold released, a new
    worker started with the README's line. Returns the task ids and the new worker."""
    beat = deployment.start_beat()
    old = _soft_shutdown_worker(deployment)
    deployment.wait_ready(old)
    deployment.wait_beat(beat)
    fake = deployment.gateway.gateway
    hold = fake.hold(operation="charge")
    ids = deployment.publish([ORDER])
    hold.wait_reached(timeout=HELD_SECONDS)
    old.signal_leader(signal.SIGTERM)
    old.wait_until(
        lambda: SOFT_SHUTDOWN_LINE in old.output(),
        KILL_SECONDS,
        message="the worker's soft shutdown, waiting for the body",
    )
    task_id = ids[ORDER]
    return ids, _killed_mid_body_then_replaced(deployment, task_id, old, hold)


@pytest.mark.parametrize("stack", [SQLITE_REDIS, POSTGRES_REDIS], indirect=True)
def test_s11b_a_shutdown_timeout_above_the_grace_is_reconciled_into_one_payment(
    stack: Stack, deploy: DeployFactory
) -> None:
    """SIGKILL lands while the worker still believes it is draining (its soft shutdown
    would wait a minute): the lease was never released under the unsettled charge, it
    expires, and the new worker's delivery looks the charge up: one payment."""
    _reconciled_into_one_payment(deployed(deploy, stack), _killed_while_the_worker_still_drains)


def test_s11b_sabotaged_a_resend_without_reconcile_pays_the_order_twice(
    sabotage_stack: Stack, deploy: DeployFactory
) -> None:
    _paid_twice(deploy, sabotage_stack, _killed_while_the_worker_still_drains)
