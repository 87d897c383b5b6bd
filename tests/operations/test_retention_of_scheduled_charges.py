"""Retention and a scheduled charge cancelled before its ETA (design: retention).

A charge published with a ``countdown`` (a renewal, a delayed capture) and cancelled
before it is ``CANCELLED`` at once, while the broker holds its message until the ETA.
Retention deleted the row ``agboss_execution_retention`` after the cancel, whatever its
ETA: the message then found no row, was recorded afresh, and charged the customer who
cancelled. Now the row stays until its ETA too is older than the retention (twin
``retention-deletes-a-scheduled-execution``), on SQLite and PostgreSQL.

The worker's ETA timer runs on the wall clock, so the delivery test uses a short real
countdown and moves only the database clock: just far enough for the cancel to be older
than the retention, never the ETA.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from celery import signals as celery_signals

from celery_agboss.core.executions import ExecutionState
from celery_agboss.core.protections import RETENTION_DELETES_A_SCHEDULED_EXECUTION
from celery_agboss.operator import cancel
from celery_agboss.testing import sabotage
from tests.delivery.conftest import PaymentShop
from tests.operations.world import World, connected

RETENTION_SECONDS = 60.0
"""Every retention of the delivery test's app (database-clock seconds)."""
COUNTDOWN_SECONDS = 2.0
"""The scheduled charge's countdown: real seconds, the worker waits for them (the cancel
must come within it less ``MARGIN_MS``; ``cancel_a_scheduled_renewal`` checks it did)."""
MARGIN_MS = 200
"""How far past the cancel the retention's cutoff is put."""


@pytest.fixture
def shop_config() -> dict[str, Any]:
    return {
        "agboss_outbound_retention": RETENTION_SECONDS,
        "agboss_fenced_effect_retention": RETENTION_SECONDS,
        "agboss_execution_retention": RETENTION_SECONDS,
    }


@pytest.fixture
def finished() -> Iterator[dict[str, threading.Event]]:
    """``finished[task_id]`` is set once a worker has handled that task's message
    (``task_postrun``: sent whether the body ran, failed or was ignored). Read a task's
    event before a worker starts."""
    events: dict[str, threading.Event] = defaultdict(threading.Event)

    def on_postrun(task_id: str | None = None, **_: Any) -> None:
        events[str(task_id)].set()

    with connected(celery_signals.task_postrun, on_postrun):
        yield events


def cancel_a_scheduled_renewal(shop: PaymentShop) -> str:
    """A renewal charged ``COUNTDOWN_SECONDS`` from now, cancelled at once; then the
    database clock moves just past the cancel's retention (the ETA still ahead of the
    cutoff), and the sweep runs its retention."""
    charge = shop.call()

    @shop.task()
    def renew(self: Any, amount: int) -> Any:
        return self.outbound(charge, {"amount": amount, "order": self.request.id})

    execution_id = str(renew.apply_async((900,), countdown=COUNTDOWN_SECONDS).id)
    cancelled = cancel(shop.app, execution_id, "the customer cancelled the renewal")
    assert cancelled.state is ExecutionState.CANCELLED
    assert cancelled.terminal_at_ms is not None and cancelled.eta_ms is not None
    store = shop.agboss.store
    cutoff = cancelled.terminal_at_ms + MARGIN_MS
    assert cancelled.eta_ms > cutoff, "the cancel came too late: the ETA is not ahead of it"
    shop.clock.advance((cutoff + int(RETENTION_SECONDS * 1000) - store.now_ms()) / 1000)
    shop.sweep()
    return execution_id


def deliver_at_its_eta(shop: PaymentShop, done: threading.Event) -> None:
    with shop.worker():
        assert done.wait(COUNTDOWN_SECONDS + 20), "the scheduled message to be delivered"


def test_a_cancelled_scheduled_charge_is_never_charged_after_retention_ran(
    shop: PaymentShop, finished: dict[str, threading.Event]
) -> None:
    execution_id = cancel_a_scheduled_renewal(shop)

    deliver_at_its_eta(shop, finished[execution_id])

    assert shop.gateway.requests == []  # the retention kept the row: the message dropped
    assert shop.execution(execution_id).state is ExecutionState.CANCELLED


def test_twin_retention_deleting_a_scheduled_execution_charges_a_cancelled_renewal(
    shop: PaymentShop, finished: dict[str, threading.Event]
) -> None:
    with sabotage(RETENTION_DELETES_A_SCHEDULED_EXECUTION):
        execution_id = cancel_a_scheduled_renewal(shop)
    assert shop.agboss.executions.read_execution(execution_id) is None

    deliver_at_its_eta(shop, finished[execution_id])

    assert len(shop.gateway.requests) == 1  # the customer who cancelled is charged


def test_retention_deletes_a_cancelled_scheduled_execution_once_its_eta_is_past_retention(
    world: World,
) -> None:
    """The row is kept as long as the message may come, not for ever: past its ETA plus
    the retention it goes like any other."""
    retention = timedelta(milliseconds=world.agboss.settings.terminal_execution_retention_ms)
    eta = timedelta(days=30)
    execution_id = world.publish("renewal", countdown=eta.total_seconds())
    cancel(world.app, execution_id, "the customer cancelled the renewal")

    world.clock.advance(retention + timedelta(days=1))
    assert world.sweep().executions_deleted == 0
    assert world.execution(execution_id).state is ExecutionState.CANCELLED

    world.clock.advance(eta)  # the ETA is now older than the retention too
    assert world.sweep().executions_deleted == 1
    assert world.agboss.executions.read_execution(execution_id) is None
