"""The Django integration as a Django shop installs it: the wheel with its ``django`` extra.

A fresh virtualenv gets ``pip install '<wheel>[django]'`` and nothing else; the project
is the one docs/django.md sets up: ``proj/celery.py`` is that page's block as written,
``proj/__init__.py`` imports the app (Celery's Django guide, which the page's
"Operating it" relies on), the settings list ``celery_agboss.contrib.django`` and no
``agboss_database_url``. Then only the page's commands: ``python manage.py migrate``,
``python manage.py agboss …`` and ``celery -A proj worker``. A view-like script
publishes inside ``transaction.atomic()``; the worker marks the order paid through the
ORM in a fenced effect, once. On PostgreSQL and SQLite, with Redis.

Deployment speed-ups: a 5 s lease, no beat (``agboss_sweep_interval = 0``), ``-Q`` a
queue of this test's own.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest

from tests.conftest import ProcessFactory
from tests.deployment.django_deploy import docs_celery_py
from tests.support.django_project import postgresql_database, sqlite_database, store_state
from tests.support.processes import wait_until

pytestmark = [pytest.mark.worker, pytest.mark.redis, pytest.mark.slow]

SECONDS = 60.0

SETTINGS = """
import json, os
SECRET_KEY = "deployment-test"
USE_TZ = True
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "celery_agboss.contrib.django",
    "shop",
]
DATABASES = {{"default": json.loads(os.environ["SHOP_DATABASE"])}}
CELERY_BROKER_URL = os.environ["SHOP_BROKER_URL"]
CELERY_TASK_DEFAULT_QUEUE = os.environ["SHOP_QUEUE"]
CELERY_AGBOSS_PSEUDONYM_KEY = "deployment-test-pseudonym-key"
CELERY_AGBOSS_LEASE_TTL = 5
CELERY_AGBOSS_SWEEP_INTERVAL = 0
"""

MODELS = """
from django.db import models


class Order(models.Model):
    reference = models.CharField(max_length=64, primary_key=True)
    times_paid = models.IntegerField(default=0)
"""

TASKS = """
from django.db.models import F

from celery_agboss import PaymentTask
from proj.celery import app
from shop.models import Order


@app.task(base=PaymentTask, bind=True)
def mark_paid(self, reference):
    def write(_conn):
        Order.objects.filter(pk=reference).update(times_paid=F("times_paid") + 1)
        return {"order": reference}

    return self.fenced_effect("mark-paid", write, business_key=f"order:{reference}")
"""

VIEW = """
from django.db import transaction
from shop.models import Order
from shop.tasks import mark_paid

with transaction.atomic():
    Order.objects.create(reference="o-1")
    result = mark_paid.delay("o-1")
print("published", result.id)
"""


def write_project(root: Path) -> None:
    (root / "proj").mkdir(parents=True)
    (root / "shop" / "migrations").mkdir(parents=True)
    (root / "proj" / "__init__.py").write_text("from .celery import app as celery_app\n")
    (root / "proj" / "celery.py").write_text(docs_celery_py())
    (root / "proj" / "settings.py").write_text(SETTINGS.format())
    (root / "shop" / "__init__.py").write_text("")
    (root / "shop" / "migrations" / "__init__.py").write_text("")
    (root / "shop" / "models.py").write_text(MODELS)
    (root / "shop" / "tasks.py").write_text(TASKS)
    (root / "manage.py").write_text(
        "import os, sys\n"
        'os.environ.setdefault("DJANGO_SETTINGS_MODULE", "proj.settings")\n'
        "from django.core.management import execute_from_command_line\n"
        "execute_from_command_line(sys.argv)\n"
    )


@pytest.mark.parametrize("backend", ["postgresql", "sqlite"])
def test_a_django_shop_installs_migrates_and_pays_once(
    backend: str,
    request: pytest.FixtureRequest,
    django_venv: Path,
    redis_url: str,
    managed_process: ProcessFactory,
    tmp_path: Path,
) -> None:
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path / 'shop.sqlite3'}"
        database = sqlite_database(tmp_path / "shop.sqlite3")
    else:
        url = request.getfixturevalue("empty_postgres_url")
        database = postgresql_database(url)
    project = tmp_path / "project"
    write_project(project)
    env = {
        # The installed wheel, not this tree: CPython ignores an empty PYTHONPATH.
        **{k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"},
        "PYTHONPATH": "",
        "SHOP_DATABASE": json.dumps(database),
        "SHOP_BROKER_URL": redis_url,
        "SHOP_QUEUE": f"django-deploy-{uuid.uuid4().hex[:8]}",
    }
    python = str(django_venv / "bin" / "python")

    def manage(*args: str) -> str:
        done = managed_process([python, "manage.py", *args], env=env, cwd=project)
        assert done.wait(SECONDS) == 0, done.describe()
        return done.output()

    manage("makemigrations", "shop")
    manage("migrate", "--no-input")
    assert json.loads(manage("agboss", "migrate", "--json"))["database"] == url
    manage("makemigrations", "--check", "--dry-run")
    worker = managed_process(
        [str(django_venv / "bin" / "celery"), "-A", "proj", "worker", "-c", "2", "-l", "info"],
        env=env,
        cwd=project,
        name="django-deploy-worker",
    )
    worker.wait_until(lambda: " ready." in worker.output(), SECONDS, message="ready")
    shell = managed_process([python, "manage.py", "shell", "-c", VIEW], env=env, cwd=project)
    assert shell.wait(SECONDS) == 0, shell.describe()
    task_id = shell.output().split("published ", 1)[1].split()[0]

    def completed() -> bool:
        row = store_state(url, "SELECT state FROM agboss_executions WHERE id = :id", id=task_id)
        return row is not None and row.state == "COMPLETED"

    wait_until(completed, SECONDS, message=lambda: worker.describe())
    paid = store_state(url, "SELECT times_paid FROM shop_order WHERE reference = 'o-1'")
    assert paid.times_paid == 1
    assert "store.unreachable" not in worker.output()
