"""Fixtures of the integration tests: a store (SQLite file or PostgreSQL clone), the gateway
over HTTP, and ``shop_factory`` that wires them to Redis (or RabbitMQ) and real workers."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from celery_agboss.store.migrate import migrate
from celery_agboss.testing.gateway import FakeGateway
from tests.conftest import ProcessFactory, TemplateFactory
from tests.integration.gateway_http import GatewayHTTPServer
from tests.integration.harness import Shop, ShopFactory, make_shop
from tests.support.databases import TemplateDatabase

pytestmark = pytest.mark.worker


@pytest.fixture
def gateway() -> Iterator[GatewayHTTPServer]:
    with GatewayHTTPServer(FakeGateway(hold_timeout=60)) as server:
        yield server


@pytest.fixture
def sqlite_database_url(tmp_path: Path) -> str:
    url = f"sqlite:///{(tmp_path / 'agboss.db').resolve()}"
    migrate(url)
    return url


@pytest.fixture
def postgres_database_url(
    postgres_templates: TemplateFactory, clone_postgres: Callable[[TemplateDatabase], str]
) -> str:
    return clone_postgres(postgres_templates("integration-migrated", migrate))


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest) -> str:
    """The store of the test, on each backend."""
    name = "sqlite_database_url" if request.param == "sqlite" else "postgres_database_url"
    url: str = request.getfixturevalue(name)
    return url


@pytest.fixture
def shop_factory(
    redis_url_factory: Callable[[], str],
    gateway: GatewayHTTPServer,
    managed_process: ProcessFactory,
    sqlite_database_url: str,
) -> Iterator[ShopFactory]:
    """``shop_factory(database_url=…, broker_url=…, app_module=…, kind=…, **config) -> Shop``
    (Redis by default; the shop app of ``tests.integration.apps.shop`` unless
    ``app_module`` names another of ``tests.integration.apps``), closed after the test."""
    made: list[Shop] = []

    def build(**overrides: Any) -> Shop:
        broker = overrides.pop("broker_url", None) or redis_url_factory()
        backend = overrides.pop("backend_url", None) or redis_url_factory()
        database = overrides.pop("database_url", None) or sqlite_database_url
        shop = make_shop(
            broker_url=broker,
            backend_url=backend,
            database_url=database,
            gateway=gateway,
            start_process=managed_process,
            **overrides,
        )
        made.append(shop)
        return shop

    yield build
    for shop in made:
        shop.close()
