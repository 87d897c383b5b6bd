"""A Django project's fenced effect: the ORM's writes commit with the fence, or never.

Issue 27 (P2 where a Django team writes): ``Order.objects.filter(...).update(...)``
inside ``self.fenced_effect`` runs in Django's ``atomic`` on the store's alias, the
same database transaction as the fence check and the effect's record.

- Once: a second execution under the order's business key replays the record and
  writes nothing (counted in the shop's own table: ``times_paid``); without the replay
  its ``fn`` runs again and its ORM write rolls back with the lost record insert (twin,
  off the fence as well: each run's write committed).
- A zombie: a pool child frozen (SIGSTOP) inside ``fn``, after its ORM write and
  before the commit, past its lease. PostgreSQL ends its idle transaction, the sweep
  re-drives the execution, another child takes it over and marks the order paid;
  continued, the zombie commits nothing. Twin (``django-writes-off-the-fence``: the
  effect on the store's own connection, as before the Django app): the zombie's ORM
  write committed by itself, and the order is paid twice.
- Prefork: each pool child fences on a session of its own, its ``conn`` the ORM's.
- Misuse: a fenced effect inside the body's own ``atomic`` is refused and holds
  nothing up; a write to another alias inside ``fn`` is refused (a read passes), so
  nothing of a failing effect stays (twin ``django-other-alias-writes-pass``: its
  report row outlives it); ``fn`` marking the transaction for rollback
  gets the effect refused, where Django alone would roll it back without a word (twin
  ``django-silent-rollback-passes``: the execution completes, the order unpaid).

Real processes, as a Django shop deploys them: ``manage.py migrate``, ``celery -A proj
worker`` (prefork, 2 children) and ``celery -A proj agboss sweep --loop`` for a
deployment without beat, on Redis, the store on PostgreSQL and on SQLite. Speed-ups
(tests/support/django_shop): ``-Q`` the test's queue, a 5 s lease, a 1 s retry delay, a 1 s
sweep loop.
"""

from __future__ import annotations

import json
import signal
import sqlite3
from pathlib import Path

import pytest

from celery_agboss.core.protections import (
    DJANGO_OTHER_ALIAS_WRITES_PASS,
    DJANGO_SILENT_ROLLBACK_PASSES,
    DJANGO_WRITES_OFF_THE_FENCE,
    FENCED_EFFECT_NOT_REPLAYED,
)
from tests.support.django_harness import DjangoShop
from tests.support.processes import signal_process, wait_until

pytestmark = [pytest.mark.worker, pytest.mark.redis, pytest.mark.slow]


def test_an_orm_write_commits_once_with_the_effects_record(django_shop: DjangoShop) -> None:
    django_shop.start()
    first = django_shop.publish("mark_paid", "o-1")
    django_shop.wait_state(first, "COMPLETED")
    again = django_shop.publish("mark_paid", "o-1")  # another execution, the order's business key
    django_shop.wait_state(again, "COMPLETED")
    assert django_shop.times_paid("o-1") == 1
    assert django_shop.query("SELECT count(*) FROM agboss_fenced_effects")[0] == 1


def test_a_rerun_of_fn_commits_nothing_when_its_record_exists(django_shop: DjangoShop) -> None:
    """Without the replay (``fenced-effect-not-replayed``), the second execution runs
    ``fn`` again: its ORM write is in the transaction whose record insert loses to the
    first one's, so it rolls back with it (three rounds, then the execution fails)."""
    _run_again(django_shop, (FENCED_EFFECT_NOT_REPLAYED,))
    assert django_shop.times_paid("o-1") == 1


@pytest.mark.parametrize("django_backend", ["postgresql"], indirect=True)
def test_twin_off_the_fence_each_rerun_of_fn_commits_its_write(django_shop: DjangoShop) -> None:
    """Twin (``django-writes-off-the-fence`` too): each round's ORM write committed by
    itself, three more payments marked. PostgreSQL only: on SQLite the store's own
    transaction holds the one write lock the ORM's write then waits for, so off the
    fence nothing is written at all (lock timeouts), which is why the fence must share
    Django's connection there too."""
    _run_again(django_shop, (FENCED_EFFECT_NOT_REPLAYED, DJANGO_WRITES_OFF_THE_FENCE))
    assert django_shop.times_paid("o-1") == 4


def _run_again(django_shop: DjangoShop, sabotage: tuple[str, ...]) -> None:
    django_shop.start(sabotage=sabotage)
    first = django_shop.publish("mark_paid", "o-1")
    django_shop.wait_state(first, "COMPLETED")
    again = django_shop.publish("mark_paid", "o-1")
    django_shop.wait_state(again, "FAILED")


def _freeze_the_zombie_inside_fn(django_shop: DjangoShop) -> tuple[str, int]:
    task_id = django_shop.publish("mark_paid", "o-1", "o-1")
    waiters = wait_until(
        lambda: django_shop.gateway.gate_waiters("o-1"), 30, message="fn at the gate"
    )
    zombie = waiters[0]
    signal_process(zombie, signal.SIGSTOP)
    django_shop.gateway.open_gate("o-1")
    return task_id, zombie


@pytest.mark.parametrize("django_backend", ["postgresql"], indirect=True)
@pytest.mark.parametrize("protected", [True, False], ids=["fenced", "twin-off-the-fence"])
def test_a_zombies_orm_write_never_commits(django_shop: DjangoShop, protected: bool) -> None:
    """PostgreSQL only: a frozen holder's open transaction holds SQLite's one write lock
    until it is continued (docs/django.md), so no take-over happens meanwhile there."""
    django_shop.start(sabotage=() if protected else (DJANGO_WRITES_OFF_THE_FENCE,))
    task_id, zombie = _freeze_the_zombie_inside_fn(django_shop)
    try:
        record = django_shop.wait_state(task_id, "COMPLETED")
    finally:
        signal_process(zombie, signal.SIGCONT)
    assert record.recovery_count >= 1, "another child took the execution over"
    # Continued, the zombie finds its session ended by the server (idle in a fenced
    # transaction for a TTL) and its delivery ends: nothing of its transaction commits.
    django_shop.wait_log(
        f"execution.store-failed error=StoreUnavailableError execution_id={task_id}"
    )
    if protected:
        assert django_shop.times_paid("o-1") == 1
    else:
        assert django_shop.times_paid("o-1") == 2, (
            "the twin: the zombie's write committed by itself"
        )


def test_a_fenced_effect_inside_the_bodys_atomic_is_refused_and_holds_nothing_up(
    django_shop: DjangoShop,
) -> None:
    django_shop.start()
    refused = django_shop.publish("mark_paid_in_atomic", "o-2")
    django_shop.wait_log("FencedEffectInsideAtomicError")
    other = django_shop.publish("mark_paid", "o-3")
    django_shop.wait_state(other, "COMPLETED")
    assert django_shop.times_paid("o-2") == 0
    assert django_shop.times_paid("o-3") == 1
    assert django_shop.execution(refused).state != "COMPLETED"


@pytest.mark.parametrize("protected", [True, False], ids=["refused", "twin-writes-pass"])
def test_a_write_to_another_alias_inside_fn_is_refused(
    django_shop: DjangoShop, protected: bool, tmp_path: Path
) -> None:
    django_shop.start(sabotage=() if protected else (DJANGO_OTHER_ALIAS_WRITES_PASS,))
    django_shop.publish("mark_paid_and_report", "o-2")
    django_shop.wait_log("OutsideFenceWriteError" if protected else "the effect fails after")
    assert django_shop.times_paid("o-2") == 0, "the order's write rolled back with the effect"
    reports = sqlite3.connect(tmp_path / "reports.sqlite3")
    try:
        kept = (
            reports.execute("SELECT count(*) FROM sqlite_master WHERE name = 'report'").fetchone()[
                0
            ]
            and reports.execute("SELECT count(*) FROM report").fetchone()[0]
        )
    finally:
        reports.close()
    assert kept == (0 if protected else 1), "the twin's report row outlived its effect"


def test_a_read_of_another_alias_inside_its_own_atomic_passes(django_shop: DjangoShop) -> None:
    """The read-only rule let SQLite's ``BEGIN`` (sent by ``atomic()`` through Django's
    cursor) be refused as a write: a read-only helper under ``@transaction.atomic``
    failed the effect, and the execution's undos refunded a paid order."""
    django_shop.start()
    task_id = django_shop.publish("mark_paid_reading_reports_in_atomic", "o-3")
    django_shop.wait_state(task_id, "COMPLETED")
    assert django_shop.times_paid("o-3") == 1


@pytest.mark.parametrize("protected", [True, False], ids=["refused", "twin-passes"])
def test_an_effect_marked_for_rollback_is_refused_not_passed_for_written(
    django_shop: DjangoShop, protected: bool
) -> None:
    django_shop.start(sabotage=() if protected else (DJANGO_SILENT_ROLLBACK_PASSES,))
    task_id = django_shop.publish("mark_paid_then_set_rollback", "o-2")
    if protected:
        django_shop.wait_log("CommitInsideFencedEffectError")
        assert django_shop.execution(task_id).state != "COMPLETED"
    else:
        django_shop.wait_state(task_id, "COMPLETED")  # the body went on: "paid"
    assert django_shop.times_paid("o-2") == 0, "Django rolled the write back either way"


@pytest.mark.parametrize("django_backend", ["postgresql"], indirect=True)
@pytest.mark.parametrize("conn_max_age", [0, 60], ids=["per-task", "persistent"])
def test_each_pool_child_fences_on_its_own_django_session(
    django_shop: DjangoShop, conn_max_age: int
) -> None:
    """Prefork: Celery's Django fixup closes the connections a child inherits, so each
    child's fenced effects run on a session of its own, and in it ``fn``'s ``conn`` is
    the ORM's own session (one transaction, not two). Persistent (``CONN_MAX_AGE`` with
    ``CELERY_DB_REUSE_MAX``, without which the fix-up closes Django's connections around
    every task), the children keep their sessions from task to task: a second round
    still fences on each child's own, the one its ORM uses."""
    test = {**json.loads(django_shop.env["AGBOSS_DJANGO_TEST"]), "conn_max_age": conn_max_age}
    django_shop.env["AGBOSS_DJANGO_TEST"] = json.dumps(test)
    django_shop.start()
    gateway = django_shop.gateway
    for round_ in ("first", "second"):
        refs = [f"{round_}-{n}" for n in (1, 2)]
        ids = [django_shop.publish("which_connection", ref, round_) for ref in refs]
        django_shop.wait_until(
            lambda gate=round_: len(gateway.gate_waiters(gate)) == 2, "both children busy"
        )
        gateway.open_gate(round_)
        for task_id in ids:
            django_shop.wait_state(task_id, "COMPLETED")
    seen = [
        json.loads(row[0])
        for row in django_shop.query_all("SELECT result FROM agboss_fenced_effects")
    ]
    assert len(seen) == 4
    assert all(one["orm"] == one["fenced"] for one in seen), seen
    sessions_of = {}
    for one in seen:
        sessions_of.setdefault(one["pid"], set()).add(one["orm"])
    assert len(sessions_of) == 2, seen
    first, second = sessions_of.values()
    assert not first & second, "no session shared across the fork"
    if conn_max_age:
        assert all(len(sessions) == 1 for sessions in sessions_of.values()), (
            "a persistent connection is kept by its child, task after task"
        )
