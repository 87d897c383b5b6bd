"""The sweep sends the links a lost message took with it (design: sweep, terminal replays).

``charge | ship``: the charge completes, the send of ``ship`` (the chain's next step) is
refused, the message goes back to the broker, and the broker loses it (purged, as a
Redis restarted without persistence, or a quorum queue's ``delivery-limit``). The
execution stays ``COMPLETED`` with ``links_dispatched`` false: paid, never shipped.
Past ``agboss_requested_grace`` the sweep re-publishes its message once; its replay, in a
worker thread, sends ``ship``. Counted at the broker (``published``) and the gateway.

What the step must not do: re-publish a row retention deletes before its message is
taken (the replay finds no row and charges again), send again links that went out when
only their record was lost (the result backend holds ``SUCCESS``), or stop at a row no
key opens.
"""

from __future__ import annotations

import base64
import logging
import os
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from celery import chain
from kombu.exceptions import OperationalError
from sqlalchemy import select, update

from celery_agboss.core.executions import ExecutionState
from celery_agboss.core.protections import (
    RETENTION_DELETES_A_REPUBLISHED_EXECUTION,
    UNSENT_LINKS_BACKEND_NOT_READ,
    UNSENT_LINKS_CAPPED_BY_WHOLE_LIFE,
    UNSENT_LINKS_PAST_RETENTION,
    UNSENT_LINKS_WITHOUT_CLAIM,
)
from celery_agboss.core.sealing import key_variable
from celery_agboss.delivery import link_ends
from celery_agboss.errors import StoreUnavailableError
from celery_agboss.store.execution_store import SQLAlchemyExecutionStore
from celery_agboss.store.schema_executions import executions
from celery_agboss.store.unsent_links import UnsentLinksRow, find_unsent_links
from celery_agboss.sweep import links as links_step
from celery_agboss.task import PaymentTask
from celery_agboss.testing.celery_app import running_worker
from celery_agboss.testing.switches import sabotage
from tests.operations.conftest import WorldFactory
from tests.operations.poison import poison, sealed_world
from tests.operations.world import CAP, GRACE_SECONDS, World
from tests.support.processes import wait_until

SHIP_AMOUNT = 7
CHARGE_AMOUNT = 1000
LONG = timedelta(days=30)
"""A retention longer than the default's (7 days), for a sweeper configured apart."""


class Shop:
    """``charge`` and ``ship`` on the world's app; ``refusing``: the broker refuses ``ship``."""

    def __init__(self, world: World, monkeypatch: pytest.MonkeyPatch) -> None:
        self.world = world
        self.refusing = False
        self.refused = 0
        call = world.call

        @world.app.task(base=PaymentTask, bind=True, shared=False, name="ops.links.charge")
        def charge(self: Any, order: str) -> Any:
            return self.outbound(
                call, {"amount": CHARGE_AMOUNT, "order": order}, business_key=order
            )

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
        self.notified: list[Any] = []

        @world.app.task(shared=False, name="ops.links.notify")
        def notify(paid: Any) -> None:  # a plain callback: an e-mail, a ledger post
            self.notified.append(paid)

        self.charge, self.ship, self.notify = charge, ship, notify
        self.monkeypatch = monkeypatch

    def shipped(self) -> int:
        return sum(1 for r in self.world.gateway.requests if r.amount == SHIP_AMOUNT)

    def charged(self) -> int:
        return sum(1 for r in self.world.gateway.requests if r.amount == CHARGE_AMOUNT)

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

    def completed_with_its_mark_lost(self, order: str = "o-1") -> str:
        """The charge completes and ``notify`` runs, but recording its links sent fails
        every try (the store failed over during ``on_success``); the charge's id."""
        self.world.app.control.purge()

        def blip(*_: Any, **__: Any) -> None:
            raise StoreUnavailableError("test: the store failed over during on_success")

        with self.monkeypatch.context() as lost:
            lost.setattr(link_ends, "_MARK_BACKOFF_SECONDS", 0.0)
            lost.setattr(SQLAlchemyExecutionStore, "mark_links_dispatched", blip)
            with running_worker(self.world.app):
                pay_id = str(self.charge.apply_async((order,), link=self.notify.s()).id)
                wait_until(lambda: len(self.notified) >= 1, 15, message="the callback")
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

    def replay_or_rerun(self, pay_id: str) -> None:
        """A worker takes the re-published message, whatever it finds of ``pay_id``."""
        with running_worker(self.world.app):
            wait_until(lambda: self.shipped() >= 1, 15, message="ship's charge")

    def past_the_grace(self) -> None:
        self.world.clock.advance(GRACE_SECONDS + 1)

    def unsent(self) -> list[str]:
        return [row.id for row in listed(self.world)]


def listed(world: World) -> list[UnsentLinksRow]:
    """What the step's listing reads now, with the world's settings."""
    s = world.agboss.settings
    return find_unsent_links(
        world.agboss.store,
        100,
        s.requested_grace_ms,
        s.max_recovery_attempts,
        retention_ms=s.terminal_execution_retention_ms,
    )


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
    read_before = listed(world)
    world.sweep()
    monkeypatch.setattr(links_step, "find_unsent_links", lambda *_, **__: read_before)
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


def test_an_execution_completed_at_the_cap_has_its_links_sent_once_said_last(
    shop: Shop, world: World, caplog: pytest.LogCaptureFixture
) -> None:
    """The recovery count is the execution's whole life: its message was lost and
    re-driven up to the cap before a copy got through and completed. Its links still go
    out, once, and the operator is told it was the last (design: recovery cap)."""
    pay_id = shop.completed_with_its_links_lost()
    with world.agboss.store.engine.begin() as conn:  # re-driven CAP times before that
        conn.execute(update(executions).where(executions.c.id == pay_id).values(recovery_count=CAP))
    published = world.publishes_of(pay_id)
    counts = []
    with caplog.at_level(logging.INFO, logger="celery_agboss"):
        for _ in range(CAP):
            shop.past_the_grace()
            counts.append(world.sweep_sending_nothing().links_republished)
    assert counts == [1] + [0] * (CAP - 1)
    assert world.publishes_of(pay_id) == published + 1
    said = [r for r in caplog.records if getattr(r, "event", None) == "sweep.links-republished"]
    assert [(r.levelno, r.__dict__.get("last")) for r in said] == [(logging.WARNING, True)]
    shop.replay(pay_id)
    assert (shop.shipped(), shop.charged()) == (1, 1), "shipped once, charged once"


def test_twin_capped_by_the_whole_life_count_its_links_never_go_out(
    shop: Shop, world: World
) -> None:
    """Sabotage twin: the cap read over the execution's whole life keeps a completion at
    the cap out of the listing: paid, never shipped, nothing said."""
    pay_id = shop.completed_with_its_links_lost()
    with world.agboss.store.engine.begin() as conn:
        conn.execute(update(executions).where(executions.c.id == pay_id).values(recovery_count=CAP))
    published = world.publishes_of(pay_id)
    with sabotage(UNSENT_LINKS_CAPPED_BY_WHOLE_LIFE):
        for _ in range(CAP):
            shop.past_the_grace()
            assert world.sweep_sending_nothing().links_republished == 0
    assert world.publishes_of(pay_id) == published
    assert shop.shipped() == 0


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


# --- retention: a row it deletes is never re-published (design: unsent links, retention) --


def test_an_execution_retention_deletes_is_left_alone_and_charged_once(
    shop: Shop, world: World
) -> None:
    """Completed so long ago that retention deletes it within two graces (the sweep was
    down, or the row predates the step; here in this very run): a message re-published
    for it would find no row and run the body again. It is left to an operator."""
    pay_id = shop.completed_with_its_links_lost()
    published = world.publishes_of(pay_id)
    world.clock.advance(timedelta(days=8))
    report = world.sweep()
    assert report.links_republished == 0 and report.executions_deleted == 1
    assert world.publishes_of(pay_id) == published, "nothing published for a deleted row"
    assert shop.charged() == 1


def test_without_the_bound_a_row_retention_deletes_is_republished(shop: Shop, world: World) -> None:
    pay_id = shop.completed_with_its_links_lost()
    published = world.publishes_of(pay_id)
    world.clock.advance(timedelta(days=8))
    with sabotage(UNSENT_LINKS_PAST_RETENTION):
        assert world.sweep().links_republished == 1
    assert world.publishes_of(pay_id) == published + 1


def test_a_row_is_listed_until_two_graces_before_retention_deletes_it(
    shop: Shop, world: World
) -> None:
    pay_id = shop.completed_with_its_links_lost()
    kept = world.agboss.settings.terminal_execution_retention_seconds
    world.clock.advance(kept - 2 * GRACE_SECONDS - 1)
    assert shop.unsent() == [pay_id]
    world.clock.advance(2)
    assert shop.unsent() == []


def test_a_message_republished_at_the_edge_of_retention_outlives_a_long_backlog(
    shop: Shop, world: World
) -> None:
    """Re-published just before the listing's bound, its message waits in a backlog
    longer than two graces: retention keeps the row as long as any message of its age,
    so the replay finds it and runs no body."""
    pay_id = shop.completed_with_its_links_lost()
    kept = world.agboss.settings.terminal_execution_retention_seconds
    world.clock.advance(kept - 2 * GRACE_SECONDS - 5)
    assert world.sweep().links_republished == 1
    world.clock.advance(2 * GRACE_SECONDS + 10)  # the message still waits in a queue
    assert world.sweep().executions_deleted == 0
    shop.replay(pay_id)
    assert (shop.shipped(), shop.charged()) == (1, 1), "the replay ran no body"


def _republished_by_a_longer_retention_then_swept_by_the_default(
    world_factory: WorldFactory, monkeypatch: pytest.MonkeyPatch
) -> Shop:
    """Two sweepers configured apart (a retention shortened in a rolling change): the one
    that keeps rows 30 days re-publishes an 8-day-old row, the default one (7 days) runs
    its retention before the message is taken, then a worker takes it."""
    longer = world_factory(
        outbound_retention=LONG, fenced_effect_retention=LONG, execution_retention=LONG
    )
    default = world_factory()
    shop = Shop(longer, monkeypatch)
    pay_id = shop.completed_with_its_links_lost()
    longer.clock.advance(timedelta(days=8))
    assert longer.sweep().links_republished == 1
    default.sweep()
    shop.replay_or_rerun(pay_id)
    return shop


def test_retention_keeps_an_execution_just_republished_and_it_charges_once(
    world_factory: WorldFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    shop = _republished_by_a_longer_retention_then_swept_by_the_default(world_factory, monkeypatch)
    assert shop.shipped() == 1
    assert shop.charged() == 1, "the replay ran no body"


def test_twin_retention_deletes_an_execution_just_republished_and_it_charges_again(
    world_factory: WorldFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    with sabotage(RETENTION_DELETES_A_REPUBLISHED_EXECUTION):
        shop = _republished_by_a_longer_retention_then_swept_by_the_default(
            world_factory, monkeypatch
        )
    assert shop.charged() == 2, "the message found no row and ran the body again"
    paid = [p for p in shop.world.gateway.payments if p["amount"] == CHARGE_AMOUNT]
    assert len(paid) == 2, "two payments at the gateway"


# --- links that went out, their record lost (design: unsent links, terminal replays) -----


def test_links_that_went_out_with_their_record_lost_are_marked_not_sent_again(
    shop: Shop, world: World
) -> None:
    """Celery stores SUCCESS only after sending the links: the backend's SUCCESS marks
    the row, nothing is published, the plain callback ran once."""
    pay_id = shop.completed_with_its_mark_lost()
    published = world.publishes_of(pay_id)
    shop.past_the_grace()
    assert world.sweep().links_republished == 0
    assert world.publishes_of(pay_id) == published, "nothing published"
    assert world.execution(pay_id).links_dispatched, "marked: never read again"
    assert shop.unsent() == []
    assert len(shop.notified) == 1


def test_without_the_backend_read_a_plain_callback_runs_twice(shop: Shop, world: World) -> None:
    pay_id = shop.completed_with_its_mark_lost()
    published = world.publishes_of(pay_id)
    shop.past_the_grace()
    with sabotage(UNSENT_LINKS_BACKEND_NOT_READ):
        assert world.sweep().links_republished == 1
    assert world.publishes_of(pay_id) == published + 1
    with running_worker(world.app):
        wait_until(lambda: len(shop.notified) >= 2, 15, message="the callback again")


def test_a_backend_that_cannot_tell_falls_back_to_the_republish(
    shop: Shop, world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An error reading the backend (as one with nothing stored: ``ignore_result``, an
    expired result) re-publishes: the replay sends the links again under their ids."""
    pay_id = shop.completed_with_its_mark_lost()
    published = world.publishes_of(pay_id)
    shop.past_the_grace()

    def unreadable(*_: Any, **__: Any) -> Any:
        raise ConnectionError("test: the result backend is down")

    with monkeypatch.context() as down:
        down.setattr(world.app.backend, "get_state", unreadable)
        assert world.sweep().links_republished == 1
    assert world.publishes_of(pay_id) == published + 1


# --- a row no key opens (design: unsent links, sealed at rest) ----------------------------


def test_a_row_no_key_opens_fails_alone_by_name_and_the_others_links_go_out(
    world_factory: WorldFactory, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An old row sealed with a key dropped before ``rotate-keys`` reached it: the listing
    reads nothing sealed, so the row is claimed, fails when its message is read (named in
    ``sweep.error``), keeps its claim (one grace away, one recovery) and never stands in
    front of the others."""
    monkeypatch.setenv(key_variable("k1"), base64.b64encode(os.urandom(32)).decode())
    world = world_factory(encryption_keys=["k1"])
    shop = Shop(world, monkeypatch)
    old = shop.completed_with_its_links_lost("o-old")
    world.clock.advance(1)
    fresh = shop.completed_with_its_links_lost("o-fresh")
    dropped_key = "agbsealed:1:k0:" + base64.b64encode(os.urandom(40)).decode()
    with world.agboss.store.engine.begin() as conn:
        conn.execute(update(executions).where(executions.c.id == old).values(args=dropped_key))
    before = world.publishes_of(fresh)
    shop.past_the_grace()
    with caplog.at_level(logging.ERROR, logger="celery_agboss"):
        report = world.sweep()
    assert world.publishes_of(fresh) == before + 1, "the fresh execution's links go out"
    assert report.errors == 1
    failed = [r for r in caplog.records if getattr(r, "event", None) == "sweep.error"]
    assert [(r.__dict__.get("step"), r.__dict__.get("execution_id")) for r in failed] == [
        ("links", old)
    ]
    with world.agboss.store.engine.connect() as conn:
        claimed = conn.execute(
            select(executions.c.recovery_count).where(executions.c.id == old)
        ).scalar_one()
    assert claimed == 1, "the claim stays: it counts toward the cap"
    assert world.sweep().errors == 0, "within the grace it is not read again"


def test_a_row_no_key_opens_says_at_its_last_claim_that_an_operator_sends_its_links(
    world_factory: WorldFactory, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Its claims used up, each a ``sweep.error``, no ``sweep.links-republished`` can say
    it was the last: the last failed claim says it (WARNING ``last=true``, the hint)."""
    world = sealed_world(world_factory, monkeypatch)
    shop = Shop(world, monkeypatch)
    pay_id = shop.completed_with_its_links_lost()
    poison(world, executions, executions.c.id, pay_id, "args")
    errors = []
    with caplog.at_level(logging.WARNING, logger="celery_agboss"):
        for _ in range(CAP + 1):
            shop.past_the_grace()
            errors.append(world.sweep().errors)
    assert errors == [1] * CAP + [0]
    said = [r.__dict__ for r in caplog.records if r.levelno == logging.WARNING]
    fields = ("event", "step", "execution_id", "last")
    assert [tuple(w.get(f) for f in fields) for w in said] == [
        ("sweep.error", "links", pay_id, True)
    ]
    assert "AGBoss.republish" in said[0]["hint"]
