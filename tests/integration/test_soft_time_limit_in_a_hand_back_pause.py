"""A soft time limit and the pause before an old worker hands back the message of an
execution a newer version wrote (a rolling upgrade), on a real prefork worker and a
RabbitMQ quorum queue.

The pause grows with each hand-back the broker counted (1 s, 2 s, 4 s, …) and runs in
the pool child, under the task's soft time limit. A limit shorter than the pause (3 s
here; common for payment tasks) raised ``SoftTimeLimitExceeded`` in the middle of it: it
escaped as the task's error and Celery acknowledged the message, so once the upgrade
finished nothing charged the order (until the newer version's sweep re-published it,
after its grace). Now the pause stays under half the shortest time limit, and a limit
landing in it all the same still hands the message back (twin
``hand-back-pause-ignores-time-limits``; the catch alone in
``tests/delivery/test_newer_state_hand_back_pause.py``).
"""

from __future__ import annotations

import re

import pytest

from celery_agboss.core.protections import HAND_BACK_PAUSE_IGNORES_TIME_LIMITS
from tests.integration.harness import Shop, ShopFactory
from tests.integration.quorum_upgrades import (
    HANDED_BACK,
    a_newer_versions_charge,
    charges,
    set_state,
)
from tests.support.processes import ManagedProcess, assert_stays, wait_until

pytestmark = [pytest.mark.worker, pytest.mark.rabbitmq, pytest.mark.slow]

SOFT_TIME_LIMIT = 3
SOFT_LIMIT_HIT = "SoftTimeLimitExceeded"


def _an_upgrade_under_a_soft_limit(
    shop_factory: ShopFactory, rabbitmq_url: str, sabotage: tuple[str, ...] = ()
) -> tuple[Shop, str, ManagedProcess]:
    """A charge with a 3 s soft time limit, moved on by a newer version, delivered to a
    worker of this version on a quorum queue until it has paused three times (the third
    pause would be 4 s)."""
    shop, execution_id, worker = a_newer_versions_charge(
        shop_factory,
        rabbitmq_url,
        order="o-soft",
        delivery_limit=50,
        sabotage=sabotage,
        apply_options={"soft_time_limit": SOFT_TIME_LIMIT},
    )
    wait_until(lambda: worker.output().count(HANDED_BACK) >= 3, 30, message="3 hand-backs")
    return shop, execution_id, worker


def _pauses(worker: ManagedProcess) -> list[float]:
    return [float(p) for p in re.findall(HANDED_BACK + r".*?pause=([0-9.]+)", worker.output())]


def test_under_a_soft_time_limit_the_message_survives_the_pauses_and_charges_once(
    shop_factory: ShopFactory, rabbitmq_url: str
) -> None:
    shop, execution_id, worker = _an_upgrade_under_a_soft_limit(shop_factory, rabbitmq_url)
    wait_until(lambda: worker.output().count(HANDED_BACK) >= 4, 30, message="4 hand-backs")
    assert charges(shop) == 0

    set_state(shop, execution_id, "REQUESTED")  # the upgrade finished

    shop.wait_state(execution_id, "COMPLETED", timeout=30)
    assert charges(shop) == 1
    assert SOFT_LIMIT_HIT not in worker.output()
    assert max(_pauses(worker)) <= SOFT_TIME_LIMIT / 2


def test_twin_a_pause_past_the_soft_limit_acknowledges_the_message_and_nothing_charges(
    shop_factory: ShopFactory, rabbitmq_url: str
) -> None:
    shop, execution_id, worker = _an_upgrade_under_a_soft_limit(
        shop_factory, rabbitmq_url, sabotage=(HAND_BACK_PAUSE_IGNORES_TIME_LIMITS,)
    )
    wait_until(lambda: SOFT_LIMIT_HIT in worker.output(), 15, message="the soft limit")

    set_state(shop, execution_id, "REQUESTED")  # the upgrade finished

    # A message still queued would run within its next pause (at most 8 s here).
    assert_stays(lambda: charges(shop) == 0, 10.0)
    assert worker.output().count(HANDED_BACK) == 3
