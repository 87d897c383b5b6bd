"""Fixtures of the operations tests: a real Celery app bound to a real store (SQLite file or
PostgreSQL clone), a virtual database clock, a fake gateway, and a ``World`` that puts
executions and intents into the states the sweep and the operator commands act on.

Messages go to Celery's in-memory transport: nothing consumes them, and every publish
(the first and each re-publish) is counted through ``after_task_publish``.

The tests that deliver for real (the operator's "payments handled", retention of scheduled
charges) use the delivery folder's ``shop`` instead: a worker thread in this process, on
each backend; a module may override its ``shop_config``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from celery import Celery
from celery import signals as celery_signals

from celery_agboss.store.migrate import migrate
from celery_agboss.testing.clock import VirtualClock
from celery_agboss.testing.gateway import FakeGateway
from celery_agboss.testing.stores import sqlite_store_url
from tests.delivery import conftest as delivery
from tests.operations.world import World, connected, make_world
from tests.support import services
from tests.support.stores import STORE_BACKENDS, fresh_store_url

BACKENDS = STORE_BACKENDS

# The delivery folder's shop (a real worker in this process), reused as it is.
delivery_store_url = delivery.delivery_store_url
shop_config = delivery.shop_config
shop = delivery.shop


@pytest.fixture(params=BACKENDS)
def ops_store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A migrated, empty store of its own, on each backend."""
    return fresh_store_url(request, tmp_path, "operations-migrated")


@pytest.fixture
def published() -> Iterator[list[str]]:
    """Task ids of every message published in this test (first publishes and re-publishes)."""
    ids: list[str] = []

    def on_publish(sender: Any = None, headers: Any = None, **_: Any) -> None:
        task_id = (headers or {}).get("id")
        if task_id:
            ids.append(str(task_id))

    with connected(celery_signals.after_task_publish, on_publish):
        yield ids


WorldFactory = Callable[..., World]


@pytest.fixture
def world_factory(ops_store_url: str, published: list[str]) -> Iterator[WorldFactory]:
    """``world_factory(**settings) -> World`` on this test's store (several share it)."""
    clock = VirtualClock()
    gateway = FakeGateway(clock=clock)
    made: list[World] = []

    def build(**settings: Any) -> World:
        made_world = make_world(
            ops_store_url, clock=clock, gateway=gateway, published=published, **settings
        )
        made.append(made_world)
        return made_world

    try:
        yield build
    finally:
        for made_world in made:
            made_world.close()
        gateway.close()


@pytest.fixture
def world(world_factory: WorldFactory) -> World:
    return world_factory()


class OnOneKey(NamedTuple):
    """A world without a lookup; A and B, two executions of one order, both waiting for
    an operator on A's intent; and that intent's key."""

    world: World
    first: str
    second: str
    key: str


@pytest.fixture
def on_one_key(world_factory: WorldFactory) -> OnOneKey:
    """``World.two_executions_on_one_key`` in a world whose lookup cannot tell."""
    world = world_factory(lookup="none")
    return OnOneKey(world, *world.two_executions_on_one_key())


def new_app_name() -> str:
    return f"ops_{uuid.uuid4().hex[:8]}"


__all__ = ["Celery", "OnOneKey", "WorldFactory", "new_app_name"]
