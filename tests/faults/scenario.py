"""What every fault scenario on the README's deployment shares: the stacks it runs on,
the speed-ups, the sabotage environment, and the few steps each test starts with.

Speed-ups, all README ``AGBOSS_<NAME>`` variables: the deployment suite's (lease TTL
5 s, sweep every 2 s, requested grace 3 s) and ``AGBOSS_RETRY_DELAY=1`` (instead of
5 s): an unknown outcome or a charge in flight elsewhere is retried after 1 s.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping
from typing import Any

import pytest

from celery_agboss.core.protections import PENDING_RESENT_WITHOUT_RECONCILE, STRANDED_NOT_RECONCILED
from tests.deployment.conftest import DeployFactory
from tests.deployment.deployment import SPEEDUPS, Deployment
from tests.deployment.test_recovery import KILL_SECONDS, recovery_deadline
from tests.support.processes import ManagedProcess, wait_until

FAULT_SPEEDUPS: Mapping[str, str] = {**SPEEDUPS, "AGBOSS_RETRY_DELAY": "1"}

Stack = tuple[str, str]  # (broker URL, database URL)


def sabotaged(*protections: str) -> dict[str, str]:
    """The environment that makes the deployment's workers run without ``protections``
    (honoured only in processes that descend from this pytest process)."""
    return {
        "AGBOSS_ALLOW_SABOTAGE": "1",
        "AGBOSS_SABOTAGE_SUBPROCESS": str(os.getpid()),
        "AGBOSS_SABOTAGE": ",".join(protections),
    }


NOT_RECONCILED = sabotaged(PENDING_RESENT_WITHOUT_RECONCILE, STRANDED_NOT_RECONCILED)
"""Reconcile-first off in both places that ask the gateway before a resend: the next
delivery and the sweep."""


def stack_for(request: pytest.FixtureRequest, store: str, broker: str) -> Stack:
    if broker == "redis":
        broker_url: str = request.getfixturevalue("redis_url_factory")()
    else:
        broker_url = request.getfixturevalue("rabbitmq_vhost_url")
    if store == "sqlite":
        database_url: str = request.getfixturevalue("sqlite_url")
    else:
        database_url = request.getfixturevalue("empty_postgres_url")
    return broker_url, database_url


def _param(store: str, broker: str) -> Any:
    marks = [
        getattr(pytest.mark, broker),
        getattr(pytest.mark, "postgres" if store != "sqlite" else "sqlite"),
    ]
    return pytest.param((store, broker), id=f"{store}-{broker}", marks=marks)


SQLITE_REDIS = _param("sqlite", "redis")
POSTGRES_REDIS = _param("postgresql", "redis")
POSTGRES_RABBITMQ = _param("postgresql", "rabbitmq")


def deployed(
    deploy: DeployFactory, stack: Stack, extra: Mapping[str, str] | None = None
) -> Deployment:
    deployment = deploy(*stack, speedups={**FAULT_SPEEDUPS, **(extra or {})})
    deployment.prepare()
    return deployment


def worker_and_beat(deployment: Deployment) -> ManagedProcess:
    beat = deployment.start_beat()
    worker = deployment.start_worker()
    deployment.wait_ready(worker)
    deployment.wait_beat(beat)
    return worker


def kill_the_child(worker: ManagedProcess, child: int) -> None:
    """SIGKILL ``child``, one pool child of ``worker``, and only that process (the main
    process lives on and starts a new child); until it is gone."""
    assert child != worker.pid and child in worker.group_pids(), (child, worker.group_pids())
    os.kill(child, signal.SIGKILL)
    wait_until(
        lambda: child not in worker.group_pids(),
        KILL_SECONDS,
        message=f"pool child {child} to be gone",
    )


def charges_of(deployment: Deployment, order: int) -> tuple[int, int]:
    """(payments, charge requests) at the gateway under ``order``'s key."""
    fake, key = deployment.gateway.gateway, deployment.key_of(order)
    return len(fake.payments_for(key)), len(fake.requests_for(key))


def looked_up(deployment: Deployment, order: int) -> bool:
    """The gateway was asked about ``order``'s charge by key (a reconcile)."""
    key = deployment.key_of(order)
    return any(lookup.value == key for lookup in deployment.gateway.gateway.lookups)


def wait_for_a_second_payment(deployment: Deployment, order: int, ids: Mapping[int, str]) -> None:
    """The harm a sabotage run shows: a second payment under ``order``'s key, each from
    its own request (the gateway does not deduplicate keys)."""
    wait_until(
        lambda: charges_of(deployment, order)[0] >= 2,
        recovery_deadline(),
        message=lambda: f"the second payment of order {order}\n{deployment.progress(ids)}",
    )
    assert charges_of(deployment, order) == (2, 2)
