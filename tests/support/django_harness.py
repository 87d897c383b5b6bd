"""The Django shop's processes for one test: its store migrated by ``manage.py``, its
worker and sweep loop, a process of it publishing, and what the test reads of them.

Used by the Django tests that run real workers (``shop_on`` from a fixture). Speed-ups
(tests only, see the package's docstring): ``-Q`` the test's queue, a 5 s lease, a 1 s
retry delay, a 1 s sweep loop; and the store is a copy of one ``manage.py migrate`` per
backend and test process (its deployment id's place forgotten, so no copy is told it is
one), not migrated per test: ``tests/django/test_django_migrations.py`` proves the command.
"""

from __future__ import annotations

import json
import os
import sqlite3
import sys
import uuid
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from celery_agboss.store.deployment import PLACE_META_KEY
from tests.integration.gateway_http import GatewayHTTPServer
from tests.support.django_project import (
    CELERY_APP,
    REPOSITORY,
    environment,
    manage,
    postgresql_database,
    sqlite_database,
    store_rows,
    store_state,
    worker_argv,
)
from tests.support.processes import ManagedProcess, wait_until

if TYPE_CHECKING:
    from tests.conftest import ProcessFactory

READY_SECONDS = 60.0
SETTLED_SECONDS = 60.0
ORDERS = ("o-1", "o-2", "o-3")


def sabotage_environment(sabotage: tuple[str, ...]) -> dict[str, str]:
    """What switches ``sabotage`` off in a process of the project (a twin's only)."""
    return {
        "AGBOSS_ALLOW_SABOTAGE": "1" if sabotage else "0",
        "AGBOSS_SABOTAGE_SUBPROCESS": str(os.getpid()) if sabotage else "",
        "AGBOSS_SABOTAGE": ",".join(sabotage),
    }


@dataclass
class DjangoShop:
    """The project's processes on one store, and what a test reads of them."""

    url: str
    env: dict[str, str]
    gateway: GatewayHTTPServer
    managed_process: ProcessFactory
    worker: ManagedProcess | None = None

    def start(self, *, sabotage: tuple[str, ...] = ()) -> None:
        env = {**self.env, **sabotage_environment(sabotage)}
        self.worker = self.managed_process(
            worker_argv(self.env_queue),
            name="django-worker",
            env=env,
            cwd=REPOSITORY,
        )
        worker = self.worker
        worker.wait_until(lambda: " ready." in worker.output(), READY_SECONDS, message="ready")
        self.managed_process(
            [
                *(sys.executable, "-m", "celery", "-A", CELERY_APP, "agboss", "sweep"),
                *("--loop", "--interval", "1"),
            ],
            name="django-sweep",
            env=env,  # a twin's sabotage reaches the sweep's reconcile too
            cwd=REPOSITORY,
        )

    @property
    def env_queue(self) -> str:
        return str(json.loads(self.env["AGBOSS_DJANGO_TEST"])["queue"])

    def run(self, code: str, *, sabotage: tuple[str, ...] = ()) -> str:
        """``code`` in a process of the project (a view, a shell); its output."""
        process = self.managed_process(
            [sys.executable, "-c", code],
            name="django-script",
            env={**self.env, **sabotage_environment(sabotage)},
            cwd=REPOSITORY,
        )
        assert process.wait(READY_SECONDS) == 0, process.describe()
        return process.output()

    def publish(self, task: str, *args: Any) -> str:
        publisher = self.managed_process(
            [
                sys.executable,
                "-c",
                "from tests.support.django_shop import tasks\n"
                f"result = getattr(tasks, {task!r}).delay(*{args!r})\n"
                "print('published', result.id, flush=True)\n",
            ],
            name=f"publish-{task}",
            env=self.env,
            cwd=REPOSITORY,
        )
        assert publisher.wait(READY_SECONDS) == 0, publisher.describe()
        return publisher.output().split("published ", 1)[1].split()[0]

    def query(self, sql: str, **params: Any) -> Any:
        return store_state(self.url, sql, **params)

    def query_all(self, sql: str, **params: Any) -> list[Any]:
        return list(store_rows(self.url, sql, **params))

    def times_paid(self, reference: str) -> int:
        return int(
            self.query("SELECT times_paid FROM orders_order WHERE reference = :r", r=reference)[0]
        )

    def execution(self, task_id: str) -> Any:
        return self.query(
            "SELECT state, recovery_count FROM agboss_executions WHERE id = :id", id=task_id
        )

    def wait_state(self, task_id: str, state: str) -> Any:
        def reached() -> Any:
            row = self.execution(task_id)
            return row if row is not None and row.state == state else None

        assert self.worker is not None
        worker = self.worker
        return wait_until(reached, SETTLED_SECONDS, message=lambda: worker.describe())

    def wait_until(self, predicate: Any, what: str) -> Any:
        assert self.worker is not None
        worker = self.worker
        return wait_until(
            predicate, SETTLED_SECONDS, message=lambda: f"{what}: {worker.describe()}"
        )

    def wait_log(self, fragment: str) -> None:
        assert self.worker is not None
        worker = self.worker
        wait_until(
            lambda: fragment in worker.output(), SETTLED_SECONDS, message=lambda: worker.describe()
        )


@contextmanager
def shop_on(
    backend: str,
    request: pytest.FixtureRequest,
    redis_url: str,
    managed_process: ProcessFactory,
    tmp_path: Path,
) -> Iterator[DjangoShop]:
    """A migrated shop on ``backend`` ("sqlite" or "postgresql"), its orders unpaid, the
    gateway serving; ``start()`` its processes."""
    if backend == "sqlite":
        path = tmp_path / "shop.sqlite3"
        template = _sqlite_template(request)
        with closing(sqlite3.connect(template)) as source, closing(sqlite3.connect(path)) as copy:
            source.backup(copy)
        url, database = f"sqlite:///{path}", sqlite_database(path)
    else:
        templates = request.getfixturevalue("postgres_templates")
        clone = request.getfixturevalue("clone_postgres")
        url = clone(templates("django-shop", lambda made: _migrate(postgresql_database(made))))
        database = postgresql_database(url)
    with GatewayHTTPServer() as gateway:
        env = environment(
            database,
            other_database=sqlite_database(tmp_path / "reports.sqlite3"),
            broker_url=redis_url,
            gateway_url=gateway.url,
            queue=f"django-{uuid.uuid4().hex[:8]}",
        )
        made = DjangoShop(url, env, gateway, managed_process)
        for reference in ORDERS:
            made.query(
                "INSERT INTO orders_order (reference, times_paid) VALUES (:r, 0) RETURNING 1",
                r=reference,
            )
        yield made


_SQLITE_TEMPLATES: dict[str, Path] = {}


def _migrate(database: dict[str, Any]) -> None:
    done = manage(database, "migrate", "--no-input")
    assert done.returncode == 0, done.stdout + done.stderr


def _sqlite_template(request: pytest.FixtureRequest) -> Path:
    """The shop's SQLite store migrated once in this test process, its place forgotten."""
    if "shop" not in _SQLITE_TEMPLATES:
        factory: pytest.TempPathFactory = request.getfixturevalue("tmp_path_factory")
        path = factory.mktemp("django-shop-template") / "shop.sqlite3"
        _migrate(sqlite_database(path))
        with closing(sqlite3.connect(path)) as conn, conn:
            conn.execute("DELETE FROM agboss_meta WHERE key = ?", (PLACE_META_KEY,))
        _SQLITE_TEMPLATES["shop"] = path
    return _SQLITE_TEMPLATES["shop"]
