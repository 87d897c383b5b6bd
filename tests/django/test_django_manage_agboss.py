"""``python manage.py agboss …`` is ``celery -A proj agboss …`` for a Django project.

Issue 27: the operator's commands from ``manage.py``, for the Celery app the project
loads (Celery's Django guide imports it in the project package, as the shop in
tests/support/django_shop does): the same output, ``--json`` and exit codes, on the
store in the project's ``DATABASES``. Each command runs in a process of the project.
"""

from __future__ import annotations

import json
from pathlib import Path

from celery_agboss.cli import EXIT_NOT_FOUND
from tests.support.django_project import manage, sqlite_database


def test_the_operator_commands_run_from_manage_py_on_the_projects_store(tmp_path: Path) -> None:
    database = sqlite_database(tmp_path / "shop.sqlite3")
    done = manage(database, "agboss", "migrate", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    shown = json.loads(done.stdout)
    assert shown["database"] == f"sqlite:///{tmp_path / 'shop.sqlite3'}"
    assert shown["revision"] is not None
    listed = manage(database, "agboss", "pending", "--json")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert json.loads(listed.stdout)["pending"] == []


def test_an_unknown_execution_exits_with_the_clis_code(tmp_path: Path) -> None:
    database = sqlite_database(tmp_path / "shop.sqlite3")
    assert manage(database, "migrate", "--no-input").returncode == 0
    missing = manage(database, "agboss", "show", "no-such-key")
    assert missing.returncode == EXIT_NOT_FOUND, missing.stdout + missing.stderr


def test_its_help_is_the_clis() -> None:
    helped = manage(sqlite_database(Path("/nonexistent/shop.sqlite3")), "agboss", "--help")
    assert helped.returncode == 0, helped.stderr
    assert helped.stdout.startswith("Usage: python -m django agboss [OPTIONS] COMMAND")
    assert "resolve" in helped.stdout and "sweep" in helped.stdout
