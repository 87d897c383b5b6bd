"""The store's deployment id (revision 0007): the tenant every idempotency key starts with.

What it proves, on SQLite and PostgreSQL: an empty store gets a short id of its own
when it is migrated, which fits every adapter's key limit and is kept however often
it is migrated again; a store that holds executions or records when it is upgraded
keeps ``"default"``, so a payment started before the upgrade and finished after it is
paid once (its twin mints an id anyway and pays twice); a moved or restored store
keeps its id; ``agboss_tenant`` overrides it; a store that never got one is refused,
naming the migration, never silently ``"default"``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.script import ScriptDirectory
from celery import Celery, signals
from sqlalchemy import text

from celery_agboss.adapters import adyen, paypal, stripe
from celery_agboss.app import AGBoss
from celery_agboss.core.engine_settings import DEFAULT_TENANT, EngineSettings
from celery_agboss.core.execution_context import ExecutionContext
from celery_agboss.core.keys import business_key, fit_key, validate_tenant
from celery_agboss.core.outbound import OutboundCall
from celery_agboss.core.protections import TENANT_MINTED_WHILE_IN_USE
from celery_agboss.errors import (
    ConfigurationError,
    OutboundCallOutcomeUnknownError,
    StoreNotMigratedError,
)
from celery_agboss.store.deployment import TENANT_META_KEY, read_store_tenant
from celery_agboss.store.migrate import alembic_config, migrate
from celery_agboss.store.sqlalchemy_store import SQLAlchemyStore
from celery_agboss.testing import sabotage
from celery_agboss.testing.gateway import FakeGateway, FakeGatewayFault
from tests.contract.conftest import copy_of_a_database, empty_sqlite_url
from tests.engine.helpers import DAY, PSEUDONYM_KEY, reconcile_by_lookup

BEFORE = ScriptDirectory.from_config(alembic_config()).get_revision("0007").down_revision
"""The revision just below the one that adds the deployment id."""
MINTED = re.compile(r"^[a-z2-7]{10}$")
LONGEST_ORDER_KEY = "order:" + "9" * 12  # a business key a shop could send


@pytest.fixture
def another_empty_url(empty_url: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A second empty database on ``empty_url``'s backend."""
    if empty_url.startswith("sqlite"):
        return empty_sqlite_url(tmp_path / "second")
    url: str = request.getfixturevalue("clone_postgres")(
        request.getfixturevalue("postgres_templates")("empty", lambda _url: None)
    )
    return url


def _tenant(opened: Callable[[str], SQLAlchemyStore], url: str) -> str | None:
    return read_store_tenant(opened(url))


# --- an empty store mints its own --------------------------------------------------------


def test_an_empty_store_gets_a_short_deployment_id_of_its_own_when_migrated(
    empty_url: str, another_empty_url: str, opened: Callable[[str], SQLAlchemyStore]
) -> None:
    migrate(empty_url)
    migrate(another_empty_url)
    first, second = _tenant(opened, empty_url), _tenant(opened, another_empty_url)
    assert first is not None and second is not None
    assert MINTED.match(first) and MINTED.match(second), (first, second)
    assert first != second
    assert validate_tenant(first) == first


def test_migrating_again_keeps_the_deployment_id(
    empty_url: str, opened: Callable[[str], SQLAlchemyStore]
) -> None:
    migrate(empty_url)
    minted = _tenant(opened, empty_url)
    migrate(empty_url)
    assert _tenant(opened, empty_url) == minted


def test_the_minted_id_leaves_every_adapter_s_business_keys_in_clear() -> None:
    """10 characters: the README's order keys stay readable under Adyen's 64, PayPal's 108
    and Stripe's 255, never a digest."""
    tenant = "a" * 10
    for name, limit in (
        ("adyen.charge", adyen.MAX_KEY_LENGTH),
        ("paypal.authorize", paypal.MAX_REQUEST_ID_LENGTH),
        ("stripe.authorize", stripe.MAX_KEY_LENGTH),
    ):
        key = business_key(tenant, LONGEST_ORDER_KEY, name)
        assert fit_key(key, limit) == key, (name, len(key), limit)


# --- a store in use keeps "default" ------------------------------------------------------


def test_a_store_that_holds_executions_when_upgraded_keeps_the_default_tenant(
    empty_url: str, opened: Callable[[str], SQLAlchemyStore]
) -> None:
    migrate(empty_url, BEFORE)
    with opened(empty_url).engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO agboss_executions (id, task_name, state, args, kwargs, options,"
                " requested_at_ms, updated_at_ms) VALUES ('task-1', 'shop.charge_order',"
                " 'REQUESTED', '[]', '{}', '{}', 0, 0)"
            )
        )
    migrate(empty_url)
    assert _tenant(opened, empty_url) == DEFAULT_TENANT


def _charge(gateway: FakeGateway) -> OutboundCall:
    def send(call: Any) -> Any:
        return gateway.charge(call.request["amount"], call.idempotency_key)

    return OutboundCall(
        name="fake.charge", send=send, reconcile=reconcile_by_lookup(gateway), key_retention=DAY
    )


def lost_answer_of_the_previous_version(
    url: str, gateway: FakeGateway, charge: OutboundCall
) -> None:
    """A worker of the previous version (tenant "default") charges order 1 as task-1 and
    its answer is lost."""
    previous = EngineSettings(pseudonym_key=PSEUDONYM_KEY, tenant=DEFAULT_TENANT)
    store = SQLAlchemyStore(url)
    try:
        gateway.inject_fault(FakeGatewayFault.ANSWER_THEN_DROP)
        with (
            ExecutionContext.start(store, "task-1", previous) as before,
            pytest.raises(OutboundCallOutcomeUnknownError),
        ):
            before.outbound(charge, {"amount": 1000}, business_key="order:1")
    finally:
        store.close()


def redelivered_by_this_version(
    url: str, apps: Callable[..., Celery], charge: OutboundCall
) -> None:
    """A worker of this version redelivers task-1 (order 1) once the lost delivery's
    lease expired."""
    agboss = AGBoss.of(apps(url, agboss_pseudonym_key=PSEUDONYM_KEY))
    agboss.store.clock_offset_source = lambda: 31_000  # the lost delivery's lease expired
    with ExecutionContext.start(agboss.store, "task-1", agboss.engine_settings) as after:
        after.outbound(charge, {"amount": 1000}, business_key="order:1")


def _pay_across_an_upgrade(
    url: str, apps: Callable[..., Celery], *, minted_anyway: bool = False
) -> FakeGateway:
    """Order 1 is charged by the previous version (tenant "default", its answer lost);
    the store is upgraded; a delivery of this version finishes the same execution."""
    gateway = FakeGateway()
    charge = _charge(gateway)
    migrate(url, BEFORE)
    lost_answer_of_the_previous_version(url, gateway, charge)
    if minted_anyway:
        with sabotage(TENANT_MINTED_WHILE_IN_USE):
            migrate(url)
    else:
        migrate(url)
    redelivered_by_this_version(url, apps, charge)
    return gateway


def test_a_payment_started_before_the_upgrade_and_finished_after_it_is_paid_once(
    empty_url: str, apps: Callable[..., Celery]
) -> None:
    gateway = _pay_across_an_upgrade(empty_url, apps)
    assert len(gateway.payments) == 1


def test_twin_minting_an_id_for_a_store_in_use_pays_a_payment_in_flight_twice(
    empty_url: str, apps: Callable[..., Celery]
) -> None:
    gateway = _pay_across_an_upgrade(empty_url, apps, minted_anyway=True)
    assert len(gateway.payments) == 2


def test_a_rollback_and_a_re_deploy_keep_the_deployment_id_of_a_payment_in_flight(
    empty_url: str, apps: Callable[..., Celery], opened: Callable[[str], SQLAlchemyStore]
) -> None:
    """Order 1's answer is lost; the release is rolled back (``alembic downgrade``) and
    deployed again: the redelivery finds the same key, and the charge, once."""
    gateway = FakeGateway()
    charge = _charge(gateway)
    migrate(empty_url)
    minted = _tenant(opened, empty_url)
    agboss = AGBoss.of(apps(empty_url, agboss_pseudonym_key=PSEUDONYM_KEY))
    gateway.inject_fault(FakeGatewayFault.ANSWER_THEN_DROP)
    with (
        ExecutionContext.start(agboss.store, "task-1", agboss.engine_settings) as before,
        pytest.raises(OutboundCallOutcomeUnknownError),
    ):
        before.outbound(charge, {"amount": 1000}, business_key="order:1")
    with opened(empty_url).engine.begin() as conn:
        command.downgrade(alembic_config(conn), BEFORE)
    migrate(empty_url)
    assert _tenant(opened, empty_url) == minted
    redelivered_by_this_version(empty_url, apps, charge)
    assert len(gateway.payments) == 1


# --- kept by a moved or restored store; overridden; never guessed ------------------------


def test_a_moved_or_restored_store_keeps_its_deployment_id(
    empty_url: str,
    opened: Callable[[str], SQLAlchemyStore],
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    migrate(empty_url)
    with SQLAlchemyStore(empty_url) as store:
        minted = read_store_tenant(store)
    copy = copy_of_a_database(empty_url, request, tmp_path / "moved")
    assert minted is not None
    assert _tenant(opened, copy) == minted


def test_agboss_tenant_wins_over_the_store_s_id(
    empty_url: str, apps: Callable[..., Celery]
) -> None:
    migrate(empty_url)
    assert AGBoss.of(apps(empty_url, agboss_tenant="shop-eu")).tenant == "shop-eu"
    assert MINTED.match(AGBoss.of(apps(empty_url)).tenant)


def test_a_store_without_a_deployment_id_is_refused_naming_the_migration(
    empty_url: str, apps: Callable[..., Celery], opened: Callable[[str], SQLAlchemyStore]
) -> None:
    migrate(empty_url, BEFORE)
    with pytest.raises(ConfigurationError, match=r"celery -A proj agboss migrate"):
        AGBoss.of(apps(empty_url)).engine_settings  # noqa: B018
    with opened(empty_url).engine.begin() as conn:
        conn.execute(text("DROP TABLE agboss_meta"))
    with pytest.raises(ConfigurationError, match=r"agboss migrate"):
        AGBoss.of(apps(empty_url)).engine_settings  # noqa: B018


def test_the_store_holds_the_id_under_its_documented_meta_key(
    empty_url: str, opened: Callable[[str], SQLAlchemyStore]
) -> None:
    migrate(empty_url)
    with opened(empty_url).engine.connect() as conn:
        value = conn.execute(
            text("SELECT value FROM agboss_meta WHERE key = :key"), {"key": TENANT_META_KEY}
        ).scalar()
    assert value == _tenant(opened, empty_url)


# --- the worker reads it at start -----------------------------------------------------


class _Worker:
    """What Celery's worker_init/worker_ready pass as sender (the real worker, a
    ``celery worker`` process of the README, logs the same: tests/deployment)."""

    def __init__(self, app: Celery) -> None:
        self.app = app
        self.hostname = "w1@test"


def test_a_worker_on_a_store_without_a_deployment_id_starts_and_says_to_migrate(
    empty_url: str, apps: Callable[..., Celery], caplog: pytest.LogCaptureFixture
) -> None:
    """Started before ``agboss migrate`` (a compose file's start order), the worker does
    not exit: it says what to run, and its deliveries are retried until it ran."""
    migrate(empty_url, BEFORE)
    app = apps(empty_url)
    with caplog.at_level(logging.ERROR, logger="celery_agboss"):
        signals.worker_init.send(sender=_Worker(app))
    assert "celery -A proj agboss migrate" in caplog.text
    with pytest.raises(StoreNotMigratedError):
        AGBoss.of(app).engine_settings  # noqa: B018
    migrate(empty_url)
    assert MINTED.match(AGBoss.of(app).tenant) or AGBoss.of(app).tenant == "default"


def test_a_worker_logs_its_tenant_and_where_it_came_from_at_start(
    empty_url: str, apps: Callable[..., Celery], caplog: pytest.LogCaptureFixture
) -> None:
    migrate(empty_url)
    minted = apps(empty_url)
    configured = apps(empty_url, agboss_tenant="shop-eu")
    caplog.set_level(logging.INFO, logger="celery_agboss")
    try:
        for app in (minted, configured):
            signals.worker_init.send(sender=_Worker(app))
            signals.worker_ready.send(sender=_Worker(app))
    finally:
        signals.worker_shutdown.send(sender=None)
    tenant = AGBoss.of(minted).tenant
    assert f"celery_agboss tenant: {tenant} (the store's deployment id)" in caplog.text
    assert "celery_agboss tenant: shop-eu (agboss_tenant)" in caplog.text
