"""The design's crash scenarios in a Django shop: a charge through ``self.outbound``, then
the order marked paid through the ORM in a fenced effect, on a real prefork worker
(the zombie of PS3/PS4 is tests/django/test_django_fence.py's).

Counted at the gateway (every charge request that reached it, whatever its key) and in
the shop's own table. Speed-ups: those of the Django shop (tests/support/django_harness.py).
"""

from __future__ import annotations

import os
import signal

import pytest

from celery_agboss.core.protections import (
    DJANGO_WRITES_OFF_THE_FENCE,
    PENDING_RESENT_WITHOUT_RECONCILE,
    STRANDED_NOT_RECONCILED,
)
from tests.support.django_harness import DjangoShop
from tests.support.processes import wait_until

pytestmark = [pytest.mark.worker, pytest.mark.redis, pytest.mark.slow]


def _guarded_and_twin(flag: str, guarded: str, twin: str) -> pytest.MarkDecorator:
    """The guarded case (``flag`` true) on SQLite and PostgreSQL, ``<store>-<guarded>``,
    then its twin (``flag`` false) on PostgreSQL only, ``postgresql-twin-<twin>``."""
    return pytest.mark.parametrize(
        ("django_backend", flag),
        [("sqlite", True), ("postgresql", True), ("postgresql", False)],
        ids=[f"sqlite-{guarded}", f"postgresql-{guarded}", f"postgresql-twin-{twin}"],
        indirect=["django_backend"],
    )


def charges_for(shop: DjangoShop, reference: str) -> int:
    return sum(1 for seen in shop.gateway.charges_seen if seen.reference == reference)


@_guarded_and_twin("protected", "fenced", "off-the-fence")
def test_ps2_a_child_killed_after_the_charge_before_the_orm_write_commits(
    django_shop: DjangoShop, protected: bool
) -> None:
    """PS2: the charge made, the ORM write done but not committed, the child SIGKILLed.
    The recovery replays the charge and writes once; off the fence (the twin) the dead
    child's write had committed by itself, and the order is marked paid twice. The twin
    runs on PostgreSQL: on SQLite a write off the fence waits for the database's one
    write lock, which the fence's own transaction holds, and no delivery ever finishes."""
    django_shop.start(sabotage=() if protected else (DJANGO_WRITES_OFF_THE_FENCE,))
    task_id = django_shop.publish("pay_order", "o-1", 500, "o-1")
    waiters = wait_until(
        lambda: django_shop.gateway.gate_waiters("o-1"), 30, message="fn at the gate"
    )
    os.kill(waiters[0], signal.SIGKILL)
    django_shop.gateway.open_gate("o-1")  # the next attempt goes through
    django_shop.wait_state(task_id, "COMPLETED")
    assert charges_for(django_shop, "o-1") == 1
    assert django_shop.times_paid("o-1") == (1 if protected else 2)


@_guarded_and_twin("protected", "reconciled", "resent")
def test_ps5_a_child_killed_after_the_send_before_the_answer(
    django_shop: DjangoShop, protected: bool
) -> None:
    """PS5: the gateway made the payment and holds its answer; the child that sent it is
    SIGKILLed. The recovery asks the gateway (reconcile) and sends nothing again; the
    twin, neither the sweep nor the next delivery asking, sends it again (a second
    request at the gateway). The twin runs on PostgreSQL only: what it switches off asks
    the gateway, not the store."""
    twin = (PENDING_RESENT_WITHOUT_RECONCILE, STRANDED_NOT_RECONCILED)
    django_shop.start(sabotage=() if protected else twin)
    held = django_shop.gateway.hold_next_answer(reference="o-1")
    task_id = django_shop.publish("pay_order", "o-1", 500)
    assert held.wait_reached(30), "the charge reached the gateway"
    assert held.pid is not None
    os.kill(held.pid, signal.SIGKILL)
    held.release()
    django_shop.wait_state(task_id, "COMPLETED")
    assert charges_for(django_shop, "o-1") == (1 if protected else 2)
    assert django_shop.times_paid("o-1") == 1


@_guarded_and_twin("keyed", "business-key", "no-business-key")
def test_ps8_two_executions_for_one_order_charge_and_mark_it_paid_once(
    django_shop: DjangoShop, keyed: bool
) -> None:
    """PS8: two executions (a double click) for one order, at once on two pool children.
    With the order as business key the second replays the first's charge and its ORM
    write; the twin, without one, is two payments and the order marked paid twice (on
    PostgreSQL only: it leaves out the caller's key, whatever the store)."""
    django_shop.start()
    first = django_shop.publish("pay_order", "o-1", 500, None, keyed)
    second = django_shop.publish("pay_order", "o-1", 500, None, keyed)
    django_shop.wait_state(first, "COMPLETED")
    django_shop.wait_state(second, "COMPLETED")
    assert charges_for(django_shop, "o-1") == (1 if keyed else 2)
    assert django_shop.times_paid("o-1") == (1 if keyed else 2)
