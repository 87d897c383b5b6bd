"""Fixtures of the deployment suite (see ``tests/deployment/__init__.py``).

- ``deployed_venv`` (session): the wheel built from this tree, installed alone into a
  fresh virtualenv of the machine's ``python3``; built once, and a build that fails
  fails every test with pip's output (nothing is skipped silently).
- ``django_venv`` / ``django_stripe_venv`` (session): another fresh virtualenv with the
  same wheel and its ``django`` extra (and ``stripe``), as a Django shop installs it.
- ``broker_url`` (redis / rabbitmq) and ``database_url`` (sqlite / postgresql): the
  parametrized services, each the test's own (a Redis database, a RabbitMQ vhost, a
  SQLite file, an empty PostgreSQL database), removed after the test.
- ``deploy(broker_url, database_url, speedups=...)``: a :class:`Deployment` with the
  README's ``shop.py`` and a ``payments.py`` for this test's gateway.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest

from tests.conftest import ProcessFactory
from tests.deployment import brokers, venv
from tests.deployment.deployment import SPEEDUPS, Deployment
from tests.deployment.gateway import RecordingGatewayServer, new_gateway_server
from tests.deployment.venv import DeployedVenv

REPO_ROOT = Path(__file__).resolve().parents[2]

DeployFactory = Callable[..., Deployment]


@pytest.fixture(scope="session")
def deployed_venv(tmp_path_factory: pytest.TempPathFactory) -> DeployedVenv:
    """The built wheel in a fresh venv (no system site-packages, nothing else installed),
    built once per session and shared by its pytest-xdist workers (tests only read it)."""
    return session_wheel(tmp_path_factory)


def session_wheel(tmp_path_factory: pytest.TempPathFactory) -> DeployedVenv:
    """``deployed_venv`` for a test outside this folder."""
    session_dir = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):  # the workers' common parent directory
        session_dir = session_dir.parent
    try:
        return venv.build_once(REPO_ROOT, session_dir / "deployed")
    except venv.BuildFailed as exc:
        pytest.fail(f"could not deploy the wheel: {exc}", pytrace=False)


def venv_with_extras(
    tmp_path_factory: pytest.TempPathFactory, deployed: DeployedVenv, extras: str
) -> Path:
    """A fresh virtualenv with ``pip install '<wheel>[<extras>]'`` and nothing else."""
    root = tmp_path_factory.mktemp(f"venv-{extras.replace(',', '-')}") / "venv"
    try:
        venv.run([venv.machine_python(), "-m", "venv", str(root)])
        venv.run([str(root / "bin" / "pip"), "install", f"{deployed.wheel}[{extras}]"])
    except venv.BuildFailed as exc:
        pytest.fail(f"could not install the wheel with [{extras}]: {exc}", pytrace=False)
    return root


@pytest.fixture(scope="session")
def django_venv(tmp_path_factory: pytest.TempPathFactory, deployed_venv: DeployedVenv) -> Path:
    """A fresh virtualenv with the same wheel and its ``django`` extra."""
    return venv_with_extras(tmp_path_factory, deployed_venv, "django")


@pytest.fixture(scope="session")
def django_stripe_venv(
    tmp_path_factory: pytest.TempPathFactory, deployed_venv: DeployedVenv
) -> Path:
    """The wheel with ``[django,stripe]``: a Django shop charging through the Stripe adapter."""
    return venv_with_extras(tmp_path_factory, deployed_venv, "django,stripe")


@pytest.fixture
def gateway_server() -> Iterator[RecordingGatewayServer]:
    """The test's fake gateway (no deduplication, lookup by key) over HTTP."""
    with new_gateway_server() as server:
        yield server


# -- brokers -----------------------------------------------------------------------


@pytest.fixture(scope="session")
def _stale_vhosts_dropped(rabbitmq_url: str) -> None:
    try:
        brokers.delete_stale_vhosts()
    except brokers.RabbitmqctlUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture
def rabbitmq_vhost_url(rabbitmq_url: str, _stale_vhosts_dropped: None) -> Iterator[str]:
    """A RabbitMQ vhost of the test's own (the README app's queues have default names)."""
    try:
        vhost = brokers.rabbitmq_vhost(rabbitmq_url)
        url = vhost.__enter__()
    except brokers.RabbitmqctlUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield url
    finally:
        vhost.__exit__(None, None, None)


@pytest.fixture(
    params=[
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("rabbitmq", marks=pytest.mark.rabbitmq),
    ]
)
def broker_url(request: pytest.FixtureRequest) -> str:
    """The test's broker: a Redis database of its own, or a RabbitMQ vhost of its own."""
    if request.param == "redis":
        lease: Callable[[], str] = request.getfixturevalue("redis_url_factory")
        return lease()
    url: str = request.getfixturevalue("rabbitmq_vhost_url")
    return url


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """A SQLite store file in the test's directory (an absolute path, as the README asks)."""
    directory = tmp_path / "store"
    directory.mkdir(exist_ok=True)
    return f"sqlite:///{(directory / 'shop.db').resolve()}"


@pytest.fixture(
    params=[
        pytest.param("sqlite", marks=pytest.mark.sqlite),
        pytest.param("postgresql", marks=pytest.mark.postgres),
    ]
)
def database_url(request: pytest.FixtureRequest, sqlite_url: str) -> str:
    """The test's store: a new SQLite file, or an empty PostgreSQL database of its own.
    Either is empty: the README's ``agboss migrate`` makes the tables."""
    if request.param == "sqlite":
        return sqlite_url
    url: str = request.getfixturevalue("empty_postgres_url")
    return url


# -- the deployment -------------------------------------------------------------------


@pytest.fixture
def deploy(
    deployed_venv: DeployedVenv,
    gateway_server: RecordingGatewayServer,
    managed_process: ProcessFactory,
    tmp_path: Path,
) -> Iterator[DeployFactory]:
    """``deploy(broker_url, database_url, speedups=SPEEDUPS, venv=None) -> Deployment``
    (app written; ``venv``: another install of the wheel, with extras)."""
    made: list[Deployment] = []

    def build(
        broker_url: str,
        database_url: str,
        speedups: Mapping[str, str] = SPEEDUPS,
        venv: DeployedVenv | None = None,
    ) -> Deployment:
        deployment = Deployment(
            venv=venv or deployed_venv,
            app_dir=tmp_path / f"app{len(made) + 1}",
            broker_url=broker_url,
            database_url=database_url,
            gateway=gateway_server,
            start_process=managed_process,
            speedups=dict(speedups),
        )
        made.append(deployment)
        deployment.write_app()
        return deployment

    yield build
    for deployment in made:
        deployment.close()
