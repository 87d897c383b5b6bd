"""The shop's tasks that publish a canvas from a payment body (test_body_publishes.py).

``it.bp.pay_then_ship(orders, shape, gate_name)`` publishes a canvas of shipments
(``it.bp.ship``: a ``PaymentTask`` whose shipping charge is keyed by its own
execution, so a second execution is a second charge) and then charges the orders.
When that charge's answer is lost, the library retries and the body runs again from
the top, reaching the publish again. Each shipment waits at the gateway's gate
``gate_name`` before it charges, so the test decides when shipping starts (after the
payment completed: the gateway's one-time fault is then the payment's).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from celery import Celery, chain, chord, group

from celery_agboss import OutboundCall, PaymentTask

SHAPES = ("chain", "group", "chord", "nested")


def add_body_publish_tasks(
    app: Celery,
    charge_call: OutboundCall,
    note: Callable[..., None],
    gate: Callable[[str], None],
) -> None:
    @app.task(base=PaymentTask, bind=True, shared=False, name="it.bp.ship")
    def ship(self: Any, order_id: str, gate_name: str) -> dict[str, str]:
        gate(gate_name)
        receipt = self.outbound(charge_call, {"amount": 500, "order": f"ship:{order_id}"})
        note("ship", self.request.id, order=order_id)
        return {"order": order_id, "shipping": receipt["id"]}

    @app.task(bind=True, shared=False, name="it.bp.notify")
    def notify(self: Any, shipped: Any) -> Any:
        """A plain task after the shipments (at least once: it may run twice)."""
        note("notify", self.request.id, shipped=shipped)
        return shipped

    def canvas(shape: str, orders: list[str], gate_name: str) -> Any:
        shipments = [ship.s(order, gate_name) for order in orders]
        if shape == "chain":
            return chain(shipments[0], notify.s())
        if shape == "group":
            return group(shipments)
        if shape == "chord":
            return chord(shipments, notify.s())
        # A canvas inside a canvas: Celery freezes the inner group as it runs.
        return chain(shipments[0], group(notify.s(), notify.s()))

    @app.task(base=PaymentTask, bind=True, shared=False, name="it.bp.pay_then_ship")
    def pay_then_ship(self: Any, orders: list[str], shape: str, gate_name: str) -> Any:
        published = canvas(shape, orders, gate_name).apply_async()
        note("published", self.request.id, result=str(published.id))
        key = "+".join(orders)
        receipt = self.outbound(
            charge_call, {"amount": 1000 * len(orders), "order": key}, business_key=f"pay:{key}"
        )
        return {"payment": receipt["id"], "published": str(published.id)}


__all__ = ["SHAPES", "add_body_publish_tasks"]
