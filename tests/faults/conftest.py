"""The fault suite runs on the same throwaway stores as the contract suite, plus a
PostgreSQL-only store for the tests that go through the TCP proxy; its scenarios on
real workers deploy the README's shop with the deployment suite's fixtures."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from celery_agboss.store.migrate import migrate
from tests.contract.conftest import (
    StoreFactory,
    db_clock,
    store,
    store_backend,
    store_factory,
    store_url,
)
from tests.deployment.conftest import (
    _stale_vhosts_dropped,
    deploy,
    deployed_venv,
    gateway_server,
    rabbitmq_vhost_url,
    sqlite_url,
)
from tests.faults.cluster import Cluster
from tests.faults.scenario import Stack, stack_for
from tests.support import services
from tests.support.databases import TemplateDatabase
from tests.support.throwaway import Unavailable

TemplateFactory = Callable[[str, Callable[[str], None]], TemplateDatabase]


@pytest.fixture
def postgres_store_url(
    postgres_templates: TemplateFactory, clone_postgres: Callable[[TemplateDatabase], str]
) -> str:
    """A migrated, empty store database on PostgreSQL (dropped after the test)."""
    return clone_postgres(postgres_templates("store", migrate))


@pytest.fixture(scope="session")
def crashable_postgres() -> Iterator[Cluster]:
    """A PostgreSQL cluster of this session's own, on a free port of 127.0.0.1, that a
    test may stop with ``pg_ctl -m immediate`` (tests/faults/cluster.py); removed at the
    end of the session."""
    try:
        cluster = Cluster.create()
    except Unavailable as exc:
        if services.in_ci():
            services.fail(str(exc))
        pytest.skip(str(exc))
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.fixture
def stack(request: pytest.FixtureRequest) -> Stack:
    store, broker = request.param
    return stack_for(request, store, broker)


@pytest.fixture
def empty_stack(request: pytest.FixtureRequest) -> Stack:
    """A broker and an empty store, for what migrates a database of its own (chaos)."""
    store, broker = request.param
    return stack_for(request, store, broker, migrated=False)


@pytest.fixture
def sabotage_stack(request: pytest.FixtureRequest) -> Stack:
    """Where every sabotage run goes: PostgreSQL + Redis."""
    return stack_for(request, "postgresql", "redis")
