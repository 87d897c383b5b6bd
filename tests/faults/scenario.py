"""What every fault scenario on the README's deployment shares: the stacks it runs on,
the speed-ups, the sabotage environment, and the few steps each test starts with.

Speed-ups, all README ``AGBOSS_<NAME>`` variables: the deployment suite's (lease TTL
5 s, sweep every 2 s, requested grace 3 s) and ``AGBOSS_RETRY_DELAY=1`` (instead of
5 s): an unknown outcome or a charge in flight elsewhere is retried after 1 s.

One more, not a setting: each scenario's store is a copy of one store migrated in this
test process (what ``celery -A shop agboss migrate`` and the app's own table make), not
migrated by that command per test (about a second of a CPU-bound machine each). The copy
forgets the place its deployment id was minted at, so it is a store of its own; the
deployment suite (tests/deployment) still runs the README's ``migrate`` command itself.
"""

from __future__ import annotations

import os
import signal
import sqlite3
from collections.abc import Callable, Mapping
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from celery_agboss.core.protections import PENDING_RESENT_WITHOUT_RECONCILE, STRANDED_NOT_RECONCILED
from celery_agboss.store.databases import create_store_engine
from celery_agboss.store.deployment import PLACE_META_KEY
from celery_agboss.store.migrate import migrate
from tests.deployment.conftest import DeployFactory
from tests.deployment.deployment import SPEEDUPS, Deployment
from tests.deployment.gateway import PAID_TABLE_DDL
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


def migrated_shop(url: str) -> None:
    """What ``celery -A shop agboss migrate`` and the app's own table make."""
    migrate(url)
    engine = create_store_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(text(PAID_TABLE_DDL))
    finally:
        engine.dispose()


_SQLITE_SHOP: dict[str, Path] = {}


def _sqlite_shop_template(request: pytest.FixtureRequest) -> Path:
    """The README's shop store on SQLite, migrated once in this test process, its
    deployment id's place forgotten (each copy is a store of its own)."""
    if "shop" not in _SQLITE_SHOP:
        factory: pytest.TempPathFactory = request.getfixturevalue("tmp_path_factory")
        path = factory.mktemp("readme-shop-template") / "shop.db"
        migrated_shop(f"sqlite:///{path}")
        with closing(sqlite3.connect(path)) as conn, conn:
            conn.execute("DELETE FROM agboss_meta WHERE key = ?", (PLACE_META_KEY,))
        _SQLITE_SHOP["shop"] = path
    return _SQLITE_SHOP["shop"]


def migrated_store_url(request: pytest.FixtureRequest, store: str) -> str:
    """A store of the test's own, as the README's ``migrate`` leaves it (a copy)."""
    if store == "sqlite":
        url: str = request.getfixturevalue("sqlite_url")
        target = make_url(url).database
        assert target, url
        source = _sqlite_shop_template(request)
        with closing(sqlite3.connect(source)) as template, closing(sqlite3.connect(target)) as copy:
            template.backup(copy)
        return url
    templates: Callable[..., Any] = request.getfixturevalue("postgres_templates")
    clone: Callable[..., str] = request.getfixturevalue("clone_postgres")
    return clone(templates("readme-shop", migrated_shop))


def stack_for(
    request: pytest.FixtureRequest, store: str, broker: str, *, migrated: bool = True
) -> Stack:
    """The test's broker and store: the store migrated (a copy), or empty."""
    if broker == "redis":
        broker_url: str = request.getfixturevalue("redis_url_factory")()
    else:
        broker_url = request.getfixturevalue("rabbitmq_vhost_url")
    if migrated:
        return broker_url, migrated_store_url(request, store)
    empty = "sqlite_url" if store == "sqlite" else "empty_postgres_url"
    database_url: str = request.getfixturevalue(empty)
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
    """The README's shop on ``stack`` (its store already migrated: ``stack_for``)."""
    return deploy(*stack, speedups={**FAULT_SPEEDUPS, **(extra or {})})


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
