"""R18, R22, R23 in a real prefork worker: a send still on the wire keeps its lease.

- R18: a revoke that interrupts the body while its charge is on the wire
  (``terminate=True, signal="SIGUSR1"`` raises ``SoftTimeLimitExceeded`` in the pool
  child; the send goes on in its thread): the lease is renewed, never released, until
  the send settled; then it is left to expire, and the next delivery reconciles and
  cancels. Twin (``release-with-unsettled-attempt``, with
  ``foreign-error-escapes-claimed-call`` too: otherwise the soft limit stops the
  delivery as an unknown outcome, whose verdict the interrupted send fences): the lease
  is handed over under the live send, the next delivery's lookup finds nothing yet, the
  execution ends CANCELLED with its intent FAILED — and the gateway then charges the
  customer.
- R22: a send that never returns is bounded by ``agboss_attempt_timeout``: renewals
  stop, the lease expires, the retry takes over and reconciles (one payment); the hung
  send's late answer is logged ``outbound-call.answered-after-hand-over`` and stored
  nowhere. Twin (``send-not-bounded``): the delivery waits on, its lease renewed, and
  nothing else can ever continue the payment.
- R23: a send longer than the lease TTL but within ``attempt_timeout`` keeps its lease
  (renewed, same token; a duplicate is deferred), one request. Past its bound, the
  holder never re-acquires its own lease: a body that catches the unknown outcome and
  calls again (with ``caught-signal-does-not-stop-delivery`` switched off, so that the
  lease is the only thing in the way) is fenced, nothing sent. Twin (also
  ``reclaim-bumps-token``): the holder's reclaim bumps the token, its own send looks
  dead, the lookup finds nothing yet and the charge is sent a second time while the
  first is still on the wire.

Deployment speed-ups it relies on: the harness's (``-Q``, a 5 s lease, no beat:
tests/integration/harness.py).
"""

from __future__ import annotations

import time

import pytest

from celery_agboss.core.history import HistoryEvent
from celery_agboss.core.protections import (
    CAUGHT_SIGNAL_DOES_NOT_STOP_DELIVERY,
    FOREIGN_ERROR_ESCAPES_CLAIMED_CALL,
    RECLAIM_BUMPS_TOKEN,
    RELEASE_WITH_UNSETTLED_ATTEMPT,
    SEND_NOT_BOUNDED,
)
from celery_agboss.core.store_protocol import IntentStatus
from celery_agboss.testing.gateway import FakeGatewayFault
from celery_agboss.testing.gateway_types import GatewayRequestOutcome
from tests.integration.gateway_http import wait_for
from tests.integration.harness import Shop, ShopFactory

pytestmark = [pytest.mark.worker, pytest.mark.redis, pytest.mark.slow]

LATE_ANSWER = "outbound-call.answered-after-hand-over"


def next_delivery(shop: Shop, task_id: str) -> None:
    """The same message again, on a fresh worker (the old one discards a revoked id)."""
    for worker in shop.workers:
        worker.close()
    shop.start_worker()
    record = shop.execution(task_id)
    assert record is not None
    shop.agboss.republish(record, reason="test: next delivery", honour_not_before=False)


def lease_token_stays(shop: Shop, task_id: str, token: int, seconds: float) -> None:
    """For ``seconds``: the lease is live, unreleased, and still carries ``token``."""

    def held() -> bool:
        lease = shop.lease_of(task_id)
        return lease is not None and lease.live and not lease.released and lease.token == token

    shop.assert_stays(held, seconds)


# --- R18 -------------------------------------------------------------------------------


def revoke_mid_send(shop: Shop, order: str) -> tuple[str, object]:
    """Publish ``it.charge_order(order)``, hold its charge before the gateway processes
    it, and revoke it with ``terminate=True, signal="SIGUSR1"``."""
    hold = shop.gateway.gateway.hold(operation="charge", before_processing=True, timeout=30)
    task_id = shop.publish("it.charge_order", order)
    hold.wait_reached(timeout=20)
    shop.app.control.revoke(task_id, terminate=True, signal="SIGUSR1")
    wait_for(lambda: f"Terminating {task_id}" in shop.worker_log(), 10, "the revoke")
    return task_id, hold


def test_r18_a_revoke_mid_send_never_releases_the_lease_before_the_send_settled(
    shop_factory: ShopFactory,
) -> None:
    shop = shop_factory(attempt_timeout=20, lookup_proves_absence=True)
    shop.start_worker()
    gateway = shop.gateway.gateway
    task_id, hold = revoke_mid_send(shop, "o-51")
    # The body was interrupted, the send is on the wire: the lease is renewed past its
    # TTL, with the same token, and nobody can take it over.
    lease_token_stays(shop, task_id, 1, seconds=shop.config["lease_ttl"] + 1)
    hold.release()  # type: ignore[attr-defined]
    wait_for(lambda: len(gateway.payments) == 1, 10, "the held charge to go through")
    shop.wait_lease_dead(task_id, timeout=20)
    lease = shop.lease_of(task_id)
    assert lease is not None and not lease.released, "left to expire, never released"
    next_delivery(shop, task_id)
    # The charge went through: a cancel after a completed payment waits for a person.
    shop.wait_state(task_id, "WAITING_OPERATOR", timeout=30)
    assert (len(gateway.requests), len(gateway.payments)) == (1, 1), "no second send"
    (intent,) = shop.intents_of(task_id)
    assert intent.status is IntentStatus.COMPLETED, "the payment is on record"
    assert len(shop.gateway.notes_of("body-start", task_id)) == 1


def test_r18_a_lease_released_under_a_live_send_records_a_paid_order_as_never_charged(
    shop_factory: ShopFactory,
) -> None:
    shop = shop_factory(attempt_timeout=20, lookup_proves_absence=True)
    shop.start_worker(sabotage=(RELEASE_WITH_UNSETTLED_ATTEMPT, FOREIGN_ERROR_ESCAPES_CLAIMED_CALL))
    gateway = shop.gateway.gateway
    task_id, hold = revoke_mid_send(shop, "o-51")
    wait_for(
        lambda: getattr(shop.lease_of(task_id), "released", False),
        10,
        "the lease to be released under the send",
    )
    next_delivery(shop, task_id)
    shop.wait_state(task_id, "CANCELLED", timeout=30)
    (intent,) = shop.intents_of(task_id)
    assert intent.status is IntentStatus.FAILED, "the lookup came too early: 'not sent'"
    hold.release()  # type: ignore[attr-defined]
    wait_for(lambda: len(gateway.payments) == 1, 10, "the send still on the wire to charge")


# --- R22 -------------------------------------------------------------------------------


def test_r22_a_send_that_never_returns_is_bounded_and_its_late_answer_stored_nowhere(
    shop_factory: ShopFactory,
) -> None:
    shop = shop_factory(attempt_timeout=3)
    shop.start_worker()
    gateway = shop.gateway.gateway
    hold = gateway.hold(operation="charge", timeout=40)  # processed; the answer never comes
    task_id = shop.publish("it.charge_order", "o-52")
    hold.wait_reached(timeout=20)
    record = shop.wait_state(task_id, "COMPLETED", timeout=30)
    shop.wait_logged("execution.taken-over")  # the bound passed, renewals stopped
    assert record.recovery_count == 1
    lease = shop.lease_of(task_id)
    assert lease is not None and lease.token == 2
    hold.release()
    wait_for(lambda: LATE_ANSWER in shop.worker_log(), 15, "the hung send to answer late")
    assert (len(gateway.requests), len(gateway.payments)) == (1, 1), "reconciled, not resent"
    (intent,) = shop.intents_of(task_id)
    assert intent.status is IntentStatus.COMPLETED
    events = [row.event for row in shop.agboss.store.read_history(intent.idempotency_key)]
    assert events.count(HistoryEvent.RECONCILED_COMPLETED.value) == 1
    assert HistoryEvent.COMPLETED.value not in events, "the late answer was stored nowhere"
    shop.wait_backend(task_id, "SUCCESS")
    assert shop.app.AsyncResult(task_id).result["payment"] == gateway.payments[0]["id"]


def test_r22_an_unbounded_send_holds_the_lease_and_the_payment_forever(
    shop_factory: ShopFactory,
) -> None:
    shop = shop_factory(attempt_timeout=3)
    shop.start_worker(sabotage=(SEND_NOT_BOUNDED,))
    hold = shop.gateway.gateway.hold(operation="charge", timeout=40)
    task_id = shop.publish("it.charge_order", "o-52")
    hold.wait_reached(timeout=20)
    # Where the bounded send has long been taken over, the unbounded one still holds on.
    lease_token_stays(shop, task_id, 1, seconds=3 + shop.config["lease_ttl"] + 1)
    assert shop.execution(task_id).state.value == "RUNNING"  # type: ignore[union-attr]
    assert "execution.taken-over" not in shop.worker_log()
    hold.release()


# --- R23 -------------------------------------------------------------------------------


def test_r23_a_send_longer_than_the_lease_but_within_its_bound_keeps_its_lease(
    shop_factory: ShopFactory,
) -> None:
    """A 10 s lease here, not the harness's 5 s: this test claims the lease stays live a
    whole TTL while the send runs, and on a loaded CI machine renewals (every TTL/3 on
    SQLite) were once late past a 5 s lease's end."""
    shop = shop_factory(attempt_timeout=20, lease_ttl=10)
    shop.start_worker()
    gateway = shop.gateway.gateway
    send_seconds = shop.config["lease_ttl"] + 3
    gateway.inject_fault(FakeGatewayFault.SLOW, delay=send_seconds, operation="charge")
    task_id = shop.publish("it.charge_order", "o-53")
    wait_for(lambda: gateway.requests, 20, "the charge on the wire")
    started = time.monotonic()
    lease_token_stays(shop, task_id, 1, seconds=shop.config["lease_ttl"] + 0.5)
    # A duplicate meets the renewed lease and is deferred.
    shop.agboss.republish(shop.execution(task_id), reason="test: duplicate")  # type: ignore[arg-type]
    record = shop.wait_state(task_id, "COMPLETED", timeout=30)
    assert time.monotonic() - started >= shop.config["lease_ttl"], "the send outlived a TTL"
    shop.wait_logged(f"execution.deferred execution_id={task_id}")
    assert (len(gateway.requests), len(gateway.payments)) == (1, 1)
    assert record.recovery_count == 0 and record.deliveries == 1
    lease = shop.lease_of(task_id)
    assert lease is not None and lease.token == 1, "no reclaim moved the token"
    assert len(shop.gateway.notes_of("body-start", task_id)) == 1


def charge_past_its_bound(shop: Shop, order: str) -> str:
    """``it.insistent_charge(order)`` with its charge held (not processed) past
    ``attempt_timeout``: the body catches the unknown outcome and calls again."""
    shop.gateway.gateway.hold(operation="charge", before_processing=True, timeout=20)
    task_id = shop.publish("it.insistent_charge", order)
    wait_for(lambda: shop.gateway.notes_of("charge-again", task_id), 20, "the body to call again")
    return task_id


def test_r23_past_its_bound_a_holder_never_reclaims_its_lease_under_its_own_send(
    shop_factory: ShopFactory,
) -> None:
    shop = shop_factory(attempt_timeout=3)
    shop.start_worker(sabotage=(CAUGHT_SIGNAL_DOES_NOT_STOP_DELIVERY,))
    task_id = charge_past_its_bound(shop, "o-54")
    wait_for(
        lambda: f"execution.fenced execution_id={task_id}" in shop.worker_log(),
        10,
        "the second call to be refused",
    )
    assert len(shop.gateway.gateway.requests) == 1, "nothing sent beside the live send"
    lease = shop.lease_of(task_id)
    assert lease is not None and lease.token == 1 and not lease.released


def test_r23_a_reclaim_that_bumps_the_token_sends_again_under_a_live_send(
    shop_factory: ShopFactory,
) -> None:
    shop = shop_factory(attempt_timeout=3)
    shop.start_worker(sabotage=(CAUGHT_SIGNAL_DOES_NOT_STOP_DELIVERY, RECLAIM_BUMPS_TOKEN))
    task_id = charge_past_its_bound(shop, "o-54")
    gateway = shop.gateway.gateway
    wait_for(lambda: len(gateway.requests) == 2, 10, "a second send of the same attempt key")
    first, second = gateway.requests
    assert first.idempotency_key == second.idempotency_key
    assert first.outcome is GatewayRequestOutcome.ON_THE_WIRE, "the first was still on the wire"
    lease = shop.lease_of(task_id)
    assert lease is not None and lease.token > 1, "the holder bumped its own token"
