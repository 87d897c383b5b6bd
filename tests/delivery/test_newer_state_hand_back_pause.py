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
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy import select, text

from celery_agboss.core.protections import NEWER_STATE_HANDED_BACK_AT_ONCE
from celery_agboss.delivery import waits
from celery_agboss.store.schema_executions import executions
from celery_agboss.testing import sabotage
from tests.delivery.conftest import PaymentShop
from tests.support.processes import wait_until

FUTURE_STATE = "SOME_FUTURE_STATE"
"""A state a newer version of the package may write; this one does not know it."""


def _raw_state(shop: PaymentShop, execution_id: str, state: str) -> None:
    """Write ``state`` into the row by raw SQL, as a newer version's worker would."""
    with shop.agboss.store.engine.begin() as conn:
        conn.execute(
            text("UPDATE agboss_executions SET state = :state WHERE id = :id"),
            {"state": state, "id": execution_id},
        )


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
    charge = shop.call()
    ran: list[str] = []

    @shop.task()
    def pay(self: Any, order: str) -> Any:
        ran.append(order)
        return self.outbound(charge, {"amount": 1000, "order": order}, business_key=order)

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
