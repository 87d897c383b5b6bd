"""A rolling upgrade on a RabbitMQ quorum queue: a worker of this version keeps getting
the message of an execution whose state a newer version wrote, and hands it back.

Each hand-back counts toward the queue's ``delivery-limit`` (20 by default from
RabbitMQ 4.0; 5 here, so the test takes seconds), past which the broker drops the
message. At one hand-back a second the message was dropped within the limit's seconds:
when the upgrade finished, the charge the newer version still had to make was gone (no
payment for the order). Now the pause doubles with each hand-back the broker counted
(``x-delivery-count``), so an upgrade of 10 s keeps the message: the first worker that
knows the state charges it once (twin ``newer-state-handed-back-at-once``). A message
dropped all the same is a lost one: the sweep of the version that knows its state
re-publishes it after its grace, and the order is charged once, later.

The newer version's worker is stood for by this version's, once the row holds a state
this version knows again (as tests/delivery/test_states_of_a_newer_version.py does).
"""

from __future__ import annotations

import time

import pytest

from celery_agboss.core.protections import NEWER_STATE_HANDED_BACK_AT_ONCE
from tests.integration.harness import Shop, ShopFactory
from tests.integration.quorum_upgrades import (
    HANDED_BACK,
    a_newer_versions_charge,
    charges,
    set_state,
)
from tests.support.processes import ManagedProcess, assert_stays, wait_until

pytestmark = [pytest.mark.worker, pytest.mark.rabbitmq, pytest.mark.slow]

DELIVERY_LIMIT = 5
UPGRADE_SECONDS = 10.0
"""How long after the first hand-back the upgrade finishes: past the 5 hand-backs one a
second makes, between the fourth (7 s) and fifth (15 s) the doubling pause makes."""


def _an_upgrade_of_ten_seconds(
    shop_factory: ShopFactory,
    rabbitmq_url: str,
    sabotage: tuple[str, ...] = (),
    **config: object,
) -> tuple[Shop, str, ManagedProcess]:
    """A charge recorded, moved on by a newer version, then delivered to a worker of
    this version on a quorum queue; the upgrade finishes ``UPGRADE_SECONDS`` after the
    first hand-back."""
    shop, execution_id, worker = a_newer_versions_charge(
        shop_factory,
        rabbitmq_url,
        order="o-quorum",
        delivery_limit=DELIVERY_LIMIT,
        sabotage=sabotage,
        **config,
    )
    wait_until(lambda: HANDED_BACK in worker.output(), 30, message="the first hand-back")
    upgraded_at = time.monotonic() + UPGRADE_SECONDS
    # The scenario's own time line (the upgrade lasts this long), not a synchronisation.
    wait_until(lambda: time.monotonic() >= upgraded_at, UPGRADE_SECONDS + 1, message="the upgrade")
    assert charges(shop) == 0
    set_state(shop, execution_id, "REQUESTED")
    return shop, execution_id, worker


def test_on_a_quorum_queue_an_upgrade_longer_than_the_delivery_limit_still_charges_once(
    shop_factory: ShopFactory, rabbitmq_url: str
) -> None:
    shop, execution_id, worker = _an_upgrade_of_ten_seconds(shop_factory, rabbitmq_url)

    shop.wait_state(execution_id, "COMPLETED", timeout=30)
    assert charges(shop) == 1
    assert worker.output().count(HANDED_BACK) < DELIVERY_LIMIT


def test_twin_handed_back_every_second_the_quorum_queue_drops_the_charge(
    shop_factory: ShopFactory, rabbitmq_url: str
) -> None:
    shop, execution_id, worker = _an_upgrade_of_ten_seconds(
        shop_factory, rabbitmq_url, sabotage=(NEWER_STATE_HANDED_BACK_AT_ONCE,)
    )

    # A message still queued would run within its one-second pause: 5 s say it is gone.
    assert_stays(lambda: charges(shop) == 0, 5.0)
    assert shop.execution(execution_id).state.value == "REQUESTED"  # type: ignore[union-attr]
    assert worker.output().count(HANDED_BACK) >= DELIVERY_LIMIT


def test_a_charge_the_quorum_queue_dropped_is_re_published_by_the_sweep_that_knows_its_state(
    shop_factory: ShopFactory, rabbitmq_url: str
) -> None:
    """What a drop costs (the limit reached all the same): a lost message, re-published
    by the sweep of the version that knows the row's state once its grace passed
    (design: re-driven when due); the order is charged once, later."""
    shop, execution_id, _ = _an_upgrade_of_ten_seconds(
        shop_factory,
        rabbitmq_url,
        sabotage=(NEWER_STATE_HANDED_BACK_AT_ONCE,),
        requested_grace=5,
    )

    with shop.sweeping():
        shop.wait_state(execution_id, "COMPLETED", timeout=30)
    assert charges(shop) == 1
