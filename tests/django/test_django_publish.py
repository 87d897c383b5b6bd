"""A payment published inside a Django request's transaction is sent only if it commits.

Issue 27: inside ``transaction.atomic()`` on the store's alias, a plain ``.delay()`` of
a ``PaymentTask`` is recorded in that transaction (an outbox row) and sent once it
commits, its ``AsyncResult`` returned at once under the id fixed then. Each case runs
as a view would, in a process of the Django shop, with its worker and sweep loop on
Redis, the store on PostgreSQL and on SQLite; counted at the gateway.

- A view that raises after ``.delay()``: nothing recorded, nothing sent. Twin
  (``django-publish-before-commit``: sent at once, as a plain Celery ``.delay()`` is;
  PostgreSQL): the customer of the rolled-back request is charged.
- A committed one: sent once, under the id the view was given; ``delay_on_commit``
  too.
- A process that dies between its commit and the send: the sweep sends the recorded
  row after ``agboss_outbox_grace``, once.
- A chain and a task with callbacks wait for the commit too; a group's part is refused.

Speed-ups (tests/support/django_shop): ``-Q`` the test's queue, a 5 s lease, a 1 s retry
delay, a 1 s sweep loop, a 1 s outbox grace.
"""

from __future__ import annotations

import pytest

from celery_agboss.core.protections import DJANGO_PUBLISH_BEFORE_COMMIT
from tests.support.django_harness import DjangoShop

pytestmark = [pytest.mark.worker, pytest.mark.redis, pytest.mark.slow]

VIEW = """
from django.db import transaction
from tests.support.django_shop.tasks import charge_order

class RolledBack(Exception):
    pass

try:
    with transaction.atomic():
        result = charge_order.delay("8", 800)
        print("published", result.id, flush=True)
        raise RolledBack()
except RolledBack:
    pass
with transaction.atomic():
    committed = charge_order.delay("9", 900)
    later = charge_order.delay_on_commit("10", 1000)
    assert later is None
print("committed", committed.id, flush=True)
"""

DIES_AFTER_COMMIT = """
import os
from django.db import transaction
from tests.support.django_shop.tasks import charge_order

with transaction.atomic():
    transaction.on_commit(lambda: os._exit(0))  # runs first: before the send
    result = charge_order.delay("11", 1100)
    print("published", result.id, flush=True)
"""


CANVAS_VIEW = """
from celery import chain, group
from django.db import transaction
from celery_agboss.errors import PublishRefusedError
from tests.support.django_shop.tasks import charge_order

class RolledBack(Exception):
    pass

try:
    with transaction.atomic():
        chain(charge_order.s("20", 2000), charge_order.si("21", 2100)).delay()
        charge_order.apply_async(("22", 2200), link=charge_order.si("23", 2300))
        raise RolledBack()
except RolledBack:
    pass
with transaction.atomic():
    chain(charge_order.s("24", 2400), charge_order.si("25", 2500)).delay()
    charge_order.apply_async(("26", 2600), link=charge_order.si("27", 2700))
    try:
        group(charge_order.si("28", 2800), charge_order.si("29", 2900)).delay()
    except PublishRefusedError as refused:
        print("refused", type(refused).__name__, "on_commit" in str(refused), flush=True)
print("committed", flush=True)
"""


def _after(output: str, word: str) -> str:
    return output.split(f"{word} ", 1)[1].split()[0]


def _orders_charged(django_shop: DjangoShop) -> list[str | None]:
    return sorted(c.reference for c in django_shop.gateway.charges_seen)


def test_a_rolled_back_request_sends_nothing_and_a_committed_one_sends_once(
    django_shop: DjangoShop,
) -> None:
    django_shop.start()
    output = django_shop.run(VIEW)
    rolled_back, committed = _after(output, "published"), _after(output, "committed")
    assert django_shop.wait_state(committed, "COMPLETED")
    django_shop.wait_until(lambda: "10" in _orders_charged(django_shop), "delay_on_commit's charge")
    assert _orders_charged(django_shop) == ["10", "9"]
    assert django_shop.execution(rolled_back) is None, "nothing recorded for the rolled-back one"
    assert django_shop.query("SELECT count(*) FROM agboss_outbox")[0] == 2  # 9 and 10, sent


@pytest.mark.parametrize("django_backend", ["postgresql"], indirect=True)
def test_twin_sent_at_once_a_rolled_back_request_is_charged(django_shop: DjangoShop) -> None:
    """PostgreSQL only: on SQLite a publish sent at once inside ``atomic`` cannot even be
    recorded (the request's immediate transaction holds the one write lock), so it is
    refused there, which is why the recorded publish waits for the commit."""
    django_shop.start()
    output = django_shop.run(VIEW, sabotage=(DJANGO_PUBLISH_BEFORE_COMMIT,))
    rolled_back, committed = _after(output, "published"), _after(output, "committed")
    django_shop.wait_state(committed, "COMPLETED")
    django_shop.wait_state(rolled_back, "COMPLETED")
    django_shop.wait_until(lambda: "10" in _orders_charged(django_shop), "delay_on_commit's charge")
    assert _orders_charged(django_shop) == ["10", "8", "9"], "a rolled-back order was charged"


def test_a_send_lost_after_the_commit_is_the_sweeps_and_happens_once(
    django_shop: DjangoShop,
) -> None:
    django_shop.start()
    task_id = _after(django_shop.run(DIES_AFTER_COMMIT), "published")
    assert django_shop.wait_state(task_id, "COMPLETED")
    assert _orders_charged(django_shop) == ["11"]
    assert django_shop.query(
        "SELECT published_at_ms IS NOT NULL, sweep_publishes FROM agboss_outbox "
        "WHERE task_id = :id",
        id=task_id,
    ) == (True, 1)


def test_a_chain_or_callback_waits_for_the_commit_and_a_group_is_refused(
    django_shop: DjangoShop,
) -> None:
    """A chain's first task and a task with callbacks are recorded with their options and
    sent on commit (a rolled-back request charges none of them); a group's part cannot
    wait for the commit and is refused, naming ``transaction.on_commit``, on both stores
    (before, PostgreSQL sent it at once and SQLite failed on the write lock)."""
    django_shop.start()
    output = django_shop.run(CANVAS_VIEW)
    assert "refused PublishRefusedError True" in output, output
    expected = ["24", "25", "26", "27"]
    django_shop.wait_until(
        lambda: set(expected) <= set(_orders_charged(django_shop)),
        "the committed canvases' charges",
    )
    # The rolled-back ones were published first: sent at once, they would be here by now.
    assert _orders_charged(django_shop) == expected


@pytest.mark.parametrize("django_backend", ["postgresql"], indirect=True)
def test_twin_canvases_sent_at_once_charge_a_rolled_back_request(django_shop: DjangoShop) -> None:
    """The twin (``django-publish-before-commit``): the rolled-back request's chain and
    callback are sent at once, and its orders are charged."""
    django_shop.start()
    django_shop.run(CANVAS_VIEW, sabotage=(DJANGO_PUBLISH_BEFORE_COMMIT,))
    django_shop.wait_until(
        lambda: {"20", "22"} <= set(_orders_charged(django_shop)),
        "the rolled-back request's canvases to be charged",
    )
