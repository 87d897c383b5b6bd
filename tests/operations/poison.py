"""A store sealed with one key, and a row sealed with another no process holds: what an
operator leaves who dropped a key before ``agboss rotate-keys`` reached every row, or a
worker that sealed with a new first key the sweeper was not given yet. One such row
must fail alone, named, and never stop a step or a command for the rows behind it
(design: sealed at rest).
"""

from __future__ import annotations

import base64
import logging
import os
from typing import Any

import pytest
from sqlalchemy import update

from celery_agboss.core.sealing import key_variable
from celery_agboss.errors import SealedValueUnopenableError
from celery_agboss.sweep import SweepReport
from tests.operations.conftest import WorldFactory
from tests.operations.world import World

HELD_KEY = "k1"
"""The one key the test's processes hold (``agboss_encryption_keys``)."""


def unopenable() -> str:
    """A sealed value under ``k0``, a key no process of the test holds."""
    return "agbsealed:1:k0:" + base64.b64encode(os.urandom(40)).decode()


def sealed_world(world_factory: WorldFactory, monkeypatch: pytest.MonkeyPatch) -> World:
    """A world whose store seals with ``HELD_KEY`` (a fresh random key)."""
    monkeypatch.setenv(key_variable(HELD_KEY), base64.b64encode(os.urandom(32)).decode())
    return world_factory(encryption_keys=[HELD_KEY])


def poison(world: World, table: Any, key_column: Any, key: str, *names: str) -> None:
    """Overwrite the columns ``names`` of the row ``key`` of ``table`` with values no
    process of the test can open."""
    values = {name: unopenable() for name in names}
    with world.agboss.store.engine.begin() as conn:
        conn.execute(update(table).where(key_column == key).values(**values))


def swept_after(world: World, caplog: pytest.LogCaptureFixture, seconds: float) -> SweepReport:
    """``seconds`` pass on the database clock, then one sweep, its errors in ``caplog``."""
    world.clock.advance(seconds)
    with caplog.at_level(logging.ERROR, logger="celery_agboss"):
        return world.sweep()


def sweep_errors(caplog: pytest.LogCaptureFixture, id_field: str) -> list[tuple[object, object]]:
    """Each ``sweep.error`` as (step, its ``id_field``), asserting it says which key
    sealed the row (``k0``, the one no process holds)."""
    found = []
    for record in caplog.records:
        if getattr(record, "event", None) != "sweep.error":
            continue
        assert record.exc_info is not None
        error = record.exc_info[1]
        assert isinstance(error, SealedValueUnopenableError) and error.key_id == "k0"
        found.append((record.__dict__.get("step"), record.__dict__.get(id_field)))
    return found


__all__ = ["HELD_KEY", "poison", "sealed_world", "sweep_errors", "swept_after", "unopenable"]
