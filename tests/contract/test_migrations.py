"""The migrations that ship in the package produce exactly the declared schema.

Applied to an empty database, ``migrate(url)`` must leave nothing for Alembic's
autogenerate to add, drop or alter against ``celery_agboss.store.metadata`` — the
check procrastinate runs in CI — on SQLite and on PostgreSQL.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect

from celery_agboss.store import metadata
from celery_agboss.store.databases import create_store_engine
from celery_agboss.store.migrate import MIGRATIONS_DIR, alembic_config, current_revision, migrate
from tests.support import services

VERSION_TABLE = "agboss_alembic_version"


@pytest.fixture(
    params=[
        pytest.param("sqlite", marks=pytest.mark.sqlite),
        pytest.param("postgresql", marks=pytest.mark.postgres),
    ]
)
def empty_database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A database with no tables at all."""
    backend: str = request.param
    if backend not in services.selected_backends():
        pytest.skip(f"{backend} not in {services.BACKENDS_ENV_VAR}")
    if backend == "sqlite":
        return f"sqlite:///{tmp_path.resolve() / 'empty.db'}"
    url: str = request.getfixturevalue("empty_postgres_url")
    return url


def _diff(url: str) -> list[object]:
    engine = create_store_engine(url)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(
                conn, opts={"version_table": VERSION_TABLE, "compare_type": True}
            )
            return list(compare_metadata(context, metadata))
    finally:
        engine.dispose()


def _tables(url: str) -> set[str]:
    engine = create_store_engine(url)
    try:
        with engine.connect() as conn:
            return set(inspect(conn).get_table_names())
    finally:
        engine.dispose()


def test_migrations_on_an_empty_database_produce_exactly_the_declared_metadata(
    empty_database_url: str,
) -> None:
    assert _tables(empty_database_url) == set()
    migrate(empty_database_url)
    assert _diff(empty_database_url) == []
    assert _tables(empty_database_url) == {*metadata.tables, VERSION_TABLE}
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert current_revision(empty_database_url) == head


def test_migrating_twice_changes_nothing(empty_database_url: str) -> None:
    migrate(empty_database_url)
    migrate(empty_database_url)
    assert _diff(empty_database_url) == []


def test_every_table_is_prefixed_and_the_migrations_ship_in_the_package() -> None:
    assert metadata.tables, "no tables declared"
    assert all(name.startswith("agboss_") for name in metadata.tables)
    assert (MIGRATIONS_DIR / "env.py").is_file()
    assert list((MIGRATIONS_DIR / "versions").glob("*.py"))
