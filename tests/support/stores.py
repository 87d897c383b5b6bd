"""One way to get a migrated, empty store database for a test, on each backend."""

from __future__ import annotations

from pathlib import Path

import pytest

from celery_agboss.store.migrate import migrate
from celery_agboss.testing.stores import sqlite_store_url
from tests.support import services

STORE_BACKENDS = [
    pytest.param("sqlite", id="sqlite", marks=pytest.mark.sqlite),
    pytest.param("postgresql", id="postgresql", marks=pytest.mark.postgres),
]


def fresh_store_url(request: pytest.FixtureRequest, tmp_path: Path, template: str) -> str:
    """For a fixture parametrized with ``STORE_BACKENDS``: a SQLite file migrated here, or a
    PostgreSQL clone of the migrated template ``template`` (dropped after the test)."""
    backend: str = request.param
    if backend not in services.selected_backends():
        pytest.skip(f"{backend} not in {services.BACKENDS_ENV_VAR}")
    if backend == "sqlite":
        url = sqlite_store_url(tmp_path)
        migrate(url)
        return url
    templates = request.getfixturevalue("postgres_templates")
    clone = request.getfixturevalue("clone_postgres")
    cloned: str = clone(templates(template, migrate))
    return cloned
