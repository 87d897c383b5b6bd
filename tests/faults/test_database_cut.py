"""The database lost mid-commit (design: PS14), tests s08 and s08b: the connection
of every process of the README's deployment goes through a TCP proxy the test holds,
and the proxy fails COMMITs right when the gateway's answer comes back.

PostgreSQL only: a SQLite store is a file on the worker's own disk, with no
connection to cut (its commit failures are the fault points of the contract suite).

In the window every COMMIT is either cut before it reaches the server
(``CommitFault.CUT_BEFORE``: the settle of the charge never commits, the intent stays
PENDING) or forwarded, committed, and its answer thrown away
(``CommitFault.DROP_ANSWER``: the worker sees an unreachable store for a transaction
that did commit). The guarantee: an unreachable store ends the delivery ("hand
over"), never a failure of the execution and never a second charge; the order is paid
once and COMPLETED once the database answers again, both when it is back at once
(s08) and only after the worker's lease expired (s08b: the next delivery takes over).
The sabotage run takes reconcile-first away (in the next delivery and in the sweep):
the charge whose settle was cut is sent again. The test itself reads the store
directly, not through the proxy.

Speed-ups: as tests/faults/scenario.py (TTL 5 s, sweep every 2 s, grace 3 s,
retry after 1 s), all README ``AGBOSS_<NAME>`` variables.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

from celery_agboss.core.protections import REQUEUE_WITHOUT_PAUSE
from celery_agboss.store.sqlalchemy_store import SQLAlchemyStore
from tests.deployment.conftest import DeployFactory
from tests.deployment.deployment import Deployment
from tests.deployment.test_recovery import HELD_SECONDS, recovery_deadline
from tests.faults.scenario import (
    FAULT_SPEEDUPS,
    NOT_RECONCILED,
    migrated_store_url,
    sabotaged,
    worker_and_beat,
)
from tests.support.processes import ManagedProcess, wait_until
from tests.support.tcp_proxy import CommitFault, PostgresProxy

pytestmark = [pytest.mark.worker, pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis]

ORDER = 5
TTL = float(FAULT_SPEEDUPS["AGBOSS_LEASE_TTL"])
FAILED_COMMITS_SECONDS = 30.0
OUTAGE_REQUEUES_AT_MOST = 30
"""About one hand-back a second for a 6 s outage, with room for a loaded machine; a
delivery that does not pause hands its message back hundreds of times."""


@pytest.fixture
def proxied(
    request: pytest.FixtureRequest, postgres_admin_url: str
) -> Iterator[tuple[PostgresProxy, str, str]]:
    """(the proxy, the URL the deployment uses through it, the direct URL); the store is
    already migrated (tests/faults/scenario.py)."""
    direct_url = migrated_store_url(request, "postgresql")
    with PostgresProxy.in_front_of(postgres_admin_url) as proxy:
        yield proxy, proxy.url_for(direct_url), direct_url


def deployed(
    deploy: DeployFactory, redis_url: str, proxied_url: str, direct_url: str, extra: dict[str, str]
) -> tuple[Deployment, ManagedProcess]:
    deployment = deploy(redis_url, proxied_url, speedups={**FAULT_SPEEDUPS, **extra})
    deployment._store = SQLAlchemyStore(direct_url)  # the test reads past the proxy
    return deployment, worker_and_beat(deployment)


def _commits_fail_when_the_answer_comes(
    deployment: Deployment,
    proxy: PostgresProxy,
    worker: ManagedProcess,
    fault: CommitFault,
    *,
    until: str = "StoreUnavailableError",
) -> dict[int, str]:
    """Hold the charge's answer; make every COMMIT fail as ``fault`` says; release the
    answer; keep failing until ``until`` is in the worker's log."""
    hold = deployment.gateway.gateway.hold(operation="charge")
    ids = deployment.publish([ORDER])
    hold.wait_reached(timeout=HELD_SECONDS)
    proxy.arm_commit_fault(fault, times=None)
    hold.release()
    worker.wait_until(
        lambda: until in worker.output(),
        FAILED_COMMITS_SECONDS,
        message=f"{until!r} in the worker's log",
    )
    return ids


@pytest.mark.parametrize("fault", [CommitFault.CUT_BEFORE, CommitFault.DROP_ANSWER], ids=str)
def test_s08_commits_cut_when_the_answer_comes_hand_over_and_pay_once(
    fault: CommitFault,
    redis_url_factory: Callable[[], str],
    proxied: tuple[PostgresProxy, str, str],
    deploy: DeployFactory,
) -> None:
    proxy, via_proxy, direct = proxied
    deployment, worker = deployed(deploy, redis_url_factory(), via_proxy, direct, {})
    ids = _commits_fail_when_the_answer_comes(deployment, proxy, worker, fault)
    proxy.disarm()
    deployment.wait_settled(ids, recovery_deadline())
    deployment.assert_each_paid_once(ids)


def _an_outage_past_the_lease(
    deploy: DeployFactory,
    redis_url: str,
    proxied: tuple[PostgresProxy, str, str],
    extra: dict[str, str],
) -> tuple[Deployment, ManagedProcess, dict[int, str]]:
    """s08b's outage: COMMITs fail from the gateway's answer until the worker's lease
    has expired (TTL + 1 s after the first failure), then the database answers again."""
    proxy, via_proxy, direct = proxied
    deployment, worker = deployed(deploy, redis_url, via_proxy, direct, extra)
    ids = _commits_fail_when_the_answer_comes(deployment, proxy, worker, CommitFault.DROP_ANSWER)
    seen = time.monotonic()
    wait_until(
        lambda: time.monotonic() - seen > TTL + 1,
        TTL + 5,
        message="the worker's lease to expire while the database fails",
    )
    proxy.disarm()
    return deployment, worker, ids


def _requeues(worker: ManagedProcess) -> int:
    """Deliveries the worker handed back to the broker because the store was down."""
    return worker.output().count("reject requeue=True")


def test_s08b_the_database_back_only_after_the_lease_expired_pays_once(
    redis_url_factory: Callable[[], str],
    proxied: tuple[PostgresProxy, str, str],
    deploy: DeployFactory,
) -> None:
    """Also: during the outage (about TTL + 1 = 6 s) the message is handed back about
    once a second (REQUEUE_PAUSE_SECONDS), not in a loop as fast as the broker goes."""
    deployment, worker, ids = _an_outage_past_the_lease(deploy, redis_url_factory(), proxied, {})
    deployment.wait_settled(ids, recovery_deadline())
    deployment.assert_each_paid_once(ids)
    assert _requeues(worker) <= OUTAGE_REQUEUES_AT_MOST, worker.tail()


def test_s08b_sabotaged_without_the_pause_an_outage_is_a_loop_of_redeliveries(
    redis_url_factory: Callable[[], str],
    proxied: tuple[PostgresProxy, str, str],
    deploy: DeployFactory,
) -> None:
    deployment, worker, ids = _an_outage_past_the_lease(
        deploy, redis_url_factory(), proxied, sabotaged(REQUEUE_WITHOUT_PAUSE)
    )
    deployment.wait_settled(ids, recovery_deadline())
    assert _requeues(worker) > OUTAGE_REQUEUES_AT_MOST


def test_s08_sabotaged_a_cut_settle_resent_without_reconcile_pays_twice(
    redis_url_factory: Callable[[], str],
    proxied: tuple[PostgresProxy, str, str],
    deploy: DeployFactory,
) -> None:
    proxy, via_proxy, direct = proxied
    deployment, worker = deployed(deploy, redis_url_factory(), via_proxy, direct, NOT_RECONCILED)
    ids = _commits_fail_when_the_answer_comes(deployment, proxy, worker, CommitFault.CUT_BEFORE)
    proxy.disarm()
    fake = deployment.gateway.gateway
    wait_until(
        lambda: len(fake.payments) >= 2,
        recovery_deadline(),
        message=lambda: f"the second payment\n{deployment.progress(ids)}",
    )
    assert len(fake.payments) == 2
