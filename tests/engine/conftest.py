"""Fixtures for the engine suite: every test runs on SQLite and on PostgreSQL.

The store fixtures are the contract suite's (``store``, ``store_factory``,
``store_url``, ``db_clock``); on top of them: a ``FakeGateway`` on the same virtual
clock, ``EngineSettings`` with a fresh call registry, and ``shop``, which builds
outbound calls against the gateway and starts deliveries.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from celery_agboss.core.engine_settings import EngineSettings
from celery_agboss.store.sqlalchemy_store import SQLAlchemyStore
from celery_agboss.testing.clock import VirtualClock
from celery_agboss.testing.gateway import FakeGateway
from tests.contract.conftest import (
    db_clock,
    store,
    store_backend,
    store_factory,
    store_url,
)
from tests.engine.helpers import PSEUDONYM_KEY, Shop


@pytest.fixture
def settings() -> EngineSettings:
    """A 30 s lease and a 5 s attempt timeout; a registry of its own per test."""
    return EngineSettings(
        pseudonym_key=PSEUDONYM_KEY, lease_ttl_ms=30_000, attempt_timeout_ms=5_000
    )


@pytest.fixture
def gateway(db_clock: VirtualClock) -> Iterator[FakeGateway]:
    """The fake gateway, on the database's virtual clock (its key retention moves with it)."""
    fake = FakeGateway(clock=db_clock, hold_timeout=20.0)
    try:
        yield fake
    finally:
        fake.close()


@pytest.fixture
def shop(
    store: SQLAlchemyStore,
    store_factory: Callable[..., SQLAlchemyStore],
    settings: EngineSettings,
    gateway: FakeGateway,
    db_clock: VirtualClock,
) -> Shop:
    """The application side: outbound calls against ``gateway``, deliveries on ``store``."""
    return Shop(store, store_factory, settings, gateway, db_clock)
