"""A replay (design: terminal replays) of a chord's header part touches no chord counter.

Celery's key-value result backends (memcached, the cache backend these tests use)
count header parts as they return; a duplicate of a completed part that replayed its
result and counted it again would make the count reach the header's size before the
other part finished: the join times out and the chord fails although every part paid.
(Celery 5.7's Redis backend keeps a set of the parts it counted; older ones did not.)
Speed-up: a 0.5 s chord join timeout instead of Celery's 3 s, so the early join gives up
while the second part is still held.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from celery import chord
from celery import signals as celery_signals

from celery_agboss.core.protections import REPLAY_COUNTS_CHORD
from celery_agboss.testing.switches import sabotage
from tests.delivery.conftest import PaymentShop
from tests.support.processes import wait_until


@pytest.fixture
def shop_config() -> dict[str, Any]:
    return {"result_chord_join_timeout": 0.5}


def _a_chord_whose_part_is_replayed(shop: PaymentShop) -> tuple[Any, list[Any]]:
    charge = shop.call()
    second_may_go = threading.Event()
    collected: list[Any] = []

    @shop.task()
    def part(self: Any, order: str) -> Any:
        if order == "o-b":
            assert second_may_go.wait(60)
        return self.outbound(charge, {"amount": 100, "order": order}, business_key=order)

    @shop.app.task(shared=False, name="shop.collect")
    def collect(results: list[Any]) -> int:
        collected.append(results)
        return len(results)

    finished: list[str] = []

    def count_runs(task_id: Any = None, state: Any = None, **_: Any) -> None:
        # Only runs that returned: a run that met store trouble (a lock timeout under
        # load) is retried, and counting it would let the second part go before the replay.
        if state == "SUCCESS":
            finished.append(str(task_id))

    celery_signals.task_postrun.connect(count_runs, weak=False)
    try:
        with shop.worker(concurrency=3):
            header = [part.s("o-a"), part.s("o-b")]
            result = chord(header)(collect.s())
            first_id = str(result.parent.results[0].id)
            shop.wait_state(first_id, "COMPLETED")
            wait_until(
                lambda: shop.execution(first_id).links_dispatched,
                10,
                message="the first part's links",
            )
            shop.agboss.republish(shop.execution(first_id), reason="test: a duplicate")
            # Celery counts a part (and joins, when the count is full) before task_postrun.
            wait_until(lambda: finished.count(first_id) == 2, 30, message="the replay")
            assert not collected, "the callback ran before the second part returned"
            second_may_go.set()
            wait_until(lambda: result.ready(), 20, message="the chord's callback")
    finally:
        celery_signals.task_postrun.disconnect(count_runs)
    return result, collected


def test_a_replay_of_a_chord_part_touches_no_counter(shop: PaymentShop) -> None:
    result, collected = _a_chord_whose_part_is_replayed(shop)
    assert result.get(timeout=5) == 2 and len(collected) == 1


def test_a_replay_that_counts_its_part_again_breaks_the_chord(shop: PaymentShop) -> None:
    with sabotage(REPLAY_COUNTS_CHORD):
        result, collected = _a_chord_whose_part_is_replayed(shop)
    assert result.failed() and collected == [], "two payments, and the chord failed"
