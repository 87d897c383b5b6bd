"""The database lost mid-commit (design: PS14), tests s08 and s08b, in a real crash:
the store of the README's deployment is a PostgreSQL cluster of the test session's own
(tests/faults/cluster.py), stopped with ``pg_ctl stop -m immediate`` while the gateway
holds the charge's answer (the charge is processed: the money moved). Every connection
dies and the work not committed is lost; the hold is then released, so the worker gets
the answer and cannot record it, and the cluster is started again on the same port.

- s08, the cluster back at once (well within the lease TTL): the delivery is handed
  over, never FAILED; the order is paid once and COMPLETED, its row written once;
- s08b, the cluster back only once the lease expired: the database's clock cannot be
  read while it is down, so the test waits until TTL + 1 s of its own monotonic clock
  have passed since the stop (the lease was renewed at the latest then); the next
  delivery takes the execution over, reconciles the charge, one payment;
- the sabotage run: reconcile-first off (next delivery and sweep), the s08 crash: the
  recovery sends the charge again, two payments under one key.

All on PostgreSQL + Redis. PostgreSQL only: a SQLite store has no server to crash (its
failing commits are the contract suite's fault points); the TCP-proxy variant of these
scenarios is tests/faults/test_database_cut.py. Each test's store is a copy of a
template already migrated (with the app's ``shop_paid_orders``) in that cluster, which
stands for the README's ``agboss migrate`` run once.

Speed-ups: as tests/faults/scenario.py (TTL 5 s, sweep every 2 s, grace 3 s,
retry after 1 s), all README ``AGBOSS_<NAME>`` variables.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping

import pytest

from celery_agboss.core.log_events import (
    EXECUTION_FAILED,
    EXECUTION_TAKEN_OVER,
    OUTBOUND_CALL_RECONCILED,
)
from tests.deployment.conftest import DeployFactory
from tests.deployment.deployment import Deployment
from tests.deployment.test_recovery import HELD_SECONDS, recovery_deadline
from tests.faults.cluster import Cluster
from tests.faults.scenario import (
    FAULT_SPEEDUPS,
    NOT_RECONCILED,
    looked_up,
    migrated_shop,
    wait_for_a_second_payment,
    worker_and_beat,
)
from tests.support.processes import ManagedProcess, wait_until

pytestmark = [pytest.mark.worker, pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis]

ORDER = 8
TTL = float(FAULT_SPEEDUPS["AGBOSS_LEASE_TTL"])
UNRECORDED_SECONDS = 30.0  # the released answer reaching a worker that cannot record it


@pytest.fixture
def crashable_store(crashable_postgres: Cluster) -> Iterator[str]:
    """A migrated store in the crashable cluster (running at the start and the end)."""
    crashable_postgres.ensure_running()
    url = crashable_postgres.clone(crashable_postgres.template("shop", migrated_shop))
    yield url
    crashable_postgres.ensure_running()
    crashable_postgres.drop(url)


Crash = Callable[[Mapping[str, str]], tuple[Deployment, ManagedProcess, dict[int, str], float]]


@pytest.fixture
def crash(
    redis_url_factory: Callable[[], str],
    crashable_postgres: Cluster,
    crashable_store: str,
    deploy: DeployFactory,
) -> Crash:
    """Deploy on the crashable store (worker and beat, ``extra`` in the environment); hold
    the charge's answer, crash the cluster, release the answer, and wait until the worker
    found it cannot record it. The deployment, its worker, the task ids and when
    (monotonic) the cluster was stopped."""

    def crash_when_the_answer_comes(
        extra: Mapping[str, str],
    ) -> tuple[Deployment, ManagedProcess, dict[int, str], float]:
        speedups = {**FAULT_SPEEDUPS, **extra}
        deployment = deploy(redis_url_factory(), crashable_store, speedups=speedups)
        worker = worker_and_beat(deployment)
        hold = deployment.gateway.gateway.hold(operation="charge")
        ids = deployment.publish([ORDER])
        hold.wait_reached(timeout=HELD_SECONDS)
        stopped = time.monotonic()
        crashable_postgres.crash()
        hold.release()
        worker.wait_until(
            lambda: "StoreUnavailableError" in worker.output(),
            UNRECORDED_SECONDS,
            message="the worker to find the store gone",
        )
        return deployment, worker, ids, stopped

    return crash_when_the_answer_comes


def test_s08_a_database_crash_when_the_answer_comes_hands_over_and_pays_once(
    crash: Crash, crashable_postgres: Cluster
) -> None:
    deployment, worker, ids, _ = crash({})
    crashable_postgres.start()
    deployment.wait_settled(ids, recovery_deadline())
    deployment.assert_each_paid_once(ids)
    assert looked_up(deployment, ORDER), "the charge whose answer was lost was never looked up"
    assert EXECUTION_FAILED not in worker.output(), worker.tail()


def test_s08b_the_database_back_after_the_lease_expired_is_taken_over_and_pays_once(
    crash: Crash, crashable_postgres: Cluster
) -> None:
    deployment, worker, ids, stopped = crash({})
    wait_until(
        lambda: time.monotonic() - stopped > TTL + 1,
        TTL + 5,
        message="the lease TTL to pass since the database stopped",
    )
    crashable_postgres.start()
    deployment.wait_settled(ids, recovery_deadline())
    deployment.assert_each_paid_once(ids)
    log = worker.output()
    assert EXECUTION_TAKEN_OVER in log and OUTBOUND_CALL_RECONCILED in log, worker.tail()
    assert EXECUTION_FAILED not in log, worker.tail()
    assert looked_up(deployment, ORDER), "the charge whose answer was lost was never looked up"


def test_s08_sabotaged_a_crash_recovered_without_reconcile_pays_twice(
    crash: Crash, crashable_postgres: Cluster
) -> None:
    deployment, _, ids, _ = crash(NOT_RECONCILED)
    crashable_postgres.start()
    wait_for_a_second_payment(deployment, ORDER, ids)
