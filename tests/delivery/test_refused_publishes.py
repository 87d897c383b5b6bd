"""A publish the broker refused (design: trap 9, publishes from a body) charges once.

``before_task_publish`` records the execution ``REQUESTED`` before the broker sees the
message, so a publish whose send then raises leaves a record with no message. The caller
saw the error: it retries, or gives up.

- From a body, the publish gives its position back, so the body's retry is the same
  derived id: one execution, whatever the sweep does later.
- Outside a body, under an id Celery made for that call alone, the recorded execution is
  ended ``EXPIRED`` (never started), so the sweep never revives it: a caller who gave up
  is never charged, and one who retried under a new id is charged once.
- An id that is published again as it is (derived in a body, or chosen by the caller)
  stays ``REQUESTED``: its next publish, or else the sweep, sends it.
- ``send_task``'s positional ``task_id`` is its fifth argument after the name, not its
  fourth (``eta``): a body's ``send_task(name, args, kwargs, None, eta)`` still gets the
  stable id.

The broker's refusal is simulated in this process by patching kombu's
``Producer.publish`` to raise ``OperationalError``: what is under test is our reaction
to an exception from the publish, not the broker.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from typing import Any

import kombu.messaging
import pytest
from celery import Celery
from celery import signals as celery_signals
from kombu.exceptions import OperationalError

from celery_agboss.core.executions import ExecutionRecord
from celery_agboss.core.protections import (
    REFUSED_PUBLISH_KEEPS_ITS_POSITION,
    REFUSED_PUBLISH_LEFT_FOR_THE_SWEEP,
    SEND_TASK_ID_READ_FROM_ETA,
)
from celery_agboss.signals import publish
from celery_agboss.testing.gateway_types import FakeGatewayFault
from celery_agboss.testing.switches import sabotage
from tests.delivery.conftest import PaymentShop
from tests.support.processes import wait_until

GRACE = 60


@pytest.fixture
def shop_config() -> dict[str, Any]:
    return {"agboss_requested_grace": GRACE}


@pytest.fixture
def refused(monkeypatch: pytest.MonkeyPatch) -> Callable[[str, int], list[str]]:
    """``refused(task, times)``: the first ``times`` publishes of ``task`` raise
    ``OperationalError`` after ``before_task_publish`` recorded them (a broker refusal,
    simulated in process); the ids refused, in order."""

    def arm(task: str, times: int = 1) -> list[str]:
        original = kombu.messaging.Producer.publish
        ids: list[str] = []

        def flaky(self: Any, body: Any, *args: Any, **kwargs: Any) -> Any:
            headers = kwargs.get("headers") or {}
            if headers.get("task") == task and len(ids) < times:
                ids.append(str(headers.get("id")))
                raise OperationalError("broker connection lost")
            return original(self, body, *args, **kwargs)

        monkeypatch.setattr(kombu.messaging.Producer, "publish", flaky)
        return ids

    return arm


def _executions_of(shop: PaymentShop, task: str) -> list[ExecutionRecord]:
    return [r for r in shop.agboss.executions.list_executions(limit=100) if r.task_name == task]


def _charged(shop: PaymentShop, order: str, amount: int) -> int:
    return sum(
        1 for p in shop.gateway.payments if p["reference"] == order and p["amount"] == amount
    )


def _sweep_after_the_grace(shop: PaymentShop, task: str) -> None:
    """Past ``agboss_requested_grace``: the sweep re-publishes what it takes for lost,
    and every execution of ``task`` it revived runs to its end."""
    shop.clock.advance(GRACE + 1)
    shop.sweep(claim_tick=False)
    wait_until(
        lambda: all(r.state.value in ("COMPLETED", "EXPIRED") for r in _executions_of(shop, task)),
        20,
        message=lambda: f"every {task} to end ({_executions_of(shop, task)})",
    )


# --- from a body --------------------------------------------------------------------------


def _pay_then_ship(shop: PaymentShop, order: str, *, retries: int) -> None:
    """``pay`` charges 1000, then publishes ``ship`` (a 500 shipping charge), trying the
    publish ``retries`` + 1 times while the broker refuses it, then going on."""
    charge, ship = shop.call("shop.charge"), shop.ship_task()

    @shop.task()
    def pay(self: Any, order: str) -> Any:
        paid = self.outbound(charge, {"amount": 1000, "order": order}, business_key=order)
        for _ in range(retries + 1):
            try:
                ship.delay(order)
                break
            except OperationalError:
                continue
        return paid

    with shop.worker():
        shop.deliver(pay, order, states=("COMPLETED",), timeout=30)
        if retries:
            wait_until(
                lambda: any(r.state.value == "COMPLETED" for r in _executions_of(shop, ship.name)),
                20,
                message="the retried ship",
            )
        _sweep_after_the_grace(shop, ship.name)


def test_a_body_retrying_a_refused_publish_ships_once(
    shop: PaymentShop, refused: Callable[[str, int], list[str]]
) -> None:
    ids = refused("shop.ship", 1)
    _pay_then_ship(shop, "o-7", retries=2)
    assert [r.id for r in _executions_of(shop, "shop.ship")] == ids, "the retry is the same id"
    assert _charged(shop, "o-7", 1000) == 1
    assert _charged(shop, "o-7", 500) == 1


def test_a_refused_publish_keeping_its_position_ships_twice(
    shop: PaymentShop, refused: Callable[[str, int], list[str]]
) -> None:
    refused("shop.ship", 1)
    with sabotage(REFUSED_PUBLISH_KEEPS_ITS_POSITION):
        _pay_then_ship(shop, "o-7", retries=2)
    assert _charged(shop, "o-7", 500) == 2, "the retry's ship, and the refused one revived"


def test_a_refused_publish_from_a_body_that_went_on_is_sent_by_the_sweep(
    shop: PaymentShop, refused: Callable[[str, int], list[str]]
) -> None:
    """Its id is the parent's position, which every re-run publishes again: it is kept
    ``REQUESTED`` (never ended, which would drop those publishes), so it goes out once,
    from the sweep, as a canvas published from a body does through the outbox."""
    ids = refused("shop.ship", 1)
    _pay_then_ship(shop, "o-8", retries=0)
    assert [(r.id, r.state.value) for r in _executions_of(shop, "shop.ship")] == [
        (ids[0], "COMPLETED")
    ]
    assert _charged(shop, "o-8", 500) == 1


def test_another_publish_after_a_refused_one_takes_the_next_position(
    shop: PaymentShop, refused: Callable[[str, int], list[str]]
) -> None:
    """Only a retry (the same arguments) takes the refused position again: a body that
    goes on to ship another parcel gets its own execution, and the refused one is sent
    by the sweep under its own id, each shipped once."""
    shipping = shop.call("shop.shipping")

    @shop.task()
    def ship(self: Any, parcel: str) -> Any:
        return self.outbound(shipping, {"amount": 500, "order": parcel})

    @shop.task()
    def pack(self: Any, order: str) -> str:
        with contextlib.suppress(OperationalError):
            ship.delay(f"{order}-a")
        ship.delay(f"{order}-b")
        return order

    ids = refused("shop.ship", 1)
    with shop.worker():
        shop.deliver(pack, "o-12", states=("COMPLETED",), timeout=30)
        wait_until(lambda: _charged(shop, "o-12-b", 500) == 1, 20, message="parcel b")
        _sweep_after_the_grace(shop, ship.name)
    assert ids[0] in {r.id for r in _executions_of(shop, ship.name)}
    assert (_charged(shop, "o-12-a", 500), _charged(shop, "o-12-b", 500)) == (1, 1)


# --- outside a body -----------------------------------------------------------------------


def _charge_order(shop: PaymentShop) -> Any:
    charge = shop.call("shop.charge")

    @shop.task()
    def charge_order(self: Any, order: str) -> Any:
        return self.outbound(charge, {"amount": 1000, "order": order})

    return charge_order


def _give_up(shop: PaymentShop, refused: Callable[[str, int], list[str]]) -> str:
    """A web handler publishes ``charge_order``, sees the broker's error and gives up."""
    charge_order = _charge_order(shop)
    ids = refused("shop.charge_order", 1)
    with shop.worker():
        with pytest.raises(OperationalError, match="broker connection lost"):
            charge_order.delay("o-9")
        _sweep_after_the_grace(shop, charge_order.name)
    return ids[0]


def test_a_caller_who_gave_up_after_a_refused_publish_is_never_charged(
    shop: PaymentShop, refused: Callable[[str, int], list[str]]
) -> None:
    task_id = _give_up(shop, refused)
    record = shop.execution(task_id)
    assert record.state.value == "EXPIRED" and record.started_at_ms is None
    assert "OperationalError" in (record.reason or "")
    assert _charged(shop, "o-9", 1000) == 0


def test_a_refused_publish_left_for_the_sweep_charges_a_caller_who_gave_up(
    shop: PaymentShop, refused: Callable[[str, int], list[str]]
) -> None:
    with sabotage(REFUSED_PUBLISH_LEFT_FOR_THE_SWEEP):
        task_id = _give_up(shop, refused)
    assert shop.execution(task_id).state.value == "COMPLETED"
    assert _charged(shop, "o-9", 1000) == 1, "charged behind the back of a caller told no"


def _retry(shop: PaymentShop, refused: Callable[[str, int], list[str]], **options: Any) -> None:
    """A caller retries its publish after the broker's error (under ``options``)."""
    charge_order = _charge_order(shop)
    refused("shop.charge_order", 1)
    with shop.worker():
        for _ in range(3):
            try:
                task_id = str(charge_order.apply_async(("o-10",), **options).id)
                break
            except OperationalError:
                continue
        shop.wait_state(task_id, "COMPLETED", timeout=30)
        _sweep_after_the_grace(shop, charge_order.name)


def test_a_caller_who_retried_a_refused_publish_is_charged_once(
    shop: PaymentShop, refused: Callable[[str, int], list[str]]
) -> None:
    _retry(shop, refused)
    assert _charged(shop, "o-10", 1000) == 1


def test_a_refused_publish_left_for_the_sweep_charges_a_retrying_caller_twice(
    shop: PaymentShop, refused: Callable[[str, int], list[str]]
) -> None:
    with sabotage(REFUSED_PUBLISH_LEFT_FOR_THE_SWEEP):
        _retry(shop, refused)
    assert _charged(shop, "o-10", 1000) == 2


def test_a_caller_retrying_under_its_own_id_is_charged_once(
    shop: PaymentShop, refused: Callable[[str, int], list[str]]
) -> None:
    """A chosen id is kept ``REQUESTED``: the retry under it is the same execution (ended,
    the retry's message would be dropped and the order never charged)."""
    _retry(shop, refused, task_id="order-o-10")
    assert shop.execution("order-o-10").state.value == "COMPLETED"
    assert _charged(shop, "o-10", 1000) == 1


# --- send_task's positional task id -------------------------------------------------------


@pytest.fixture
def ships_published() -> Iterator[tuple[list[str], list[str]]]:
    """Ids of ``shop.ship`` that reached the broker, and that ran."""
    published: list[str] = []
    ran: list[str] = []

    def on_publish(sender: Any = None, headers: Any = None, **_: Any) -> None:
        if sender == "shop.ship":
            published.append(str((headers or {}).get("id")))

    def on_postrun(sender: Any = None, task_id: Any = None, **_: Any) -> None:
        if getattr(sender, "name", None) == "shop.ship":
            ran.append(str(task_id))

    celery_signals.after_task_publish.connect(on_publish, weak=False)
    celery_signals.task_postrun.connect(on_postrun, weak=False)
    try:
        yield published, ran
    finally:
        celery_signals.after_task_publish.disconnect(on_publish)
        celery_signals.task_postrun.disconnect(on_postrun)


def _send_task_with_an_eta_then_a_lost_answer(
    shop: PaymentShop, seen: tuple[list[str], list[str]]
) -> None:
    """``pay`` publishes ``ship`` by ``send_task`` with a positional ``eta`` and then loses
    its charge's answer, so its re-run publishes ``ship`` again."""
    charge = shop.call("shop.charge")
    shop.ship_task()  # published by its name below
    published, _ = seen

    @shop.task()
    def pay(self: Any, order: str) -> Any:
        self.app.send_task("shop.ship", [order], {}, None, datetime.now(timezone.utc))
        return self.outbound(charge, {"amount": 1000, "order": order}, business_key=order)

    shop.gateway.inject_fault(FakeGatewayFault.ANSWER_THEN_DROP, operation="charge", times=1)
    with shop.worker():
        shop.deliver(pay, "o-11", states=("COMPLETED",), timeout=30)
        wait_until(lambda: len(published) >= 2, 10, message="both publishes of ship")
        # Each published ship to its end: a run that only retried (its postrun seen) has
        # not charged yet.
        for ship_id in sorted(set(published)):
            shop.wait_state(ship_id, "COMPLETED", "FAILED", "WAITING_OPERATOR")


def test_a_send_task_with_a_positional_eta_is_one_execution_on_every_rerun(
    shop: PaymentShop, ships_published: tuple[list[str], list[str]]
) -> None:
    _send_task_with_an_eta_then_a_lost_answer(shop, ships_published)
    assert len(set(ships_published[0])) == 1, "the re-run published the same id"
    assert _charged(shop, "o-11", 500) == 1


def test_a_task_id_read_from_the_eta_ships_twice(
    shop: PaymentShop, ships_published: tuple[list[str], list[str]]
) -> None:
    with sabotage(SEND_TASK_ID_READ_FROM_ETA):
        _send_task_with_an_eta_then_a_lost_answer(shop, ships_published)
    assert _charged(shop, "o-11", 500) == 2


def test_send_task_names_its_task_id_fifth_after_the_name() -> None:
    """Checked against Celery's own signature: ``args, kwargs, countdown, eta, task_id``."""
    at = publish._task_id_index(Celery.send_task)
    assert at == 4
    eta = datetime.now(timezone.utc)
    assert not publish._chosen_task_id(at, ([], {}, None, eta), {})
    assert publish._chosen_task_id(at, ([], {}, None, eta, "mine"), {})
    assert publish._chosen_task_id(at, ([],), {"task_id": "mine"})
    assert publish._with_task_id(at, ([], {}, None, eta, None), {}, "derived") == (
        ([], {}, None, eta, "derived"),
        {},
    )
    assert publish._with_task_id(at, ([], {}), {}, "derived") == (([], {}), {"task_id": "derived"})
