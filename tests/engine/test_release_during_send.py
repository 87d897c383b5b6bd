"""A send that passed its lease check just before another thread released the lease
must not go out after the release (design: P1, R18), on both stores."""

from __future__ import annotations

import threading

from celery_agboss.core import protections, sabotage
from celery_agboss.core.execution_context import ExecutionContext
from celery_agboss.errors import ExecutionFencedError
from tests.engine.helpers import Background, Shop


class _PausedAfterLeaseCheck(ExecutionContext):
    """A delivery whose sending thread is descheduled right after its lease check."""

    checked: threading.Event
    go: threading.Event

    def assert_can_send(self) -> None:
        super().assert_can_send()
        self.checked.set()
        assert self.go.wait(10), "the test never let the send go on"


def _paused_delivery(shop: Shop, execution_id: str) -> _PausedAfterLeaseCheck:
    ctx = _PausedAfterLeaseCheck.start(shop.store, execution_id, shop.settings)
    assert isinstance(ctx, _PausedAfterLeaseCheck)
    ctx.checked = threading.Event()
    ctx.go = threading.Event()
    return ctx


def _release_under_a_checked_send(shop: Shop) -> tuple[BaseException | None, int]:
    """Thread B passes its lease check; the delivery's thread releases; then B goes on.

    Returns B's error and how many requests reached the gateway while a second delivery
    already held the lease."""
    charge = shop.charge_call()
    first = _paused_delivery(shop, "task-1")
    sending = Background(lambda: first.outbound(charge, {"amount": 100}), name="sender")
    assert first.checked.wait(10)
    assert first.release() is True  # the body "returned": nothing is registered as sending
    second = shop.start("task-1")  # the lease is free: the next delivery holds it now
    try:
        first.go.set()
        _, error = sending.outcome()
        behind_its_back = len(shop.gateway.requests)
    finally:
        second.release()
    return error, behind_its_back


def test_a_send_checked_before_another_thread_released_the_lease_is_not_sent(
    shop: Shop,
) -> None:
    """Once the lease is released, no send of that holder starts (design: P1, R18)."""
    error, behind_its_back = _release_under_a_checked_send(shop)
    assert isinstance(error, ExecutionFencedError)
    assert behind_its_back == 0
    # The claimed attempt is reconciled by the next delivery and sent once.
    charge = shop.settings.call_named("fake.charge")
    assert charge is not None
    with shop.start("task-1") as third:
        third.outbound(charge, {"amount": 100})
    assert len(shop.gateway.payments) == 1


def test_twin_without_the_check_a_send_goes_out_under_a_released_lease(shop: Shop) -> None:
    with sabotage.switched_off(protections.RELEASE_WITH_UNSETTLED_ATTEMPT):
        _, behind_its_back = _release_under_a_checked_send(shop)
    assert behind_its_back == 1  # sent while another delivery held the lease (then fenced)
