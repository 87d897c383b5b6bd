"""Store-level findings of the engine review (both backends).

``COMMIT`` (or ``END``, ``ROLLBACK``, ``BEGIN``) sent as SQL text by code running inside
a store transaction would end it behind SQLAlchemy's back: what was written before it
would commit without the commit-time lease check. The store refuses such statements
the way it refuses ``Connection.commit()``; savepoints still work.
"""

from __future__ import annotations

import pytest
from sqlalchemy import text

from celery_agboss.core.store import EffectRecord, Store
from celery_agboss.errors import CommitInsideFencedEffectError

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


@pytest.mark.parametrize(
    "statement", ["COMMIT", "  commit;", "END", "ROLLBACK", "BEGIN", "START TRANSACTION"]
)
def test_transaction_control_sent_as_text_inside_a_fenced_transaction_is_refused(
    store: Store, statement: str
) -> None:
    grant = store.acquire_lease("sneaky", "holder-a", TTL_MS)
    assert grant is not None
    with pytest.raises(CommitInsideFencedEffectError), store.fenced(grant.lease, TTL_MS) as tx:
        tx.insert_effect(_effect("sneaky", grant.lease.token))
        tx.connection.exec_driver_sql(statement)
    assert store.read_effect("sneaky:effect") is None


def test_savepoints_sent_as_text_still_work_inside_a_fenced_transaction(store: Store) -> None:
    grant = store.acquire_lease("savepoint", "holder-a", TTL_MS)
    assert grant is not None
    with store.fenced(grant.lease, TTL_MS) as tx:
        tx.connection.execute(text("SAVEPOINT agboss_review"))
        tx.insert_effect(_effect("savepoint", grant.lease.token))
        tx.connection.execute(text("ROLLBACK TO SAVEPOINT agboss_review"))
        tx.connection.execute(text("RELEASE SAVEPOINT agboss_review"))
    assert store.read_effect("savepoint:effect") is None
