"""Fixtures shared by every test: the real services, throwaway databases,
managed subprocesses and a fault-injecting PostgreSQL proxy.

Sabotage switches (protections turned off to prove a test can fail) work in
this test run: ``AGBOSS_ALLOW_SABOTAGE=1`` is set here.

A test that uses ``postgres_admin_url`` (directly or through another fixture),
``redis_url`` or ``rabbitmq_url`` is marked ``postgres``, ``redis`` or
``rabbitmq`` on its own, so ``-m "not postgres"`` leaves it out.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Generator, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from celery.worker import state as worker_state

from celery_agboss.core.sabotage import ENV_SWITCH as ALLOW_SABOTAGE
from tests.support import databases, services
from tests.support.databases import TemplateDatabase
from tests.support.processes import ManagedProcess
from tests.support.redis_databases import NoFreeDatabase, RedisDatabaseLeases
from tests.support.tcp_proxy import PostgresProxy

if TYPE_CHECKING:
    from tests.support.django_harness import DjangoShop

os.environ.setdefault(ALLOW_SABOTAGE, "1")

pytest_plugins = [
    "tests.support.collector",
    "tests.support.file_times",
    "tests.support.pauses",
]

# -- markers from fixtures -----------------------------------------------------

_MARKER_FOR_FIXTURE = {
    "postgres_admin_url": "postgres",
    "redis_url_factory": "redis",
    "rabbitmq_url": "rabbitmq",
}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        names = getattr(item, "fixturenames", ())
        for fixture, marker in _MARKER_FOR_FIXTURE.items():
            if fixture in names:
                item.add_marker(marker)


def pytest_report_header() -> list[str]:
    lines = [
        f"{service.env_var}: {services.redact(services.resolve_url(service))}"
        for service in services.SERVICES
    ]
    lines.append(f"store backends: {', '.join(services.selected_backends())}")
    lines.append(f"CI: {'yes (a missing service fails)' if services.in_ci() else 'no'}")
    return lines


# -- PostgreSQL ------------------------------------------------------------------


@pytest.fixture(scope="session")
def postgres_admin_url() -> str:
    """SQLAlchemy URL of a PostgreSQL database whose role may create databases."""
    url = services.require(services.POSTGRES)
    databases.drop_stale_databases(url)
    return url


TemplateFactory = Callable[[str, Callable[[str], None]], TemplateDatabase]


@pytest.fixture(scope="session")
def postgres_templates(postgres_admin_url: str) -> Iterator[TemplateFactory]:
    """``postgres_templates(name, prepare) -> TemplateDatabase``, built once per session.

    ``prepare(url)`` fills the new database (e.g. runs the migrations); a second
    call with the same name returns the template built by the first.
    """
    built: dict[str, TemplateDatabase] = {}

    def get(name: str, prepare: Callable[[str], None]) -> TemplateDatabase:
        if name not in built:
            built[name] = databases.create_template(postgres_admin_url, name, prepare)
        return built[name]

    yield get
    for template in built.values():
        databases.drop_template(template)


@pytest.fixture
def clone_postgres() -> Iterator[Callable[[TemplateDatabase], str]]:
    """``clone_postgres(template) -> url``: a copy of the template, dropped after the test."""
    made: list[tuple[str, str]] = []

    def clone(template: TemplateDatabase) -> str:
        url = databases.clone_database(template)
        made.append((template.admin_url, url))
        return url

    yield clone
    for admin_url, url in made:
        databases.drop_database(admin_url, databases.database_name(url))


def _nothing(url: str) -> None:
    """An empty template."""


@pytest.fixture
def empty_postgres_url(
    postgres_templates: TemplateFactory, clone_postgres: Callable[[TemplateDatabase], str]
) -> str:
    """URL of a new, empty PostgreSQL database, dropped after the test."""
    return clone_postgres(postgres_templates("empty", _nothing))


@pytest.fixture
def postgres_proxy(postgres_admin_url: str) -> Iterator[PostgresProxy]:
    """A started :class:`PostgresProxy` in front of the test PostgreSQL server."""
    with PostgresProxy.in_front_of(postgres_admin_url) as proxy:
        yield proxy


# -- Redis -------------------------------------------------------------------------


@pytest.fixture
def redis_url_factory() -> Iterator[Callable[[], str]]:
    """``redis_url_factory() -> url``: each call leases a Redis database of its own (1–15).

    Each database is flushed when leased and when the test ends.
    """
    leases = RedisDatabaseLeases(services.require(services.REDIS))

    def lease() -> str:
        try:
            return leases.lease()
        except NoFreeDatabase as exc:
            pytest.fail(str(exc), pytrace=False)

    try:
        yield lease
    finally:
        leases.release_all()


@pytest.fixture
def redis_url(redis_url_factory: Callable[[], str]) -> str:
    """URL of a Redis database (1–15) that this test has to itself, flushed before and after."""
    return redis_url_factory()


# -- RabbitMQ ----------------------------------------------------------------------


@pytest.fixture(scope="session")
def rabbitmq_url() -> str:
    """AMQP URL of the test RabbitMQ."""
    return services.require(services.RABBITMQ)


# -- subprocesses ------------------------------------------------------------------

_PROCESSES = pytest.StashKey[list[ManagedProcess]]()

ProcessFactory = Callable[..., ManagedProcess]


@pytest.fixture
def managed_process(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ProcessFactory]:
    """``managed_process(argv, *, name=None, env=None, cwd=None) -> ManagedProcess``, started.

    The repository root is put first on the process's ``PYTHONPATH``, so that
    ``celery -A tests.….app worker`` finds the test modules. Every process group
    is killed after the test, pass or fail; a failed test's report ends with the
    tail of each process's output.
    """
    started: list[ManagedProcess] = []
    request.node.stash[_PROCESSES] = started
    python_path = os.pathsep.join(
        part for part in (str(request.config.rootpath), os.environ.get("PYTHONPATH")) if part
    )

    def start(
        argv: list[str],
        *,
        name: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
    ) -> ManagedProcess:
        process = ManagedProcess(
            argv,
            log_dir=tmp_path / "processes",
            name=name,
            env={"PYTHONPATH": python_path, **(env or {})},
            cwd=cwd,
        )
        started.append(process.start())
        return process

    yield start
    errors: list[BaseException] = []
    for process in reversed(started):
        try:
            process.close()
        except Exception as exc:  # end the others first, then report
            errors.append(exc)
    if errors:
        raise errors[0]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.failed:
        for process in item.stash.get(_PROCESSES, []):
            report.sections.append((f"process {process.name}", process.describe()))
    return report


# -- the Django shop (tests/support/django_shop) ---------------------------------------


@pytest.fixture(params=["postgresql", "sqlite"])
def django_backend(request: pytest.FixtureRequest) -> str:
    """The store the Django shop's alias is (``indirect`` parametrization picks one)."""
    return str(request.param)


@pytest.fixture
def django_shop(
    django_backend: str,
    request: pytest.FixtureRequest,
    redis_url: str,
    managed_process: ProcessFactory,
    tmp_path: Path,
) -> Iterator[DjangoShop]:
    """The Django shop migrated on ``django_backend``, its orders unpaid; ``start()`` its
    worker and sweep loop."""
    from tests.support.django_harness import shop_on

    with shop_on(django_backend, request, redis_url, managed_process, tmp_path) as made:
        yield made


@pytest.fixture(autouse=True)
def _forget_the_workers_revokes() -> Iterator[None]:
    """Celery keeps the revoked ids and stamps a worker heard per process, for hours: one
    test's revoke must not drop another test's message. A derived task id (an undo's, a
    body's publish) repeats across tests whose PostgreSQL stores are clones of one
    template, and so share its deployment id."""
    yield
    worker_state.revoked.clear()
    worker_state.revoked_stamps.clear()
