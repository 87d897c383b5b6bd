"""How a PaymentTask (design: what Celery records) meets Celery's own machinery, and tells
the truth.

Links go out at most once under ids fixed before the first send; ``replace()`` is
refused; a retry whose publish failed leaves the execution waiting, never FAILURE;
every way out of a delivery stops renewing its lease; a body's own
``Reject(requeue=False)`` ends the execution FAILED; the package's own retries never use
the application's ``max_retries``; an eager run that ends unfinished says so;
``outbound()`` inside a fenced effect is refused; a call keyed by position warns once.
(Chords: test_chord_replay.py.)
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from celery import signals as celery_signals
from celery.exceptions import Reject

from celery_agboss.core.fault_points import FENCED_BEFORE_BEGIN
from celery_agboss.core.protections import (
    EAGER_IGNORE_READ,
    LEASE_KEPT_AFTER_A_BROKEN_END,
    LINK_IDS_NOT_FIXED,
    PACKAGE_RETRIES_COUNTED,
    REJECT_WAITS_FOR_THE_SWEEP,
    REPLACE_HANDED_TO_CELERY,
    REPLAY_SENDS_LINKS,
    RETRY_PUBLISH_FAILURE_REJECTS,
)
from celery_agboss.errors import (
    ConfigurationError,
    ExecutionNotFinishedError,
    PublishNotRecorded,
    PublishRefusedError,
)
from celery_agboss.testing.fault_arming import arm_raise
from celery_agboss.testing.gateway_types import FakeGatewayError, FakeGatewayFault
from celery_agboss.testing.switches import sabotage
from tests.delivery.conftest import PaymentShop, lease_lapses_in_real_time
from tests.delivery.test_outcomes_kept import backend_state
from tests.support.processes import assert_stays, wait_until

# --- links ---------------------------------------------------------------------------


@pytest.fixture
def shop_config() -> dict[str, Any]:
    return lease_lapses_in_real_time()


def _a_duplicate_that_sends_the_links_again(shop: PaymentShop) -> str:
    """``pay`` is published with an unfrozen ``link=ship.s()``; after it completed, a
    duplicate delivery replays it and sends its links again (the window between Celery
    sending the links and ``on_success`` recording it, held open here)."""
    charge, shipping = shop.call("shop.charge"), shop.call("shop.shipping")

    @shop.task()
    def ship(self: Any, paid: Any) -> Any:
        return self.outbound(shipping, {"amount": 500, "order": paid["reference"]})

    @shop.task()
    def pay(self: Any, order: str) -> Any:
        return self.outbound(charge, {"amount": 1000, "order": order}, business_key=order)

    with shop.worker():
        task_id = str(pay.apply_async(("o-1",), link=ship.s()).id)
        shop.wait_state(task_id, "COMPLETED")
        wait_until(lambda: shop.times_sent("shop.shipping") == 1, 10, message="the shipping")
        with sabotage(REPLAY_SENDS_LINKS):
            shop.agboss.republish(shop.execution(task_id), reason="test: a duplicate")
            assert_stays(lambda: shop.times_sent("shop.shipping") <= 1, 2.0)
    return task_id


def test_links_go_out_under_ids_fixed_before_the_first_send(shop: PaymentShop) -> None:
    _a_duplicate_that_sends_the_links_again(shop)
    assert shop.times_sent("shop.shipping") == 1, "the same ship execution, charged once"


def test_unfrozen_links_sent_again_charge_the_shipping_twice(shop: PaymentShop) -> None:
    with sabotage(LINK_IDS_NOT_FIXED), pytest.raises(AssertionError, match="stopped holding"):
        _a_duplicate_that_sends_the_links_again(shop)
    wait_until(lambda: shop.times_sent("shop.shipping") == 2, 10, message="the second shipping")


# --- replace --------------------------------------------------------------------------


def _three_installments_by_replace(shop: PaymentShop) -> tuple[str, list[BaseException]]:
    """Each run charges one installment and replaces itself with the next."""
    charge = shop.call()
    refused: list[BaseException] = []

    @shop.task()
    def installments(self: Any, order: str, left: int) -> Any:
        receipt = self.outbound(
            charge, {"amount": 100, "order": order}, business_key=f"{order}:{left}"
        )
        if left == 1:
            return receipt
        try:
            return self.replace(installments.s(order, left - 1))
        except ConfigurationError as exc:
            refused.append(exc)
            raise

    with shop.worker():
        task_id = shop.deliver(installments, "o-r", 3, states=("COMPLETED", "FAILED"), timeout=20)
        assert_stays(lambda: shop.execution(task_id).state.value in ("COMPLETED", "FAILED"), 1.0)
    return task_id, refused


def test_replace_is_refused_at_the_call(shop: PaymentShop) -> None:
    task_id, refused = _three_installments_by_replace(shop)
    (error,) = refused
    assert "cannot use self.replace()" in str(error) and "Publish the follow-up" in str(error)
    assert shop.execution(task_id).state.value == "FAILED", "loud, at the first replace"


def test_celerys_replace_loses_the_installments(shop: PaymentShop) -> None:
    with sabotage(REPLACE_HANDED_TO_CELERY):
        task_id, _ = _three_installments_by_replace(shop)
    assert shop.execution(task_id).state.value == "COMPLETED"
    assert len(shop.gateway.payments) == 1, "three installments, one payment"


# --- a retry whose publish failed ---------------------------------------------------------


def _a_retry_the_store_refuses(shop: PaymentShop) -> tuple[str, str, list[str]]:
    """A body's ``self.retry()`` whose publish the store refuses once; returns the task
    id, the result backend's state once the delivery ended, and the errbacks fired."""
    charge = shop.call()
    errbacks: list[str] = []

    @shop.task()
    def pay(self: Any, order: str) -> Any:
        if self.request.retries == 0:
            raise self.retry(countdown=0.1)
        return self.outbound(charge, {"amount": 1000, "order": order}, business_key=order)

    @shop.app.task(shared=False, name="shop.refund_on_error")
    def refund_on_error(*args: Any, **kwargs: Any) -> None:
        errbacks.append("refund")

    refused: list[str] = []

    def refuse_the_retry(sender: Any = None, headers: Any = None, **_: Any) -> None:
        headers = headers or {}
        if headers.get("task") == "shop.pay" and headers.get("retries") and not refused:
            refused.append(str(headers["id"]))
            raise PublishNotRecorded(PublishRefusedError("the store is down"))

    celery_signals.before_task_publish.connect(refuse_the_retry, weak=False)
    try:
        with shop.worker():
            task_id = str(pay.apply_async(("o-2",), link_error=refund_on_error.s()).id)
            wait_until(lambda: refused, 10, message="the retry to be refused")
            ended = shop.wait_state(task_id, "WAITING", "FAILED", timeout=10)
            result = pay.AsyncResult(task_id)
            if ended.state.value == "FAILED":  # Celery's Reject: FAILURE, errbacks
                wait_until(
                    lambda: backend_state(shop, result) == "FAILURE" and errbacks,
                    10,
                    message="Celery to record the rejected retry",
                )
            else:
                assert_stays(lambda: backend_state(shop, result) != "FAILURE" and not errbacks, 0.5)
            seen = backend_state(shop, result)
            if ended.state.value == "WAITING":
                shop.clock.advance(1)
                shop.sweep()  # the stored retry is published by the sweep
                shop.wait_state(task_id, "COMPLETED", timeout=20)
    finally:
        celery_signals.before_task_publish.disconnect(refuse_the_retry)
    return task_id, seen, errbacks


def test_a_retry_whose_publish_failed_waits_and_is_continued_never_failure(
    shop: PaymentShop,
) -> None:
    task_id, seen, errbacks = _a_retry_the_store_refuses(shop)
    assert seen != "FAILURE" and errbacks == []
    assert len(shop.gateway.payments) == 1
    assert shop.execution(task_id).state.value == "COMPLETED"


def test_celerys_reject_for_it_fails_the_payment_over_a_passing_outage(
    shop: PaymentShop,
) -> None:
    with sabotage(RETRY_PUBLISH_FAILURE_REJECTS):
        _, seen, errbacks = _a_retry_the_store_refuses(shop)
    assert seen == "FAILURE" and errbacks == ["refund"]
    assert shop.gateway.payments == [], "an order never paid over a one-off publish error"


# --- every way out stops renewing --------------------------------------------------------


def _renewed_after_a_broken_end(shop: PaymentShop, *, ends_with_retry: bool) -> bool:
    """The verdict's own transaction fails with an error nothing expects: whether the
    lease is still renewed after the delivery is over (watched for two renewal periods
    of the 5 s test lease). A body that returns ends in one transaction that writes the
    verdict and releases the lease, so its lease is let go before that transaction
    begins; one that retries writes ``WAITING`` first and releases after, so there
    only the end-of-delivery guard stops the renewals."""
    charge = shop.call()
    ended: list[str] = []

    @shop.task()
    def pay(self: Any, order: str) -> Any:
        receipt = self.outbound(charge, {"amount": 1000, "order": order}, business_key=order)
        arm_raise(FENCED_BEFORE_BEGIN, RuntimeError("a bug in the end-of-run code"))
        if ends_with_retry:
            raise self.retry(countdown=60)
        return receipt

    def record_the_end(task_id: Any = None, **_: Any) -> None:
        ended.append(str(task_id))

    celery_signals.task_postrun.connect(record_the_end, weak=False)
    try:
        with shop.worker():
            task_id = str(pay.delay("o-3").id)
            wait_until(lambda: task_id in ended, 15, message="the delivery to end")
            lease = shop.agboss.store.read_lease(task_id)
            assert lease is not None and not lease.released
            renewal_period = shop.agboss.settings.lease_ttl_seconds / 3
            try:
                assert_stays(
                    lambda: _expiry(shop, task_id) == lease.expires_at_ms, 2 * renewal_period + 0.5
                )
            except AssertionError:
                return True
            return False
    finally:
        celery_signals.task_postrun.disconnect(record_the_end)


def _expiry(shop: PaymentShop, task_id: str) -> int | None:
    lease = shop.agboss.store.read_lease(task_id)
    return None if lease is None else lease.expires_at_ms


def _lease_live(shop: PaymentShop, task_id: str) -> bool:
    lease = shop.agboss.store.read_lease(task_id)
    return bool(lease is not None and lease.live)


@pytest.mark.parametrize("ends_with_retry", [False, True], ids=["returned", "retried"])
def test_a_delivery_whose_own_end_raised_stops_renewing_its_lease(
    shop: PaymentShop, ends_with_retry: bool
) -> None:
    renewed = _renewed_after_a_broken_end(shop, ends_with_retry=ends_with_retry)
    assert not renewed, "left to expire: the sweep can take it"


def test_without_that_its_lease_is_renewed_for_as_long_as_the_worker_lives(
    shop: PaymentShop,
) -> None:
    with sabotage(LEASE_KEPT_AFTER_A_BROKEN_END):
        assert _renewed_after_a_broken_end(shop, ends_with_retry=True)


def test_an_exception_whose_str_raises_is_still_recorded_failed(shop: PaymentShop) -> None:
    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    @shop.task()
    def pay(self: Any) -> Any:
        raise Unprintable()

    with shop.worker():
        task_id = str(pay.delay().id)
        record = shop.wait_state(task_id, "FAILED")
    assert "str() raised" in (record.error or "")
    assert not _lease_live(shop, task_id)


# --- Reject -----------------------------------------------------------------------------


def _a_body_that_rejects(shop: PaymentShop) -> str:
    @shop.task()
    def pay(self: Any) -> Any:
        raise Reject("a poison message", requeue=False)

    return shop.run(pay, states=("FAILED", "WAITING"))


def test_a_bodys_own_reject_without_requeue_ends_it_failed(shop: PaymentShop) -> None:
    task_id = _a_body_that_rejects(shop)
    assert shop.execution(task_id).state.value == "FAILED"
    shop.clock.advance(3600)
    assert shop.sweep().republished == 0, "what the body dropped stays dropped"


def test_leaving_it_waiting_brings_back_what_the_body_dropped(shop: PaymentShop) -> None:
    with sabotage(REJECT_WAITS_FOR_THE_SWEEP):
        _a_body_that_rejects(shop)
    shop.clock.advance(3600)
    assert shop.sweep().republished == 1


# --- the application's retry budget -------------------------------------------------------


def _unknown_twice_then_declined_once(shop: PaymentShop) -> str:
    """Two sends time out before the gateway processes them (unknown outcomes: the
    package's own retries), the third is declined: ``autoretry_for`` with
    ``max_retries=1`` still has its one retry, and the fourth send pays."""
    charge = shop.call()
    declined: list[int] = []

    @shop.task(autoretry_for=(FakeGatewayError,), max_retries=1, default_retry_delay=0.1)
    def pay(self: Any, order: str) -> Any:
        if self.request.retries == 2 and not declined:  # after the two unknown outcomes
            declined.append(1)
            shop.gateway.inject_fault(FakeGatewayFault.DECLINE, operation="charge")
        return self.outbound(charge, {"amount": 1000, "order": order}, business_key=order)

    shop.gateway.hold(before_processing=True, operation="charge", times=2, timeout=0.3)
    task_id = shop.run(pay, "o-4", states=("COMPLETED", "FAILED"), timeout=40)
    assert declined, "the third delivery was declined"
    return task_id


def test_the_packages_own_retries_never_use_the_applications_budget(
    shop: PaymentShop,
) -> None:
    task_id = _unknown_twice_then_declined_once(shop)
    assert shop.execution(task_id).state.value == "COMPLETED"
    assert len(shop.gateway.payments) == 1


def test_counting_them_spends_the_budget_and_fails_a_payable_order(shop: PaymentShop) -> None:
    with sabotage(PACKAGE_RETRIES_COUNTED):
        task_id = _unknown_twice_then_declined_once(shop)
    assert shop.execution(task_id).state.value == "FAILED"


# --- eager runs ----------------------------------------------------------------------------


def _paused_eagerly(shop: PaymentShop) -> Any:
    @shop.task()
    def pay(self: Any, order: str) -> Any:
        self.pause("approve")
        return "paid"

    return pay.apply(("o-5",))


def test_an_eager_run_that_pauses_says_so(shop: PaymentShop) -> None:
    result = _paused_eagerly(shop)
    assert result.failed()
    error = result.result
    assert isinstance(error, ExecutionNotFinishedError) and error.state == "PAUSED"


def test_reading_it_as_celery_does_gives_a_paused_payment_as_none(shop: PaymentShop) -> None:
    with sabotage(EAGER_IGNORE_READ):
        result = _paused_eagerly(shop)
    assert result.get() is None, "a test suite would read a paused payment as done"


# --- smaller ----------------------------------------------------------------------------


def test_an_outbound_call_inside_a_fenced_effect_is_refused(shop: PaymentShop) -> None:
    charge = shop.call()

    @shop.task()
    def pay(self: Any) -> Any:
        return self.fenced_effect(
            "mark", lambda conn: self.outbound(charge, {"amount": 1, "order": "o"})
        )

    result = pay.apply()
    assert result.failed() and isinstance(result.result, ConfigurationError)
    assert "inside a fenced effect" in str(result.result)
    assert shop.gateway.requests == []


def test_a_call_keyed_by_position_warns_once(
    shop: PaymentShop, caplog: pytest.LogCaptureFixture
) -> None:
    charge = shop.call(f"shop.installment.{shop.app.main}")

    @shop.task()
    def pay(self: Any, count: int) -> Any:
        return [self.outbound(charge, {"amount": 100, "order": str(n)}) for n in range(count)]

    with caplog.at_level(logging.WARNING, logger="celery_agboss"):
        assert pay.apply((3,)).successful()
        assert pay.apply((3,)).successful()
    lines = [r for r in caplog.records if "position-keys" in r.getMessage()]
    assert len(lines) <= 1 and "business_key" in caplog.text
