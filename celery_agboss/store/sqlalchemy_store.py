"""``SQLAlchemyStore``: the store protocol on SQLite or PostgreSQL through SQLAlchemy Core.

Each verb is one short transaction; ``fenced()`` and ``transaction()`` hand out an
open one. The fence is the first statement of its transaction: one guarded
``UPDATE`` of the lease row that both checks the holder and extends the lease, so
the check and the writes after it commit together or not at all (design: PS4).
"""

from __future__ import annotations

import contextlib
import os
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy.engine import URL, Connection, Engine

from celery_agboss.core import sabotage
from celery_agboss.core.fault_points import (
    FENCED_AFTER_CHECK,
    FENCED_AFTER_COMMIT,
    FENCED_BEFORE_BEGIN,
    FENCED_BEFORE_COMMIT,
    LEASE_BEFORE_COMMIT,
    fault_point,
)
from celery_agboss.core.protections import (
    ENGINE_COMMIT_CHECK_SKIPPED_PAST_ITS_BOUND,
    FENCE_NOT_RECHECKED_AT_COMMIT,
    LEASE_CHECK_IN_SEPARATE_ROUND_TRIP,
    SQLITE_LONG_TRANSACTION_NOT_INTERRUPTED,
)
from celery_agboss.core.sealing import PLAINTEXT, Sealer
from celery_agboss.core.store_protocol import (
    EffectRecord,
    HistoryRow,
    IntentRecord,
    IntentTransition,
    LeaseGrant,
    LeaseRef,
    LeaseState,
    NewIntent,
    OneStatementClaim,
    OneStatementTransition,
    RenewOutcome,
    Store,
)
from celery_agboss.store import effects, history, intent_transitions, intents
from celery_agboss.store import leases as lease_sql
from celery_agboss.store.borrowed import UsersDatabase
from celery_agboss.store.commit_guard import CommitGuard, StoreConnection, guard_engine
from celery_agboss.store.databases import BEGIN_MODE_OPTION, create_store_engine, dispose_after_fork
from celery_agboss.store.dialect import is_postgresql
from celery_agboss.store.driver_errors import (
    quietly,
    raise_if_store_trouble,
    raise_interrupted,
    translated,
)
from celery_agboss.store.fences import (
    fence_txn,
    fenced_error,
    lock_timeout_ms,
    postgres_transaction_bounds,
    postgres_transaction_bounds_sql,
)
from celery_agboss.store.sealed_columns import use_sealer
from celery_agboss.store.sqlite_watch import FencedTransactionWatchdog, FencedWatch
from celery_agboss.store.transactions import SQLFencedTransaction, SQLTransaction

T = TypeVar("T")
OneStatement = TypeVar("OneStatement", OneStatementClaim, OneStatementTransition)


def sqlite_write_lock_bound_ms(ttl_ms: int) -> int:
    """How long a SQLite fenced transaction may hold the single write lock before the
    watchdog rolls it back: the PostgreSQL lock timeout, ttl/4, rather than ttl/3. A
    renewal sent ttl/3 after a lease's last extension and queued behind one such
    transaction lands by 7/12 ttl; behind two in a row still by 10/12 ttl, before the
    holder's own deadline (ttl minus its 1 s margin) for any TTL above 6 s. With ttl/3
    the second would already cost the lease."""
    return lock_timeout_ms(ttl_ms)


class SQLAlchemyStore:
    """The store on one database URL (or an engine the caller owns).

    ``engine_options`` go to ``create_store_engine`` (e.g. ``pool_size`` for a worker
    with many threads, ``sqlite_busy_timeout_ms``). An engine passed in must come from
    ``create_store_engine`` (SQLite needs its set-up) and is not disposed by ``close()``.
    """

    def __init__(
        self,
        url_or_engine: str | URL | Engine,
        *,
        clock_offset_source: Callable[[], int] | None = None,
        engine_options: Mapping[str, Any] | None = None,
    ) -> None:
        if isinstance(url_or_engine, Engine):
            if engine_options:
                raise ValueError("engine_options apply only when the store makes its engine")
            self.engine = url_or_engine
            self._owns_engine = False
        else:
            self.engine = create_store_engine(url_or_engine, **dict(engine_options or {}))
            self._owns_engine = True
        guard_engine(self.engine)
        self.clock_offset_source = clock_offset_source
        self._watchdog = FencedTransactionWatchdog()
        """Rolls back SQLite fenced transactions that hold the write lock too long
        (design: lock bound)."""
        _stores_to_dispose_after_fork.add(self)
        self.caller_clock_skew_ms = 0
        """Sabotage only (``EXPIRY_BY_CALLER_CLOCK``): the acquiring caller's clock skew."""
        self._sealer: Sealer = PLAINTEXT
        self.users_database: UsersDatabase | None = None
        """Where a fenced transaction that runs the user's writes runs instead of this
        store's own pool: a framework's transaction on its own connection to the same
        database (``celery_agboss.contrib.django``), yielding the engine over it."""

    # --- plumbing ----------------------------------------------------------------

    @property
    def sealer(self) -> Sealer:  # what sealed columns are sealed and opened with
        return self._sealer

    @sealer.setter
    def sealer(self, sealer: Sealer) -> None:
        self._sealer = sealer
        use_sealer(self.engine, sealer)

    @property
    def dialect_name(self) -> str:
        return self.engine.dialect.name

    def offset_ms(self) -> int:
        source = self.clock_offset_source
        return 0 if source is None else int(source())

    @contextlib.contextmanager
    def _begin(
        self,
        *,
        read_only: bool = False,
        watch_ttl_ms: int | None = None,
        engine: Engine | None = None,
    ) -> Iterator[Connection]:
        """A connection in an open transaction: committed on success, rolled back on any
        exception (which propagates unchanged if it is not a driver error).

        ``watch_ttl_ms`` (fenced transactions on SQLite): the watchdog rolls the
        transaction back once it has held the write lock ``sqlite_write_lock_bound_ms``;
        it then raises ``StoreLockTimeoutError`` and its connection is thrown away.
        ``engine``: one over a borrowed connection (``users_database``), else the store's.
        """
        with translated():
            opened = StoreConnection(engine or self.engine)  # engine.connect()
        opened.agboss_sealer = self.sealer
        conn: Connection = opened
        guard = CommitGuard(conn)
        watch: FencedWatch | None = None
        try:
            if read_only:
                conn = conn.execution_options(**{BEGIN_MODE_OPTION: "deferred"})
            with translated():
                trans = conn.begin()
            if watch_ttl_ms is not None:
                # Counted from here: waiting for the write lock is not holding it.
                watch = self._watchdog.watch(
                    conn, bound_ms=sqlite_write_lock_bound_ms(watch_ttl_ms), ttl_ms=watch_ttl_ms
                )
            guard.allowed = False
            try:
                yield conn
            except BaseException as error:
                guard.allowed = True
                quietly(conn.rollback)
                if watch is not None and watch.interrupted:
                    raise_interrupted(watch, error)
                raise_if_store_trouble(error)
                raise
            guard.allowed = True
            with translated():
                trans.commit()
        finally:
            guard.allowed = True
            if watch is not None and self._watchdog.unwatch(watch):
                # Rolled back from another thread: never hand this connection out again.
                quietly(conn.invalidate)
            quietly(conn.close)

    def _watch_ttl_ms(self, ttl_ms: int) -> int | None:
        """Fenced transactions are watched on SQLite only: PostgreSQL has row locks and a
        lock timeout, so a long one there holds up nobody else's renewal."""
        if self.dialect_name != "sqlite" or sabotage.active(
            SQLITE_LONG_TRANSACTION_NOT_INTERRUPTED
        ):
            return None
        return ttl_ms

    def _run(self, body: Callable[[Connection], T], *, read_only: bool = False) -> T:
        with self._begin(read_only=read_only) as conn, translated():
            return body(conn)

    # --- clock ---------------------------------------------------------------------

    def now_ms(self) -> int:
        offset = self.offset_ms()
        return self._run(lambda conn: lease_sql.now_txn(conn, offset_ms=offset), read_only=True)

    # --- leases --------------------------------------------------------------------

    def acquire_lease(self, scope: str, holder: str, ttl_ms: int) -> LeaseGrant | None:
        offset = self.offset_ms()
        with self._begin() as conn:
            with translated():
                grant = lease_sql.acquire_txn(
                    conn,
                    scope,
                    holder,
                    ttl_ms,
                    offset_ms=offset,
                    caller_skew_ms=self.caller_clock_skew_ms,
                )
            fault_point(LEASE_BEFORE_COMMIT, scope=scope, holder=holder)
        return grant

    def renew_lease(self, lease: LeaseRef, ttl_ms: int) -> int | None:
        offset = self.offset_ms()
        return self._run(lambda conn: lease_sql.renew_txn(conn, lease, ttl_ms, offset_ms=offset))

    def renew_leases(self, leases: Sequence[LeaseRef], ttl_ms: int) -> dict[LeaseRef, RenewOutcome]:
        if not leases:
            return {}
        offset = self.offset_ms()
        return self._run(
            lambda conn: lease_sql.renew_many_txn(conn, leases, ttl_ms, offset_ms=offset)
        )

    def release_lease(self, lease: LeaseRef) -> bool:
        return self._run(lambda conn: lease_sql.release_txn(conn, lease))

    def read_lease(self, scope: str) -> LeaseState | None:
        offset = self.offset_ms()
        return self._run(
            lambda conn: lease_sql.read_txn(conn, scope, offset_ms=offset), read_only=True
        )

    # --- transactions ----------------------------------------------------------------

    @contextlib.contextmanager
    def fenced(
        self,
        lease: LeaseRef,
        ttl_ms: int,
        *,
        engine_only: bool = False,
        users_writes: bool = False,
    ) -> Iterator[SQLFencedTransaction]:
        """Check and extend ``lease`` as the first statement of a transaction, then yield it.

        Raises ``ExecutionFencedError`` (nothing written) when ``lease`` is not the live
        holder. On PostgreSQL the transaction's ``lock_timeout`` is below ttl/3 and a
        session idle in it for a TTL is ended by the server; on SQLite
        it is rolled back (``StoreLockTimeoutError``) once it has held the database's
        single write lock for ttl/4, so that other executions' renewals go through.

        ``engine_only``: the transaction runs the engine's own statements, no user code.
        On PostgreSQL its commit then skips the second lease check when it ends within
        ``ENGINE_COMMIT_BOUND`` of the TTL after the first was sent (``_ended_in_bound``).

        ``users_writes``: the user's code writes in it (a fenced effect's ``fn``); with a
        ``users_database`` it runs there, so those writes are in this transaction.
        """
        started = time.monotonic()
        offset = self.offset_ms()
        where = lease.fields()
        separate = sabotage.active(LEASE_CHECK_IN_SEPARATE_ROUND_TRIP)
        checked: tuple[int, int] | None = None
        if separate:
            # The sabotage twin (design: PS4): check in its own committed transaction, write in
            # another.
            checked = self._run(
                lambda conn: lease_sql.extend_txn(conn, lease, ttl_ms, offset_ms=offset)
            )
            if checked is None:
                raise fenced_error(lease)
        fault_point(FENCED_BEFORE_BEGIN, **where)
        users = self.users_database if users_writes else None
        with (
            contextlib.nullcontext(None)
            if users is None
            else users.fenced_transaction() as borrowed,
            # The watchdog interrupts SQLite connections the store opened, not borrowed ones.
            self._begin(
                watch_ttl_ms=self._watch_ttl_ms(ttl_ms) if borrowed is None else None,
                engine=borrowed,
            ) as conn,
        ):
            with translated():
                if separate:
                    if is_postgresql(conn):
                        conn.exec_driver_sql(postgres_transaction_bounds_sql(ttl_ms))
                elif is_postgresql(conn):
                    lock, idle = postgres_transaction_bounds(ttl_ms)
                    checked = fence_txn(
                        conn, lease, ttl_ms, offset_ms=offset, lock_timeout=lock, idle_timeout=idle
                    )
                else:
                    checked = lease_sql.extend_txn(conn, lease, ttl_ms, offset_ms=offset)
            if checked is None:
                raise fenced_error(lease)
            expires_at_ms, now = checked
            fault_point(FENCED_AFTER_CHECK, **where)
            tx = SQLFencedTransaction(
                conn, now, offset, lease, expires_at_ms, self.caller_clock_skew_ms
            )
            yield tx
            self._check_at_commit(
                conn,
                tx,
                ttl_ms,
                unchecked=separate or sabotage.active(FENCE_NOT_RECHECKED_AT_COMMIT),
                in_bound=engine_only
                and is_postgresql(conn)
                and _ended_in_bound(started, ttl_ms, offset, self),
            )
            fault_point(FENCED_BEFORE_COMMIT, **where)
        fault_point(FENCED_AFTER_COMMIT, **where)

    def _check_at_commit(
        self,
        conn: Connection,
        tx: SQLFencedTransaction,
        ttl_ms: int,
        *,
        unchecked: bool,
        in_bound: bool,
    ) -> None:
        """The fence's second check, as the transaction's last statement: what commits is
        what a live holder wrote (``in_bound``: an engine-only transaction that ended well
        inside its TTL needs no second look)."""
        if tx.releases_at_commit:
            # The verdict's transaction ends the lease: released only while it is
            # still live, so an outlived holder's verdict is rolled back with it.
            with translated():
                if unchecked:
                    lease_sql.release_txn(conn, tx.lease)
                elif not lease_sql.release_live_txn(conn, tx.lease, offset_ms=self.offset_ms()):
                    raise fenced_error(tx.lease)
        elif not unchecked and not in_bound:
            # Extend again at the commit boundary: a long transaction keeps its lease
            # (the renewer skipped the locked row meanwhile), and one that outlived
            # its lease on the database clock commits nothing (design: P1).
            with translated():
                again = lease_sql.extend_txn(conn, tx.lease, ttl_ms, offset_ms=self.offset_ms())
                if again is None:
                    raise fenced_error(tx.lease)

    def transition_in_one(
        self,
        lease: LeaseRef,
        ttl_ms: int,
        change: IntentTransition,
        *,
        relied_by: str | None = None,
    ) -> OneStatementTransition | None:
        """``fenced()`` with a ``transition`` in it, as one autocommit statement on
        PostgreSQL (``store.intent_transitions``); None on SQLite, where the caller runs
        the transaction (in process, it costs no round trips)."""
        return self._in_one(
            lease,
            lambda conn, offset_ms: intent_transitions.transition_txn(
                conn, lease, ttl_ms, change, relied_by=relied_by, offset_ms=offset_ms
            ),
        )

    def claim_in_one(
        self,
        lease: LeaseRef,
        ttl_ms: int,
        intent: NewIntent,
        row: HistoryRow,
        *,
        cancel_of: str | None = None,
    ) -> OneStatementClaim | None:
        """``fenced()`` with the cancel check and ``create`` in it, as one autocommit
        statement on PostgreSQL; None on SQLite."""
        return self._in_one(
            lease,
            lambda conn, offset_ms: intent_transitions.claim_txn(
                conn, lease, ttl_ms, intent, row, cancel_of=cancel_of, offset_ms=offset_ms
            ),
        )

    def _in_one(
        self, lease: LeaseRef, body: Callable[[Connection, int], OneStatement]
    ) -> OneStatement | None:
        """``body`` (given its connection and the test clock's offset, read as the
        statement is sent) as ``intent_transitions.in_one``'s one statement."""
        return intent_transitions.in_one(
            self.engine, lease, lambda conn: body(conn, self.offset_ms())
        )

    @contextlib.contextmanager
    def transaction(self) -> Iterator[SQLTransaction]:
        """An unfenced transaction (sweep, operators): every write in it is a guarded CAS."""
        offset = self.offset_ms()
        with self._begin() as conn:
            yield SQLTransaction(conn, None, offset, self.caller_clock_skew_ms)

    @contextlib.contextmanager
    def read_transaction(self) -> Iterator[SQLTransaction]:
        """A transaction for reads only: on SQLite it does not take the write lock."""
        offset = self.offset_ms()
        with self._begin(read_only=True) as conn:
            yield SQLTransaction(conn, None, offset, self.caller_clock_skew_ms)

    # --- reads -------------------------------------------------------------------------

    def read_intent(self, idempotency_key: str) -> IntentRecord | None:
        offset = self.offset_ms()
        return self._run(
            lambda conn: intents.read_txn(conn, idempotency_key, offset_ms=offset),
            read_only=True,
        )

    def read_history(self, idempotency_key: str) -> list[HistoryRow]:
        return self._run(
            lambda conn: history.read_history_txn(conn, idempotency_key), read_only=True
        )

    def read_effect(self, key: str) -> EffectRecord | None:
        return self._run(lambda conn: effects.read_txn(conn, key), read_only=True)

    # --- lifecycle -----------------------------------------------------------------------

    def dispose_after_fork(self) -> None:
        """Call in a forked child (``worker_process_init``): drop the parent's pool."""
        dispose_after_fork(self.engine)

    def close(self) -> None:
        self._watchdog.stop()
        if self._owns_engine:
            self.engine.dispose()

    def __enter__(self) -> SQLAlchemyStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


_stores_to_dispose_after_fork: weakref.WeakSet[SQLAlchemyStore] = weakref.WeakSet()


def _dispose_all_after_fork() -> None:
    """In a forked child, no store may use the parent's pooled connections (design: trap 12).
    Celery's ``worker_process_init`` does the same; this covers any other fork."""
    for store in list(_stores_to_dispose_after_fork):
        with contextlib.suppress(Exception):
            store.dispose_after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_dispose_all_after_fork)


ENGINE_COMMIT_BOUND = 0.25
"""The share of the TTL within which an engine-only fenced transaction on PostgreSQL
commits without a second lease check (the same bound as the lock timeout's)."""


def _ended_in_bound(started: float, ttl_ms: int, offset_ms: int, store: SQLAlchemyStore) -> bool:
    """Whether an engine-only transaction may commit on its first lease check alone.

    Its first statement extended the lease to the database's now + TTL and locked the
    lease row until the commit: no take-over can happen before it, and every decision
    about a locked lease treats it as live. What is left to prove is that the lease has
    not expired on the database clock, and a transaction that ended within a quarter
    of the TTL after its first statement was *sent* (the monotonic clock counts time
    spent stopped) cannot have outlived a lease that began after that. A moved test
    clock, or a longer transaction, is checked on the database as before."""
    if sabotage.active(ENGINE_COMMIT_CHECK_SKIPPED_PAST_ITS_BOUND):
        return True
    if store.offset_ms() != offset_ms:
        return False
    return (time.monotonic() - started) * 1000 < ttl_ms * ENGINE_COMMIT_BOUND


if TYPE_CHECKING:  # mypy proves the class implements the protocol the core speaks

    def _implements_the_protocol(store: SQLAlchemyStore) -> Store:
        return store
