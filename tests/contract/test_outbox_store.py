"""The outbox table on each store: a row exists if and only if its transaction committed,
one task id is one row, and the sweep's claim hands each due row to one sweeper.

``celery_agboss.outbox.enqueue`` writes on the caller's connection; everything after
(``claim_due``, ``mark_published``, retention) is a transaction of its own. The clock
moves through ``db_clock`` (the store's test offset), never by sleeping.
"""

from __future__ import annotations

import pytest
from celery import chain, signature
from sqlalchemy import select

from celery_agboss import outbox
from celery_agboss.errors import ConfigurationError, IdempotencyKeyConflictError
from celery_agboss.runtime.messages import loads
from celery_agboss.store import outbox_rows as rows
from celery_agboss.store.schema_executions import outbox as outbox_table
from celery_agboss.store.sqlalchemy_store import SQLAlchemyStore
from celery_agboss.testing.clock import VirtualClock
from tests.contract.conftest import StoreFactory

GRACE_SECONDS = 30
RETRY_AFTER_MS = 60_000


class _RolledBack(Exception):
    pass


def _enqueue(store: SQLAlchemyStore, key: str, *args: object) -> str:
    with store.transaction() as tx:
        return outbox.enqueue(
            tx.connection, "shop.send_receipt", list(args), key=key, grace=GRACE_SECONDS
        )


def test_a_row_exists_only_when_its_transaction_committed(store: SQLAlchemyStore) -> None:
    with pytest.raises(_RolledBack), store.transaction() as tx:
        lost = outbox.enqueue(tx.connection, "shop.send_receipt", ["o-1"], key="receipt:o-1")
        raise _RolledBack()
    assert rows.read(store, lost) is None
    assert rows.unpublished(store, [lost]) == []
    kept = _enqueue(store, "receipt:o-1", "o-1")
    assert kept == lost, "the id is the key's, whichever transaction writes it"
    row = rows.read(store, kept)
    assert row is not None and not row.published
    assert row.message.task_name == "shop.send_receipt"
    assert row.publish_after_ms - row.created_at_ms == GRACE_SECONDS * 1000


def test_one_task_id_is_one_row_and_never_two_tasks(store: SQLAlchemyStore) -> None:
    first = _enqueue(store, "receipt:o-1", "o-1")
    assert _enqueue(store, "receipt:o-1", "o-1") == first, "a retried transaction: no new row"
    with store.read_transaction() as tx:
        assert len(tx.execute(select(outbox_table)).all()) == 1
    with pytest.raises(IdempotencyKeyConflictError):
        _enqueue(store, "receipt:o-1", "o-2")
    with pytest.raises(ConfigurationError, match="key="), store.transaction() as tx:
        outbox.enqueue(tx.connection, "shop.send_receipt", ["o-3"])


def test_the_sweep_claims_a_row_once_its_grace_passed_and_once_only(
    store: SQLAlchemyStore, db_clock: VirtualClock
) -> None:
    task_id = _enqueue(store, "receipt:o-1", "o-1")
    assert rows.claim_due(store, 10, RETRY_AFTER_MS) == [], "within its grace"
    db_clock.advance(GRACE_SECONDS + 1)
    (claimed,) = rows.claim_due(store, 10, RETRY_AFTER_MS)
    assert claimed.task_id == task_id
    assert rows.claim_due(store, 10, RETRY_AFTER_MS) == [], "claimed: moved on"
    db_clock.advance(RETRY_AFTER_MS / 1000 + 1)
    (again,) = rows.claim_due(store, 10, RETRY_AFTER_MS)  # that sweeper died: claimed again
    assert rows.mark_published(store, task_id)
    assert not rows.mark_published(store, task_id), "marked once"
    found = rows.read(store, task_id)
    assert found is not None and found.published and found.sweep_publishes == 2
    db_clock.advance(RETRY_AFTER_MS)
    assert rows.claim_due(store, 10, RETRY_AFTER_MS) == [], "a published row is never due"
    assert again == claimed


def test_a_claim_is_bounded_oldest_first_and_retention_keeps_unpublished_rows(
    store: SQLAlchemyStore, db_clock: VirtualClock
) -> None:
    ids = [_enqueue(store, f"receipt:o-{n}", f"o-{n}") for n in range(3)]
    db_clock.advance(GRACE_SECONDS + 1)
    claimed = rows.claim_due(store, 2, RETRY_AFTER_MS)
    assert len(claimed) == 2 and {row.task_id for row in claimed} <= set(ids)
    assert rows.mark_published(store, claimed[0].task_id)
    assert rows.count_unpublished(store) == 2
    cutoff = store.now_ms() + 1
    assert rows.delete_published_before(store, cutoff, 10) == 1
    assert rows.count_unpublished(store) == 2, "an unpublished row is never deleted"
    assert rows.read(store, claimed[0].task_id) is None


def test_two_sweepers_never_claim_one_row(
    store: SQLAlchemyStore, store_factory: StoreFactory, db_clock: VirtualClock
) -> None:
    """On PostgreSQL a row another sweeper's claim holds is skipped (SKIP LOCKED); on SQLite
    the write lock orders the claims and the second finds the row moved on."""
    first, second = (_enqueue(store, f"receipt:o-{n}", f"o-{n}") for n in range(2))
    db_clock.advance(GRACE_SECONDS + 1)
    other = store_factory()
    if store.engine.dialect.name != "postgresql":
        assert len(rows.claim_due(store, 10, RETRY_AFTER_MS)) == 2
        assert rows.claim_due(other, 10, RETRY_AFTER_MS) == []
        return
    with store.transaction() as tx:  # a claim in progress, holding the first row
        tx.execute(
            select(outbox_table.c.task_id).where(outbox_table.c.task_id == first).with_for_update()
        ).all()
        (taken,) = rows.claim_due(other, 10, RETRY_AFTER_MS)
        assert taken.task_id == second


def test_a_signature_brings_its_arguments_options_and_frozen_id(store: SQLAlchemyStore) -> None:
    receipt = signature("shop.send_receipt", ("o-1",), {"lang": "fr"}, queue="mail")
    frozen = receipt.clone()
    frozen.set(task_id="receipt-o-1")
    with store.transaction() as tx:
        assert outbox.enqueue(tx.connection, frozen) == "receipt-o-1"
        with pytest.raises(ConfigurationError, match="canvas"):
            outbox.enqueue(tx.connection, chain(receipt, receipt), key="both")
        with pytest.raises(TypeError):
            outbox.enqueue(tx.connection, receipt, ["o-2"], key="o-2")
    row = rows.read(store, "receipt-o-1")
    assert row is not None
    assert (loads(row.message.args), loads(row.message.kwargs)) == (["o-1"], {"lang": "fr"})
    assert loads(row.message.options) == {"queue": "mail"}, "the id is the row's, not an option"
