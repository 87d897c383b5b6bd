"""The fault suite runs on the same throwaway stores as the contract suite, plus a
PostgreSQL-only store for the tests that go through the TCP proxy; its scenarios on
real workers deploy the README's shop with the deployment suite's fixtures."""

from __future__ import annotations

from collections.abc import Callable

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
from tests.support.databases import TemplateDatabase

TemplateFactory = Callable[[str, Callable[[str], None]], TemplateDatabase]


@pytest.fixture
def postgres_store_url(
    postgres_templates: TemplateFactory, clone_postgres: Callable[[TemplateDatabase], str]
) -> str:
    """A migrated, empty store database on PostgreSQL (dropped after the test)."""
    return clone_postgres(postgres_templates("store", migrate))
