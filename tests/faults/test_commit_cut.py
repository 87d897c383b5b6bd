"""PS14 (design: P2, P3): the database connection is lost mid-commit. The caller never guesses.

PostgreSQL, through a TCP proxy that breaks the connection on purpose:
- cut before COMMIT: the caller gets ``StoreUnavailableError``; the store, asked again
  over a direct connection, shows nothing was committed, so the retry writes once;
- COMMIT reached the server but its answer was dropped: the same error; the store
  shows it *did* commit, so the retry finds the write and replays it.
(SQLite's equivalents, errors raised at the commit boundary, are contract cases.)
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import NamedTuple

import pytest

from celery_agboss.core.store_protocol import (
    IntentGuard,
    IntentStatus,
    IntentUpdate,
    LeaseRef,
    NewIntent,
)
from celery_agboss.errors import StoreUnavailableError
from celery_agboss.store.sqlalchemy_store import SQLAlchemyStore
from celery_agboss.testing.contract.base import write_effect
from tests.contract.one_statement_world import TTL_MS, claimed_settle
from tests.support.tcp_proxy import CommitFault, PostgresProxy


class Stores(NamedTuple):
    """The worker's store (through the proxy), the one the retry asks (direct), the proxy
    that cuts, and a lease granted on the direct store."""

    proxied: SQLAlchemyStore
    direct: SQLAlchemyStore
    proxy: PostgresProxy
    lease: LeaseRef


@pytest.fixture
def stores(postgres_store_url: str, postgres_proxy: PostgresProxy) -> Iterator[Stores]:
    proxied = SQLAlchemyStore(postgres_proxy.url_for(postgres_store_url))
    direct = SQLAlchemyStore(postgres_store_url)
    try:
        yield Stores(proxied, direct, postgres_proxy, _lease(direct))
    finally:
        proxied.close()
        direct.close()


def _lease(store: SQLAlchemyStore) -> LeaseRef:
    grant = store.acquire_lease(f"ps14:{uuid.uuid4().hex}", uuid.uuid4().hex, TTL_MS)
    assert grant is not None
    return grant.lease


def test_a_fenced_write_cut_before_commit_is_absent_and_the_retry_writes_it_once(
    stores: Stores,
) -> None:
    proxied, direct, postgres_proxy, lease = stores
    key = f"{lease.scope}:effect"
    postgres_proxy.arm_commit_fault(CommitFault.CUT_BEFORE)
    with pytest.raises(StoreUnavailableError):
        write_effect(proxied, lease, key, {"attempt": 1}, TTL_MS)
    assert postgres_proxy.faults_fired == 1
    assert direct.read_effect(key) is None  # the store says: not committed
    written, stored = write_effect(direct, lease, key, {"attempt": 2}, TTL_MS)
    assert written and stored.result == {"attempt": 2}
    assert write_effect(direct, lease, key, {"attempt": 3}, TTL_MS)[0] is False


def test_a_fenced_write_whose_commit_answer_is_lost_is_found_and_replayed_on_retry(
    stores: Stores,
) -> None:
    proxied, direct, postgres_proxy, lease = stores
    key = f"{lease.scope}:effect"
    postgres_proxy.drop_answer_after_commit()
    with pytest.raises(StoreUnavailableError):
        write_effect(proxied, lease, key, {"attempt": 1}, TTL_MS)
    postgres_proxy.wait_for_faults(1)
    found = direct.read_effect(key)  # the store says: committed
    assert found is not None and found.result == {"attempt": 1}
    written, stored = write_effect(direct, lease, key, {"attempt": 2}, TTL_MS)
    assert not written, "the retry wrote a committed effect a second time"
    assert stored.result == {"attempt": 1}


def test_a_settle_whose_commit_answer_is_lost_is_found_completed_by_its_own_attempt(
    stores: Stores,
) -> None:
    """The outbound call's settle (design: settle): PENDING → COMPLETED committed, answer lost. The
    re-read shows COMPLETED by this very attempt and owner: success, nothing resent."""
    proxied, direct, postgres_proxy, lease = stores
    key = f"default:t:{lease.scope}:stripe.charge"
    with direct.fenced(lease, TTL_MS) as tx:
        assert tx.insert_intent(
            NewIntent(key, lease.scope, "stripe.charge", None, "fp", {"amount": 1000}, lease)
        )
    guard = IntentGuard(status=IntentStatus.PENDING, attempt=1, owner=lease)
    settle = IntentUpdate(
        status=IntentStatus.COMPLETED, complete=True, result={"id": "ch_1"}, result_stored=True
    )
    postgres_proxy.drop_answer_after_commit()
    with pytest.raises(StoreUnavailableError), proxied.fenced(lease, TTL_MS) as tx:
        assert tx.update_intent(key, guard, settle)
    postgres_proxy.wait_for_faults(1)
    found = direct.read_intent(key)
    assert found is not None
    assert (found.status, found.attempt, found.owner) == (IntentStatus.COMPLETED, 1, lease)
    assert found.result == {"id": "ch_1"}
    with direct.fenced(lease, TTL_MS) as tx:  # the same CAS again matches nothing
        assert not tx.update_intent(key, guard, settle)


@pytest.mark.parametrize("fault", [CommitFault.CUT_BEFORE, CommitFault.DROP_ANSWER], ids=str)
def test_a_one_statement_settle_whose_connection_is_cut_is_found_as_the_store_says(
    stores: Stores, fault: CommitFault
) -> None:
    """The settle as one autocommit statement (its own commit): cut before it reaches
    the server, nothing changed; its answer dropped, the intent is COMPLETED by this
    attempt, with its history row. Either way the caller got ``StoreUnavailableError``
    and a re-read decides, never a guess."""
    proxied, direct, postgres_proxy, lease = stores
    settle = claimed_settle(direct, lease)
    postgres_proxy.arm_commit_fault(fault)
    with pytest.raises(StoreUnavailableError):
        proxied.transition_in_one(lease, TTL_MS, settle)
    postgres_proxy.wait_for_faults(1)
    found = direct.read_intent(settle.key)
    assert found is not None
    history = direct.read_history(settle.key)
    if fault is CommitFault.CUT_BEFORE:
        assert (found.status, len(history)) == (IntentStatus.PENDING, 1)
    else:
        assert (found.status, found.attempt, found.owner) == (IntentStatus.COMPLETED, 1, lease)
        assert [entry.event for entry in history] == ["claimed", "completed"]


def test_a_connection_cut_inside_a_fenced_transaction_commits_nothing(stores: Stores) -> None:
    proxied, direct, postgres_proxy, lease = stores
    key = f"{lease.scope}:effect"
    with pytest.raises(StoreUnavailableError), proxied.fenced(lease, TTL_MS) as tx:
        assert tx.read_effect(key) is None
        assert postgres_proxy.cut_all() >= 1
        tx.read_effect(key)
    assert direct.read_effect(key) is None
    # The proxied store recovers on a new connection and writes once.
    written, _ = write_effect(proxied, lease, key, {"attempt": 2}, TTL_MS)
    assert written
