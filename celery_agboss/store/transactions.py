"""The open-transaction objects that ``SQLAlchemyStore.transaction()`` and ``fenced()`` yield.

Each verb runs on the transaction's one connection and translates driver errors.
Beyond the protocol they offer a few additive verbs for the Celery layer (lease
verbs folded into its own transactions, the sweep's listing, retention) and
``now_expr()``, the database-clock expression with the test offset, for its SQL.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from sqlalchemy import BigInteger, bindparam
from sqlalchemy.engine import Connection
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.selectable import Subquery

from celery_agboss.core.store_protocol import (
    EffectRecord,
    HistoryRow,
    IntentGuard,
    IntentRecord,
    IntentUpdate,
    LeaseGrant,
    LeaseRef,
    LeaseState,
    NewIntent,
    Reliance,
    SharedRecord,
)
from celery_agboss.store import effects, history, intents, leases, record_uses, shared_records
from celery_agboss.store.dialect import clock, now_expr
from celery_agboss.store.driver_errors import translated


class SQLTransaction:
    """One open transaction on one connection (implements ``StoreTransaction``)."""

    def __init__(
        self, conn: Connection, now_ms: int | None, offset_ms: int, caller_skew_ms: int = 0
    ) -> None:
        self._conn = conn
        self._now_ms = now_ms
        self._offset_ms = offset_ms
        self._caller_skew_ms = caller_skew_ms

    # --- protocol ----------------------------------------------------------------

    @property
    def now_ms(self) -> int:
        """The database clock, read once, when first asked: most transactions never ask
        (their SQL reads the clock itself), and a read nobody uses is a round trip."""
        if self._now_ms is None:
            with translated():
                self._now_ms = leases.now_txn(self._conn, offset_ms=self._offset_ms)
        return self._now_ms

    @property
    def connection(self) -> Connection:
        return self._conn

    def read_intent(self, idempotency_key: str) -> IntentRecord | None:
        with translated():
            return intents.read_txn(self._conn, idempotency_key, offset_ms=self._offset_ms)

    def insert_intent(self, intent: NewIntent, first_history: HistoryRow | None = None) -> bool:
        with translated():
            return intents.insert_txn(
                self._conn, intent, offset_ms=self._offset_ms, first_history=first_history
            )

    def update_intent(self, idempotency_key: str, guard: IntentGuard, update: IntentUpdate) -> bool:
        with translated():
            return intents.update_txn(
                self._conn, idempotency_key, guard, update, offset_ms=self._offset_ms
            )

    def last_history(self, idempotency_key: str) -> HistoryRow | None:
        with translated():
            return history.last_history_txn(self._conn, idempotency_key)

    def append_history(self, row: HistoryRow) -> None:
        with translated():
            history.append_history_txn(self._conn, row)

    def append_history_after(self, row: HistoryRow) -> bool:
        with translated():
            return history.append_history_after_txn(self._conn, row)

    def read_effect(self, key: str) -> EffectRecord | None:
        with translated():
            return effects.read_txn(self._conn, key)

    def insert_effect(self, record: EffectRecord) -> bool:
        with translated():
            return effects.insert_txn(self._conn, record, offset_ms=self._offset_ms)

    def record_use(self, kind: str, record_key: str, execution_id: str) -> None:
        with translated():
            record_uses.record_use_txn(
                self._conn, kind, record_key, execution_id, offset_ms=self._offset_ms
            )

    def rely_on(
        self, kind: str, record_key: str, execution_id: str, *, counted: bool = False
    ) -> Reliance:
        with translated():
            return shared_records.rely_on_txn(
                self._conn,
                kind,
                record_key,
                execution_id,
                counted=counted,
                offset_ms=self._offset_ms,
            )

    def read_shared(self, kind: str, record_key: str) -> SharedRecord | None:
        with translated():
            return shared_records.read_shared_txn(self._conn, kind, record_key)

    def shared_records_of(
        self, execution_id: str, *, excluding: Collection[str] = ()
    ) -> list[SharedRecord]:
        with translated():
            return shared_records.shared_records_of_txn(
                self._conn, execution_id, excluding=excluding
            )

    def claim_undo(self, kind: str, record_key: str, execution_id: str, reliance: int) -> bool:
        with translated():
            return shared_records.claim_undo_txn(
                self._conn, kind, record_key, execution_id, reliance
            )

    def lock_shared(self, kind: str, record_key: str) -> None:
        with translated():
            shared_records.lock_shared_txn(self._conn, kind, record_key)

    def mark_compensated(self, kind: str, record_key: str, execution_id: str) -> None:
        with translated():
            shared_records.mark_compensated_txn(
                self._conn, kind, record_key, execution_id, offset_ms=self._offset_ms
            )

    def completed_on_records(self, execution_id: str) -> None:
        with translated():
            shared_records.completed_on_records_txn(
                self._conn, execution_id, offset_ms=self._offset_ms
            )

    # --- additive verbs ------------------------------------------------------------

    @property
    def offset_ms(self) -> int:
        """The test-only clock offset this transaction applies (0 in production)."""
        return self._offset_ms

    def now_expr(self, as_of_ms: int | None = None) -> ColumnElement[int]:
        """The database clock in ms plus the test offset, for the Celery layer's own SQL;
        with ``as_of_ms``, that time (a reading of the same clock taken earlier, so that
        several statements judge by one)."""
        if as_of_ms is not None:
            return bindparam(None, as_of_ms, type_=BigInteger)
        return now_expr(self._conn, self._offset_ms)

    def clock(self) -> Subquery:
        """A one-row relation ``(now)`` reading the clock once for a whole statement:
        join it (``.c.now``) when a statement needs "now" in several places."""
        return clock(self._conn, self._offset_ms)

    def read_now_ms(self) -> int:
        """The database clock now (``now_ms`` is the one read when the transaction began)."""
        with translated():
            return leases.now_txn(self._conn, offset_ms=self._offset_ms)

    def acquire_lease(self, scope: str, holder: str, ttl_ms: int) -> LeaseGrant | None:
        """``Store.acquire_lease`` inside this transaction (e.g. with marking RUNNING)."""
        with translated():
            return leases.acquire_txn(
                self._conn,
                scope,
                holder,
                ttl_ms,
                offset_ms=self._offset_ms,
                caller_skew_ms=self._caller_skew_ms,
            )

    def release_lease(self, lease: LeaseRef) -> bool:
        """``Store.release_lease`` inside this transaction (e.g. with a re-publish mark)."""
        with translated():
            return leases.release_txn(self._conn, lease)

    def read_lease(self, scope: str) -> LeaseState | None:
        """The last committed lease row: for listings and reports, never for a decision
        about another holder's lease (``lock_lease``)."""
        with translated():
            return leases.read_txn(self._conn, scope, offset_ms=self._offset_ms)

    def lock_lease(self, scope: str) -> LeaseState | None:
        """The lease under its row lock, held until this transaction ends; a row a running
        transaction holds locked is live (design: another holder's lease). Every decision about
        another holder's lease reads it this way, in the transaction that writes the decision."""
        with translated():
            return leases.lock_txn(
                self._conn, scope, offset_ms=self._offset_ms, caller_skew_ms=self._caller_skew_ms
            )

    def list_intents(self, execution_id: str) -> list[IntentRecord]:
        """Every intent of one execution, oldest first."""
        with translated():
            return intents.list_for_execution_txn(
                self._conn, execution_id, offset_ms=self._offset_ms
            )

    def delete_record_uses(self, kind: str, record_keys: Sequence[str]) -> int:
        """Forget who used records that retention deleted."""
        with translated():
            return record_uses.delete_uses_txn(self._conn, kind, record_keys)

    def users_of(self, kind: str, record_key: str) -> list[str]:
        """The executions other than its creator that used the record."""
        with translated():
            return record_uses.users_of_txn(self._conn, kind, record_key)

    def execute(self, statement: Any, parameters: Any = None) -> Any:
        """Run a SQLAlchemy statement on this transaction, driver errors translated."""
        with translated():
            if parameters is None:
                return self._conn.execute(statement)
            return self._conn.execute(statement, parameters)


class SQLFencedTransaction(SQLTransaction):
    """A transaction that began by checking and extending ``lease`` (``FencedTransaction``)."""

    def __init__(
        self,
        conn: Connection,
        now_ms: int,
        offset_ms: int,
        lease: LeaseRef,
        expires_at_ms: int,
        caller_skew_ms: int = 0,
    ) -> None:
        super().__init__(conn, now_ms, offset_ms, caller_skew_ms)
        self._lease = lease
        self._expires_at_ms = expires_at_ms
        self.releases_at_commit = False

    def release_at_commit(self) -> None:
        self.releases_at_commit = True

    @property
    def lease(self) -> LeaseRef:
        return self._lease

    @property
    def expires_at_ms(self) -> int:
        return self._expires_at_ms
