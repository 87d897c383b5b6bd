"""``COMMIT`` sent as SQL text through Django's cursor inside a fenced effect is refused
(design: P2), as the store refuses it on its own connections
(tests/engine/test_commit_as_sql_text.py).

Django's cursor never passes through SQLAlchemy, so the store's ``CommitGuard`` does not
see it; the fence refuses it on its alias itself. Without that (the twins,
``django-commit-text-passes``), ``fn``'s write before the ``COMMIT`` commits on the
fence's first lease check alone, and the write happens twice:

- a holder that loses its lease while ``fn`` runs has its write committed, its commit-time
  check refuses and records nothing, and the holder that took over writes again
  (PostgreSQL; see the twin's docstring for SQLite);
- an ``fn`` that fails after its ``COMMIT`` has its write committed and nothing recorded,
  and the next delivery runs it again (both stores).

Each case runs in a process of the Django shop (its settings, its store on SQLite and
PostgreSQL, the order's row in its own table), with deliveries cut short as the
operations tests' ``World`` makes them: the holder "dies" by moving the virtual
database clock past its lease, and a second delivery takes the execution over.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from celery_agboss.core.protections import DJANGO_COMMIT_TEXT_PASSES
from tests.support.django_harness import DjangoShop

pytestmark = [pytest.mark.redis, pytest.mark.slow]

# In a process of the project (argv: the store's URL, the statement, and what fn does
# after it: "returns" or "fails"): the first delivery's fenced effect credits the order
# through Django's cursor, sends the statement on it, and the lease passes while fn runs;
# a second delivery takes the execution over and credits the order through the fence.
# Prints how the first ended, what the second got, whether its fn ran, and the records.
TAKE_OVER = r"""
import json, sys
import django
django.setup()
from django.db import connection
from celery_agboss.contrib.django.fence import transactions_on
from celery_agboss.core import sabotage
from celery_agboss.testing.clock import VirtualClock
from celery_agboss.testing.gateway import FakeGateway
from tests.operations.world import make_world

sabotage.activate_from_environment()  # the twin's switch, when the test sets one
store_url, statement, then = sys.argv[1:4]
clock = VirtualClock()
world = make_world(store_url, clock=clock, gateway=FakeGateway(clock=clock), published=[])
store = world.agboss.store
store.users_database = transactions_on(store.engine, "default")
CREDIT = "UPDATE orders_order SET times_paid = times_paid + 1 WHERE reference = 'o-1'"
seen = {"second_ran": False}

def credit_then_end_it(_conn):
    try:
        with connection.cursor() as cursor:
            cursor.execute(CREDIT)
            cursor.execute(statement)
    finally:
        world.die()  # the lease passes while fn runs
    if then == "fails":
        raise RuntimeError("the effect fails after its own COMMIT")
    return "credited"

def credit(_conn):
    seen["second_ran"] = True
    with connection.cursor() as cursor:
        cursor.execute(CREDIT)
    return "credited"

execution = world.publish("o-1")
first = world.start(execution)
try:
    first.fenced_effect("credit", credit_then_end_it)
except BaseException as stopped:
    seen["first"] = type(stopped).__name__
second = world.start(execution)
seen["second"] = second.fenced_effect("credit", credit)
second.settle_all_and_release()
with store.engine.connect() as conn:
    seen["recorded"] = conn.exec_driver_sql("SELECT count(*) FROM agboss_fenced_effects").scalar()
world.close()
print("SEEN" + json.dumps(seen), flush=True)
"""


def _take_over(
    django_shop: DjangoShop, statement: str, then: str, sabotage: tuple[str, ...] = ()
) -> dict[str, Any]:
    argv = ["-c", django_shop.url, statement, then]
    output = django_shop.run(f"import sys; sys.argv = {argv!r}\n{TAKE_OVER}", sabotage=sabotage)
    seen: dict[str, Any] = json.loads(output.split("SEEN", 1)[1].splitlines()[0])
    return seen


REFUSED_AND_TAKEN_OVER = {
    "first": "CommitInsideFencedEffectError",
    "second": "credited",
    "second_ran": True,
    "recorded": 1,
}


@pytest.mark.parametrize("statement", ["COMMIT", "commit;", " END", "ROLLBACK"])
def test_commit_as_sql_text_through_djangos_cursor_is_refused_and_a_take_over_writes_once(
    django_shop: DjangoShop, statement: str
) -> None:
    """P2: refused before it runs, the lost holder's write rolls back with its fence; the
    holder that took over writes it, once, with the effect's record."""
    assert _take_over(django_shop, statement, "returns") == REFUSED_AND_TAKEN_OVER
    assert django_shop.times_paid("o-1") == 1


@pytest.mark.parametrize("django_backend", ["postgresql"], indirect=True)
def test_twin_commit_as_sql_text_passes_and_a_lost_holder_writes_twice(
    django_shop: DjangoShop,
) -> None:
    """The twin (``django-commit-text-passes``): the lost holder's ``COMMIT`` commits its
    write on the first lease check alone; its commit-time check then finds the lease gone
    and records nothing, and the holder that took over writes again. PostgreSQL only: on
    SQLite the statements after the ``COMMIT`` run in autocommit, so the lost holder's
    record commits too (the check refuses too late) and the take-over replays it; the
    next twin shows the write twice there."""
    seen = _take_over(django_shop, "COMMIT", "returns", sabotage=(DJANGO_COMMIT_TEXT_PASSES,))
    assert seen == {**REFUSED_AND_TAKEN_OVER, "first": "ExecutionFencedError"}
    assert django_shop.times_paid("o-1") == 2, "the lost holder's write committed"


@pytest.mark.parametrize("protected", [True, False], ids=["refused", "twin-passes"])
def test_an_effect_failing_after_its_commit_as_sql_text_writes_once(
    django_shop: DjangoShop, protected: bool
) -> None:
    """P2: ``fn`` fails after its ``COMMIT``; refused, nothing of it stays and the next
    delivery writes once. The twin: its write committed though nothing was recorded, and
    the next delivery writes again."""
    sabotage = () if protected else (DJANGO_COMMIT_TEXT_PASSES,)
    seen = _take_over(django_shop, "COMMIT", "fails", sabotage=sabotage)
    if protected:
        assert seen == REFUSED_AND_TAKEN_OVER
        assert django_shop.times_paid("o-1") == 1
    else:
        assert seen == {**REFUSED_AND_TAKEN_OVER, "first": "RuntimeError"}
        assert django_shop.times_paid("o-1") == 2, "the failed effect's write committed"


def test_a_savepoint_sent_as_sql_text_passes_and_the_fence_still_holds(
    django_shop: DjangoShop,
) -> None:
    """Only what ends the transaction is refused: a savepoint (what an ``atomic()`` inside
    ``fn`` sends) runs, and the lost holder's commit-time check still refuses its write."""
    seen = _take_over(django_shop, "SAVEPOINT agboss_inner", "returns")
    assert seen == {**REFUSED_AND_TAKEN_OVER, "first": "ExecutionFencedError"}
    assert django_shop.times_paid("o-1") == 1
