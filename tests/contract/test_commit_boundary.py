"""The fence is checked again at the commit boundary (design: P1, P2).

A fenced transaction extends its lease when it begins and once more right before
COMMIT: a long effect keeps its lease after it commits (the renewer skipped the
locked row meanwhile), and a transaction that outlived its lease on the database
clock commits nothing. ``COMMIT`` (or ``END``, ``ROLLBACK``, ``BEGIN``) sent as SQL text
by code inside a store transaction would end it behind SQLAlchemy's back, without that
check: the store refuses it as it refuses ``Connection.commit()``; savepoints work.
"""

from __future__ import annotations

import pytest
from sqlalchemy import text

from celery_agboss.core.protections import FENCE_NOT_RECHECKED_AT_COMMIT
from celery_agboss.core.store_protocol import EffectRecord, Store
from celery_agboss.errors import CommitInsideFencedEffectError, ExecutionFencedError
from celery_agboss.testing import VirtualClock, sabotage
from tests.contract.conftest import granted

TTL_MS = 10_000


def _effect(scope: str, token: int) -> EffectRecord:
    return EffectRecord(
        key=f"{scope}:effect",
        execution_id=scope,
        name="test.effect",
        result={"ok": True},
        token=token,
        created_at_ms=0,
    )


def _write_past_the_lease(
    store: Store, db_clock: VirtualClock, scope: str, *, release: bool = False
) -> None:
    """A holder's fenced write (ending its lease at commit if ``release``, as a
    delivery's verdict does) whose transaction outlives the lease before its COMMIT."""
    grant = granted(store, scope, TTL_MS)
    with store.fenced(grant.lease, TTL_MS) as tx:
        tx.insert_effect(_effect(scope, grant.lease.token))
        if release:
            tx.release_at_commit()
        db_clock.advance(TTL_MS * 1.1 / 1000)


def test_a_long_fenced_transaction_keeps_its_lease_after_it_commits(
    store: Store, db_clock: VirtualClock
) -> None:
    grant = granted(store, "long", TTL_MS)
    with store.fenced(grant.lease, TTL_MS) as tx:
        tx.insert_effect(_effect("long", grant.lease.token))
        db_clock.advance(TTL_MS * 0.9 / 1000)
    state = store.read_lease("long")
    assert state is not None and state.live
    assert state.expires_at_ms - state.db_now_ms > TTL_MS * 0.9
    assert store.read_effect("long:effect") is not None


def test_a_fenced_transaction_that_outlived_its_lease_commits_nothing(
    store: Store, db_clock: VirtualClock
) -> None:
    with pytest.raises(ExecutionFencedError):
        _write_past_the_lease(store, db_clock, "late")
    assert store.read_effect("late:effect") is None


def test_without_the_commit_check_a_transaction_past_its_lease_commits(
    store: Store, db_clock: VirtualClock
) -> None:
    """Sabotage twin: the write of a holder past its lease goes in."""
    with sabotage(FENCE_NOT_RECHECKED_AT_COMMIT):
        _write_past_the_lease(store, db_clock, "late")
    assert store.read_effect("late:effect") is not None


# --- a transaction that ends its lease (a delivery's verdict and release) -------------------


def test_a_fenced_transaction_can_end_by_releasing_its_lease(store: Store) -> None:
    grant = granted(store, "done", TTL_MS)
    with store.fenced(grant.lease, TTL_MS) as tx:
        tx.insert_effect(_effect("done", grant.lease.token))
        tx.release_at_commit()
    state = store.read_lease("done")
    assert state is not None and state.released and not state.live
    assert store.read_effect("done:effect") is not None
    assert store.acquire_lease("done", "holder-b", TTL_MS) is not None  # free at once


def test_a_releasing_transaction_that_outlived_its_lease_commits_nothing(
    store: Store, db_clock: VirtualClock
) -> None:
    """The release stands for the commit-time extension: an outlived holder writes
    nothing, and a take-over that happened meanwhile is not released by it."""
    with pytest.raises(ExecutionFencedError):
        _write_past_the_lease(store, db_clock, "late-end", release=True)
    assert store.read_effect("late-end:effect") is None
    state = store.read_lease("late-end")
    assert state is not None and not state.released


def test_without_the_commit_check_a_releasing_transaction_past_its_lease_commits(
    store: Store, db_clock: VirtualClock
) -> None:
    """Sabotage twin of the one above."""
    with sabotage(FENCE_NOT_RECHECKED_AT_COMMIT):
        _write_past_the_lease(store, db_clock, "late-end", release=True)
    assert store.read_effect("late-end:effect") is not None


# --- transaction control sent as SQL text ------------------------------------------------


@pytest.mark.parametrize(
    "statement", ["COMMIT", "  commit;", "END", "ROLLBACK", "BEGIN", "START TRANSACTION"]
)
def test_transaction_control_sent_as_text_inside_a_fenced_transaction_is_refused(
    store: Store, statement: str
) -> None:
    grant = granted(store, "sneaky", TTL_MS)
    with pytest.raises(CommitInsideFencedEffectError), store.fenced(grant.lease, TTL_MS) as tx:
        tx.insert_effect(_effect("sneaky", grant.lease.token))
        tx.connection.exec_driver_sql(statement)
    assert store.read_effect("sneaky:effect") is None


def test_savepoints_sent_as_text_still_work_inside_a_fenced_transaction(store: Store) -> None:
    grant = granted(store, "savepoint", TTL_MS)
    with store.fenced(grant.lease, TTL_MS) as tx:
        tx.connection.execute(text("SAVEPOINT agboss_review"))
        tx.insert_effect(_effect("savepoint", grant.lease.token))
        tx.connection.execute(text("ROLLBACK TO SAVEPOINT agboss_review"))
        tx.connection.execute(text("RELEASE SAVEPOINT agboss_review"))
    assert store.read_effect("savepoint:effect") is None
