"""A script run in a process of the Django shop: a payment task that charges (the fake
gateway, in process), declares the refund as its undo, then marks the order paid in a
fenced effect whose ``fn`` the test writes; it prints one ``REPORT`` line (JSON) with
the gateway's requests (the money), the execution's state and the order's payments.

Not a test module: tests/django's fence tests build their scripts from it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.support.django_project import (
    COMMAND_SECONDS,
    REPOSITORY,
    environment,
    manage,
    postgresql_database,
    python,
    sqlite_database,
)

PRELUDE = textwrap.dedent(
    """
    import django, json, threading
    django.setup()
    from datetime import timedelta
    from django.db import connection, transaction
    from django.db.models import F
    from celery_agboss import AGBoss, OutboundCall, PaymentTask, Completed, NotSent
    from celery_agboss.task import undo_function
    from celery_agboss.testing import FakeGateway
    from tests.support.django_shop.celery import app
    from tests.support.django_shop.orders.models import Order

    gw = FakeGateway()

    def reconcile(call, lookup):
        found = gw.lookup(lookup.idempotency_key)
        return NotSent() if found is None else Completed(found)

    charge = AGBoss.of(app).register(OutboundCall(
        name="t.charge", key_retention=timedelta(hours=24), reconcile=reconcile,
        send=lambda call: gw.charge(call.request["amount"], call.idempotency_key)))
    refund = AGBoss.of(app).register(OutboundCall(
        name="t.refund", key_retention=timedelta(hours=24), reconcile=reconcile,
        send=lambda call: gw.refund(call.request["payment"], call.idempotency_key)))

    @undo_function(app, "t.refund-charge")
    def refund_charge(task, undo, payment):
        task.outbound(refund, {"payment": payment}, business_key="refund:" + payment)

    def mark_paid(ref):
        Order.objects.filter(pk=ref).update(times_paid=F("times_paid") + 1)

    def paying(write, around=None):
        @app.task(base=PaymentTask, bind=True, name="t.pay")
        def pay(self, ref):
            receipt = self.outbound(charge, {"amount": 1500}, business_key="order:" + ref)
            self.undo_with("t.refund-charge", payment=receipt["id"])
            effect = lambda: self.fenced_effect(
                "mark-paid", lambda conn: write(ref, conn), business_key="order:" + ref)
            return (around or (lambda run: run()))(effect)
        return pay

    def again_until_finished(pay, seconds=60):
        # The delivery a worker retries once the lease expired: again, eager, until done.
        import time
        deadline = time.monotonic() + seconds
        while True:
            result = pay.apply(args=("o-1",), task_id="t-1")
            if result.state == "SUCCESS" or time.monotonic() > deadline:
                return result
            time.sleep(0.5)

    def report(result, **more):
        connection.close()  # a fresh session: the effect's may be gone
        with connection.cursor() as cur:
            cur.execute("SELECT state FROM agboss_executions WHERE id = 't-1'")
            state = (cur.fetchone() or [None])[0]   # None: never recorded
            cur.execute("SELECT times_paid FROM orders_order WHERE reference = 'o-1'")
            paid = cur.fetchone()[0]
            cur.execute("SELECT count(*) FROM agboss_fenced_effects WHERE name = 'mark-paid'")
            effects = cur.fetchone()[0]
        print("REPORT", json.dumps({
            "gateway": [q.operation for q in gw.requests], "state": state, "paid": paid,
            "effects": effects, "result": type(result.result).__name__,
            "message": str(result.result)[:400], **more}), flush=True)
    """
)


def run_shop(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    backend: str,
    script: str,
    *,
    before: str = "",
    store_url: str | None = None,
    **database: Any,
) -> dict[str, Any]:
    """The shop migrated on ``backend`` (one order, ``o-1``), then ``before`` (settings
    changed before Django is set up), ``PRELUDE`` and ``script`` run in a process of it
    (``database``: more of its ``DATABASES`` entry); its report. ``script`` may use ``PG``
    (a libpq URL) or ``SQLITE`` (the file's path), whichever the backend is.
    ``store_url``: the store set as ``agboss_database_url`` instead of as the alias."""
    if backend == "sqlite":
        path = tmp_path / "shop.sqlite3"
        entry, where = sqlite_database(path), f"SQLITE = {str(path)!r}\n"
    else:
        url = request.getfixturevalue("empty_postgres_url")
        entry = postgresql_database(url)
        where = f"PG = {url.replace('postgresql+psycopg://', 'postgresql://')!r}\n"
    done = manage(entry, "migrate", "--no-input")
    assert done.returncode == 0, done.stdout + done.stderr
    seeded = python(
        entry,
        "import django; django.setup()\n"
        "from tests.support.django_shop.orders.models import Order\n"
        "Order.objects.create(reference='o-1')\n",
    )
    assert seeded.returncode == 0, seeded.stderr
    code = textwrap.dedent(before) + PRELUDE + where + textwrap.dedent(script)
    ran = subprocess.run(
        [sys.executable, "-c", code],
        env=environment({**entry, **database}, **({"store_url": store_url} if store_url else {})),
        cwd=REPOSITORY,
        capture_output=True,
        text=True,
        timeout=COMMAND_SECONDS,
        check=False,
    )
    lines = [line for line in ran.stdout.splitlines() if line.startswith("REPORT ")]
    assert lines, ran.stdout + ran.stderr[-4000:]
    return {**json.loads(lines[-1][len("REPORT ") :]), "stdout": ran.stdout, "stderr": ran.stderr}
