"""A task's own Celery hooks and calls that run outside or around its delivery.

- ``before_start`` runs before Celery calls the task: what it raises is kept and raised
  as the body's first act (design: what fails an execution), so the execution ends
  FAILED and says why, instead of staying REQUESTED for the sweep to re-publish for ever.
- A body that calls its own task directly is refused: that call is the same execution,
  whose delivery was deferred (its lease is live), and its ``Ignore`` would have ended the
  execution COMPLETED with nothing charged.
- A soft time limit that lands after the COMPLETED verdict committed (the delivery's
  tail: its log line and event) hands the message back, so the chain's next step is sent
  by the replay instead of never.

Each guarantee on both stores; each twin on PostgreSQL only, since what it switches off
(where a hook runs, a direct call, an ack) is decided above the store.
"""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from amqp.exceptions import MessageNacked
from celery import Task
from celery.exceptions import SoftTimeLimitExceeded

from celery_agboss import PaymentTask
from celery_agboss.core.executions import ExecutionRecord
from celery_agboss.core.fault_points import DELIVERY_AFTER_VERDICT
from celery_agboss.core.protections import (
    BEFORE_START_OUTSIDE_THE_DELIVERY,
    FAILED_LINK_SEND_ACKED,
    NESTED_DIRECT_CALL_ALLOWED,
)
from celery_agboss.testing.fault_arming import arm_raise
from celery_agboss.testing.switches import sabotage
from tests.delivery.conftest import PaymentShop
from tests.support.processes import assert_stays, wait_until


def backend_state(shop: PaymentShop, task_id: str) -> str:
    return str(shop.app.AsyncResult(task_id).state)


# --- before_start ---------------------------------------------------------------------


def _hooked(shop: PaymentShop) -> Any:
    charge = shop.call()

    class Hooked(PaymentTask):  # type: ignore[misc]
        abstract = True

        def before_start(self, task_id: str, args: Any, kwargs: Any) -> None:
            raise RuntimeError("the tracing service is down")

    @shop.app.task(base=Hooked, bind=True, shared=False, name="shop.hooked")
    def hooked(self: Any, order: str) -> Any:
        return self.outbound(charge, {"amount": 1000, "order": order}, business_key=order)

    return hooked


def test_a_before_start_that_raises_fails_the_execution_and_says_why(shop: PaymentShop) -> None:
    hooked = _hooked(shop)
    with shop.worker():
        task_id = str(hooked.delay("o-1").id)
        record = shop.wait_state(task_id, "FAILED", "COMPLETED")
        wait_until(lambda: backend_state(shop, task_id) == "FAILURE", 10, message="FAILURE")
    assert record.state.value == "FAILED"
    assert "RuntimeError" in (record.reason or "") or "tracing" in (record.error or "")
    assert shop.gateway.requests == [], "the body never ran"
    shop.clock.advance(3600)
    assert shop.sweep().republished == 0


@pytest.mark.parametrize("delivery_store_url", ["postgresql"], indirect=True)
def test_twin_a_before_start_outside_the_delivery_leaves_it_requested_for_ever(
    shop: PaymentShop,
) -> None:
    hooked = _hooked(shop)
    with sabotage(BEFORE_START_OUTSIDE_THE_DELIVERY), shop.worker():
        task_id = str(hooked.delay("o-1").id)
        assert_stays(lambda: shop.execution(task_id).state.value == "REQUESTED", 2)
        for _ in range(2):
            shop.clock.advance(3600)
            assert shop.sweep().republished == 1, "published again, every time"
            assert_stays(lambda: shop.execution(task_id).state.value == "REQUESTED", 1)
    assert shop.execution(task_id).reason is None, "nobody is told"


class _TracingMixin:
    def before_start(self, task_id: str, args: Any, kwargs: Any) -> None:
        raise RuntimeError("the tracing service is down")


def _tracing_down(self: Any, task_id: str, args: Any, kwargs: Any) -> None:
    raise RuntimeError("the tracing service is down")


def _a_charge_on(shop: PaymentShop, base: Any, name: str) -> ExecutionRecord:
    """A task ``name`` of ``base`` charging its order, delivered once for ``o-1``: where
    its delivery ended."""
    charge = shop.call()

    @shop.app.task(base=base, bind=True, shared=False, name=name)
    def charging(self: Any, order: str) -> Any:
        return self.outbound(charge, {"amount": 1000, "order": order}, business_key=order)

    with shop.worker():
        task_id = str(charging.delay("o-1").id)
        return shop.wait_state(task_id, "FAILED", "COMPLETED")


@pytest.mark.parametrize("where", ["mixin", "annotation"])
def test_a_before_start_from_a_mixin_or_an_annotation_fails_the_execution_too(
    shop: PaymentShop, where: str
) -> None:
    """The hook Celery calls is resolved once the task is bound (annotations applied)."""
    base: Any = PaymentTask
    if where == "mixin":

        class Traced(_TracingMixin, PaymentTask):  # type: ignore[misc]
            abstract = True

        base = Traced
    else:
        shop.app.conf.task_annotations = {"shop.traced": {"before_start": _tracing_down}}

    record = _a_charge_on(shop, base, "shop.traced")
    assert record.state.value == "FAILED"
    assert shop.gateway.requests == []


def test_a_before_start_that_handles_its_base_s_error_goes_on_to_pay(shop: PaymentShop) -> None:
    """Wrapped once, at the hook Celery calls: a ``super()`` chain inside it runs as
    written, so an error the subclass handles is handled."""

    class Tenanted(PaymentTask):  # type: ignore[misc]
        abstract = True

        def before_start(self, task_id: str, args: Any, kwargs: Any) -> None:
            raise LookupError("no tenant header")

    class DefaultTenant(Tenanted):  # type: ignore[misc]
        abstract = True

        def before_start(self, task_id: str, args: Any, kwargs: Any) -> None:
            with contextlib.suppress(LookupError):  # the default tenant
                super().before_start(task_id, args, kwargs)

    record = _a_charge_on(shop, DefaultTenant, "shop.tenanted")
    assert record.state.value == "COMPLETED", record.error
    assert len(shop.gateway.payments) == 1


# --- a direct call of its own task inside its body ------------------------------------


def _calls_itself(shop: PaymentShop) -> Any:
    charge = shop.call()

    @shop.task()
    def pay(self: Any, order: str, split: bool = False) -> Any:
        if split:
            pay(f"{order}-a")  # a direct call, as Celery allows for plain tasks
        return self.outbound(charge, {"amount": 1000, "order": order}, business_key=order)

    return pay


def test_a_body_calling_its_own_task_directly_is_refused(shop: PaymentShop) -> None:
    pay = _calls_itself(shop)
    with shop.worker():
        task_id = str(pay.delay("o-1", True).id)
        record = shop.wait_state(task_id, "FAILED", "COMPLETED")
    assert record.state.value == "FAILED"
    assert "ConfigurationError" in (record.reason or "") + (record.error or "")
    assert shop.gateway.payments == []


@pytest.mark.parametrize("delivery_store_url", ["postgresql"], indirect=True)
def test_twin_a_nested_call_ends_the_execution_completed_unpaid(shop: PaymentShop) -> None:
    pay = _calls_itself(shop)
    with sabotage(NESTED_DIRECT_CALL_ALLOWED), shop.worker():
        task_id = str(pay.delay("o-1", True).id)
        record = shop.wait_state(task_id, "FAILED", "COMPLETED")
    assert record.state.value == "COMPLETED"
    assert shop.gateway.payments == [], "the order reads paid, nothing was charged"


# --- a soft time limit after the verdict ------------------------------------------------


def _paid_then_soft_limited(shop: PaymentShop, ships_within: float) -> tuple[str, list[str]]:
    charge = shop.call()
    shipped: list[str] = []

    @shop.task()
    def pay(self: Any, order: str) -> Any:
        return self.outbound(charge, {"amount": 1000, "order": order}, business_key=order)

    @shop.app.task(shared=False, name="shop.ship")
    def ship(paid: Any) -> None:
        shipped.append(paid["id"])

    arm_raise(DELIVERY_AFTER_VERDICT, SoftTimeLimitExceeded("soft time limit (5s) exceeded"))
    with shop.worker():
        result = (pay.s("o-1") | ship.s()).apply_async()
        task_id = str(result.parent.id)
        shop.wait_state(task_id, "COMPLETED")
        wait_until(lambda: shipped, ships_within, message="the chain's next step")
    return task_id, shipped


def test_a_soft_time_limit_after_the_verdict_still_sends_the_chain_once(
    shop: PaymentShop,
) -> None:
    task_id, shipped = _paid_then_soft_limited(shop, 15)
    assert len(shipped) == 1
    assert len(shop.gateway.payments) == 1
    assert backend_state(shop, task_id) == "SUCCESS"
    assert shop.execution(task_id).links_dispatched


@pytest.mark.parametrize("delivery_store_url", ["postgresql"], indirect=True)
def test_twin_acked_after_a_soft_time_limit_the_paid_order_never_ships(
    shop: PaymentShop,
) -> None:
    with sabotage(FAILED_LINK_SEND_ACKED):
        try:
            _paid_then_soft_limited(shop, 3)
        except AssertionError as never:
            assert "the chain's next step" in str(never)
        else:
            raise AssertionError("the chain's next step was sent")
    assert len(shop.gateway.payments) == 1


# --- a failure inside Celery's own send of the links ----------------------------------


def _paid_then_link_send_fails(shop: PaymentShop, failure: BaseException, wait: float) -> list[str]:
    """The chain's next step's first send raises ``failure`` inside Celery's trace, after
    the COMPLETED verdict and after Celery let go of the task's request: the delivery's
    ``on_failure`` sees no links; the worker's request (the main process) hands back."""
    charge = shop.call()
    shipped: list[str] = []
    raised: list[int] = []

    @shop.task()
    def pay(self: Any, order: str) -> Any:
        return self.outbound(charge, {"amount": 1000, "order": order}, business_key=order)

    class FailsOnce(Task):  # type: ignore[misc]
        abstract = True

        def apply_async(self, *args: Any, **kwargs: Any) -> Any:
            if not raised:
                raised.append(1)
                raise failure
            return super().apply_async(*args, **kwargs)

    @shop.app.task(base=FailsOnce, shared=False, name="shop.ship")
    def ship(paid: Any) -> None:
        shipped.append(paid["id"])

    with shop.worker():
        result = (pay.s("o-1") | ship.s()).apply_async()
        task_id = str(result.parent.id)
        shop.wait_state(task_id, "COMPLETED")
        with contextlib.suppress(AssertionError):
            wait_until(lambda: shipped, wait, message="the chain's next step")
    assert raised == [1] and len(shop.gateway.payments) == 1
    return shipped


# Celery reports such a failure as an internal error, with a RuntimeWarning (an error
# under this suite's filterwarnings; a warning in production).
_INTERNAL = pytest.mark.filterwarnings("ignore::RuntimeWarning")


@_INTERNAL
@pytest.mark.parametrize(
    "failure",
    [SoftTimeLimitExceeded("soft time limit (5s) exceeded"), MessageNacked()],
    ids=["soft-time-limit", "broker-refused"],
)
def test_a_link_send_that_fails_inside_celery_is_handed_back_and_ships_once(
    shop: PaymentShop, failure: BaseException
) -> None:
    assert len(_paid_then_link_send_fails(shop, failure, 15)) == 1


@_INTERNAL
@pytest.mark.parametrize("delivery_store_url", ["postgresql"], indirect=True)
def test_twin_acked_the_paid_order_never_ships(shop: PaymentShop) -> None:
    with sabotage(FAILED_LINK_SEND_ACKED):
        assert _paid_then_link_send_fails(shop, MessageNacked(), 3) == []
