"""A Django project's worker pays from the store in its own ``DATABASES``.

Issue 27, as a Django shop deploys it: ``manage.py migrate`` makes the
tables, ``celery -A proj worker`` runs with the app Celery's Django guide writes (its
settings read with ``namespace="CELERY"``, no ``agboss_database_url``), and a process
of the project publishes the charge. The order is charged once, counted at the
gateway, and its execution completes in the project's database, on SQLite and on
PostgreSQL. Deployment speed-ups (tests/support/django_shop): ``-Q`` the test's queue,
a 5 s lease, a 1 s retry delay, no beat.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from celery_agboss.store.databases import create_store_engine
from tests.conftest import ProcessFactory
from tests.integration.gateway_http import GatewayHTTPServer
from tests.support.django_shop.project import (
    CELERY_APP,
    REPOSITORY,
    environment,
    manage,
    postgresql_database,
    sqlite_database,
)
from tests.support.processes import wait_until

pytestmark = [pytest.mark.worker, pytest.mark.redis, pytest.mark.slow]

READY_SECONDS = 60.0
SETTLED_SECONDS = 60.0


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, dict[str, Any]]:
    """(store URL, the project's ``DATABASES["default"]``), migrated by ``manage.py``."""
    if request.param == "sqlite":
        path = tmp_path / "shop.sqlite3"
        url, database = f"sqlite:///{path}", sqlite_database(path)
    else:
        url = request.getfixturevalue("empty_postgres_url")
        database = postgresql_database(url)
    done = manage(database, "migrate", "--no-input")
    assert done.returncode == 0, done.stdout + done.stderr
    return url, database


def _state(url: str, task_id: str) -> str | None:
    engine = create_store_engine(url)
    try:
        with engine.connect() as conn:
            found = conn.execute(
                text("SELECT state FROM agboss_executions WHERE id = :id"), {"id": task_id}
            ).scalar_one_or_none()
            return None if found is None else str(found)
    finally:
        engine.dispose()


def test_the_worker_of_a_django_project_charges_once_from_its_database(
    store: tuple[str, dict[str, Any]],
    redis_url: str,
    managed_process: ProcessFactory,
) -> None:
    url, database = store
    queue = f"django-{uuid.uuid4().hex[:8]}"
    with GatewayHTTPServer() as gateway:
        env = environment(database, broker_url=redis_url, gateway_url=gateway.url, queue=queue)
        worker = managed_process(
            [
                *(sys.executable, "-m", "celery", "-A", CELERY_APP, "worker", "-Q", queue),
                *("-c", "2", "--without-heartbeat", "--without-gossip", "--without-mingle"),
                *("-l", "info"),
            ],
            name="django-worker",
            env=env,
            cwd=REPOSITORY,
        )
        worker.wait_until(lambda: " ready." in worker.output(), READY_SECONDS, message="ready")
        publisher = managed_process(
            [
                sys.executable,
                "-c",
                "from tests.support.django_shop.tasks import charge_order\n"
                "print('published', charge_order.delay('7', 1500).id, flush=True)\n",
            ],
            name="django-publish",
            env=env,
            cwd=REPOSITORY,
        )
        assert publisher.wait(READY_SECONDS) == 0, publisher.describe()
        task_id = publisher.output().split("published ", 1)[1].split()[0]
        completed: Callable[[], bool] = lambda: _state(url, task_id) == "COMPLETED"  # noqa: E731
        wait_until(completed, SETTLED_SECONDS, message=lambda: worker.describe())
        assert [c.reference for c in gateway.charges_seen] == ["7"]
