"""Running the Django shop as its own processes: ``manage.py`` commands and the
environment a worker of it needs (the test process never configures Django itself)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import make_url

from celery_agboss.store.databases import create_store_engine

SETTINGS_MODULE = "tests.support.django_shop.settings"
CELERY_APP = "tests.support.django_shop.celery:app"
REPOSITORY = Path(__file__).resolve().parents[2]
COMMAND_SECONDS = 120.0


def sqlite_database(path: Path, transaction_mode: str | None = "IMMEDIATE") -> dict[str, Any]:
    """A ``DATABASES`` entry for a SQLite file (``transaction_mode`` None: Django's default)."""
    options = {} if transaction_mode is None else {"transaction_mode": transaction_mode}
    return {"ENGINE": "django.db.backends.sqlite3", "NAME": str(path), "OPTIONS": options}


def postgresql_database(url: str) -> dict[str, Any]:
    """A ``DATABASES`` entry for the PostgreSQL database of a store URL."""
    parsed = make_url(url)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": parsed.database,
        "USER": parsed.username or "",
        "PASSWORD": parsed.password or "",
        "HOST": parsed.host or "",
        "PORT": str(parsed.port or ""),
    }


def environment(database: dict[str, Any], **test: Any) -> dict[str, str]:
    """The environment of one of the project's processes: its settings and the test's
    database, broker, gateway and queue."""
    python_path = os.pathsep.join(
        part for part in (str(REPOSITORY), os.environ.get("PYTHONPATH")) if part
    )
    return {
        **os.environ,
        "PYTHONPATH": python_path,
        "DJANGO_SETTINGS_MODULE": SETTINGS_MODULE,
        "AGBOSS_DJANGO_TEST": json.dumps({"database": database, **test}),
    }


def manage(database: dict[str, Any], *args: str) -> subprocess.CompletedProcess[str]:
    """``python manage.py <args>`` of the project on ``database`` (``django-admin`` with its
    settings, as ``manage.py`` runs it)."""
    return _run(database, "-m", "django", *args)


def python(database: dict[str, Any], code: str) -> subprocess.CompletedProcess[str]:
    """``code`` run in a process of the project (its settings in the environment)."""
    return _run(database, "-c", code)


def _run(database: dict[str, Any], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        env=environment(database),
        cwd=REPOSITORY,
        capture_output=True,
        text=True,
        timeout=COMMAND_SECONDS,
        check=False,
    )


def worker_argv(queue: str) -> list[str]:
    """``celery -A proj worker`` of the project: prefork, 2 children, the test's queue."""
    return [
        *(sys.executable, "-m", "celery", "-A", CELERY_APP, "worker", "-Q", queue),
        *("-c", "2", "--without-heartbeat", "--without-gossip", "--without-mingle"),
        *("-l", "info"),
    ]


def store_state(url: str, sql: str, **params: Any) -> Any:
    """The first row ``sql`` reads from the store's database (in a transaction of its own)."""
    rows = store_rows(url, sql, **params)
    return rows[0] if rows else None


def store_rows(url: str, sql: str, **params: Any) -> list[Any]:
    """The rows ``sql`` reads (or returns) in the store's database, in a transaction of its
    own."""
    engine = create_store_engine(url)
    try:
        with engine.begin() as conn:
            return list(conn.execute(text(sql), params))
    finally:
        engine.dispose()
