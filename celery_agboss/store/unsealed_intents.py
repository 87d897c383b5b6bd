"""What the sweep's back-off of a stranded intent reads (``core.stranded.
back_off_stranded``): the intent's columns never sealed at rest
(``sealed_columns.SEALED_COLUMNS``) and the link its history row chains to.

An intent sealed under a key this process does not hold cannot be read whole
(``read_intent`` opens its request), so its reconcile fails, named; its back-off is
decided and written from these, so it leaves the head of the oldest-first listing like
any intent that could not be looked up (design: sealed at rest, sweep reconciles).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select

from celery_agboss.core.store_protocol import (
    HistoryRow,
    IntentStatus,
    LeaseRef,
    StoreTransaction,
)
from celery_agboss.store.history import last_link_txn
from celery_agboss.store.intents import owner_live_expr
from celery_agboss.store.schema import outbound_calls
from celery_agboss.store.transactions import SQLTransaction

_i = outbound_calls.c


@dataclass(frozen=True)
class UnsealedIntent:
    """``core.stranded.UnsealedStranded`` as the store reads it. ``last_history``: the
    intent's last history row with its detail left unopened (None): only its ``seq`` and
    ``digest`` are read, to chain the next row to."""

    idempotency_key: str
    status: IntentStatus
    attempt: int
    owner: LeaseRef | None
    owner_live: bool
    lookup_failures: int
    last_history: HistoryRow | None


def read_unsealed_intent(tx: StoreTransaction, idempotency_key: str) -> UnsealedIntent | None:
    """The intent's unsealed facts in ``tx``, ``owner_live`` on the database clock; None
    when it is gone. Nothing here opens a sealed value, so a key this process lacks
    never makes it fail; whatever writes on them re-checks them in its guard."""
    if not isinstance(tx, SQLTransaction):
        raise TypeError(f"read_unsealed_intent reads a SQL store's transaction, not {tx!r}")
    row = tx.execute(
        select(
            _i.idempotency_key,
            _i.status,
            _i.attempt,
            _i.owner_scope,
            _i.owner_holder,
            _i.owner_token,
            _i.lookup_failures,
            owner_live_expr(tx.now_expr()).label("owner_live"),
        ).where(_i.idempotency_key == idempotency_key)
    ).first()
    if row is None:
        return None
    owner = None
    if row.owner_holder is not None:
        owner = LeaseRef(str(row.owner_scope), str(row.owner_holder), int(row.owner_token))
    return UnsealedIntent(
        idempotency_key=str(row.idempotency_key),
        status=IntentStatus(row.status),
        attempt=int(row.attempt),
        owner=owner,
        owner_live=bool(row.owner_live),
        lookup_failures=int(row.lookup_failures),
        last_history=last_link_txn(tx.connection, idempotency_key),
    )


__all__ = ["UnsealedIntent", "read_unsealed_intent"]
