"""pytest fixtures for testing code built on celery_agboss (the ``agboss`` pytest11 plugin).

Installed packages load this plugin in every pytest run, so importing it costs
nothing beyond pytest itself: each fixture imports what it needs when used.

- ``agboss_clock``: a ``VirtualClock``;
- ``fake_gateway``: a ``FakeGateway`` on that clock (holds released at teardown);
- ``agboss_store``: a migrated SQLite store in ``tmp_path`` whose database clock
  moves with ``agboss_clock`` (needs the store's dependencies, SQLAlchemy);
- ``agboss_app``: a Celery app (in-memory broker and results) with ``AGBoss`` on
  that same database, a 5 s lease and no sweep beat; ``agboss_app_config``
  (override it) adds or changes settings;
- ``agboss_database_url``: that database's URL (your own tables and migrations);
- ``agboss_bind``: ``agboss_bind(app)`` puts your own app, its tasks as written, on
  that database, clock and broker for the test (override ``agboss_app`` with it);
- ``agboss_worker``: a real worker for ``agboss_app`` in a thread of this process;
  ``agboss_worker_parameters`` (override it) changes its pool or concurrency;
- after every test, armed fault points are disarmed and paused threads woken.

It also tells ``celery_agboss.core.sabotage`` that a pytest session runs in this
process (``pytest_configure`` to ``pytest_unconfigure``): the sabotage switches open only
there (with ``AGBOSS_ALLOW_SABOTAGE=1``), never in a process that merely imports pytest.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from celery import Celery

    from celery_agboss.core.store_protocol import Store
    from celery_agboss.testing.clock import VirtualClock
    from celery_agboss.testing.gateway import FakeGateway


def pytest_configure(config: pytest.Config) -> None:
    """A pytest session runs here: the sabotage switches may open (docs/testing.md)."""
    from celery_agboss.core import sabotage

    sabotage.test_session_started()


def pytest_unconfigure(config: pytest.Config) -> None:
    from celery_agboss.core import sabotage

    sabotage.test_session_ended()


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
    store: Store = stores.open_store(
        _store_url(stores, tmp_path), clock_offset_source=agboss_clock.offset_ms
    )
    agboss_clock.attach(store)
    try:
        yield store
    finally:
        store.close()


def _store_url(stores: Any, tmp_path: Path) -> str:
    """The one throwaway database of a test: ``agboss_store`` and ``agboss_app`` share it."""
    directory = tmp_path / "agboss-store"
    directory.mkdir(exist_ok=True)
    url: str = stores.sqlite_store_url(directory)
    return url


@pytest.fixture
def agboss_database_url(tmp_path: Path, agboss_store: Store) -> str:
    """The URL of ``agboss_store``'s database: run your own migrations there (your
    tables beside celery_agboss's, as in production)."""
    return _store_url(importlib.import_module("celery_agboss.testing.stores"), tmp_path)


@pytest.fixture
def agboss_bind(
    agboss_clock: VirtualClock,
    agboss_database_url: str,
    agboss_app_config: dict[str, Any],
) -> Iterator[Callable[[Celery], Celery]]:
    """``agboss_bind(app) -> app``: your own app, its tasks as written, on this test's
    store, clock and in-memory broker (``agboss_app``'s settings); put back after the
    test. Override ``agboss_app`` with it so that ``agboss_worker`` runs your app::

        @pytest.fixture
        def agboss_app(agboss_bind):
            return agboss_bind(shop.app)
    """
    from contextlib import ExitStack

    from celery_agboss.testing.celery_app import bound_app

    with ExitStack() as stack:

        def bind(app: Celery) -> Celery:
            return stack.enter_context(
                bound_app(
                    app,
                    agboss_database_url,
                    clock_offset_source=agboss_clock.offset_ms,
                    config=agboss_app_config,
                )
            )

        yield bind


@pytest.fixture
def agboss_app_config() -> dict[str, Any]:
    """Celery and ``agboss_*`` settings for ``agboss_app``; override it to change them."""
    return {}


@pytest.fixture
def agboss_app(
    tmp_path: Path,
    agboss_clock: VirtualClock,
    agboss_store: Store,
    agboss_app_config: dict[str, Any],
) -> Iterator[Celery]:
    """A Celery app with ``AGBoss`` on the ``agboss_store`` database, on ``agboss_clock``.

    Declare tasks on it with ``@agboss_app.task(base=PaymentTask, bind=True)``. Without
    ``agboss_worker``, ``task.apply(...)`` runs one delivery in the test's thread.
    """
    stores = importlib.import_module("celery_agboss.testing.stores")
    from celery_agboss.testing.celery_app import close_test_app, make_test_app

    app = make_test_app(
        _store_url(stores, tmp_path),
        clock_offset_source=agboss_clock.offset_ms,
        config=agboss_app_config,
    )
    try:
        yield app
    finally:
        close_test_app(app)


@pytest.fixture
def agboss_worker_parameters() -> dict[str, Any]:
    """Keyword arguments of ``running_worker`` (``pool``, ``concurrency``, …); override it."""
    return {}


@pytest.fixture
def agboss_worker(
    agboss_app: Celery,
    fake_gateway: FakeGateway,
    agboss_worker_parameters: dict[str, Any],
) -> Iterator[Any]:
    """A real Celery worker for ``agboss_app``, in a thread of this process (threads pool).

    It also runs tasks declared after it started. Before it stops, ``fake_gateway``'s
    holds are released and paused fault points woken, so that no task it runs stays
    blocked and its shutdown is quick.
    """
    from celery_agboss.testing.celery_app import running_worker

    with running_worker(agboss_app, **agboss_worker_parameters) as worker:
        try:
            yield worker
        finally:
            fake_gateway.close()
            _disarm_fault_points()


@pytest.fixture(autouse=True)
def _agboss_disarm_fault_points() -> Iterator[None]:
    """A test that armed a fault point and failed must not leave it armed for the next."""
    yield
    _disarm_fault_points()


def _disarm_fault_points() -> None:
    """Disarm (and wake) every fault point, when any could be armed: not imported, none is."""
    if "celery_agboss.core.fault_points" in sys.modules:
        from celery_agboss.testing.fault_arming import disarm_all

        disarm_all()
