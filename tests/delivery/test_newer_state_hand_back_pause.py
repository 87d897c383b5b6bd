"""How long a worker of this version waits before it hands back the message of an
execution whose state a newer version wrote (a rolling upgrade).

It paused one second each time, however often the broker had handed the message back.
A RabbitMQ quorum queue counts every hand-back toward its ``delivery-limit`` (20 from
RabbitMQ 4.0) and drops the message past it: a rolling upgrade longer than about 20 s
lost the payment the newer version still had to continue. Now the pause doubles with
each hand-back the broker counted (``x-delivery-count``), up to 30 s, so the limit
takes about 8 minutes; the delivery still runs no body and writes nothing (twin
``newer-state-handed-back-at-once``; the money is counted on a real quorum queue in
``tests/integration/test_quorum_queue_newer_state.py``).

A soft time limit landing in that pause escaped as the task's error, and Celery
acknowledged the message: the payment waited for the newer version's sweep to
re-publish it. Now the message goes back all the same, and the pause stays under half
the delivery's shortest time limit (twin ``hand-back-pause-ignores-time-limits``; on a
real prefork worker in ``tests/integration/test_soft_time_limit_in_a_hand_back_pause.py``).
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest
from celery.exceptions import SoftTimeLimitExceeded
from sqlalchemy import select

from celery_agboss.core.protections import (
    HAND_BACK_PAUSE_IGNORES_TIME_LIMITS,
    NEWER_STATE_HANDED_BACK_AT_ONCE,
)
from celery_agboss.delivery import waits
from celery_agboss.store.schema_executions import executions
from celery_agboss.testing import sabotage
from tests.delivery.conftest import PaymentShop
from tests.support.newer_states import FUTURE_STATE, write_raw_state
from tests.support.processes import assert_stays, wait_until


def _raw_state(shop: PaymentShop, execution_id: str, state: str) -> None:
    write_raw_state(shop.agboss.store.engine, execution_id, state)


def _row(shop: PaymentShop, execution_id: str) -> tuple[Any, ...]:
    with shop.agboss.store.engine.connect() as conn:
        found = conn.execute(select(executions).where(executions.c.id == execution_id)).one()
    return tuple(found)


class _Pauses:
    """Stands for ``waits._sleep``: notes each pause, waits a moment only (the in-memory
    broker hands the message out again at once, so the test never waits the pause)."""

    def __init__(self) -> None:
        self.seen: list[float] = []
        self.lock = threading.Lock()

    def __call__(self, seconds: float) -> None:
        with self.lock:
            self.seen.append(seconds)
        time.sleep(0.05)


def _handed_back_after(shop: PaymentShop, monkeypatch: pytest.MonkeyPatch, counted: int) -> Any:
    """A message the broker already handed back ``counted`` times, of an execution a
    newer version moved on; the pauses of its hand-backs, until the upgrade "finishes"
    (a state this version knows, standing for the newer worker) and it runs once."""
    pauses = _Pauses()
    monkeypatch.setattr(waits, "_sleep", pauses)
    pay, ran = shop.pay_noting_each_run()

    task_id = str(pay.apply_async(("o-1",), headers={waits.DELIVERY_COUNT_HEADER: counted}).id)
    _raw_state(shop, task_id, FUTURE_STATE)
    before = _row(shop, task_id)
    with shop.worker():
        wait_until(lambda: len(pauses.seen) >= 2, 20, message="handed back twice")
        assert ran == [] and shop.gateway.requests == []
        assert _row(shop, task_id) == before
        _raw_state(shop, task_id, "REQUESTED")
        shop.wait_state(task_id, "COMPLETED")
    assert ran == ["o-1"] and len(shop.gateway.requests) == 1
    return SimpleNamespace(pauses=pauses.seen)


def test_a_message_the_broker_handed_back_three_times_waits_eight_seconds_before_the_next(
    shop: PaymentShop, monkeypatch: pytest.MonkeyPatch
) -> None:
    handed = _handed_back_after(shop, monkeypatch, counted=3)

    assert handed.pauses[0] == 8.0


def test_twin_without_the_back_off_a_counted_message_goes_back_after_a_second(
    shop: PaymentShop, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The harm: on a quorum queue, 20 hand-backs in about 20 s, then the message is
    dropped (counted at the gateway on a real quorum queue, see the module doc)."""
    with sabotage(NEWER_STATE_HANDED_BACK_AT_ONCE):
        handed = _handed_back_after(shop, monkeypatch, counted=3)

    assert handed.pauses[0] == 1.0


@pytest.mark.parametrize(
    ("counted", "pause"),
    [(None, 1.0), (0, 1.0), (1, 2.0), (2, 4.0), (4, 16.0), (5, 30.0), (19, 30.0), (10**9, 30.0)],
)
def test_the_pause_doubles_with_each_hand_back_up_to_thirty_seconds(
    counted: int | None, pause: float
) -> None:
    headers = {} if counted is None else {waits.DELIVERY_COUNT_HEADER: counted}
    assert waits.newer_state_pause(SimpleNamespace(headers=headers)) == pause


def test_twenty_hand_backs_take_minutes_not_seconds() -> None:
    """RabbitMQ 4.0's default ``delivery-limit``, reached after this long."""
    total = sum(
        waits.newer_state_pause(SimpleNamespace(headers={waits.DELIVERY_COUNT_HEADER: n}))
        for n in range(20)
    )
    assert total >= 8 * 60


class _SoftLimitInTheFirstPause(_Pauses):
    """Stands for ``waits._sleep``: the first pause is cut by the task's soft time limit."""

    def __call__(self, seconds: float) -> None:
        super().__call__(seconds)
        if len(self.seen) == 1:
            raise SoftTimeLimitExceeded()


def _cut_by_a_soft_limit(shop: PaymentShop, monkeypatch: pytest.MonkeyPatch) -> Any:
    """An execution a newer version moved on, its first pause cut by a soft time limit;
    ``upgraded()`` stands for the newer worker finishing the upgrade."""
    pauses = _SoftLimitInTheFirstPause()
    monkeypatch.setattr(waits, "_sleep", pauses)
    charge = shop.call()

    @shop.task()
    def pay(self: Any, order: str) -> Any:
        return self.outbound(charge, {"amount": 1000, "order": order}, business_key=order)

    task_id = str(pay.apply_async(("o-1",)).id)
    _raw_state(shop, task_id, FUTURE_STATE)
    return SimpleNamespace(
        pauses=pauses.seen,
        task_id=task_id,
        upgraded=lambda: _raw_state(shop, task_id, "REQUESTED"),
    )


def test_a_soft_time_limit_in_the_pause_still_hands_the_message_back(
    shop: PaymentShop, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = _cut_by_a_soft_limit(shop, monkeypatch)
    with shop.worker():
        wait_until(lambda: len(run.pauses) >= 2, 20, message="delivered again after the limit")
        assert shop.gateway.requests == []
        run.upgraded()
        shop.wait_state(run.task_id, "COMPLETED")
    assert len(shop.gateway.requests) == 1


def test_twin_a_soft_time_limit_in_the_pause_acknowledges_the_message(
    shop: PaymentShop, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The harm: the message is gone, and the upgraded execution is never charged (until
    a sweep of the newer version re-publishes it, after its grace)."""
    with sabotage(HAND_BACK_PAUSE_IGNORES_TIME_LIMITS):
        run = _cut_by_a_soft_limit(shop, monkeypatch)
        with shop.worker():
            wait_until(lambda: len(run.pauses) >= 1, 20, message="the first pause")
            run.upgraded()
            # A message handed back runs again within the fake pause (0.05 s).
            assert_stays(lambda: shop.gateway.requests == [], 2.0)
    assert run.pauses == [1.0]


@pytest.mark.parametrize(
    ("timelimit", "task_limits", "pause"),
    [
        ((None, 3), (None, None), 1.5),
        ((10, None), (None, None), 5.0),
        ((None, None), (None, 4), 2.0),
        ((100, 90), (2, 1), 30.0),
        ((None, None), (None, None), 30.0),
    ],
)
def test_the_pause_stays_under_half_the_shortest_time_limit(
    timelimit: tuple[float | None, float | None],
    task_limits: tuple[float | None, float | None],
    pause: float,
) -> None:
    """The message's limits, else the task's (Celery's rule); the pause here would be 30 s."""
    request = SimpleNamespace(headers={waits.DELIVERY_COUNT_HEADER: 7}, timelimit=timelimit)
    task = SimpleNamespace(time_limit=task_limits[0], soft_time_limit=task_limits[1])
    assert waits.newer_state_pause(request, task) == pause


def test_twin_without_the_cap_the_pause_runs_past_a_three_second_soft_limit() -> None:
    request = SimpleNamespace(headers={waits.DELIVERY_COUNT_HEADER: 7}, timelimit=(None, 3))
    with sabotage(HAND_BACK_PAUSE_IGNORES_TIME_LIMITS):
        assert waits.newer_state_pause(request) == 30.0
