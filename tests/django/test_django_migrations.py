"""``python manage.py migrate`` makes the store the Alembic revisions make, on both stores.

Issue 27: a Django project keeps no second migration tool and no second
URL. Each Django command runs in a process of the project in tests/support/django_shop
(the test process never configures Django): its migrations, adopting a store that
``agboss migrate`` made, refusing to go back, and the Celery app finding its store in
``DATABASES``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import inspect, text

from celery_agboss.store.databases import create_store_engine
from celery_agboss.store.migrate import MIGRATIONS_DIR, current_revision, migrate
from tests.support.databases import TemplateDatabase
from tests.support.django_project import (
    manage,
    postgresql_database,
    python,
    sqlite_database,
)

DatabaseFactory = Callable[[], tuple[str, dict[str, Any]]]


@pytest.fixture(params=["sqlite", "postgresql"])
def new_database(request: pytest.FixtureRequest, tmp_path: Path) -> DatabaseFactory:
    """``new_database() -> (store url, DATABASES entry)``: an empty database of the backend."""
    made = iter(range(100))
    if request.param == "sqlite":

        def sqlite() -> tuple[str, dict[str, Any]]:
            path = tmp_path / f"db{next(made)}.sqlite3"
            return f"sqlite:///{path}", sqlite_database(path)

        return sqlite
    templates = request.getfixturevalue("postgres_templates")
    clone: Callable[[TemplateDatabase], str] = request.getfixturevalue("clone_postgres")
    template = templates("empty", lambda url: None)

    def postgresql() -> tuple[str, dict[str, Any]]:
        url = clone(template)
        return url, postgresql_database(url)

    return postgresql


def _schema(url: str) -> dict[str, Any]:
    """Every agboss table's columns, key and indexes, and the store's revision."""
    engine = create_store_engine(url)
    try:
        found = inspect(engine)
        tables = sorted(name for name in found.get_table_names() if name.startswith("agboss_"))
        schema: dict[str, Any] = {
            table: {
                "columns": [
                    (c["name"], str(c["type"]), c["nullable"], str(c.get("default")))
                    for c in found.get_columns(table)
                ],
                "key": found.get_pk_constraint(table)["constrained_columns"],
                "indexes": sorted(
                    (i["name"] or "", tuple(i["column_names"]), bool(i["unique"]))
                    for i in found.get_indexes(table)
                ),
            }
            for table in tables
        }
    finally:
        engine.dispose()
    schema["revision"] = current_revision(url)
    return schema


def _deployment_id(url: str) -> str:
    engine = create_store_engine(url)
    try:
        with engine.connect() as conn:
            return str(
                conn.execute(
                    text("SELECT value FROM agboss_meta WHERE key = 'deployment.tenant'")
                ).scalar_one()
            )
    finally:
        engine.dispose()


def _succeeded(done: Any) -> str:
    assert done.returncode == 0, done.stdout + done.stderr
    return str(done.stdout)


def test_migrate_makes_the_schema_agboss_migrate_makes(new_database: DatabaseFactory) -> None:
    by_django, database = new_database()
    by_agboss, _ = new_database()
    out = _succeeded(manage(database, "migrate", "--no-input"))
    assert "Applying agboss.0001_initial... OK" in out
    migrate(by_agboss)
    assert _schema(by_django) == _schema(by_agboss)
    assert _schema(by_django)["revision"] is not None


def test_a_store_agboss_migrate_made_is_adopted_as_it_is(new_database: DatabaseFactory) -> None:
    url, database = new_database()
    migrate(url)
    before, deployment = _schema(url), _deployment_id(url)
    _succeeded(manage(database, "migrate", "--no-input"))
    assert _schema(url) == before
    assert _deployment_id(url) == deployment  # its keys in flight keep their tenant
    assert "[X] 0001_initial" in _succeeded(manage(database, "showmigrations", "agboss"))


def test_going_back_is_refused_and_drops_nothing(new_database: DatabaseFactory) -> None:
    url, database = new_database()
    _succeeded(manage(database, "migrate", "--no-input"))
    made = _schema(url)
    refused = manage(database, "migrate", "agboss", "zero", "--no-input")
    assert refused.returncode != 0
    assert "is not reversible" in refused.stderr
    assert _schema(url) == made


def test_makemigrations_finds_nothing_to_make(tmp_path: Path) -> None:
    database = sqlite_database(tmp_path / "db.sqlite3")
    _succeeded(manage(database, "makemigrations", "--check", "--dry-run"))


def test_the_last_django_migration_reaches_the_alembic_head() -> None:
    """A new Alembic revision needs a Django migration of this app that names it."""
    django_migrations = Path(importlib.import_module("celery_agboss.contrib.django").__file__)
    names = sorted(p.stem for p in (django_migrations.parent / "migrations").glob("0*.py"))
    upgrades = [
        op.revision
        for name in names
        for op in importlib.import_module(
            f"celery_agboss.contrib.django.migrations.{name}"
        ).Migration.operations
        if hasattr(op, "revision")  # the store's upgrades; the admin's models have none
    ]
    revisions = sorted(p.stem.split("_")[0] for p in (MIGRATIONS_DIR / "versions").glob("0*.py"))
    assert upgrades and upgrades[-1] == revisions[-1]


def test_the_celery_app_finds_its_store_in_databases(new_database: DatabaseFactory) -> None:
    url, database = new_database()
    shown = _succeeded(
        python(
            database,
            "from celery_agboss import AGBoss\n"
            "from tests.support.django_shop.celery import app\n"
            "s = AGBoss.of(app).settings\n"
            "print(s.database_url, s.django_database)\n",
        )
    )
    assert shown.split() == [url, "default"]


@pytest.mark.parametrize(
    ("database", "told"),
    [
        (
            {"ENGINE": "django.db.backends.sqlite3", "NAME": "/tmp/shop.sqlite3"},
            '"OPTIONS": {"transaction_mode": "IMMEDIATE"}',
        ),
        ({"ENGINE": "django.db.backends.mysql", "NAME": "shop"}, "PostgreSQL or SQLite"),
    ],
    ids=["sqlite-deferred", "mysql"],
)
def test_an_alias_the_store_cannot_use_is_refused_naming_what_to_do(
    database: dict[str, Any], told: str
) -> None:
    refused = python(
        database,
        "from celery_agboss import AGBoss\n"
        "from tests.support.django_shop.celery import app\n"
        "AGBoss.of(app).settings\n",
    )
    assert refused.returncode != 0
    assert "ConfigurationError" in refused.stderr and told in refused.stderr
