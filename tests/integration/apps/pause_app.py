"""The pause tests' worker app: the shop's app (tests.integration.apps.shop) plus tasks that
pause.

- ``ps.approve_then_charge``: pauses for an approval, then charges (design: PS11);
- ``ps.checkout_3ds``: authorises, pauses for the 3-D Secure outcome, reads the payment's
  status from the gateway and captures it (design: PS21);
- ``ps.charge_record_then_pause``: charges and records the order in an app table (a
  fenced effect) before it pauses (retention while it waits).

Each body says where it is through the gateway's ``/note``: ``before-pause`` on every run
of the steps before the pause, ``after-pause`` on every run past it. ``install_routes``
gives the test's gateway server the authorise, capture and read endpoints.

The worker runs ``celery -A tests.integration.apps.pause_app:app`` with the config in
``AGBOSS_PS_CONFIG`` (JSON).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from celery import Celery
from sqlalchemy import text

from celery_agboss import AGBoss, OutboundCall, PaymentTask
from celery_agboss.core.outbound import CallContext, SendFn
from celery_agboss.testing.gateway_server import FakeGatewayServer, GatewayCall, Reply
from celery_agboss.testing.gateway_types import FakeGatewayError
from tests.integration.apps.shop import _http, app_from_environment, gateway_app, gateway_call

CONFIG_ENV = "AGBOSS_PS_CONFIG"
"""Not the shop's variable: importing the shop must not build its own app here too."""
ORDERS_TABLE = "ps_orders"


def install_routes(server: FakeGatewayServer) -> None:
    """``POST /authorize``, ``POST /capture`` and ``GET /payments/{id}`` on the server."""
    gateway = server.gateway

    def answered(make: Any) -> Reply:
        try:
            return Reply(200, make())
        except FakeGatewayError as exc:
            return server.error_reply(exc)

    def authorize(call: GatewayCall) -> Reply:
        body = call.body
        return answered(
            lambda: gateway.charge(
                int(body["amount"]),
                body.get("idempotency_key"),
                reference=body.get("reference"),
                capture=False,
            )
        )

    def capture(call: GatewayCall) -> Reply:
        body = call.body
        return answered(
            lambda: gateway.capture(str(body["payment_id"]), body.get("idempotency_key"))
        )

    def retrieve(call: GatewayCall) -> Reply:
        return answered(lambda: gateway.retrieve(call.params["payment_id"]))

    server.route("POST", "/authorize", authorize)
    server.route("POST", "/capture", capture)
    server.route("GET", "/payments/{payment_id}", retrieve)


def create_orders_table(conn: Any) -> None:
    conn.execute(
        text(
            f"create table if not exists {ORDERS_TABLE} "
            "(order_id varchar(100) not null, payment varchar(100) not null)"
        )
    )


def make_app(config: dict[str, Any]) -> Celery:
    """The shop's app with the pause tasks and the ``ps.*`` calls they make."""
    app, agboss, base, note = gateway_app(config, shop_tasks=True)
    charge_call, authorize_call, capture_call = _register_pause_calls(agboss, base)
    _add_approval_task(app, note, charge_call)
    _add_checkout_tasks(app, note, base, authorize_call, capture_call)
    _add_record_then_pause_task(app, note, charge_call)
    return app


def _posting(base: str, path: str, body: Callable[[CallContext], Any]) -> SendFn:
    """A ``send`` that posts ``body(call)`` to ``path`` with the call's idempotency key."""

    def send(call: CallContext) -> Any:
        return _http(base, "POST", path, {**body(call), "idempotency_key": call.idempotency_key})

    return send


def _order_body(call: CallContext) -> dict[str, Any]:
    return {"amount": call.request["amount"], "reference": call.request["order"]}


def _register_pause_calls(
    agboss: AGBoss, base: str
) -> tuple[OutboundCall, OutboundCall, OutboundCall]:
    """``ps.charge``, ``ps.authorize`` and ``ps.capture``, registered on ``agboss``."""

    def call(name: str, path: str, body: Callable[[CallContext], Any]) -> OutboundCall:
        made = gateway_call(name, base, _posting(base, path, body))
        agboss.register(made)
        return made

    charge_call = call("ps.charge", "/charge", _order_body)
    authorize_call = call("ps.authorize", "/authorize", _order_body)
    capture_call = call(
        "ps.capture", "/capture", lambda call: {"payment_id": call.request["payment"]}
    )
    return charge_call, authorize_call, capture_call


def _add_approval_task(app: Celery, note: Callable[..., None], charge_call: OutboundCall) -> None:
    """Design: PS11, a charge that waits for a person's approval first."""

    @app.task(base=PaymentTask, bind=True, shared=False, name="ps.approve_then_charge")
    def approve_then_charge(self: Any, order_id: str, amount: int = 1000):  # type: ignore[no-untyped-def]
        note("before-pause", self.request.id)
        answer = self.pause("approve", {"order": order_id, "amount": amount})
        note("after-pause", self.request.id, by=answer["by"])
        receipt = self.outbound(
            charge_call, {"amount": amount, "order": order_id}, business_key=f"order:{order_id}"
        )
        return {"payment": receipt["id"], "by": answer["by"]}


def _add_checkout_tasks(
    app: Celery,
    note: Callable[..., None],
    base: str,
    authorize_call: OutboundCall,
    capture_call: OutboundCall,
) -> None:
    """Design: PS21, a 3-D Secure checkout whose outcome is read from the gateway."""

    def checkout(task: Any, order_id: str, amount: int, accept_early: bool) -> dict[str, Any]:
        note("before-pause", task.request.id)
        payment = task.outbound(
            authorize_call, {"amount": amount, "order": order_id}, business_key=f"order:{order_id}"
        )
        answer = task.pause("3ds", {"payment": payment["id"]}, accept_early=accept_early)
        note("after-pause", task.request.id, source=answer["source"])
        # The outcome comes from the gateway (design: G6), never from who answered the pause.
        status = _http(base, "GET", f"/payments/{payment['id']}")["status"]
        if status != "requires_capture":
            return {"order": order_id, "status": status, "source": answer["source"]}
        captured = task.outbound(
            capture_call,
            {"payment": payment["id"], "order": order_id},
            business_key=f"order:{order_id}:capture",
        )
        return {"order": order_id, "status": captured["status"], "source": answer["source"]}

    @app.task(base=PaymentTask, bind=True, shared=False, name="ps.checkout_3ds")
    def checkout_3ds(self: Any, order_id: str, amount: int = 1000):  # type: ignore[no-untyped-def]
        return checkout(self, order_id, amount, accept_early=False)

    @app.task(base=PaymentTask, bind=True, shared=False, name="ps.checkout_3ds_early")
    def checkout_3ds_early(self: Any, order_id: str, amount: int = 1000):  # type: ignore[no-untyped-def]
        """The same, taking a 3-D Secure answer that came before its pause."""
        return checkout(self, order_id, amount, accept_early=True)


def _add_record_then_pause_task(
    app: Celery, note: Callable[..., None], charge_call: OutboundCall
) -> None:
    """A charge whose fenced effect is written before it pauses (retention while it waits)."""

    @app.task(base=PaymentTask, bind=True, shared=False, name="ps.charge_record_then_pause")
    def charge_record_then_pause(self: Any, order_id: str, amount: int = 1000):  # type: ignore[no-untyped-def]
        note("before-pause", self.request.id)
        receipt = self.outbound(
            charge_call, {"amount": amount, "order": order_id}, business_key=f"order:{order_id}"
        )

        def record(conn: Any) -> str:
            conn.execute(
                text(f"insert into {ORDERS_TABLE} (order_id, payment) values (:o, :p)"),
                {"o": order_id, "p": receipt["id"]},
            )
            return str(receipt["id"])

        self.fenced_effect("record-order", record)
        answer = self.pause("ship", {"order": order_id})
        note("after-pause", self.request.id, by=answer["by"])
        return {"payment": receipt["id"], "by": answer["by"]}


app = app_from_environment(CONFIG_ENV, make_app)
