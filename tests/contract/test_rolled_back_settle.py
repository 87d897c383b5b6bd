"""A one-statement settle that failed whole leaves the holder's deadline where the database
left the lease (design: holder deadline).

The settle's statement extends the lease, changes the intent and writes its next history
row together. While it waits, another session commits a history row under the same
``(key, seq)``: the statement fails whole on the unique constraint, its lease extension
rolled back with the rest, and the engine falls back to the transaction. The holder's own
clock is its second safety line, so it may count from that statement only what the
database kept: its deadline stays where the last real extension put it. The twin
(``ROLLED_BACK_SETTLE_MOVES_HOLDER_DEADLINE``) counts the rolled-back extension, and the
holder trusts its lease for most of a TTL longer than the database keeps it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import pytest

from celery_agboss.core.delivery_lease import DeliveryLease
from celery_agboss.core.lease import LeaseHandle, SentAt
from celery_agboss.core.protections import ROLLED_BACK_SETTLE_MOVES_HOLDER_DEADLINE
from celery_agboss.core.store_protocol import LeaseState, OneStatementTransition
from celery_agboss.store.execution_store import SQLAlchemyExecutionStore
from celery_agboss.testing.switches import sabotage
from tests.contract.one_statement_world import TTL_MS, claimed_settle
from tests.support.lock_waits import during_a_change

pytestmark = pytest.mark.postgres

SCOPE = "rolled-back"
WAITED = 20.0  # seconds the holder's clocks moved before its settle was sent

_SAME_SEQ = (
    "INSERT INTO agboss_intent_history (idempotency_key, seq, at_ms, event, from_status, "
    "to_status, attempt, holder, token, detail, prev_digest, digest) "
    "VALUES (:key, :seq, 0, 'completed', 'PENDING', 'COMPLETED', 1, 'other', 1, '{}', "
    ":prev, 'other-digest')"
)


class _HolderClock:
    """The holder's two clocks, moved only by the test (no waiting on real time)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._now = 1_000.0

    def monotonic(self) -> float:
        with self._lock:
            return self._now

    def wall(self) -> float:
        with self._lock:
            return 1_700_000_000.0 + self._now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds


@dataclass(frozen=True)
class _Seen:
    settle: Any  # what ``transition_in_one`` returned (or raised)
    trusted_before: float  # the holder's seconds left just before the settle
    trusted_after: float
    granted_expiry_ms: int
    lease: LeaseState


def _settle_that_loses_its_seq(executions: SQLAlchemyExecutionStore) -> _Seen:
    """The holder's settle sent while another session holds a history row of the same
    ``(key, seq)`` uncommitted; that row commits once the settle waits for it."""
    store = executions.store
    clock = _HolderClock()
    grant = store.acquire_lease(SCOPE, "holder", TTL_MS)
    assert grant is not None
    handle = LeaseHandle(grant.lease, TTL_MS, SentAt.now(clock), clock=clock, grant=grant)
    delivery = DeliveryLease(store, handle, SCOPE)
    change = claimed_settle(store, grant.lease)
    clock.advance(WAITED)
    before = handle.seconds_left()
    settle = during_a_change(
        store.engine,
        _SAME_SEQ,
        {"key": change.key, "seq": change.row.seq, "prev": change.row.prev_digest},
        lambda: delivery.transition_in_one(change),
    )
    lease = store.read_lease(SCOPE)
    assert lease is not None
    return _Seen(settle, before, handle.seconds_left(), grant.expires_at_ms, lease)


def test_a_settle_that_failed_whole_does_not_move_the_holders_deadline(
    executions: SQLAlchemyExecutionStore,
) -> None:
    seen = _settle_that_loses_its_seq(executions)
    assert isinstance(seen.settle, OneStatementTransition), seen
    assert not seen.settle.won and seen.settle.expires_at_ms is None  # rolled back whole
    assert seen.lease.expires_at_ms == seen.granted_expiry_ms  # the database kept no extension
    assert seen.trusted_after == pytest.approx(seen.trusted_before)
    assert seen.trusted_after < TTL_MS / 1000 - WAITED  # trusted no longer than the database


def test_a_rolled_back_extension_counted_by_the_holder_outlives_the_database_lease(
    executions: SQLAlchemyExecutionStore,
) -> None:
    """Sabotage twin: the holder counts the extension the statement rolled back."""
    with sabotage(ROLLED_BACK_SETTLE_MOVES_HOLDER_DEADLINE):
        seen = _settle_that_loses_its_seq(executions)
    assert isinstance(seen.settle, OneStatementTransition), seen
    assert seen.lease.expires_at_ms == seen.granted_expiry_ms
    assert seen.trusted_after > TTL_MS / 1000 - WAITED + 10  # past the database's expiry
