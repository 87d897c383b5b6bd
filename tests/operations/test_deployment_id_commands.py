"""``celery -A proj agboss migrate [--new-deployment-id | --same-deployment]`` and
``agboss checklist`` on a copy of a store (docs/keys.md, "A copy of a store"), on SQLite
and PostgreSQL: the copy is named as one with the two choices, a new id is refused
(exit 1, naming what is in flight) until nothing is, and the checklist fails on a copy.

Speed-up: where no worker runs, the command's ping waits 0.3 s, not 2 s, for answers
that cannot come (``_quick_ping``).
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker
from sqlalchemy import text

from celery_agboss.cli import EXIT_REFUSED, EXIT_USAGE, maintenance_commands
from celery_agboss.store.deployment import read_store_tenant
from celery_agboss.store.sqlalchemy_store import SQLAlchemyStore
from celery_agboss.testing.celery_app import close_test_app, make_test_app
from celery_agboss.testing.gateway import FakeGateway
from celery_agboss.testing.gateway_server import FakeGatewayServer
from tests.adapters.checklist_targets import URL_ENV
from tests.contract.conftest import BACKENDS
from tests.contract.test_deployment_id_of_a_copy import _add_execution, copy_of_a_store
from tests.operations.cli import run


@pytest.fixture(autouse=True)
def _quick_ping(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if "a_worker_of_the_app_answers" not in request.node.name:
        monkeypatch.setattr(maintenance_commands, "_PING_SECONDS", 0.3)


@pytest.fixture(params=BACKENDS)
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str]:
    """A migrated store and a copy of it."""
    return copy_of_a_store(request, tmp_path)


@pytest.fixture
def app_on() -> Iterator[Callable[[str], Celery]]:
    made: list[Celery] = []

    def make(url: str) -> Celery:
        made.append(make_test_app(url))
        return made[-1]

    yield make
    for app in made:
        close_test_app(app)


def _audit_actions(url: str) -> list[str]:
    store = SQLAlchemyStore(url)
    try:
        with store.engine.connect() as conn:
            return [str(a) for a in conn.execute(text("SELECT action FROM agboss_audit")).scalars()]
    finally:
        store.close()


def test_migrate_names_a_copy_and_the_two_choices(
    stores: tuple[str, str], app_on: Callable[[str], Celery]
) -> None:
    original_url, copy_url = stores
    said = run(app_on(copy_url), "migrate")
    assert said.exit_code == 0, "a copy (a restore) is never refused"
    assert "WARNING: this store is a copy" in said.output
    assert "--new-deployment-id" in said.output and "--same-deployment" in said.output
    original = run(app_on(original_url), "migrate")
    assert original.exit_code == 0 and "WARNING" not in original.output
    data = json.loads(run(app_on(copy_url), "migrate", "--json").output)
    assert data["copy"] is True and data["minted_at"] != data["found_at"]


def test_a_new_id_is_refused_while_in_flight_then_given(
    stores: tuple[str, str], app_on: Callable[[str], Celery]
) -> None:
    original_url, copy_url = stores
    _add_execution(copy_url, "RUNNING")
    app = app_on(copy_url)
    refused = run(app, "migrate", "--new-deployment-id")
    assert refused.exit_code == EXIT_REFUSED
    assert "exec-1" in refused.output and "was not changed" in refused.output
    assert "Let them finish (or cancel them" in refused.output
    as_json = json.loads(run(app, "migrate", "--new-deployment-id", "--json").output)
    assert as_json["error"]["code"] == "in-flight"
    before = json.loads(run(app, "migrate", "--json").output)
    assert before["copy"] is True
    store = SQLAlchemyStore(copy_url)
    try:
        with store.engine.begin() as conn:
            conn.execute(text("UPDATE agboss_executions SET state = 'CANCELLED'"))
    finally:
        store.close()
    given = run(app_on(copy_url), "migrate", "--new-deployment-id", "--actor", "ops")
    assert given.exit_code == 0, given.output
    assert "restart every worker" in given.output
    after = json.loads(run(app_on(copy_url), "migrate", "--json").output)
    original = json.loads(run(app_on(original_url), "migrate", "--json").output)
    assert after["copy"] is False
    assert after["deployment_id"] not in (before["deployment_id"], original["deployment_id"])
    assert "new-deployment-id" in _audit_actions(copy_url)


def test_same_deployment_keeps_the_id_and_the_place_moves(
    stores: tuple[str, str], app_on: Callable[[str], Celery]
) -> None:
    _original_url, copy_url = stores
    before = json.loads(run(app_on(copy_url), "migrate", "--json").output)
    done = json.loads(run(app_on(copy_url), "migrate", "--same-deployment", "--json").output)
    assert done["copy"] is False and done["deployment_id"] == before["deployment_id"]
    both = run(app_on(copy_url), "migrate", "--same-deployment", "--new-deployment-id")
    assert both.exit_code == EXIT_USAGE


def test_the_checklist_fails_on_a_copy(
    stores: tuple[str, str], app_on: Callable[[str], Celery], monkeypatch: pytest.MonkeyPatch
) -> None:
    original_url, copy_url = stores
    target = "tests.adapters.checklist_targets:stripe_on_fake"
    with FakeGatewayServer(FakeGateway(), dialect="stripe") as server:
        monkeypatch.setenv(URL_ENV, server.url)
        on_copy = run(app_on(copy_url), "checklist", "--adapter", target)
        on_original = run(app_on(original_url), "checklist", "--adapter", target)
    assert on_copy.exit_code == EXIT_REFUSED
    assert "STORE FAILED: this store is a copy" in on_copy.output
    assert on_copy.output.rstrip().endswith("checklist FAILED (the store is a copy)")
    assert on_original.exit_code == 0, on_original.output
    assert "STORE passed" in on_original.output


def _deployment_id(url: str) -> str | None:
    store = SQLAlchemyStore(url)
    try:
        return read_store_tenant(store)
    finally:
        store.close()


def test_a_new_id_is_refused_while_a_worker_of_the_app_answers(
    stores: tuple[str, str], app_on: Callable[[str], Celery]
) -> None:
    """A worker keeps the id it read at start: changed under it, an order it charged and
    crashed on is charged again under the new id after the restart (two charges; the
    review's scratch test shows it). Nothing in flight in the store, so only asking the
    workers sees it."""
    _original_url, copy_url = stores
    app = app_on(copy_url)
    before = _deployment_id(copy_url)
    with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=30):
        refused = run(app, "migrate", "--new-deployment-id")
        assert refused.exit_code == EXIT_REFUSED, refused.output
        said_stopped = "--workers-stopped"  # a worker that answers still refuses it
        as_json = json.loads(
            run(app, "migrate", "--new-deployment-id", said_stopped, "--json").output
        )
    assert "was not changed" in refused.output and "Stop every worker" in refused.output
    assert as_json["error"]["code"] == "workers-running"
    assert socket.gethostname() in as_json["error"]["message"], "the worker is named"
    assert _deployment_id(copy_url) == before, "nothing changed"
    given = run(app, "migrate", "--new-deployment-id")
    assert given.exit_code == 0, given.output
    assert _deployment_id(copy_url) != before


def test_a_broker_that_cannot_be_asked_refuses_unless_every_worker_is_said_stopped(
    stores: tuple[str, str], app_on: Callable[[str], Celery]
) -> None:
    _original_url, copy_url = stores
    app = app_on(copy_url)
    app.conf.broker_url = "redis://127.0.0.1:1/0"  # nothing listens there
    before = _deployment_id(copy_url)
    refused = json.loads(run(app, "migrate", "--new-deployment-id", "--json").output)
    assert refused["error"]["code"] == "workers-unknown"
    assert "--workers-stopped" in refused["error"]["message"]
    assert _deployment_id(copy_url) == before
    alone = run(app, "migrate", "--workers-stopped")
    assert alone.exit_code == EXIT_USAGE
    given = run(app, "migrate", "--new-deployment-id", "--workers-stopped")
    assert given.exit_code == 0, given.output
    assert _deployment_id(copy_url) != before
