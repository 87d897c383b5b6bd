"""Messages that reach a worker after their ``expires`` (design: expires bounds the start).

A broker restore, a requeue after a lost pool child or a visibility timeout can hand a
worker the original message of an execution that already started, after its
``expires``. Celery's own check drops that copy and also puts the id in the worker's
revoked set, for hours: the execution's retry, due later on the same worker, is then
dropped as revoked and recorded as a cancel nobody asked for, and the order is never
charged. The store decides instead: the started execution goes on and charges once.
The twin keeps Celery's check (``EXPIRY_REVOKES_THE_ID``): the order ends ``CANCELLED``,
unpaid. An execution that never started is still dropped and ``EXPIRED``.

Deployment speed-ups it relies on: the harness's (``-Q``, a 5 s lease, no beat:
tests/integration/harness.py).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from celery import Celery

from celery_agboss.core.protections import EXPIRY_REVOKES_THE_ID
from tests.integration.gateway_http import wait_for
from tests.integration.harness import Shop, ShopFactory

pytestmark = [pytest.mark.worker, pytest.mark.redis, pytest.mark.slow]

EXPIRES_IN = 2.0
RETRY_COUNTDOWN = 6.0
"""Long enough that the expired copy is handled before the retry is due."""


def _expired_copy_after_the_first_delivery(shop: Shop, order: str) -> str:
    """Publish ``it.waiting_charge`` (it retries once, then charges) with ``expires``; once
    the first delivery ended and ``expires`` passed, send a copy of the original message,
    as a broker hands an unacked message back (from a client without celery_agboss, so
    nothing is recorded at its publish)."""
    expires = datetime.now(timezone.utc) + timedelta(seconds=EXPIRES_IN)
    signature = shop.app.signature("it.waiting_charge", args=(order, RETRY_COUNTDOWN))
    task_id = str(signature.apply_async(expires=expires).id)
    shop.wait_state(task_id, "WAITING", timeout=20)  # started in time, its retry is due later
    wait_for(lambda: datetime.now(timezone.utc) > expires, EXPIRES_IN + 5, "expires to pass")
    bare = Celery("bare-client", broker=shop.config["broker_url"])
    try:
        bare.send_task(
            "it.waiting_charge",
            args=(order, RETRY_COUNTDOWN),
            task_id=task_id,
            expires=expires,
            queue=shop.config["queue"],
        )
    finally:
        bare.close()
    return task_id


def test_an_expired_copy_of_a_started_execution_leaves_its_retry_to_charge(
    shop_factory: ShopFactory,
) -> None:
    shop = shop_factory()
    worker = shop.start_worker()
    task_id = _expired_copy_after_the_first_delivery(shop, "o-41")
    record = shop.wait_state(task_id, "COMPLETED", timeout=40)
    shop.wait_backend(task_id, "SUCCESS")
    gateway = shop.gateway.gateway
    assert (len(gateway.requests), len(gateway.payments)) == (1, 1), "charged once"
    assert not record.cancel_requested, "nobody asked for a cancel"
    assert "Discarding revoked task" not in worker.output()
    retries = [note.fields["retries"] for note in shop.gateway.notes_of("body-start", task_id)]
    assert retries.count(0) >= 1 and max(retries) >= 1, "the retry ran"


def test_with_celerys_expiry_the_copy_revokes_the_retry_and_the_order_is_never_paid(
    shop_factory: ShopFactory,
) -> None:
    """The twin: Celery's check alone."""
    shop = shop_factory()
    worker = shop.start_worker(sabotage=(EXPIRY_REVOKES_THE_ID,))
    task_id = _expired_copy_after_the_first_delivery(shop, "o-42")
    record = shop.wait_state(task_id, "CANCELLED", timeout=40)
    assert record.cancel_requested, "a cancel nobody asked for"
    assert "Discarding revoked task" in worker.output()
    assert shop.gateway.gateway.payments == [], "the order is never paid"


def test_a_message_that_reaches_a_worker_after_its_expires_never_starts(
    shop_factory: ShopFactory,
) -> None:
    shop = shop_factory()
    expires = datetime.now(timezone.utc) + timedelta(seconds=1)
    signature = shop.app.signature("it.charge_order", args=("o-43",))
    task_id = str(signature.apply_async(expires=expires).id)
    wait_for(lambda: datetime.now(timezone.utc) > expires, 6, "expires to pass")
    shop.start_worker()
    shop.wait_state(task_id, "EXPIRED", timeout=20)
    shop.wait_backend(task_id, "REVOKED")
    assert shop.gateway.notes_of("body-start", task_id) == []
    assert shop.gateway.gateway.requests == []
