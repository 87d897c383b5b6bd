"""Fixtures two or more unit files share."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from celery import Celery

from celery_agboss.signals import disconnect


@pytest.fixture
def apps() -> Iterator[list[Celery]]:
    """Every app a test appends here is disconnected and closed after it: its signal
    handlers and patterns must not leak into the next test."""
    made: list[Celery] = []
    yield made
    for app in made:
        agboss = getattr(app, "_agboss", None)
        if agboss is not None:
            disconnect(agboss)
        app.close()
