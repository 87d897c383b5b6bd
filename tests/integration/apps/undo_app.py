"""The worker app of tests/integration/test_undo_in_killed_workers.py: charges with undos.

``make_app(config)`` builds it; a worker runs ``celery -A tests.integration.apps.undo_app:app``
with the config (JSON) in ``AGBOSS_UNDO_IT_CONFIG``, and the test process builds the same
app to publish and to read the store. The gateway is the test's ``FakeGateway`` behind
``tests.integration.gateway_http``, with a ``POST /refund`` route the test adds; every
request carries the sender's pid, so a test can kill the pool child that is refunding.

``charge_then_freeze`` waits at a gate on its first delivery, so a test can freeze
(SIGSTOP) the pool child there. Two undos: ``refund-charge`` refunds through an outbound
call (keyed by the undo's ``<step key>:compensation``: exactly once, PS10),
``plain-refund`` with a plain HTTP call (PS10's "wrong", a part of the payment: it shows
every time the undo runs again).
"""

from __future__ import annotations

import contextlib
from typing import Any

from celery import Celery

from celery_agboss import AGBoss, PaymentTask
from celery_agboss.core.compensation import UndoStep
from celery_agboss.core.outbound import CallContext
from celery_agboss.task import undo_function
from tests.integration.apps.shop import (
    GatewayAnswerLost,
    app_from_environment,
    charge_at_gateway,
    gateway_app,
    gateway_call,
    overrun_on_first_delivery,
)
from tests.integration.apps.shop import _http as http

CONFIG_ENV = "AGBOSS_UNDO_IT_CONFIG"
PLAIN_REFUND_AMOUNT = 100


def make_app(config: dict[str, Any]) -> Celery:
    app, agboss, gateway, note = gateway_app(config, "agboss_undo")

    def send_refund(call: CallContext) -> Any:
        body = {"payment": call.request["payment"], "idempotency_key": call.idempotency_key}
        return http(gateway, "POST", "/refund", body)

    charge_call = gateway_call("undo_it.charge", gateway, charge_at_gateway(gateway))
    refund_call = gateway_call("undo_it.refund", gateway, send_refund)
    agboss.register(charge_call)
    agboss.register(refund_call)

    @undo_function(app, "refund-charge")
    def refund_charge(task: Any, undo: UndoStep, payment: str, order: str) -> None:
        note("undo-start", task.request.id, undo=undo.name, order=order)
        task.outbound(refund_call, {"payment": payment})  # business key: undo.key
        note("undo-end", task.request.id, undo=undo.name, order=order)

    @undo_function(app, "plain-refund")
    def plain_refund(task: Any, undo: UndoStep, payment: str, order: str) -> None:
        note("undo-start", task.request.id, undo=undo.name, order=order)
        body = {"payment": payment, "amount": PLAIN_REFUND_AMOUNT, "idempotency_key": None}
        http(gateway, "POST", "/refund", body)
        note("undo-end", task.request.id, undo=undo.name, order=order)

    def charge(task: Any, order: str, amount: int) -> Any:
        request = {"amount": amount, "order": order}
        receipt = task.outbound(charge_call, request, business_key=f"order:{order}")
        return receipt

    @app.task(base=PaymentTask, bind=True, shared=False, name="undo_it.charge_then_fail")
    def charge_then_fail(self: Any, order: str, amount: int = 1000) -> Any:
        note("body-start", self.request.id)
        receipt = charge(self, order, amount)
        self.undo_with("refund-charge", payment=receipt["id"], order=order)
        raise ValueError(f"order {order} cannot be fulfilled")

    @app.task(base=PaymentTask, bind=True, shared=False, name="undo_it.two_charges_then_fail")
    def two_charges_then_fail(self: Any, order: str) -> Any:
        """Goods (refunded through an outbound call), then shipping (a plain refund): the
        shipping's undo runs first, then the goods'."""
        note("body-start", self.request.id)
        goods = charge(self, f"{order}:goods", 1000)
        self.undo_with("refund-charge", payment=goods["id"], order=f"{order}:goods")
        shipping = charge(self, f"{order}:shipping", 500)
        self.undo_with("plain-refund", payment=shipping["id"], order=f"{order}:shipping")
        raise ValueError(f"order {order} cannot be shipped")

    @app.task(base=PaymentTask, bind=True, shared=False, name="undo_it.charge_then_overrun")
    def charge_then_overrun(self: Any, order: str, seconds: float) -> Any:
        """Charges, then (on its first delivery only) overruns its hard time limit."""
        note("body-start", self.request.id)
        receipt = charge(self, order, 1000)
        self.undo_with("refund-charge", payment=receipt["id"], order=order)
        overrun_on_first_delivery(self, seconds, note)
        note("body-end", self.request.id)
        return {"payment": receipt["id"], "order": order}

    @app.task(base=PaymentTask, bind=True, shared=False, name="undo_it.charge_then_freeze")
    def charge_then_freeze(self: Any, order: str) -> Any:
        """Charges (its undo a plain refund, which would show any run of it); on its first
        delivery waits at the gate ``freeze:<order>`` — the test freezes the child there
        past its lease, the order is taken over and completed — then fails."""
        note("body-start", self.request.id)
        receipt = charge(self, order, 1000)
        self.undo_with("plain-refund", payment=receipt["id"], order=order)
        record = AGBoss.of(app).executions.read_execution(self.request.id)
        if record is not None and record.deliveries == 1:
            with contextlib.suppress(GatewayAnswerLost):  # lost to the freeze: fails anyway
                http(gateway, "POST", "/gate", {"name": f"freeze:{order}"})
            raise ValueError(f"order {order} failed after its take-over")
        return {"payment": receipt["id"], "order": order}

    return app


app = app_from_environment(CONFIG_ENV, make_app)
