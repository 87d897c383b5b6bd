"""Fixtures for the store contract suite: every test runs once per store backend.

- ``store_url``: a migrated, empty database of its own, parametrized ``sqlite`` and
  ``postgresql`` (the latter marked ``postgres``; skipped on a laptop without it,
  failed under CI; ``AGBOSS_TEST_BACKENDS`` narrows the set);
- ``db_clock``: a ``VirtualClock`` whose offset every store below adds to the
  database clock (``db_clock.advance(31)`` expires a 30 s lease, no sleeping);
- ``store``: an open ``SQLAlchemyStore`` on ``store_url``;
- ``store_factory(**kwargs)``: another ``SQLAlchemyStore`` on the same database
  (its own engine and pool, as a second worker process would have), closed after;
- ``executions``: the execution verbs on a PostgreSQL database of their own, for the
  one-statement tests; ``executions.offset["ms"]`` moves the clock every statement reads;
- ``empty_url``: a database with no tables at all, on each backend (the deployment id's
  tests migrate it themselves); ``apps(url, **config)``: test apps on it, closed after;
  ``opened(url)``: a store on any url, closed after; ``copy_of_a_database``: a copy.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from celery_agboss.core.store_protocol import LeaseGrant, Store
from celery_agboss.store.execution_store import SQLAlchemyExecutionStore
from celery_agboss.store.migrate import migrate
from celery_agboss.store.sqlalchemy_store import SQLAlchemyStore
from celery_agboss.testing.celery_app import close_test_app, make_test_app
from celery_agboss.testing.clock import VirtualClock
from celery_agboss.testing.stores import sqlite_store_url
from tests.conftest import TemplateFactory
from tests.support import services
from tests.support.databases import TemplateDatabase, database_name
from tests.support.stores import STORE_BACKENDS, fresh_store_url

BACKENDS = STORE_BACKENDS

StoreFactory = Callable[..., SQLAlchemyStore]


@pytest.fixture
def executions(
    postgres_templates: TemplateFactory, clone_postgres: Callable[[TemplateDatabase], str]
) -> Iterator[SQLAlchemyExecutionStore]:
    store = SQLAlchemyStore(clone_postgres(postgres_templates("store", migrate)))
    offset = {"ms": 0}
    store.clock_offset_source = lambda: offset["ms"]
    verbs = SQLAlchemyExecutionStore(store)
    verbs.offset = offset  # type: ignore[attr-defined]
    yield verbs
    store.close()


@pytest.fixture(params=BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A migrated, empty store database for this test (dropped after it on PostgreSQL)."""
    return fresh_store_url(request, tmp_path, "store")


@pytest.fixture
def store_backend(store_url: str) -> str:
    """``"sqlite"`` or ``"postgresql"``: the backend of this test's ``store_url``."""
    return "sqlite" if store_url.startswith("sqlite") else "postgresql"


@pytest.fixture
def db_clock() -> VirtualClock:
    """The database clock's test offset, shared by ``store`` and ``store_factory`` stores."""
    return VirtualClock()


@pytest.fixture
def store_factory(store_url: str, db_clock: VirtualClock) -> Iterator[StoreFactory]:
    """``store_factory(**kwargs)``: a new ``SQLAlchemyStore`` on ``store_url``.

    Keyword arguments go to ``SQLAlchemyStore``; ``clock_offset_source`` defaults
    to ``db_clock``'s. Every store made is closed after the test.
    """
    made: list[SQLAlchemyStore] = []

    def make(**kwargs: Any) -> SQLAlchemyStore:
        kwargs.setdefault("clock_offset_source", db_clock.offset_ms)
        opened = SQLAlchemyStore(store_url, **kwargs)
        made.append(opened)
        return opened

    yield make
    for opened in reversed(made):
        opened.close()


@pytest.fixture
def store(store_factory: StoreFactory) -> SQLAlchemyStore:
    """An open store on a fresh database, its clock driven by ``db_clock``."""
    return store_factory()


@pytest.fixture(params=BACKENDS)
def empty_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A database with no tables at all, on each backend."""
    return empty_database(request, tmp_path / "first")


def empty_database(request: pytest.FixtureRequest, directory: Path) -> str:
    """An empty database on the backend ``request.param`` names (skipped when that backend
    is not selected)."""
    backend: str = request.param
    if backend not in services.selected_backends():
        pytest.skip(f"{backend} not in {services.BACKENDS_ENV_VAR}")
    if backend == "sqlite":
        return empty_sqlite_url(directory)
    url: str = request.getfixturevalue("empty_postgres_url")
    return url


def empty_sqlite_url(directory: Path) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{(directory / 'agboss.db').resolve()}"


def copy_of_a_database(url: str, request: pytest.FixtureRequest, directory: Path) -> str:
    """A copy of the database at ``url``, rows and all, as a restore or a moved store brings
    them back: the SQLite file copied into ``directory``, or ``CREATE DATABASE copy TEMPLATE
    original`` (dropped after the test)."""
    if url.startswith("sqlite"):
        copy = empty_sqlite_url(directory)
        shutil.copy(url.removeprefix("sqlite:///"), copy.removeprefix("sqlite:///"))
        return copy
    admin_url: str = request.getfixturevalue("postgres_admin_url")
    clone: Callable[[TemplateDatabase], str] = request.getfixturevalue("clone_postgres")
    return clone(TemplateDatabase(admin_url=admin_url, name=database_name(url)))


@pytest.fixture
def opened() -> Iterator[Callable[[str], SQLAlchemyStore]]:
    """``opened(url)``: a ``SQLAlchemyStore`` on ``url``; every store made is closed after."""
    made: list[SQLAlchemyStore] = []

    def open_(url: str) -> SQLAlchemyStore:
        made.append(SQLAlchemyStore(url))
        return made[-1]

    yield open_
    for store in made:
        store.close()


@pytest.fixture
def apps() -> Iterator[Callable[..., Celery]]:
    """``apps(url, **config)``: a test app on ``url``; every app made is closed after."""
    made: list[Celery] = []

    def make(url: str, **config: Any) -> Celery:
        made.append(make_test_app(url, config=config))
        return made[-1]

    yield make
    for app in made:
        close_test_app(app)


def granted(store: Store, scope: str, ttl_ms: int, holder: str = "holder-a") -> LeaseGrant:
    """A lease on ``scope`` for ``holder``, which the test needs to go on (it asserts
    the store granted it)."""
    grant = store.acquire_lease(scope, holder, ttl_ms)
    assert grant is not None, f"no lease on {scope} for {holder}"
    return grant
