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

from pathlib import Path

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


def _charged_once_and_paid(out: dict[str, object], first: str) -> None:
    assert out["first"] == first, out
    assert out["gateway"] == ["charge"], "one charge, never refunded"
    assert (out["state"], out["paid"], out["effects"]) == ("COMPLETED", 1, 1), out


@pytest.mark.postgres
def test_an_orm_lock_timeout_in_fn_is_retried_not_refunded(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    out = run_shop(request, tmp_path, "postgresql", HOLD + HOLD_THE_ORDER_ROW + RUN)
    _charged_once_and_paid(out, "ExecutionNotFinishedError")
    assert "store-failed error=StoreLockTimeoutError" in out["stderr"]


@pytest.mark.postgres
def test_an_orm_session_lost_in_fn_is_retried_not_refunded(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    out = run_shop(request, tmp_path, "postgresql", LOSE_THE_SESSION)
    _charged_once_and_paid(out, "ExecutionNotFinishedError")
    assert "store-failed error=StoreUnavailableError" in out["stderr"]


def test_sqlites_lock_at_djangos_begin_is_retried_not_refunded(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Django's own ``BEGIN IMMEDIATE`` (the fence's ``atomic``) waits Python's 5 s busy
    timeout for the write lock, then "database is locked": a lock timeout of the store.
    A 12 s lease here (the project's is 5 s), so the wait is not a lost lease."""
    out = run_shop(
        request,
        tmp_path,
        "sqlite",
        HOLD + HOLD_SQLITES_WRITE_LOCK + RUN,
        before="from django.conf import settings\nsettings.CELERY_AGBOSS_LEASE_TTL = 12\n",
    )
    _charged_once_and_paid(out, "ExecutionNotFinishedError")
    assert "store-failed error=StoreLockTimeoutError" in out["stderr"]


@pytest.mark.postgres
def test_an_applications_own_database_error_still_fails_and_refunds(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """The line not crossed: a duplicate insert of fn's own is the application's."""
    script = """
    pay = paying(lambda ref, conn: Order.objects.create(reference=ref))
    report(pay.apply(args=("o-1",), task_id="t-1"))
    """
    out = run_shop(request, tmp_path, "postgresql", script)
    assert out["result"] == "IntegrityError", out
    assert out["gateway"] == ["charge", "refund"]
    assert (out["state"], out["paid"], out["effects"]) == ("FAILED", 0, 0), out
