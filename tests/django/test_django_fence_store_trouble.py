"""A database's trouble met by Django's ORM inside a fenced effect is the store's trouble.

Django re-raises a driver's error as its own (``django.db.utils.OperationalError``, the
driver's as ``__cause__``). Before, the store did not see through it: a lock timeout
(the fence's ``lock_timeout``, ttl/4, on the order row a web request holds), a session
the server ended, or SQLite's ``database is locked`` at Django's ``BEGIN IMMEDIATE``
was the application's error, so the execution FAILED and its undo refunded the charge
(the order never marked paid). Now it is a store failure: the delivery stops without a
verdict, a later one (here: eager, run again once the lease expired) marks the order
paid. Counted at the fake gateway: one charge, no refund.

An application's own database error (a duplicate insert) stays the application's:
FAILED, refunded, as before.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from tests.django.money_script import run_shop

pytestmark = [pytest.mark.slow]

# A row or lock another transaction holds while the fenced effect runs (the first
# delivery only: the one run again finds it free), released once the effect ended.
HOLD = """
held, release, first = threading.Event(), threading.Event(), [True]

def around(effect):
    if not first:
        return effect()
    first.pop()
    holder = threading.Thread(target=HOLDER); holder.start()
    assert held.wait(60), "the holder took the lock"
    try:
        return effect()
    finally:
        release.set(); holder.join(60)
"""

HOLD_THE_ORDER_ROW = """
def HOLDER():   # a web request's select_for_update on the order
    import psycopg
    with psycopg.connect(PG) as c:
        c.execute("SELECT 1 FROM orders_order WHERE reference = 'o-1' FOR UPDATE")
        held.set(); release.wait(60)
"""

HOLD_SQLITES_WRITE_LOCK = """
def HOLDER():   # a web request's atomic() on the same SQLite file, past Python's 5 s
    import sqlite3
    c = sqlite3.connect(SQLITE, isolation_level=None)
    c.execute("BEGIN IMMEDIATE"); held.set(); release.wait(60); c.execute("COMMIT")
"""

RUN = """
pay = paying(lambda ref, conn: mark_paid(ref), around)
first_run = pay.apply(args=("o-1",), task_id="t-1")
report(again_until_finished(pay), first=type(first_run.result).__name__,
       first_state=first_run.state)
"""

LOSE_THE_SESSION = """
def lose_the_session(ref, conn):   # the server ends the session (a restart, a failover)
    import psycopg
    if first:
        first.pop()
        with connection.cursor() as cur:
            cur.execute("SELECT pg_backend_pid()"); pid = cur.fetchone()[0]
        with psycopg.connect(PG, autocommit=True) as c:
            c.execute("SELECT pg_terminate_backend(%s)", [pid])
    mark_paid(ref)

first = [True]
pay = paying(lose_the_session)
first_run = pay.apply(args=("o-1",), task_id="t-1")
report(again_until_finished(pay), first=type(first_run.result).__name__,
       first_state=first_run.state)
"""


ShopRun = Callable[..., dict[str, Any]]


@pytest.fixture
def shop_run(request: pytest.FixtureRequest, tmp_path: Path) -> ShopRun:
    """``run_shop(backend, script, ...)`` in this test's folder."""
    return partial(run_shop, request, tmp_path)


def _retried_not_refunded(out: dict[str, Any], store_error: str) -> None:
    """The first delivery stopped on ``store_error`` without a verdict; a later one
    marked the order paid: one charge, never refunded."""
    assert out["first"] == "ExecutionNotFinishedError", out
    assert out["gateway"] == ["charge"], "one charge, never refunded"
    assert (out["state"], out["paid"], out["effects"]) == ("COMPLETED", 1, 1), out
    assert f"store-failed error={store_error}" in out["stderr"]


@pytest.mark.postgres
def test_an_orm_lock_timeout_in_fn_is_retried_not_refunded(shop_run: ShopRun) -> None:
    out = shop_run("postgresql", HOLD + HOLD_THE_ORDER_ROW + RUN)
    _retried_not_refunded(out, "StoreLockTimeoutError")


@pytest.mark.postgres
def test_an_orm_session_lost_in_fn_is_retried_not_refunded(shop_run: ShopRun) -> None:
    _retried_not_refunded(shop_run("postgresql", LOSE_THE_SESSION), "StoreUnavailableError")


def test_sqlites_lock_at_djangos_begin_is_retried_not_refunded(shop_run: ShopRun) -> None:
    """Django's own ``BEGIN IMMEDIATE`` (the fence's ``atomic``) waits Python's 5 s busy
    timeout for the write lock, then "database is locked": a lock timeout of the store.
    A 12 s lease here (the project's is 5 s), so the wait is not a lost lease."""
    out = shop_run(
        "sqlite",
        HOLD + HOLD_SQLITES_WRITE_LOCK + RUN,
        before="from django.conf import settings\nsettings.CELERY_AGBOSS_LEASE_TTL = 12\n",
    )
    _retried_not_refunded(out, "StoreLockTimeoutError")


@pytest.mark.postgres
def test_an_applications_own_database_error_still_fails_and_refunds(shop_run: ShopRun) -> None:
    """The line not crossed: a duplicate insert of fn's own is the application's."""
    script = """
    pay = paying(lambda ref, conn: Order.objects.create(reference=ref))
    report(pay.apply(args=("o-1",), task_id="t-1"))
    """
    out = shop_run("postgresql", script)
    assert out["result"] == "IntegrityError", out
    assert out["gateway"] == ["charge", "refund"]
    assert (out["state"], out["paid"], out["effects"]) == ("FAILED", 0, 0), out
