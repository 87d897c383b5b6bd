"""The transactional outbox with real workers: a follow-up runs once if and only if the
effect that enqueued it committed.

``it.outbox.pay_order`` charges, then marks the order paid and enqueues its receipt
(``it.outbox.send_receipt``, a ``PaymentTask``) in one fenced effect
(tests/integration/apps/outbox_app.py). A committed effect's receipt is published after
the commit and runs once; a rolled-back effect's never goes out; a pool child SIGKILLed
between the commit and the publish leaves the row to the sweep, which publishes it
once its grace (1 s here) passed: one receipt. The twins: publishing what ``fn``
enqueued without waiting for the commit sends a rolled-back order's receipt; a sweep
that does not re-publish leaves the killed worker's receipt unsent for good.

Deployment speed-ups it relies on: the harness's (``-Q``, a 5 s lease, no beat:
tests/integration/harness.py) and a 1 s outbox grace (30 s by default).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import select, text

from celery_agboss import outbox
from celery_agboss.core.protections import PUBLISHED_WITHOUT_COMMIT, SWEEP_NOT_REPUBLISHING
from celery_agboss.delivery.outcomes import decode_result
from celery_agboss.store.outbox_rows import OutboxRow
from celery_agboss.store.schema_executions import outbox as outbox_table
from celery_agboss.sweep import run_sweep
from celery_agboss.testing.switches import sabotage
from tests.integration.apps import outbox_app
from tests.integration.apps.outbox_app import ORDERS_TABLE, create_orders_table
from tests.integration.gateway_http import wait_for
from tests.integration.harness import Shop, ShopFactory
from tests.support.processes import ManagedProcess, process_state

pytestmark = [pytest.mark.worker, pytest.mark.redis, pytest.mark.slow]


class OutboxShop(Shop):
    """The harness's shop, its workers running the outbox app instead of the shop's."""

    # --- what the tests read ----------------------------------------------------------

    def pay(self, order: str, **options: Any) -> str:
        return str(self.app.signature("it.outbox.pay_order", (order,), options).apply_async().id)

    def receipts(self, order: str) -> int:
        """How many times a receipt body ran for ``order``."""
        return sum(1 for n in self.gateway.notes_of("receipt") if n.fields.get("order") == order)

    def orders(self) -> list[str]:
        with self.agboss.store.engine.connect() as conn:
            return [str(r[0]) for r in conn.execute(text(f"SELECT id FROM {ORDERS_TABLE}"))]

    def outbox_rows(self, execution_id: str) -> list[OutboxRow]:
        with self.agboss.store.engine.connect() as conn:
            ids = conn.execute(
                select(outbox_table.c.task_id).where(outbox_table.c.execution_id == execution_id)
            ).scalars()
            found = [outbox.read(self.app, str(task_id)) for task_id in ids]
        return [row for row in found if row is not None]

    def committed_then_killed(self, order: str) -> tuple[ManagedProcess, OutboxRow]:
        """A worker whose child commits ``order``'s effect and is SIGKILLed before its
        publish; the row it left (unpublished, and no receipt ran)."""
        worker = self.start_worker()
        parent = self.pay(order, die_after_commit=True)
        wait_for(lambda: self.gateway.charge_pids, 20, "the charge")
        child = self.gateway.charge_pids[-1]
        wait_for(lambda: _dead(child), 20, "the child's SIGKILL after its commit")
        (row,) = self.outbox_rows(parent)
        assert self.orders() == [order], "the effect committed"
        assert not row.published and self.receipts(order) == 0, "and nothing was published"
        store = self.agboss.store
        wait_for(lambda: store.now_ms() >= row.publish_after_ms, 10, "the row's grace to pass")
        return worker, row


def _dead(pid: int) -> bool:
    """Gone, or a zombie its worker has not reaped yet (it notices within seconds)."""
    return process_state(pid) in (None, "Z")


OutboxShopFactory = Callable[[str], OutboxShop]


@pytest.fixture
def outbox_shops(shop_factory: ShopFactory) -> OutboxShopFactory:
    """``outbox_shops(database_url)``: the harness's world, with a 1 s outbox grace."""

    def build(database_url: str) -> OutboxShop:
        shop: OutboxShop = shop_factory(
            database_url=database_url, app_module=outbox_app, kind=OutboxShop, outbox_grace=1.0
        )
        create_orders_table(shop.agboss.store.engine)
        return shop

    return build


@pytest.fixture
def outbox_shop(outbox_shops: OutboxShopFactory, database_url: str) -> OutboxShop:
    return outbox_shops(database_url)


@pytest.fixture
def twin_shop(outbox_shops: OutboxShopFactory, sqlite_database_url: str) -> OutboxShop:
    """The twins prove a test can fail; the protection they remove is the same on both
    stores, so they run on SQLite only."""
    return outbox_shops(sqlite_database_url)


def test_a_committed_effect_sends_its_receipt_once_and_a_rolled_back_one_none(
    outbox_shop: OutboxShop,
) -> None:
    shop = outbox_shop
    shop.start_worker()
    failed = shop.pay("o-fail", fail_in_effect=True)
    shop.wait_state(failed, "FAILED")
    paid = shop.pay("o-paid")
    record = shop.wait_state(paid, "COMPLETED")
    receipt_task = decode_result(record.result)["receipt_task"]
    shop.wait_state(receipt_task, "COMPLETED")
    # A receipt published for o-fail would have been queued before o-paid was even
    # published, and run before o-paid's receipt did (one queue, in order).
    assert shop.receipts("o-fail") == 0
    assert shop.receipts("o-paid") == 1
    assert shop.orders() == ["o-paid"]
    assert shop.outbox_rows(failed) == [], "the rolled-back effect left no row"
    (row,) = shop.outbox_rows(paid)
    assert row.message.task_id == receipt_task
    assert row.published and row.sweep_publishes == 0, "published by the delivery, after commit"
    assert outbox.count_unpublished(shop.app) == 0


def test_twin_published_without_waiting_for_the_commit_a_rolled_back_order_gets_a_receipt(
    twin_shop: OutboxShop,
) -> None:
    shop = twin_shop
    shop.start_worker(sabotage=(PUBLISHED_WITHOUT_COMMIT,))
    failed = shop.pay("o-fail", fail_in_effect=True)
    shop.wait_state(failed, "FAILED")
    wait_for(lambda: shop.receipts("o-fail") == 1, 10, "the rolled-back order's receipt")
    assert shop.orders() == [], "the order was never marked paid"
    assert shop.outbox_rows(failed) == []


def test_a_worker_killed_between_commit_and_publish_leaves_the_receipt_to_the_sweep(
    outbox_shop: OutboxShop,
) -> None:
    shop = outbox_shop
    _, row = shop.committed_then_killed("o-kill")
    report = run_sweep(shop.agboss, claim_tick=False)
    assert report.outbox_published == 1
    receipt_task = row.message.task_id
    shop.wait_state(receipt_task, "COMPLETED")
    assert shop.receipts("o-kill") == 1
    found = outbox.read(shop.app, receipt_task)
    assert found is not None and found.published and found.sweep_publishes == 1
    assert run_sweep(shop.agboss, claim_tick=False).outbox_published == 0, "published once"


def test_twin_a_sweep_that_does_not_republish_never_sends_the_killed_workers_receipt(
    twin_shop: OutboxShop,
) -> None:
    shop = twin_shop
    _, row = shop.committed_then_killed("o-kill")
    with sabotage(SWEEP_NOT_REPUBLISHING):
        report = run_sweep(shop.agboss, claim_tick=False)
    assert report.outbox_published == 0
    shop.assert_stays(lambda: shop.receipts("o-kill") == 0, 1.0)
    found = outbox.read(shop.app, row.message.task_id)
    assert found is not None and not found.published
