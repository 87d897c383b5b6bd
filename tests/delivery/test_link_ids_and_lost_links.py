"""Links sent again never charge again, and links that did not go out are sent
(design: terminal replays, publishes from a body).

Celery sends an execution's links (callbacks, the chain's next step, errbacks), then
stores its result and counts its chord part, then calls ``on_success``/``on_failure``,
where ``links_dispatched`` is recorded. When that record is lost (a store error, a kill
in between), a duplicate replays the execution and sends its links again:

- every task inside a group, chain or chord link goes out under the id fixed at
  publish, so the second send is the same executions, never a second charge;
- the replay does not count its chord part again when the result backend holds its
  result, so a key-value backend does not fail the chord before its body runs.

A send of the links that raised after the execution completed is not recorded as sent:
the message goes back to the broker, and its redelivery sends them.

``links_not_recorded`` makes every ``mark_links_dispatched`` raise, as a lost write.
The waits are deterministic (the second run of every ``ship`` delivery, counted by
``task_postrun``); a short ``assert_stays`` then checks nothing more arrives.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from celery import chain, chord, group
from celery import signals as celery_signals
from kombu.exceptions import OperationalError

from celery_agboss.core.protections import (
    CANVAS_LINK_MEMBERS_UNFIXED,
    FAILED_LINK_SEND_ACKED,
    FAILED_LINK_SEND_RECORDED_SENT,
    REPLAY_RECOUNTS_STORED_CHORD_PART,
)
from celery_agboss.errors import StoreUnavailableError
from celery_agboss.runtime.messages import loads
from celery_agboss.store.execution_store import SQLAlchemyExecutionStore
from celery_agboss.testing.switches import sabotage
from tests.delivery.conftest import PaymentShop
from tests.support.processes import assert_stays, wait_until


@pytest.fixture
def shop_config() -> dict[str, Any]:
    # The chord join gives up quickly: an early join (a part counted twice) fails at once.
    return {"result_chord_join_timeout": 0.5}


@pytest.fixture
def links_not_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    def lost(self: Any, execution_id: str) -> None:
        raise StoreUnavailableError("test: the write of links_dispatched was lost")

    monkeypatch.setattr(SQLAlchemyExecutionStore, "mark_links_dispatched", lost)


@pytest.fixture
def runs() -> Iterator[Counter[str]]:
    """How many deliveries of each task name (and of each task id) ended."""
    counted: Counter[str] = Counter()

    def count(sender: Any = None, task_id: Any = None, **_: Any) -> None:
        counted[getattr(sender, "name", str(sender))] += 1
        counted[str(task_id)] += 1

    celery_signals.task_postrun.connect(count, weak=False)
    try:
        yield counted
    finally:
        celery_signals.task_postrun.disconnect(count)


# --- C1: every task in a canvas link keeps its id -----------------------------------------


def _shop_tasks(shop: PaymentShop) -> tuple[Any, Any, Any]:
    charge, shipping = shop.call("shop.charge"), shop.call("shop.shipping")

    @shop.task()
    def ship(self: Any, paid: Any, what: str) -> Any:
        # A callback gets pay's result; an errback gets pay's task id.
        reference = paid["reference"] if isinstance(paid, dict) else str(paid)
        return self.outbound(shipping, {"amount": 500, "order": f"{reference}:{what}"})

    @shop.task()
    def pay(self: Any, order: str, fail: bool = False) -> Any:
        if fail:
            raise ValueError("test: the order is refused")
        return self.outbound(charge, {"amount": 1000, "order": order}, business_key=order)

    @shop.app.task(shared=False, name="shop.notify")
    def notify(paid: Any) -> str:
        return "notified"

    return pay, ship, notify


LINKS: dict[str, Callable[[Any, Any], tuple[dict[str, Any], int]]] = {
    "group": lambda ship, notify: ({"link": group(ship.s("box-1"), ship.s("box-2"))}, 2),
    "chain": lambda ship, notify: ({"link": chain(ship.s("box-1"), notify.s())}, 1),
    "errback-group": lambda ship, notify: (
        {"link_error": group(ship.s("box-1"), ship.s("box-2"))},
        2,
    ),
}


def _a_link_sent_twice(shop: PaymentShop, runs: Counter[str], shape: str) -> int:
    """``pay`` with a canvas link completes (or fails, for errbacks) and its links go out;
    ``links_dispatched`` is lost; a duplicate replays it and sends the links again. The
    shipping requests once every ``ship`` delivery of both sends ended; how many the
    first send made."""
    pay, ship, notify = _shop_tasks(shop)
    options, ships = LINKS[shape](ship, notify)
    fail = shape.startswith("errback")
    with shop.worker(concurrency=3):
        task_id = str(pay.apply_async(("o-1",), {"fail": fail}, **options).id)
        shop.wait_state(task_id, "FAILED" if fail else "COMPLETED")
        wait_until(lambda: runs[ship.name] == ships, 15, message="the first shipping")
        first = shop.times_sent("shop.shipping")
        assert first == ships
        shop.agboss.republish(shop.execution(task_id), reason="test: a duplicate")
        wait_until(lambda: runs[task_id] == 2, 10, message="the duplicate's replay")
        wait_until(lambda: runs[ship.name] == 2 * ships, 15, message="the links sent again")
        settled = shop.times_sent("shop.shipping")
        assert_stays(lambda: shop.times_sent("shop.shipping") == settled, 1.0)
    return first


@pytest.mark.usefixtures("links_not_recorded")
@pytest.mark.parametrize("shape", list(LINKS))
def test_a_canvas_link_sent_again_ships_each_box_once(
    shop: PaymentShop, runs: Counter[str], shape: str
) -> None:
    first = _a_link_sent_twice(shop, runs, shape)
    assert shop.times_sent("shop.shipping") == first, "the same ship executions, each charged once"


@pytest.mark.usefixtures("links_not_recorded")
@pytest.mark.parametrize("shape", list(LINKS))
def test_members_under_new_ids_ship_every_box_twice(
    shop: PaymentShop, runs: Counter[str], shape: str
) -> None:
    with sabotage(CANVAS_LINK_MEMBERS_UNFIXED):
        first = _a_link_sent_twice(shop, runs, shape)
    assert shop.times_sent("shop.shipping") == 2 * first, "a second charge for every box"


def test_every_task_of_a_canvas_link_gets_an_id_fixed_at_publish(shop: PaymentShop) -> None:
    """The ids are in the recorded message, derived from the execution and the place in
    the link (a chord's header group, its parts and its body included)."""
    pay, ship, notify = _shop_tasks(shop)
    link = chain(ship.s("box-1"), chord([ship.s("box-2"), ship.s("box-3")], notify.s()))
    task_id = str(pay.apply_async(("o-1",), link=link).id)
    callbacks = loads(shop.execution(task_id).options)["link"]
    found: list[str] = []

    def walk(sig: Any) -> None:
        found.append(str(sig["options"].get("task_id")))
        kwargs = sig.get("kwargs") or {}
        members = kwargs.get("tasks") or kwargs.get("header") or () if "subtask_type" in sig else ()
        for member in [*members, *([kwargs["body"]] if sig.get("subtask_type") == "chord" else [])]:
            walk(member)

    for sig in callbacks:
        walk(sig)
    # the chain, ship, the chord (its header group), two parts, the body
    assert len(found) == 6 and "None" not in found, found
    assert len(set(found)) == 5, "the chain's id is its last task's (the chord's)"


# --- C3: links whose send raised after the verdict are sent, never marked sent ------------


def _a_next_step_refused_once(
    shop: PaymentShop,
    monkeypatch: pytest.MonkeyPatch,
    runs: Counter[str],
    then: Callable[[], object],
) -> str:
    """``chain(pay, ship)``: pay completes, and sending ship (the chain's next step)
    raises once, as a broker that refused it; ``then`` runs, with the worker, once that
    delivery ended. Pay's id."""
    pay, ship, _ = _shop_tasks(shop)
    refused: list[BaseException] = []
    real = ship.apply_async

    def flaky(*args: Any, **kwargs: Any) -> Any:
        if not refused:
            refused.append(OperationalError("test: the broker refused the next step"))
            raise refused[0]
        return real(*args, **kwargs)

    monkeypatch.setattr(ship, "apply_async", flaky)
    with shop.worker():
        res = chain(pay.s("o-1"), ship.s("box-1")).apply_async()
        pay_id = str(res.parent.id)
        shop.wait_state(pay_id, "COMPLETED")
        wait_until(lambda: refused and runs[pay_id] >= 1, 10, message="the refused send")
        then()
    return pay_id


def test_a_next_step_whose_send_raised_is_sent_once(
    shop: PaymentShop, monkeypatch: pytest.MonkeyPatch, runs: Counter[str]
) -> None:
    def shipped_once() -> None:
        wait_until(
            lambda: shop.times_sent("shop.shipping") == 1,
            15,
            message="the step sent by the redelivery",
        )
        assert_stays(lambda: shop.times_sent("shop.shipping") == 1, 1.0)

    pay_id = _a_next_step_refused_once(shop, monkeypatch, runs, shipped_once)
    assert shop.execution(pay_id).links_dispatched


def _never_shipped(shop: PaymentShop) -> Callable[[], None]:
    # The message handed back comes again after a pause of 0.2 s (the test retry delay).
    return lambda: assert_stays(lambda: shop.times_sent("shop.shipping") == 0, 2.0)


def test_recording_it_sent_loses_the_next_step(
    shop: PaymentShop, monkeypatch: pytest.MonkeyPatch, runs: Counter[str]
) -> None:
    with sabotage(FAILED_LINK_SEND_RECORDED_SENT):
        pay_id = _a_next_step_refused_once(shop, monkeypatch, runs, _never_shipped(shop))
    assert shop.execution(pay_id).links_dispatched, "paid, never shipped, recorded as sent"


def test_acknowledging_it_leaves_the_next_step_unsent(
    shop: PaymentShop, monkeypatch: pytest.MonkeyPatch, runs: Counter[str]
) -> None:
    with sabotage(FAILED_LINK_SEND_ACKED):
        pay_id = _a_next_step_refused_once(shop, monkeypatch, runs, _never_shipped(shop))
    assert not shop.execution(pay_id).links_dispatched, "paid, never shipped"


# --- C2: a replay does not count a chord part the result backend holds --------------------


def _a_chord_part_replayed_without_its_mark(
    shop: PaymentShop, runs: Counter[str]
) -> tuple[Any, int]:
    """Two header parts; the first completes (its ``links_dispatched`` lost) and a
    duplicate replays it while the second is held; then the second returns. The chord's
    result and the total the body charged (0 when it never ran)."""
    charge = shop.call()
    second_may_go = threading.Event()

    @shop.task()
    def part(self: Any, order: str) -> Any:
        if order == "o-b":
            assert second_may_go.wait(20)
        return self.outbound(charge, {"amount": 100, "order": order}, business_key=order)

    @shop.task()
    def settle(self: Any, receipts: list[Any]) -> Any:
        total = 100 * len(receipts)
        return self.outbound(charge, {"amount": total, "order": "total"}, business_key="total")

    with shop.worker(concurrency=3):
        result = chord([part.s("o-a"), part.s("o-b")])(settle.s())
        first_id = str(result.parent.results[0].id)
        shop.wait_state(first_id, "COMPLETED")
        wait_until(lambda: runs[first_id] == 1, 10, message="the first part")
        shop.agboss.republish(shop.execution(first_id), reason="test: a duplicate")
        wait_until(lambda: runs[first_id] == 2, 10, message="the replay")
        second_may_go.set()
        wait_until(lambda: result.ready(), 20, message="the chord's body")
    totals = [r.amount for r in shop.gateway.requests if r.amount == 200]
    return result, sum(totals)


@pytest.mark.usefixtures("links_not_recorded")
def test_a_replayed_part_whose_mark_was_lost_lets_the_body_run(
    shop: PaymentShop, runs: Counter[str]
) -> None:
    result, total = _a_chord_part_replayed_without_its_mark(shop, runs)
    assert result.successful() and total == 200, "the body charged the total, once"


@pytest.mark.usefixtures("links_not_recorded")
def test_counting_it_again_fails_the_chord_and_the_body_never_runs(
    shop: PaymentShop, runs: Counter[str]
) -> None:
    with sabotage(REPLAY_RECOUNTS_STORED_CHORD_PART):
        result, total = _a_chord_part_replayed_without_its_mark(shop, runs)
    assert result.failed() and total == 0, "both parts paid, the total never charged"
