"""Revision 0007 run while workers of the version before it still run (a rolling deploy:
``agboss migrate`` is "safe to run from every pod"), on SQLite and PostgreSQL.

A store that held nothing at that moment (new and idle, or emptied by retention) got a
freshly minted deployment id even though it existed below 0007: a worker of the
previous version, still keying with ``"default"``, took a payment after the migration
committed, and a worker of this version keyed the same order differently, so one order
was charged twice. Now a store ``migrate`` found at an earlier revision keeps
``"default"`` (twin ``tenant-minted-for-an-idle-store``); only a store the run creates
from nothing mints, and Alembic run by hand keeps the tables' rule.
"""

from __future__ import annotations

from collections.abc import Callable

from alembic import command
from celery import Celery

from celery_agboss.app import AGBoss
from celery_agboss.core.engine_settings import DEFAULT_TENANT, EngineSettings
from celery_agboss.core.execution_context import ExecutionContext
from celery_agboss.core.protections import TENANT_MINTED_FOR_AN_IDLE_STORE
from celery_agboss.store.deployment import read_store_tenant
from celery_agboss.store.migrate import alembic_config, migrate
from celery_agboss.store.sqlalchemy_store import SQLAlchemyStore
from celery_agboss.testing import sabotage
from celery_agboss.testing.gateway import FakeGateway
from tests.contract import test_deployment_tenant as tenant_tests
from tests.contract.test_deployment_tenant import (
    MINTED,
    _charge,
    lost_answer_of_the_previous_version,
    redelivered_by_this_version,
)
from tests.engine.helpers import PSEUDONYM_KEY

BEFORE = str(tenant_tests.BEFORE)
"""The revision just below 0007."""


def _tenant(url: str) -> str | None:
    with SQLAlchemyStore(url) as store:
        return read_store_tenant(store)


def _upgraded_while_idle(url: str, *, minted_anyway: bool = False) -> None:
    """The deployment ran below 0007 and holds nothing now; the new release migrates."""
    migrate(url, BEFORE)
    if minted_anyway:
        with sabotage(TENANT_MINTED_FOR_AN_IDLE_STORE):
            migrate(url)
    else:
        migrate(url)


def _old_worker_then_new_worker(url: str, apps: Callable[..., Celery]) -> FakeGateway:
    """After the upgrade a worker of the previous version (tenant "default") charges
    order 1 and its answer is lost; the rolling deploy replaces it, and a worker of
    this version redelivers the execution once the lost delivery's lease expired."""
    gateway = FakeGateway()
    charge = _charge(gateway)
    lost_answer_of_the_previous_version(url, gateway, charge)
    redelivered_by_this_version(url, apps, charge)
    return gateway


def test_an_idle_store_upgraded_under_old_workers_keeps_default_and_pays_once(
    empty_url: str, apps: Callable[..., Celery]
) -> None:
    _upgraded_while_idle(empty_url)

    gateway = _old_worker_then_new_worker(empty_url, apps)

    assert len(gateway.payments) == 1
    assert _tenant(empty_url) == DEFAULT_TENANT


def test_twin_minting_for_an_idle_store_under_old_workers_pays_twice(
    empty_url: str, apps: Callable[..., Celery]
) -> None:
    _upgraded_while_idle(empty_url, minted_anyway=True)

    gateway = _old_worker_then_new_worker(empty_url, apps)

    assert len(gateway.payments) == 2


def test_a_double_click_split_between_an_old_and_a_new_worker_is_paid_once(
    empty_url: str, apps: Callable[..., Celery]
) -> None:
    """No crash needed: order 1's first click is completed by a worker of the previous
    version, its double click reaches one of this version, under one business key."""
    _upgraded_while_idle(empty_url)
    gateway = FakeGateway()
    charge = _charge(gateway)
    previous = EngineSettings(pseudonym_key=PSEUDONYM_KEY, tenant=DEFAULT_TENANT)
    with (
        SQLAlchemyStore(empty_url) as store,
        ExecutionContext.start(store, "click-1", previous) as first,
    ):
        first.outbound(charge, {"amount": 1000}, business_key="order:1")
    agboss = AGBoss.of(apps(empty_url, agboss_pseudonym_key=PSEUDONYM_KEY))
    with ExecutionContext.start(agboss.store, "click-2", agboss.engine_settings) as second:
        second.outbound(charge, {"amount": 1000}, business_key="order:1")

    assert len(gateway.payments) == 1


def test_a_store_the_run_creates_from_nothing_mints_its_id(empty_url: str) -> None:
    migrate(empty_url)
    minted = _tenant(empty_url)
    assert minted is not None and MINTED.match(minted)


def test_alembic_run_by_hand_on_an_idle_store_below_0007_judges_by_its_tables(
    empty_url: str,
) -> None:
    """Without ``migrate`` nobody says where the store stood: the tables' rule, as before."""
    migrate(empty_url, BEFORE)
    with SQLAlchemyStore(empty_url) as store, store.engine.begin() as conn:
        command.upgrade(alembic_config(conn), "0007")
    minted = _tenant(empty_url)
    assert minted is not None and MINTED.match(minted)
