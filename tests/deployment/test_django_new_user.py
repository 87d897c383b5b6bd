"""Issue 27's "done means", tried as a new user would: a Django shop from nothing.

A fresh virtualenv gets the wheel with ``[django,stripe]``. In an empty directory the
venv's ``django-admin startproject proj .`` and ``python manage.py startapp shop``;
then only what docs/django.md tells a user to edit: ``settings.py`` gets the page's
settings appended (the app in ``INSTALLED_APPS``, ``CELERY_BROKER_URL``,
``CELERY_AGBOSS_PSEUDONYM_KEY`` from the environment, and the page's SQLite
``OPTIONS`` or a PostgreSQL ``DATABASES``), ``proj/celery.py`` is the page's block and
``proj/__init__.py`` imports the app. The user's own code is ``shop/models.py`` (an
``Order``) and ``shop/tasks.py``: a ``PaymentTask`` that charges through
``StripeAdapter`` (docs/gateways.md, "Usage") and marks the order paid with the ORM
inside ``self.fenced_effect`` (docs/django.md, "Writing to your own tables once").

Then the commands: ``manage.py makemigrations shop``, ``manage.py migrate``,
``celery -A proj beat -l INFO`` and ``celery -A proj worker -l INFO`` (prefork, as a
user starts it). One order is published from ``manage.py shell`` inside
``transaction.atomic()``. The fake Stripe (``FakeGatewayServer``, on loopback in this
process) processes the charge and holds its answer; the whole worker is SIGKILLed
(main process and pool), a new worker started. On Redis the killed worker's message
stays hidden (1 h visibility timeout), so the sweep beat schedules re-drives it; the
new delivery reconciles the pending charge (Stripe search) instead of sending it
again. At the end: one charge counted at the gateway, ``times_paid == 1`` in the
ORM's table, and the admin lists the execution and its intent.

Test-only lines, appended to ``settings.py`` after the page's (defaults in brackets):
``CELERY_AGBOSS_LEASE_TTL = 5`` (30 s) so the dead worker's lease expires soon,
``CELERY_AGBOSS_SWEEP_INTERVAL = 2`` (30 s) so beat sweeps soon, and
``STRIPE_BASE_URL``, the fake gateway's loopback URL (a real shop leaves the SDK's).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from celery_agboss.core.log_events import SWEEP_REPUBLISHED
from celery_agboss.testing.dialects.stripe import render_intent
from celery_agboss.testing.gateway import FakeGateway
from celery_agboss.testing.gateway_server import FakeGatewayServer, documented_capabilities
from tests.conftest import ProcessFactory
from tests.deployment import brokers
from tests.deployment.django_deploy import (
    assert_docs_say,
    docs_celery_py,
    kill_the_worker,
    project_environment,
)
from tests.support.django_project import postgresql_database, store_state
from tests.support.processes import ManagedProcess, wait_until

pytestmark = [pytest.mark.worker, pytest.mark.redis, pytest.mark.slow]

SECONDS = 60.0  # a command, or a process's start, on a loaded 2-core machine
RECOVERY_SECONDS = 90.0  # lease TTL + sweep intervals + the re-driven body, with margin
REFERENCE = "o-1"
READY_LINE = " ready."
BEAT_STARTED_LINE = "beat: Starting..."

DOCS_SETTINGS = (
    '"celery_agboss.contrib.django"',
    "CELERY_BROKER_URL",
    'CELERY_AGBOSS_PSEUDONYM_KEY = os.environ["AGBOSS_PSEUDONYM_KEY"]',
    '"OPTIONS": {"transaction_mode": "IMMEDIATE"}',
    "from .celery import app as celery_app",
)

MODELS = """
from django.db import models


class Order(models.Model):
    reference = models.CharField(max_length=64, primary_key=True)
    times_paid = models.IntegerField(default=0)
    receipt = models.CharField(max_length=64, blank=True)
"""

TASKS = """
from django.conf import settings
from django.db.models import F

from celery_agboss import AGBoss, PaymentTask
from celery_agboss.adapters.stripe import StripeAdapter
from proj.celery import app
from shop.models import Order

stripe_gw = StripeAdapter(settings.STRIPE_SECRET_KEY, base_url=settings.STRIPE_BASE_URL)
for call in stripe_gw.calls:
    AGBoss(app).register(call)  # the sweep reconciles by these names


@app.task(base=PaymentTask, bind=True)
def charge_order(self, reference):
    request = {"amount": 1500, "currency": "usd", "reference": reference,
               "source": "pm_card_visa"}
    receipt = self.outbound(stripe_gw.charge, request, business_key=f"order:{reference}")

    def mark_paid(_conn):
        Order.objects.filter(pk=reference).update(
            times_paid=F("times_paid") + 1, receipt=receipt["id"])
        return {"order": reference}

    self.fenced_effect("mark-paid", mark_paid, business_key=f"order:{reference}")
    return receipt["id"]
"""

PUBLISH = f"""
from django.db import transaction
from shop.models import Order
from shop.tasks import charge_order

with transaction.atomic():
    Order.objects.create(reference={REFERENCE!r})
    result = charge_order.delay({REFERENCE!r})
print("published", result.id)
"""

ADMIN_CHECK = """
import json
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils.html import escape

user = get_user_model().objects.create_superuser("admin", "admin@example.com", "unused")
client = Client(SERVER_NAME="localhost")  # DEBUG's ALLOWED_HOSTS: localhost, not testserver
client.force_login(user)
seen = {{}}
for name, path, needle in (
    ("execution", "/admin/agboss/execution/", {execution_id!r}),
    ("intent", "/admin/agboss/intent/", {idempotency_key!r}),
):
    response = client.get(path)
    body = response.content.decode(errors="replace")
    seen[name] = {{"status": response.status_code, "listed": escape(needle) in body}}
print("admin", json.dumps(seen))
"""


@pytest.fixture
def stripe_server() -> Iterator[FakeGatewayServer]:
    """The fake Stripe on loopback, with Stripe's documented behaviour (consistent search)."""
    gateway = FakeGateway(capabilities=documented_capabilities("stripe"))
    with FakeGatewayServer(gateway, dialect="stripe") as server:
        yield server


def appended_settings(database: dict[str, Any] | None, broker_url: str, gateway_url: str) -> str:
    """What the user appends to the generated ``settings.py``: the page's settings, then
    this test's (module docstring). ``database`` None keeps startproject's SQLite file."""
    if database is None:  # the page's SQLite entry: startproject's NAME, immediate mode
        databases = 'DATABASES["default"]["OPTIONS"] = {"transaction_mode": "IMMEDIATE"}'
    else:
        databases = f"DATABASES = {{'default': {database!r}}}"
    return (
        "\n# docs/django.md, Set-up\nimport os\n\n"
        'INSTALLED_APPS += ["celery_agboss.contrib.django", "shop"]\n'
        f"{databases}\n"
        f"CELERY_BROKER_URL = {broker_url!r}\n"
        'CELERY_AGBOSS_PSEUDONYM_KEY = os.environ["AGBOSS_PSEUDONYM_KEY"]\n'
        'STRIPE_SECRET_KEY = "sk_test_new_user_shop"\n'
        "\n# this test's speed-ups and its fake gateway\n"
        "CELERY_AGBOSS_LEASE_TTL = 5\n"
        "CELERY_AGBOSS_SWEEP_INTERVAL = 2\n"
        f"STRIPE_BASE_URL = {gateway_url!r}\n"
    )


class NewProject:
    """The user's project directory and the commands they run in it."""

    def __init__(self, root: Path, venv: Path, start: ProcessFactory) -> None:
        self.root = root
        self.venv = venv
        self._start = start
        # manage.py and proj/celery.py default DJANGO_SETTINGS_MODULE to this anyway; set
        # so that none of the test process's environment can point elsewhere.
        self.env = project_environment(
            venv,
            AGBOSS_PSEUDONYM_KEY="new-user-shop-pseudonym-key-0123456789",
            DJANGO_SETTINGS_MODULE="proj.settings",
        )

    def run(self, *argv: str, name: str | None = None) -> str:
        """A command to its end; its output."""
        done = self.start(*argv, name=name)
        assert done.wait(SECONDS) == 0, done.describe()
        return done.output()

    def start(self, *argv: str, name: str | None = None) -> ManagedProcess:
        return self._start(list(argv), env=self.env, cwd=self.root, name=name)

    def manage(self, *args: str) -> str:
        return self.run(str(self.venv / "bin" / "python"), "manage.py", *args)

    def celery(self, *args: str, name: str) -> ManagedProcess:
        return self.start(str(self.venv / "bin" / "celery"), "-A", "proj", *args, name=name)

    def create(self, settings: str) -> None:
        """startproject, startapp, and the edits docs/django.md asks for."""
        self.root.mkdir(parents=True)
        self.run(str(self.venv / "bin" / "django-admin"), "startproject", "proj", ".")
        self.manage("startapp", "shop")
        with (self.root / "proj" / "settings.py").open("a", encoding="utf-8") as file:
            file.write(settings)
        (self.root / "proj" / "celery.py").write_text(docs_celery_py(), encoding="utf-8")
        with (self.root / "proj" / "__init__.py").open("a", encoding="utf-8") as file:
            file.write("from .celery import app as celery_app\n")
        (self.root / "shop" / "models.py").write_text(MODELS, encoding="utf-8")
        (self.root / "shop" / "tasks.py").write_text(TASKS, encoding="utf-8")


def wait_for_line(process: ManagedProcess, line: str) -> None:
    process.wait_until(lambda: line in process.output(), SECONDS, message=repr(line))


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_new_django_shop_pays_once_when_its_worker_is_killed_mid_charge(
    backend: str,
    request: pytest.FixtureRequest,
    django_stripe_venv: Path,
    redis_url: str,
    stripe_server: FakeGatewayServer,
    managed_process: ProcessFactory,
    tmp_path: Path,
) -> None:
    assert_docs_say(*DOCS_SETTINGS)
    project = NewProject((tmp_path / "project").resolve(), django_stripe_venv, managed_process)
    if backend == "sqlite":
        url, database = f"sqlite:///{project.root / 'db.sqlite3'}", None
    else:
        url = request.getfixturevalue("empty_postgres_url")
        database = postgresql_database(url)
    project.create(appended_settings(database, redis_url, stripe_server.url))
    project.manage("makemigrations", "shop")
    project.manage("migrate", "--no-input")

    beat = project.celery("beat", "-l", "INFO", name="beat")
    worker = project.celery("worker", "-l", "INFO", name="worker")
    wait_for_line(worker, READY_LINE)
    wait_for_line(beat, BEAT_STARTED_LINE)

    held = stripe_server.hold_next_answer(timeout=RECOVERY_SECONDS, reference=REFERENCE)
    task_id = project.manage("shell", "-c", PUBLISH).split("published ", 1)[1].split()[0]
    assert held.wait_reached(SECONDS), f"the charge never reached the gateway\n{worker.tail()}"
    assert held.pid in worker.group_pids(), f"pid {held.pid} is not one of the worker's"
    kill_the_worker(worker)
    held.release()  # to a connection nobody reads any more
    second = project.celery("worker", "-l", "INFO", name="worker-2")
    wait_for_line(second, READY_LINE)

    def completed() -> bool:
        row = store_state(url, "SELECT state FROM agboss_executions WHERE id = :id", id=task_id)
        return row is not None and row.state == "COMPLETED"

    wait_until(completed, RECOVERY_SECONDS, message=lambda: f"{task_id} COMPLETED\n{second.tail()}")
    # Redis hides the killed worker's message for an hour: beat's sweep re-drove it.
    assert task_id in brokers.unacked_task_ids(redis_url)
    swept = [line for line in second.output().splitlines() if SWEEP_REPUBLISHED in line]
    assert any(task_id in line for line in swept), second.tail()
    charges = [seen for seen in stripe_server.charges_seen if seen.reference == REFERENCE]
    assert len(charges) == 1, charges
    assert len(stripe_server.gateway.payments) == 1, stripe_server.gateway.payments
    order = store_state(
        url, "SELECT times_paid, receipt FROM shop_order WHERE reference = :r", r=REFERENCE
    )
    assert order.times_paid == 1
    assert order.receipt == render_intent(stripe_server.gateway.payments[0])["id"]

    # --- ADMIN (issue 27): needs celery_agboss/contrib/django/admin.py (Execution,
    # Intent); fails until it lands. The changelists must list the execution and its
    # intent's idempotency key, read here from the store's own table.
    intent = store_state(
        url,
        "SELECT idempotency_key FROM agboss_outbound_calls WHERE execution_id = :id",
        id=task_id,
    )
    assert intent is not None
    script = ADMIN_CHECK.format(execution_id=task_id, idempotency_key=intent.idempotency_key)
    shown = json.loads(project.manage("shell", "-c", script).split("admin ", 1)[1].splitlines()[0])
    assert shown == {
        "execution": {"status": 200, "listed": True},
        "intent": {"status": 200, "listed": True},
    }, shown
    # --- end ADMIN
