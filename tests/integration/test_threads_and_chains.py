"""Trap 2 in a threads pool, and a chain's link fired only by the completing delivery.

``-P threads -c 4``: deliveries of one task instance run side by side in one process,
so per-delivery state lives on ``self.request`` (thread-local), and a copy of a
running execution delivered to another thread of the same process is deferred like
any other (the lease is never re-entrant). In a chain ``charge | ship``, a deferred
copy of the charge and a late duplicate of the finished charge send no ``ship``:
it runs once, after the charge completed.

Deployment speed-ups it relies on: the harness's (``-Q``, a 5 s lease, no beat:
tests/integration/harness.py).
"""

from __future__ import annotations

import pytest

from celery_agboss import answer_pause
from celery_agboss.core.protections import REPLAY_SENDS_LINKS
from tests.integration.gateway_http import wait_for
from tests.integration.harness import Shop, ShopFactory

pytestmark = [pytest.mark.worker, pytest.mark.redis, pytest.mark.slow]


def test_two_executions_interleaved_in_a_threads_pool_keep_their_own_state(
    shop_factory: ShopFactory, database_url: str
) -> None:
    shop = shop_factory(database_url=database_url)
    worker = shop.start_worker(pool="threads", concurrency=4)
    orders = ("o-5a", "o-5b")
    ids = {
        order: str(
            shop.app.signature("it.charge_order", args=(order,), kwargs={"gate_name": order})
            .apply_async()
            .id
        )
        for order in orders
    }
    for order in orders:
        wait_for(lambda order=order: shop.gateway.gate_waiters(order), 20, f"{order} at its gate")
    assert {shop.gateway.gate_waiters(o)[0] for o in orders} == {worker.pid}, "one process"
    # A copy of o-5a, delivered to another thread of the same process, while it runs.
    shop.app.signature("it.charge_order", args=("o-5a",), kwargs={"gate_name": "o-5a"}).apply_async(
        task_id=ids["o-5a"]
    )
    wait_for(lambda: "execution.deferred" in shop.worker_log(), 20, "the copy to be deferred")
    shop.gateway.open_gate("o-5b")
    shop.wait_state(ids["o-5b"], "COMPLETED")
    shop.gateway.open_gate("o-5a")
    shop.wait_state(ids["o-5a"], "COMPLETED")
    payments = shop.gateway.gateway.payments
    assert sorted(p["reference"] for p in payments) == sorted(orders), "one payment per order"
    for order in orders:
        shop.wait_backend(ids[order], "SUCCESS")
        result = shop.app.AsyncResult(ids[order]).result
        paid = next(p for p in payments if p["id"] == result["payment"])
        assert (result["order"], paid["reference"]) == (order, order), "no state crossed over"
        assert len(shop.gateway.notes_of("body-start", ids[order])) == 1
        assert shop.gateway.notes_of("body-end", ids[order])[0].fields["outcome"] == "Outcome.SENT"


def charge_then_ship_with_duplicates(shop: Shop) -> tuple[str, str]:
    """``charge | plain_ship``: a copy of the charge while it runs, another after it ended.

    The charge and ship ids."""
    charge = shop.app.signature("it.charge_order", args=("o-6",), kwargs={"gate_name": "o-6"})
    final = (charge | shop.app.signature("it.plain_ship")).apply_async()
    charge_id = str(final.parent.id)
    wait_for(lambda: shop.gateway.gate_waiters("o-6"), 20, "the charge at its gate")
    running = shop.wait_state(charge_id, "RUNNING")
    shop.agboss.republish(running, reason="test duplicate")  # the same message, chain and all
    wait_for(lambda: "execution.deferred" in shop.worker_log(), 20, "the copy to be deferred")
    assert not shop.gateway.notes_of("ship"), "a deferred copy sends no link"
    shop.gateway.open_gate("o-6")
    shop.wait_backend(str(final.id), "SUCCESS")
    # A late duplicate of the finished charge replays its result.
    done = shop.wait_state(charge_id, "COMPLETED")
    wait_for(lambda: shop.execution(charge_id).links_dispatched, 10, "the links to be recorded")
    shop.agboss.republish(done, reason="test late duplicate")
    wait_for(
        lambda: shop.worker_log().count(f"it.charge_order[{charge_id}] succeeded") == 2,
        20,
        "the late duplicate to end",
    )
    return charge_id, str(final.id)


def test_a_chained_ship_runs_once_and_only_after_the_charge_completed(
    shop_factory: ShopFactory,
) -> None:
    shop = shop_factory()
    shop.start_worker()
    charge_id, ship_id = charge_then_ship_with_duplicates(shop)
    shop.wait_logged(f"execution.replayed execution_id={charge_id}")
    shop.assert_stays(lambda: len(shop.gateway.notes_of("ship")) == 1, 1.0)
    ships = shop.gateway.notes_of("ship")
    assert ships[0].task_id == ship_id
    assert ships[0].at > shop.gateway.notes_of("body-end", charge_id)[0].at
    assert len(shop.gateway.gateway.payments) == 1


def test_a_replay_that_resends_its_links_ships_twice(shop_factory: ShopFactory) -> None:
    shop = shop_factory()
    shop.start_worker(sabotage=(REPLAY_SENDS_LINKS,))
    charge_then_ship_with_duplicates(shop)
    wait_for(lambda: len(shop.gateway.notes_of("ship")) == 2, 20, "a second ship")


def test_a_chained_ship_waits_for_a_paused_charge_and_runs_once_after_it(
    shop_factory: ShopFactory,
) -> None:
    shop = shop_factory()
    shop.start_worker()
    charge = shop.app.signature("it.approved_charge", args=("o-13",))
    final = (charge | shop.app.signature("it.plain_ship")).apply_async()
    charge_id = str(final.parent.id)
    shop.wait_state(charge_id, "PAUSED")
    shop.assert_stays(lambda: not shop.gateway.notes_of("ship"), 1.0)  # no link on a pause
    answer_pause(shop.app, f"{charge_id}:approve", {"approved": True, "by": "ops"})
    completed = shop.wait_state(charge_id, "COMPLETED", timeout=30)
    shop.wait_backend(str(final.id), "SUCCESS")
    shop.assert_stays(lambda: len(shop.gateway.notes_of("ship")) == 1, 1.0)
    assert shop.gateway.notes_of("ship")[0].task_id == str(final.id)
    assert completed.terminal_at_ms is not None
    assert shop.gateway.notes_of("ship")[0].at * 1000 >= completed.terminal_at_ms - 1000
    assert len(shop.gateway.gateway.payments) == 1
