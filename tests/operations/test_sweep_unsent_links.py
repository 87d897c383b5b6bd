"""The sweep sends the links a lost message took with it (design: sweep, terminal replays).

``charge | ship``: the charge completes, the send of ``ship`` (the chain's next step) is
refused, the message goes back to the broker, and the broker loses it (purged, as a
Redis restarted without persistence, or a quorum queue's ``delivery-limit``). The
execution stays ``COMPLETED`` with ``links_dispatched`` false: paid, never shipped.
Past ``agboss_requested_grace`` the sweep re-publishes its message once; its replay, in a
worker thread, sends ``ship``. Counted at the broker (``published``) and the gateway.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from celery import chain
from kombu.exceptions import OperationalError

from celery_agboss.core.executions import ExecutionState
from celery_agboss.core.protections import UNSENT_LINKS_WITHOUT_CLAIM
from celery_agboss.store.unsent_links import find_unsent_links
from celery_agboss.sweep import links as links_step
from celery_agboss.task import PaymentTask
from celery_agboss.testing.celery_app import running_worker
from celery_agboss.testing.switches import sabotage
from tests.operations.world import CAP, GRACE_SECONDS, World
from tests.support.processes import wait_until

SHIP_AMOUNT = 7


class Shop:
    """``charge`` and ``ship`` on the world's app; ``refusing``: the broker refuses ``ship``."""

    def __init__(self, world: World, monkeypatch: pytest.MonkeyPatch) -> None:
        self.world = world
        self.refusing = False
        self.refused = 0
        call = world.call

        @world.app.task(base=PaymentTask, bind=True, shared=False, name="ops.links.charge")
        def charge(self: Any, order: str) -> Any:
            return self.outbound(call, {"amount": 1000, "order": order}, business_key=order)

        @world.app.task(base=PaymentTask, bind=True, shared=False, name="ops.links.ship")
        def ship(self: Any, paid: Any, box: str) -> Any:
            return self.outbound(call, {"amount": SHIP_AMOUNT, "order": box}, business_key=box)

        real = ship.apply_async

        def refused_while_down(*args: Any, **kwargs: Any) -> Any:
            if self.refusing:
                self.refused += 1
                raise OperationalError("test: the broker refused the next step")
            return real(*args, **kwargs)

        monkeypatch.setattr(ship, "apply_async", refused_while_down)
        self.charge, self.ship = charge, ship

    def shipped(self) -> int:
        return sum(1 for r in self.world.gateway.requests if r.amount == SHIP_AMOUNT)

    def completed_with_its_links_lost(self, order: str = "o-1") -> str:
        """The charge completes, ``ship`` is refused and the handed-back message lost; the
        charge's id."""
        self.world.app.control.purge()
        self.refusing = True
        with running_worker(self.world.app):
            pay_id = str(chain(self.charge.s(order), self.ship.s("box-1")).apply_async().parent.id)
            wait_until(lambda: self.refused >= 1, 15, message="the refused send of ship")
        self.world.app.control.purge()  # the broker loses the handed-back message
        self.refusing = False
        record = self.world.execution(pay_id)
        assert record.state is ExecutionState.COMPLETED and not record.links_dispatched
        return pay_id

    def completed_without_links(self, order: str, **options: Any) -> str:
        with running_worker(self.world.app):
            task_id = str(self.charge.apply_async((order,), **options).id)
            wait_until(
                lambda: self.world.execution(task_id).state is ExecutionState.COMPLETED,
                15,
                message="the charge",
            )
        return task_id

    def replay(self, pay_id: str) -> None:
        """A worker takes the re-published message: its replay sends ``ship``."""
        with running_worker(self.world.app):
            wait_until(lambda: self.world.execution(pay_id).links_dispatched, 15, message="links")
            wait_until(lambda: self.shipped() >= 1, 15, message="ship's charge")

    def past_the_grace(self) -> None:
        self.world.clock.advance(GRACE_SECONDS + 1)

    def unsent(self) -> list[str]:
        s = self.world.agboss.settings
        found = find_unsent_links(
            self.world.agboss.store, 100, s.requested_grace_ms, s.max_recovery_attempts
        )
        return [record.id for record in found]


@pytest.fixture
def shop(world: World, monkeypatch: pytest.MonkeyPatch) -> Iterator[Shop]:
    yield Shop(world, monkeypatch)
    world.app.control.purge()


def test_links_a_lost_message_took_are_sent_once_after_the_grace(shop: Shop, world: World) -> None:
    pay_id = shop.completed_with_its_links_lost()
    published = world.publishes_of(pay_id)
    assert shop.shipped() == 0, "paid, not shipped"
    shop.past_the_grace()
    report = world.sweep_sending_nothing()
    assert report.links_republished == 1
    assert world.publishes_of(pay_id) == published + 1, "published once"
    shop.replay(pay_id)
    assert shop.shipped() == 1, "shipped once"
    shop.past_the_grace()
    again = world.sweep()
    assert again.links_republished == 0
    assert world.publishes_of(pay_id) == published + 1, "recorded sent: never again"


def test_nothing_is_republished_before_the_grace(shop: Shop, world: World) -> None:
    pay_id = shop.completed_with_its_links_lost()
    published = world.publishes_of(pay_id)
    world.clock.advance(GRACE_SECONDS - 5)
    assert world.sweep().links_republished == 0
    assert world.publishes_of(pay_id) == published


def test_a_completed_execution_without_links_is_never_republished_nor_read_again(
    shop: Shop, world: World
) -> None:
    plain = shop.completed_without_links("o-plain")
    # A custom header named like a link option: listed once, found link-less, marked.
    named = shop.completed_without_links("o-named", headers={"link": "not-a-link"})
    published = world.publishes_of(plain), world.publishes_of(named)
    shop.past_the_grace()
    assert shop.unsent() == [named], "a link-less message is never in the index"
    assert world.sweep().links_republished == 0
    assert shop.unsent() == [], "read once"
    assert world.execution(named).links_dispatched
    shop.past_the_grace()
    assert world.sweep().links_republished == 0
    assert (world.publishes_of(plain), world.publishes_of(named)) == published


def _two_sweepers(shop: Shop, world: World, monkeypatch: pytest.MonkeyPatch) -> int:
    """Two sweepers list the row before either claims it; how often it was published."""
    pay_id = shop.completed_with_its_links_lost()
    published = world.publishes_of(pay_id)
    shop.past_the_grace()
    s = world.agboss.settings
    listed = find_unsent_links(
        world.agboss.store, 10, s.requested_grace_ms, s.max_recovery_attempts
    )
    world.sweep()
    monkeypatch.setattr(links_step, "find_unsent_links", lambda *_, **__: listed)
    world.sweep()  # the second sweeper, on what it read before the first one's claim
    return world.publishes_of(pay_id) - published


def test_two_sweepers_publish_it_once(
    shop: Shop, world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _two_sweepers(shop, world, monkeypatch) == 1


def test_without_the_claim_two_sweepers_publish_it_twice(
    shop: Shop, world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    with sabotage(UNSENT_LINKS_WITHOUT_CLAIM):
        assert _two_sweepers(shop, world, monkeypatch) == 2


def test_a_replay_that_never_sends_is_republished_up_to_the_cap_once_per_grace(
    shop: Shop, world: World
) -> None:
    pay_id = shop.completed_with_its_links_lost()
    published = world.publishes_of(pay_id)
    shop.past_the_grace()
    counts = [world.sweep().links_republished]
    counts.append(world.sweep().links_republished)  # within the grace of the first
    for _ in range(CAP):
        shop.past_the_grace()
        counts.append(world.sweep().links_republished)
    assert counts == [1, 0] + [1] * (CAP - 1) + [0]
    assert world.publishes_of(pay_id) == published + CAP


def test_a_publish_that_fails_leaves_the_row_to_the_next_run(
    shop: Shop, world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    pay_id = shop.completed_with_its_links_lost()
    published = world.publishes_of(pay_id)
    shop.past_the_grace()

    def broker_down(*_: Any, **__: Any) -> Any:
        raise OperationalError("test: the broker is down")

    with monkeypatch.context() as down:
        down.setattr(links_step, "republish", broker_down)
        failed = world.sweep()
    assert failed.errors == 1 and failed.links_republished == 0
    assert world.sweep().links_republished == 1, "the next run, not one grace later"
    assert world.publishes_of(pay_id) == published + 1
    assert world.execution(pay_id).recovery_count == 1, "the failed publish counted nothing"
