"""pytest fixtures for testing code built on celery_agboss (the ``agboss`` pytest11 plugin).

Installed packages load this plugin in every pytest run, so importing it costs
nothing beyond pytest itself: each fixture imports what it needs when used.

- ``agboss_clock``: a ``VirtualClock``;
- ``fake_gateway``: a ``FakeGateway`` on that clock (holds released at teardown);
- ``agboss_store``: a migrated SQLite store in ``tmp_path`` whose database clock
  moves with ``agboss_clock`` (needs the store's dependencies, SQLAlchemy);
- after every test, armed fault points are disarmed and paused threads woken.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from celery_agboss.core.store import Store
    from celery_agboss.testing.clock import VirtualClock
    from celery_agboss.testing.gateway import FakeGateway


@pytest.fixture
def agboss_clock() -> VirtualClock:
    """A clock the test moves forward; attached stores and fake gateways follow it."""
    from celery_agboss.testing.clock import VirtualClock

    return VirtualClock()


@pytest.fixture
def fake_gateway(agboss_clock: VirtualClock) -> Iterator[FakeGateway]:
    """A fake payment gateway with every capability on, on ``agboss_clock``."""
    from celery_agboss.testing.gateway import FakeGateway

    gateway = FakeGateway(clock=agboss_clock)
    try:
        yield gateway
    finally:
        gateway.close()


@pytest.fixture
def agboss_store(tmp_path: Path, agboss_clock: VirtualClock) -> Iterator[Store]:
    """A throwaway, migrated SQLite store whose database clock follows ``agboss_clock``."""
    try:
        stores = importlib.import_module("celery_agboss.testing.stores")
    except ImportError as exc:
        pytest.fail(
            "the agboss_store fixture needs celery_agboss.testing.stores and the store's "
            f"dependencies (SQLAlchemy, alembic), which could not be imported: {exc}",
            pytrace=False,
        )
    directory = tmp_path / "agboss-store"
    directory.mkdir(exist_ok=True)
    store: Store = stores.open_store(
        stores.sqlite_store_url(directory), clock_offset_source=agboss_clock.offset_ms
    )
    agboss_clock.attach(store)
    try:
        yield store
    finally:
        store.close()


@pytest.fixture(autouse=True)
def _agboss_disarm_fault_points() -> Iterator[None]:
    """A test that armed a fault point and failed must not leave it armed for the next."""
    yield
    if "celery_agboss.core.faults" in sys.modules:  # nothing to disarm otherwise
        from celery_agboss.testing.faults import disarm_all

        disarm_all()
