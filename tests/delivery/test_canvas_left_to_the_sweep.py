"""A canvas published from a body whose publish never happened after its commit: the sweep
publishes the recorded row, and each payment in it runs once
(design: publishes from a body, outbox), on both stores, in a worker thread.

The crash: the body's fenced effect commits the canvas's outbox row, then the publish
after the commit is skipped (``publishing.publish`` does nothing), as a worker dying
between the two would leave it: committed, unpublished, nothing sent. The body goes on
and completes. The sweep leaves the row alone within ``agboss_outbox_grace`` and
publishes it after it, under the ids the body was handed; every shipment (a
``PaymentTask`` keyed by its own execution, so a second execution is a second charge)
charges once, the plain task after them runs once, and a later sweep sends nothing
more. The twin (``SWEEP_NOT_REPUBLISHING``) leaves the row where the crash left it: the
order paid, nothing shipped, ever.
"""

from __future__ import annotations

from typing import Any

import pytest
from celery import chain, chord, group

from celery_agboss.core.protections import SWEEP_NOT_REPUBLISHING
from celery_agboss.delivery.outcomes import decode_result
from celery_agboss.outbox import publishing
from celery_agboss.signals.body_publishes import derived_task_id
from celery_agboss.testing.switches import sabotage
from tests.delivery.conftest import PaymentShop
from tests.support.processes import wait_until

GRACE_SECONDS = 5
ORDERS = ["o-1", "o-2"]
SHAPES = ["chain", "group", "chord"]


@pytest.fixture
def shop_config() -> dict[str, Any]:
    return {"agboss_outbox_grace": GRACE_SECONDS}


class _Canvas:
    """The shop's tasks: ``pay`` publishes a canvas of shipments, then charges."""

    def __init__(self, shop: PaymentShop, shape: str) -> None:
        self.shop = shop
        self.notified: list[Any] = []
        charge = shop.call()
        notified = self.notified

        @shop.task()
        def ship(self: Any, order: str) -> str:
            receipt = self.outbound(charge, {"amount": 500, "order": f"ship:{order}"})
            return str(receipt["id"])

        @shop.app.task(shared=False, name="shop.notify")
        def notify(shipped: Any) -> Any:
            """A plain task after the shipments (at least once)."""
            notified.append(shipped)
            return shipped

        def canvas() -> Any:
            if shape == "chain":
                return chain(ship.si(ORDERS[0]), ship.si(ORDERS[1]), notify.s())
            shipments = [ship.s(order) for order in ORDERS]
            return group(shipments) if shape == "group" else chord(shipments, notify.s())

        @shop.task()
        def pay(self: Any, order: str) -> list[str]:
            published = canvas().apply_async()
            self.outbound(charge, {"amount": 1000, "order": order}, business_key=f"pay:{order}")
            if shape == "group":
                return [str(r.id) for r in published.results]
            if shape == "chord":
                return [str(r.id) for r in published.parent.results]
            ids = [str(published.id)]  # the chain's last task, then back to its first
            while (published := published.parent) is not None:
                ids.insert(0, str(published.id))
            return ids[:-1]  # the shipments: all but notify

        self.pay = pay
        self.shape = shape

    def pay_with_the_publish_lost(self, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
        """Run ``pay`` with the publish after the commit skipped; (its id, the row's id).
        The row is checked committed and unpublished, and nothing shipped."""
        skipped: list[tuple[str, ...]] = []

        def crashed(app: Any, *task_ids: str) -> list[str]:
            skipped.append(task_ids)
            return []

        monkeypatch.setattr(publishing, "publish", crashed)
        with self.shop.worker():
            task_id = self.shop.deliver(self.pay, "o-pay", states=("COMPLETED",))
        monkeypatch.undo()
        row = derived_task_id(task_id, f"publish/{self.shape}:shop.ship#1")
        assert skipped == [(row,)], "the body's one publish, of its recorded row"
        recorded = publishing.read(self.shop.app, row)
        assert recorded is not None and not recorded.published
        assert recorded.message.task_name == publishing.CANVAS_TASK_NAME
        assert self.ships() == [], "nothing sent: no shipment recorded"
        assert self.charges("o-pay") == 1 and self.charges("ship:o-1") == 0
        return task_id, row

    def ships(self) -> list[Any]:
        records = self.shop.agboss.executions.list_executions(limit=100)
        return [r for r in records if r.task_name == "shop.ship"]

    def charges(self, reference: str) -> int:
        return sum(1 for p in self.shop.gateway.payments if p["reference"] == reference)


@pytest.fixture(params=SHAPES)
def lost(
    request: pytest.FixtureRequest, shop: PaymentShop, monkeypatch: pytest.MonkeyPatch
) -> tuple[_Canvas, str, str]:
    """A canvas of each shape whose publish was lost (``pay_with_the_publish_lost``):
    the canvas, the paying task's id and its outbox row."""
    canvas = _Canvas(shop, request.param)
    return canvas, *canvas.pay_with_the_publish_lost(monkeypatch)


def test_a_canvas_whose_publish_was_lost_is_published_by_the_sweep_and_ships_once(
    shop: PaymentShop, lost: tuple[_Canvas, str, str]
) -> None:
    canvas, task_id, row = lost
    shape = canvas.shape
    handed = shop.execution(task_id).result
    with shop.worker(concurrency=3):
        assert shop.sweep(claim_tick=False).outbox_published == 0, "within the grace"
        shop.clock.advance(GRACE_SECONDS + 1)
        assert shop.sweep(claim_tick=False).outbox_published == 1
        recorded = publishing.read(shop.app, row)
        assert recorded is not None and recorded.published
        ship_ids = decode_result(handed)
        assert len(ship_ids) == len(ORDERS)
        for ship_id in ship_ids:  # the ids the body was handed are the ones that ran
            shop.wait_state(ship_id, "COMPLETED")
        if shape != "group":
            wait_until(lambda: canvas.notified, 10, message="the plain task after the shipments")
        shop.clock.advance(GRACE_SECONDS + 1)
        assert shop.sweep(claim_tick=False).outbox_published == 0, "published once"
    assert sorted(r.id for r in canvas.ships()) == sorted(ship_ids)
    for order in ORDERS:
        assert canvas.charges(f"ship:{order}") == 1, order
    assert canvas.charges("o-pay") == 1
    assert len(canvas.notified) == (0 if shape == "group" else 1)


def test_without_the_sweeps_publish_the_paid_order_never_ships(
    shop: PaymentShop, lost: tuple[_Canvas, str, str]
) -> None:
    canvas, _, row = lost
    shop.clock.advance(GRACE_SECONDS + 1)
    with sabotage(SWEEP_NOT_REPUBLISHING):
        assert shop.sweep(claim_tick=False).outbox_published == 0
        shop.clock.advance(10 * GRACE_SECONDS)
        assert shop.sweep(claim_tick=False).outbox_published == 0
    recorded = publishing.read(shop.app, row)
    assert recorded is not None and not recorded.published, "left where the crash left it"
    assert canvas.ships() == [], "no shipment was ever sent"
    assert canvas.charges("o-pay") == 1, "the order is paid"
    for order in ORDERS:
        assert canvas.charges(f"ship:{order}") == 0, order
