"""The ``encryption`` row of ``agboss_meta`` says the truth about a store holding sealed
values (docs/security.md, "A store written before encryption"), on both stores.

- A process with keys whose first seal's transaction rolls back (the application's own
  transaction around ``outbox.enqueue``, a store transaction that fails, a savepoint)
  does not count the row as written: the next transaction that seals writes it, so it
  commits with the sealed values; the process (and a child forked from it) holds the
  store sealed only once it has read the row committed, and from then on sends no
  statement for it. The twin ``encryption-flag-settled-before-commit`` holds it settled
  as soon as it is written: the store ends with sealed values and no row.
- A process without keys then refuses to write a card in clear
  (``EncryptionKeysMissingError``).
- ``outbox.enqueue`` on the application's own engine, where the current Celery app has
  no ``AGBoss``, reads the row (once per engine): into a store in clear it writes as
  before, into a sealed store it raises instead of writing the arguments in clear.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from celery import Celery, current_app
from sqlalchemy import event, select, text
from sqlalchemy.engine import Engine

from celery_agboss import outbox
from celery_agboss.core.protections import ENCRYPTION_FLAG_SETTLED_BEFORE_COMMIT
from celery_agboss.core.sealing import ENCRYPTION_META_KEY, KeyRing, Sealer
from celery_agboss.errors import EncryptionKeysMissingError
from celery_agboss.store.databases import create_store_engine
from celery_agboss.store.outbox_rows import OutboxMessage, insert_txn
from celery_agboss.store.schema_executions import meta
from celery_agboss.store.sealed_columns import sealed
from celery_agboss.store.sqlalchemy_store import SQLAlchemyStore
from celery_agboss.testing import sabotage
from tests.contract.conftest import StoreFactory

CARD = "4111 1111 1111 1111"
RING = KeyRing([("k1", os.urandom(32))])


def _flag(store: SQLAlchemyStore) -> str | None:
    with store.read_transaction() as tx:
        value = tx.execute(select(meta.c.value).where(meta.c.key == ENCRYPTION_META_KEY)).scalar()
        return None if value is None else str(value)


@contextmanager
def _meta_statements(engine: Engine) -> Iterator[list[str]]:
    """The statements sent on ``engine`` that name ``agboss_meta``."""
    seen: list[str] = []

    def note(_conn: Any, _cursor: Any, statement: str, *_rest: Any) -> None:
        if "agboss_meta" in statement:
            seen.append(statement)

    event.listen(engine, "before_cursor_execute", note)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", note)


def _seal_committed(store: SQLAlchemyStore, row: str) -> None:
    with store.transaction() as tx:
        stored = sealed(tx.connection, "agboss_executions", "result", row, '{"paid": 1}')
    assert stored is not None and stored.startswith("agbsealed:1:k1:")


def _first_seal_in_the_applications_rolled_back_transaction(store: SQLAlchemyStore) -> None:
    with store.engine.connect() as conn:
        conn.begin()
        message = OutboxMessage("t-1", "shop.receipt", '["o-1"]', "{}", "{}")
        insert_txn(conn, message, grace_ms=0, sealer=store.sealer)
        conn.rollback()


def _rolled_back_then_sealed(store: SQLAlchemyStore) -> None:
    store.sealer = Sealer(RING)
    _first_seal_in_the_applications_rolled_back_transaction(store)
    _seal_committed(store, "e-2")


def test_a_first_seal_rolled_back_leaves_the_flag_to_the_next_transaction_that_seals(
    store: SQLAlchemyStore,
) -> None:
    store.sealer = Sealer(RING)
    _first_seal_in_the_applications_rolled_back_transaction(store)
    assert store.sealer.store_sealed is None, "settled on a row that rolled back"
    _seal_committed(store, "e-2")
    assert _flag(store) == "on", "the store holds sealed values but agboss_meta does not say so"
    # Read back committed by the next transaction that seals; then settled: no statement.
    _seal_committed(store, "e-3")
    assert store.sealer.store_sealed is True
    with _meta_statements(store.engine) as seen:
        _seal_committed(store, "e-4")
    assert seen == []


def test_twin_settled_before_commit_leaves_sealed_values_without_the_flag(
    store: SQLAlchemyStore,
) -> None:
    with sabotage(ENCRYPTION_FLAG_SETTLED_BEFORE_COMMIT):
        _rolled_back_then_sealed(store)
    assert _flag(store) is None  # the harm the test above rules out


def test_a_first_seal_in_a_savepoint_rolled_back_is_written_again_in_its_transaction(
    store: SQLAlchemyStore,
) -> None:
    store.sealer = Sealer(RING)
    with store.transaction() as tx:
        conn = tx.connection
        savepoint = conn.begin_nested()
        sealed(conn, "agboss_executions", "result", "e-1", '"first"')
        savepoint.rollback()
        sealed(conn, "agboss_executions", "result", "e-2", '"second"')
    assert _flag(store) == "on"
    assert store.sealer.store_sealed is None  # written by that transaction, not read back


def test_a_keyless_process_refuses_to_write_in_clear_after_a_first_seal_rolled_back(
    store: SQLAlchemyStore, store_factory: StoreFactory
) -> None:
    store.sealer = Sealer(RING)
    with pytest.raises(RuntimeError), store.transaction() as tx:
        sealed(tx.connection, "agboss_executions", "result", "e-1", '"first"')
        raise RuntimeError("the transaction of the process's first seal fails")
    _seal_committed(store, "e-2")
    keyless = store_factory()
    keyless.sealer = Sealer()  # started without agboss_encryption_keys
    with pytest.raises(EncryptionKeysMissingError), keyless.transaction() as tx:
        written = sealed(tx.connection, "agboss_executions", "error", "e-3", f"declined {CARD}")
        pytest.fail(f"written in clear into a sealed store: {written!r}")


def _enqueue(engine: Engine, key: str) -> str:
    with engine.begin() as conn:
        return outbox.enqueue(conn, "shop.receipt", [CARD], key=key)


def _stored_args(engine: Engine, task_id: str) -> object:
    with engine.connect() as conn:
        return conn.execute(
            text("SELECT args FROM agboss_outbox WHERE task_id = :t"), {"t": task_id}
        ).scalar()


@pytest.fixture
def no_agboss_app_current() -> Iterator[None]:
    """The current Celery app is one without ``AGBoss`` (an earlier test of this process
    may have left its own current, whose store's sealer the enqueue would use)."""
    previous = current_app._get_current_object()
    Celery("no-agboss", set_as_current=True)
    try:
        yield
    finally:
        previous.set_current()


@pytest.mark.usefixtures("no_agboss_app_current")
def test_outbox_enqueue_on_the_applications_own_engine_reads_whether_the_store_is_sealed(
    store: SQLAlchemyStore, store_url: str
) -> None:
    """No ``AGBoss`` on the current Celery app: the enqueue is given no sealer, and the
    application's engine is not the store's."""
    engines: list[Engine] = []

    def new_engine() -> Engine:  # the application's own, as each process makes it
        engines.append(create_store_engine(store_url))
        return engines[-1]

    try:
        in_clear = new_engine()
        with _meta_statements(in_clear) as seen:
            first = _enqueue(in_clear, "receipt-o-1")
            assert len(seen) == 1  # read once for this engine...
            _enqueue(in_clear, "receipt-o-2")
            assert len(seen) == 1  # ...not at every enqueue
        assert _stored_args(in_clear, first) == f'["{CARD}"]'  # a store in clear: as before
        store.sealer = Sealer(RING)
        _seal_committed(store, "e-1")  # the store is sealed from now on
        assert _flag(store) == "on"
        later = new_engine()  # a process started since
        with pytest.raises(EncryptionKeysMissingError):
            _enqueue(later, "receipt-o-3")
        with later.connect() as conn:
            rows = conn.execute(text("SELECT count(*) FROM agboss_outbox")).scalar()
        assert rows == 2  # nothing of the refused enqueue was written
    finally:
        for engine in engines:
            engine.dispose()
