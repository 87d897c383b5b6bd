"""The shop's tasks: a charge through ``self.outbound`` (sent to the test's fake gateway
over HTTP), and an order marked paid through the ORM in a fenced effect."""

from __future__ import annotations

import json
import os
from datetime import timedelta
from typing import Any

from celery_agboss import AGBoss, OutboundCall, PaymentTask
from celery_agboss.core.masking import MaskingPolicy
from tests.integration.apps.shop import (
    GatewayDeclined,
    _http,
    charge_at_gateway,
    lookup_at_gateway,
)
from tests.support.django_shop.celery import app

_GATEWAY = json.loads(os.environ.get("AGBOSS_DJANGO_TEST", "{}")).get("gateway_url", "")

charge_call = AGBoss.of(app).register(
    OutboundCall(
        name="django_shop.charge",
        send=charge_at_gateway(_GATEWAY),
        reconcile=lookup_at_gateway(_GATEWAY),
        is_definite_failure=lambda exc: isinstance(exc, GatewayDeclined),
        key_retention=timedelta(hours=24),
    )
)


def gate(gateway: str, name: str) -> None:
    """Wait at the test's gate ``name`` (the gateway's ``/gate``; this process's pid sent)."""
    _http(gateway, "POST", "/gate", {"name": name})


@app.task(base=PaymentTask, bind=True, name="django_shop.charge_order")
def charge_order(self: Any, order_id: str, amount: int) -> dict[str, Any]:
    receipt = self.outbound(
        charge_call, {"amount": amount, "order": order_id}, business_key=f"order:{order_id}"
    )
    return {"payment": receipt["id"], "order": order_id}


@app.task(base=PaymentTask, bind=True, name="django_shop.mark_paid")
def mark_paid(self: Any, reference: str, gate_name: str | None = None) -> dict[str, Any]:
    """Mark the order paid through the ORM in a fenced effect; with ``gate_name``, wait at
    the test's gate after the write, before the effect's transaction commits."""
    from django.db.models import F

    from tests.support.django_shop.orders.models import Order

    def write(_conn: Any) -> dict[str, Any]:
        Order.objects.filter(pk=reference).update(times_paid=F("times_paid") + 1)
        if gate_name:
            gate(_GATEWAY, gate_name)
        return {"order": reference}

    result: dict[str, Any] = self.fenced_effect(
        "mark-paid", write, business_key=f"order:{reference}"
    )
    return result


@app.task(base=PaymentTask, bind=True, name="django_shop.mark_paid_in_atomic")
def mark_paid_in_atomic(self: Any, reference: str) -> dict[str, Any]:
    """The mistake: the body's own ``atomic`` around a fenced effect."""
    from django.db import transaction

    from tests.support.django_shop.orders.models import Order

    def write(_conn: Any) -> dict[str, Any]:
        Order.objects.filter(pk=reference).update(times_paid=1)
        return {"order": reference}

    with transaction.atomic():
        result: dict[str, Any] = self.fenced_effect("mark-paid", write)
    return result


@app.task(base=PaymentTask, bind=True, name="django_shop.mark_paid_and_report")
def mark_paid_and_report(self: Any, reference: str) -> dict[str, Any]:
    """Another mistake: a write to another alias inside the fenced effect (a read passes),
    then the effect fails: the order's write rolls back, the report's would not."""
    from django.db import connections

    from tests.support.django_shop.orders.models import Order

    def write(_conn: Any) -> dict[str, Any]:
        Order.objects.filter(pk=reference).update(times_paid=1)
        with connections["reports"].cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.execute("CREATE TABLE IF NOT EXISTS report (reference TEXT)")
            cursor.execute("INSERT INTO report (reference) VALUES (%s)", [reference])
        raise RuntimeError("the effect fails after its writes: none of them may stay")

    result: dict[str, Any] = self.fenced_effect("mark-paid", write)
    return result


@app.task(base=PaymentTask, bind=True, name="django_shop.mark_paid_reading_reports_in_atomic")
def mark_paid_reading_reports_in_atomic(self: Any, reference: str) -> dict[str, Any]:
    """A read of another alias inside its own ``atomic()`` in ``fn``: Django's SQLite
    backend opens that block with ``BEGIN`` through the cursor, which is no write."""
    from django.db import connections, transaction

    from tests.support.django_shop.orders.models import Order

    def write(_conn: Any) -> dict[str, Any]:
        Order.objects.filter(pk=reference).update(times_paid=1)
        with transaction.atomic(using="reports"), connections["reports"].cursor() as cursor:
            cursor.execute("SELECT 1")
        return {"order": reference}

    result: dict[str, Any] = self.fenced_effect("mark-paid", write)
    return result


@app.task(base=PaymentTask, bind=True, name="django_shop.mark_paid_then_set_rollback")
def mark_paid_then_set_rollback(self: Any, reference: str) -> dict[str, Any]:
    """fn marks the effect's transaction for rollback after its write."""
    from django.db import transaction

    from tests.support.django_shop.orders.models import Order

    def write(_conn: Any) -> dict[str, Any]:
        Order.objects.filter(pk=reference).update(times_paid=1)
        transaction.set_rollback(True)
        return {"order": reference}

    result: dict[str, Any] = self.fenced_effect("mark-paid", write)
    return result


@app.task(base=PaymentTask, bind=True, name="django_shop.which_connection")
def which_connection(self: Any, reference: str, gate_name: str) -> dict[str, Any]:
    """Record, in a fenced effect, which server session its ORM and its ``conn`` use, and
    which process ran it (after waiting at the test's gate, so that the pool's children
    are busy at once)."""
    import os

    from django.db import connection
    from sqlalchemy import text

    def record(conn: Any) -> dict[str, Any]:
        gate(_GATEWAY, gate_name)
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            orm_session = cursor.fetchone()[0]
        fenced_session = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
        return {"pid": os.getpid(), "orm": orm_session, "fenced": fenced_session}

    result: dict[str, Any] = self.fenced_effect(
        "which-connection", record, business_key=f"order:{reference}"
    )
    return result


card_charge_call = AGBoss.of(app).register(
    OutboundCall(
        name="django_shop.charge_card",
        send=charge_at_gateway(_GATEWAY),
        reconcile=lookup_at_gateway(_GATEWAY),
        key_retention=timedelta(hours=24),
        mask=MaskingPolicy(mask=["card"]),
    )
)


@app.task(base=PaymentTask, bind=True, name="django_shop.charge_card")
def charge_card(self: Any, order_id: str, amount: int, card: str) -> dict[str, Any]:
    """A charge whose request holds a card number, masked as the store keeps it (the
    task's own arguments hold it too: the admin shows neither)."""
    receipt = self.outbound(
        card_charge_call,
        {"amount": amount, "order": order_id, "card": card},
        business_key=f"order:{order_id}",
    )
    return {"payment": receipt["id"], "order": order_id}


@app.task(base=PaymentTask, bind=True, name="django_shop.wait_for_approval")
def wait_for_approval(self: Any, order_id: str) -> dict[str, Any]:
    """A payment that waits for a person's answer (answered from the admin in tests)."""
    answer = self.pause("approval")
    return {"order": order_id, "answer": answer}


@app.task(base=PaymentTask, bind=True, name="django_shop.pay_order")
def pay_order(
    self: Any, reference: str, amount: int, gate_name: str | None = None, keyed: bool = True
) -> dict[str, Any]:
    """Charge, then mark the order paid through the ORM in a fenced effect (with
    ``gate_name``: wait at the test's gate after the ORM write, before it commits).
    ``keyed=False``: the order is not the business key (each execution its own payment)."""
    from django.db.models import F

    from tests.support.django_shop.orders.models import Order

    business_key = f"order:{reference}" if keyed else None
    receipt = self.outbound(
        charge_call, {"amount": amount, "order": reference}, business_key=business_key
    )

    def write(_conn: Any) -> dict[str, Any]:
        Order.objects.filter(pk=reference).update(times_paid=F("times_paid") + 1)
        if gate_name:
            gate(_GATEWAY, gate_name)
        return {"order": reference}

    self.fenced_effect("mark-paid", write, business_key=business_key)
    return {"payment": receipt["id"], "order": reference}
