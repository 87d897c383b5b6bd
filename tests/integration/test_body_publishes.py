"""Publishes from a body and ``UNMANAGED`` (design: publishes from a body, unmanaged), with
real workers on Redis.

P3 through what a payment body publishes. ``it.bp.pay_then_ship`` publishes a canvas
of shipments, then charges; that charge's answer is lost (``ANSWER_THEN_DROP``), so
the library retries and the body runs again from the top, reaching the publish again
(tests/integration/apps/body_publish_tasks.py). A chain, a group or a chord published
from a body is published once per execution and position: one shipping charge per
order. The twin gives the re-run's canvas new ids, as Celery does: a second shipment
of every order, charged. A canvas inside a canvas is refused before anything goes out
(its twin lets it through: two shipments).

A plain task matching ``agboss_payment_tasks`` (a rolling deploy: the publisher knows the
task only by the pattern, the worker still runs the plain task) is recorded at publish;
the worker that receives it ends it ``UNMANAGED`` before it runs, so it runs once and the
sweep never publishes it again. The twin leaves it ``REQUESTED``: the sweep re-publishes
it up to the recovery cap, four runs and four charges, then ``PARKED``.

Each guarantee runs on SQLite and PostgreSQL; its twin on PostgreSQL only, since what the
twin switches off (a publish's id, a plain task's ``UNMANAGED``) is decided above the store.

Deployment speed-ups it relies on: the harness's (``-Q``, a 5 s lease, a 1 s retry
delay, no beat: tests/integration/harness.py); the rolling deploy also sets
``agboss_requested_grace`` to 1 s (300 s by default) and a recovery cap of 3 (10).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from celery import Celery
from celery.bin.base import CLIContext
from click.testing import CliRunner

from celery_agboss import AGBoss
from celery_agboss.cli import agboss as agboss_command
from celery_agboss.core.executions import ExecutionRecord
from celery_agboss.core.protections import BODY_PUBLISHES_GET_NEW_IDS, PLAIN_TASK_LEFT_REQUESTED
from celery_agboss.signals import disconnect
from celery_agboss.testing.gateway_types import FakeGatewayFault
from tests.integration.gateway_http import wait_for
from tests.integration.harness import Shop, ShopFactory

pytestmark = [pytest.mark.worker, pytest.mark.redis, pytest.mark.slow]

SHIP = "it.bp.ship"
CAP = 3


def _ships(shop: Shop) -> list[ExecutionRecord]:
    """Every shipment recorded (each publish of ``it.bp.ship`` is recorded before it goes
    out, so once the payment completed every shipment it published is here)."""
    records = shop.agboss.executions.list_executions(limit=100)
    return [record for record in records if record.task_name == SHIP]


def _shipping_charges(shop: Shop, order: str) -> int:
    return sum(1 for p in shop.gateway.gateway.payments if p["reference"] == f"ship:{order}")


def _pay_then_ship(shop: Shop, orders: list[str], shape: str) -> str:
    """Publish the payment with its charge's answer lost; let the shipments through once
    it completed; return once every recorded shipment ran (and its chain's or chord's
    plain task, when it has one)."""
    gate = f"ship-{uuid.uuid4().hex[:8]}"
    shop.gateway.gateway.inject_fault(FakeGatewayFault.ANSWER_THEN_DROP, operation="charge")
    task_id = str(
        shop.app.signature("it.bp.pay_then_ship", args=(orders, shape, gate)).apply_async().id
    )
    shop.wait_state(task_id, "COMPLETED", timeout=60)
    assert len(shop.gateway.notes_of("published", task_id)) == 2, "the body ran twice"
    shop.gateway.open_gate(gate)
    wait_for(
        lambda: all(r.state.value == "COMPLETED" for r in _ships(shop)),
        60,
        lambda: f"every shipment to complete ({[r.state.value for r in _ships(shop)]})",
    )
    ships = len(_ships(shop))
    notifies = {"chain": ships, "chord": ships // len(orders)}.get(shape, 0)
    wait_for(
        lambda: len(shop.gateway.notes_of("notify")) >= notifies,
        30,
        lambda: f"{notifies} notifications (saw {len(shop.gateway.notes_of('notify'))})",
    )
    return task_id


@pytest.mark.parametrize("shape", ["chain", "group", "chord"])
def test_a_canvas_published_from_a_body_ships_each_order_once_across_reruns(
    shop_factory: ShopFactory, database_url: str, shape: str
) -> None:
    shop = shop_factory(database_url=database_url)
    shop.start_worker(concurrency=3)
    orders = ["o-1"] if shape == "chain" else ["o-1", "o-2"]
    task_id = _pay_then_ship(shop, orders, shape)
    for order in orders:
        assert _shipping_charges(shop, order) == 1, order
    assert len(_ships(shop)) == len(orders)
    results = {n.fields["result"] for n in shop.gateway.notes_of("published", task_id)}
    assert len(results) == 1, "both runs handed the body the same result"
    if shape != "group":  # the plain task after the shipments: once here
        assert len(shop.gateway.notes_of("notify")) == 1


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
@pytest.mark.parametrize("shape", ["chain", "group", "chord"])
def test_new_ids_on_the_rerun_ship_every_order_twice(
    shop_factory: ShopFactory, database_url: str, shape: str
) -> None:
    shop = shop_factory(database_url=database_url)
    shop.start_worker(concurrency=3, sabotage=(BODY_PUBLISHES_GET_NEW_IDS,))
    orders = ["o-1"] if shape == "chain" else ["o-1", "o-2"]
    _pay_then_ship(shop, orders, shape)
    for order in orders:
        assert _shipping_charges(shop, order) == 2, order


def test_a_canvas_inside_a_canvas_is_refused_and_ships_nothing(
    shop_factory: ShopFactory, database_url: str
) -> None:
    shop = shop_factory(database_url=database_url)
    shop.start_worker(concurrency=3)
    nested = shop.app.signature("it.bp.pay_then_ship", args=(["o-1"], "nested", "never"))
    task_id = str(nested.apply_async().id)
    record = shop.wait_state(task_id, "FAILED")
    assert "Publish its first task" in str(record.error)
    assert "celery_agboss.outbox" in str(record.error)
    assert _ships(shop) == []
    assert shop.gateway.gateway.payments == [], "nothing charged, nothing shipped"


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_a_canvas_inside_a_canvas_let_through_ships_twice(
    shop_factory: ShopFactory, database_url: str
) -> None:
    shop = shop_factory(database_url=database_url)
    shop.start_worker(concurrency=3, sabotage=(BODY_PUBLISHES_GET_NEW_IDS,))
    _pay_then_ship(shop, ["o-1"], "nested")
    assert _shipping_charges(shop, "o-1") == 2


# --- a plain task recorded as a payment task --------------------------------------------


@contextmanager
def _web_publisher(shop: Shop) -> Iterator[Celery]:
    """A web process's app: AGBoss on the shop's store, none of its tasks imported, and
    ``it.plain_*`` declared in ``agboss_payment_tasks`` (the task being ported)."""
    config = shop.config
    web = Celery(f"web_{config['queue']}", broker=config["broker_url"])
    web.conf.update(
        task_default_queue=config["queue"],
        broker_connection_retry_on_startup=True,
        agboss_database_url=config["database_url"],
        agboss_pseudonym_key="integration-tests-pseudonym-key",
        agboss_sweep_interval=0,
        agboss_payment_tasks=["it.plain_*"],
    )
    agboss = AGBoss(web)
    try:
        yield web
    finally:
        disconnect(agboss)
        agboss.close()
        web.close()


def _charges_of(shop: Shop, order: str) -> int:
    return sum(1 for p in shop.gateway.gateway.payments if p["reference"] == order)


def test_a_plain_task_published_by_its_pattern_runs_once_and_ends_unmanaged(
    shop_factory: ShopFactory, database_url: str
) -> None:
    shop = shop_factory(database_url=database_url, requested_grace=1, max_recovery_attempts=CAP)
    shop.start_worker()
    with _web_publisher(shop) as web, shop.capturing_events() as events, shop.sweeping():
        task_id = str(web.send_task("it.plain_charge", args=("o-1",)).id)
        shop.wait_state(task_id, "UNMANAGED")
        wait_for(lambda: _charges_of(shop, "o-1") == 1, 20, "the plain task's charge")
        # Past the grace, again and again: the sweep leaves it alone.
        Shop.assert_stays(
            lambda: _charges_of(shop, "o-1") == 1 and _state(shop, task_id) == "UNMANAGED",
            (CAP + 2) * 1.0,
        )
        wait_for(lambda: "UNMANAGED" in Shop.flower_state(events, task_id), 10, "Flower's state")
    shop.wait_logged("execution.unmanaged")
    logged = [line for line in shop.worker_log().splitlines() if "execution.unmanaged" in line]
    assert len(logged) == 1, logged
    assert "task=it.plain_charge" in logged[0] and "pattern=it.plain_*" in logged[0]
    listed = CliRunner().invoke(
        agboss_command,
        ["executions", "--state", "UNMANAGED"],
        obj=_cli_context(shop.app),
        catch_exceptions=False,
    )
    assert task_id in listed.output


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_a_plain_task_left_requested_is_republished_until_parked(
    shop_factory: ShopFactory, database_url: str
) -> None:
    shop = shop_factory(database_url=database_url, requested_grace=1, max_recovery_attempts=CAP)
    shop.start_worker(sabotage=(PLAIN_TASK_LEFT_REQUESTED,))
    with _web_publisher(shop) as web, shop.sweeping():
        task_id = str(web.send_task("it.plain_charge", args=("o-1",)).id)
        shop.wait_state(task_id, "PARKED", timeout=60)
        wait_for(lambda: _charges_of(shop, "o-1") >= CAP + 1, 20, "every run's charge")
    assert _charges_of(shop, "o-1") == CAP + 1, "one publish, four charges"


def _state(shop: Shop, task_id: str) -> str | None:
    record = shop.execution(task_id)
    return None if record is None else record.state.value


def _cli_context(app: Celery) -> CLIContext:
    return CLIContext(app=app, no_color=True, workdir=None)
