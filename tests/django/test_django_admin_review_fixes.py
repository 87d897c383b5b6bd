"""The admin says what ``agboss show`` says, and answers when the store fails.

- An intent whose lookup answered ``NotSent`` for a call that cannot prove absence
  (the default) showed as ``not_sent_confirmed  True`` and ``PENDING`` beside the form
  that resolves it as not sent (an operator reading "confirmed" resolves it so, and its
  next delivery charges again where the first may have gone through). Its status now
  reads as the CLI's ``status_text``: "it may be paid".
- A store error is a ``BaseException``: Django's handler turns only ``Exception`` into a
  response, so a store failure on an admin page or decision escaped the WSGI handler
  (under gunicorn's sync worker the process exits, the operator told nothing). Now the
  page says the store failed, and a decision's that it may or may not be recorded.

Django's test client and handler run in a process of the project (tests/README.md).
"""

from __future__ import annotations

import json
import textwrap

import pytest

from tests.support.django_project import manage, python, sqlite_database

pytestmark = [pytest.mark.slow]

SCRIPT = textwrap.dedent(
    """
    import django, io, json, sys
    django.setup()
    from datetime import timedelta
    from django.contrib.admin.utils import quote
    from django.contrib.auth.models import User
    from django.core.handlers.wsgi import WSGIHandler
    from django.db import connection
    from django.test import Client
    import celery_agboss.operator as operator
    from celery_agboss import AGBoss, NotSent, OutboundCall, PaymentTask
    from celery_agboss.errors import StoreUnavailableError
    from tests.support.django_shop.celery import app

    def send(call):
        raise ConnectionError("the gateway's answer was lost")   # it may have charged

    charge = AGBoss.of(app).register(OutboundCall(
        name="t.charge", key_retention=timedelta(hours=24), send=send,
        reconcile=lambda call, lookup: NotSent()))

    @app.task(base=PaymentTask, bind=True, name="t.pay")
    def pay(self, ref):
        return self.outbound(charge, {"amount": 1500}, business_key="order:" + ref)

    pay.apply(args=("o-1",), task_id="t-1")
    with connection.cursor() as cur:   # what a reconcile answering NotSent records on it
        cur.execute("UPDATE agboss_outbound_calls SET not_sent_confirmed = 1")
        cur.execute("SELECT idempotency_key FROM agboss_outbound_calls")
        key = cur.fetchone()[0]
    User.objects.create_superuser("ops", "ops@example.com", "x")
    client = Client()
    client.force_login(User.objects.get(username="ops"))
    seen = {}
    seen["intent"] = client.get(f"/admin/agboss/intent/{quote(key)}/change/").content.decode()
    print("SEEN", json.dumps(seen), flush=True)   # each step's, in case the next one dies

    def unavailable(*args, **kwargs):
        raise StoreUnavailableError("store connection lost: the database restarted")

    real_cancel, operator.cancel = operator.cancel, unavailable
    decided = client.post("/admin/agboss/execution/t-1/cancel/",
                          {"reason": "customer asked"}, follow=True)
    seen["decision"] = [decided.status_code, decided.content.decode()]
    with connection.cursor() as cur:
        cur.execute("SELECT state FROM agboss_executions WHERE id = 't-1'")
        seen["state"] = cur.fetchone()[0]
    print("SEEN", json.dumps(seen), flush=True)
    operator.cancel, operator.describe = real_cancel, unavailable
    environ = {
        "REQUEST_METHOD": "GET", "PATH_INFO": "/admin/agboss/execution/t-1/change/",
        "SERVER_NAME": "testserver", "SERVER_PORT": "80", "wsgi.url_scheme": "http",
        "wsgi.input": io.BytesIO(b""), "wsgi.errors": sys.stderr, "HTTP_HOST": "testserver",
        "HTTP_COOKIE": f"sessionid={client.cookies['sessionid'].value}",
    }
    statuses = []
    body = WSGIHandler()(environ, lambda status, headers, exc_info=None: statuses.append(status))
    seen["page"] = [statuses, b"".join(body).decode()]
    print("SEEN", json.dumps(seen), flush=True)
    """
)


@pytest.fixture(scope="module")
def seen(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    database = sqlite_database(tmp_path_factory.mktemp("admin") / "shop.sqlite3")
    done = manage(database, "migrate", "--no-input")
    assert done.returncode == 0, done.stdout + done.stderr
    ran = python(database, SCRIPT)
    lines = [line for line in ran.stdout.splitlines() if line.startswith("SEEN ")]
    assert lines, ran.stdout + ran.stderr[-4000:]
    found: dict[str, object] = json.loads(lines[-1][len("SEEN ") :])
    found["stderr"] = ran.stderr[-4000:]  # why a later step is missing, if one is
    return found


def test_an_unproven_not_sent_reads_as_may_be_paid(seen: dict[str, object]) -> None:
    page = str(seen["intent"])
    assert "<th>status</th><td>PENDING — NOT FOUND by its lookup (cannot be proven" in page
    assert "it may be paid" in page
    assert "<th>not_sent_confirmed</th>" not in page, "no bare 'confirmed' beside the form"


def test_a_store_failure_on_a_decision_says_it_may_or_may_not_be_recorded(
    seen: dict[str, object],
) -> None:
    assert "decision" in seen, seen["stderr"]
    status, page = seen["decision"]  # type: ignore[misc]
    assert status == 200
    assert "The store failed" in page and "may or may not be recorded" in page
    assert seen["state"] != "CANCELLED"


def test_a_store_failure_on_a_page_is_answered_not_escaped(seen: dict[str, object]) -> None:
    assert "page" in seen, seen["stderr"]
    statuses, page = seen["page"]  # type: ignore[misc]
    assert statuses == ["200 OK"]
    assert "The store failed" in page and "store connection lost" in page
