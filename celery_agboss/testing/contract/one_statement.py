"""Contract cases of ``Store.transition_in_one``: an intent's transition by its holder
in one statement keeps every check of the fenced transaction it replaces. A backend
without such a statement answers None and the cases have nothing to check."""

from __future__ import annotations

from dataclasses import dataclass, replace

from celery_agboss.core.history import HistoryEvent, next_history_row, verify_history
from celery_agboss.core.store_protocol import (
    HistoryRow,
    IntentGuard,
    IntentStatus,
    IntentTransition,
    IntentUpdate,
    LeaseRef,
    NewIntent,
    OneStatementTransition,
    Store,
)
from celery_agboss.errors import ExecutionFencedError
from celery_agboss.testing.clock import VirtualClock
from celery_agboss.testing.contract.base import (
    TTL_MS,
    StoreFactory,
    acquire,
    expire,
    new_intent,
    new_scope,
    open_stores,
    require,
)

_KEY = b"contract-one-statement-key-32byte"
ONE_STATEMENT = "one round trip per state change"


@dataclass(frozen=True)
class Claimed:
    """An intent claimed by ``lease`` (``PENDING``, attempt 1) and its first history row."""

    lease: LeaseRef
    key: str
    first: HistoryRow


def claim(store: Store, prefix: str) -> Claimed:
    lease = acquire(store, new_scope(prefix))
    intent, first = _claim_of(lease)
    with store.transaction() as tx:
        require(tx.insert_intent(intent, first_history=first), "P3", "a new key not claimed")
    return Claimed(lease, intent.idempotency_key, first)


def _claim_of(lease: LeaseRef) -> tuple[NewIntent, HistoryRow]:
    """The intent ``lease`` claims (its execution's charge) and the claim's history row."""
    key = f"{lease.scope}:charge"
    return new_intent(key, lease), _row(None, key, lease, HistoryEvent.CLAIMED)


def _row(previous: HistoryRow | None, key: str, lease: LeaseRef, event: HistoryEvent) -> HistoryRow:
    return next_history_row(
        _KEY,
        previous,
        idempotency_key=key,
        at_ms=0,
        event=event,
        from_status=None if previous is None else IntentStatus.PENDING.value,
        to_status=IntentStatus.PENDING.value if previous is None else IntentStatus.COMPLETED.value,
        attempt=1,
        holder=lease.holder,
        token=lease.token,
        detail={},
        execution_id=lease.scope,
    )


def complete(
    store: Store, claimed: Claimed, lease: LeaseRef | None = None, after: HistoryRow | None = None
) -> OneStatementTransition | None:
    """``lease`` (the claimer's by default) completes the claimed intent in one statement,
    its history row chained to ``after`` (the first row by default)."""
    holder = claimed.lease if lease is None else lease
    return store.transition_in_one(
        holder,
        TTL_MS,
        IntentTransition(
            claimed.key,
            IntentGuard(IntentStatus.PENDING, 1, claimed.lease),
            IntentUpdate(status=IntentStatus.COMPLETED, result={"ok": True}, complete=True),
            _row(
                claimed.first if after is None else after,
                claimed.key,
                holder,
                HistoryEvent.COMPLETED,
            ),
        ),
        relied_by=holder.scope,
    )


def _unchanged(store: Store, claimed: Claimed, guarantee: str, what: str) -> None:
    record = store.read_intent(claimed.key)
    require(
        record is not None and record.status is IntentStatus.PENDING,
        guarantee,
        f"{what}: the intent changed to {None if record is None else record.status}",
    )
    rows = store.read_history(claimed.key)
    require(len(rows) == 1, guarantee, f"{what}: {len(rows)} history rows, want the claim's only")


def _refused(store: Store, claimed: Claimed, lease: LeaseRef, what: str) -> bool:
    """True when the statement refused ``lease`` as fenced; False when the backend has no
    such statement."""
    try:
        done = complete(store, claimed, lease)
    except ExecutionFencedError:
        _unchanged(store, claimed, "P1", what)
        return True
    require(done is None, "P1", f"{what}: the one-statement transition wrote ({done})")
    return False


def check_a_one_statement_transition_is_fenced(factory: StoreFactory) -> None:
    """A holder whose lease expired, and one whose token was taken over, write nothing;
    the fence is checked on the database clock as the transaction checked it."""
    clock = VirtualClock()
    with open_stores(factory, 1, clock) as (store,):
        expired = claim(store, "one-statement-expired")
        expire(clock)
        if not _refused(store, expired, expired.lease, "an expired lease"):
            return
        stale = claim(store, "one-statement-stale")
        expire(clock)
        successor = store.acquire_lease(stale.lease.scope, "successor", TTL_MS)
        require(successor is not None, "P1", "an expired lease was not taken over")
        _refused(store, stale, stale.lease, "a stale token")


def check_a_one_statement_transition_writes_its_row_with_it(factory: StoreFactory) -> None:
    """A won transition writes the intent and its history row after the holder's last
    row, with the statement's database time (the chain holds); a lost one, and one whose
    holder's last row is no longer the intent's last, write nothing at all."""
    with open_stores(factory, 1, VirtualClock()) as (store,):
        claimed = claim(store, "one-statement-won")
        done = complete(store, claimed)
        if done is None:
            return
        require(
            done.won and done.chained, ONE_STATEMENT, f"the holder's own transition lost: {done}"
        )
        record = store.read_intent(claimed.key)
        require(
            record is not None and record.status is IntentStatus.COMPLETED,
            ONE_STATEMENT,
            f"a won transition left the intent {None if record is None else record.status}",
        )
        rows = store.read_history(claimed.key)
        verdict = verify_history(_KEY, rows, expected_last_status="COMPLETED")
        require(verdict.ok, "quarantine record", f"the chain after it: {verdict.reason}")
        require(
            rows[-1].at_ms == done.now_ms,
            "quarantine record",
            "the history row does not carry the statement's database time",
        )
        again = complete(store, claimed, after=rows[-1])
        require(
            again is not None and not again.won and again.chained,
            "R15",
            f"a transition whose guard no longer matches: {again}",
        )
        require(len(store.read_history(claimed.key)) == 2, "R15", "a lost transition wrote a row")
        stale_tail = claim(store, "one-statement-tail")
        with store.transaction() as tx:
            tx.append_history_after(
                _row(stale_tail.first, stale_tail.key, stale_tail.lease, HistoryEvent.SENT)
            )
        behind = complete(store, stale_tail)
        require(
            behind is not None and not behind.won and not behind.chained,
            "quarantine record",
            f"a transition chained to a row that is no longer the last: {behind}",
        )
        record = store.read_intent(stale_tail.key)
        require(
            record is not None and record.status is IntentStatus.PENDING,
            "quarantine record",
            "a transition whose history row could not chain changed the intent",
        )


def check_a_one_statement_claim_is_fenced_and_claims_once(factory: StoreFactory) -> None:
    """The claim in one statement: refused (nothing inserted) for an expired lease; a new
    key claimed with its first history row at the statement's time; a key that exists
    left as it is (nothing written, the caller reads it)."""
    clock = VirtualClock()
    with open_stores(factory, 1, clock) as (store,):
        lease = acquire(store, new_scope("one-statement-claim"))
        intent, first = _claim_of(lease)
        key = intent.idempotency_key
        done = store.claim_in_one(lease, TTL_MS, intent, first, cancel_of=lease.scope)
        if done is None:
            return
        require(done.inserted and done.cancel_reason is None, "P3", f"a new key: {done}")
        rows = store.read_history(key)
        require(
            len(rows) == 1 and rows[0].at_ms == done.now_ms,
            "quarantine record",
            "the claim's first history row is missing or not at the statement's time",
        )
        again = store.claim_in_one(
            lease, TTL_MS, replace(intent, fingerprint="other"), first, cancel_of=lease.scope
        )
        require(
            again is not None and not again.inserted,
            "P3",
            f"a second claim of one key: {again}",
        )
        stored = store.read_intent(key)
        require(
            stored is not None and stored.fingerprint == "fp" and len(store.read_history(key)) == 1,
            "P3",
            "a second claim of one key changed the first",
        )
        late = acquire(store, new_scope("one-statement-claim-late"))
        late_intent, late_first = _claim_of(late)
        expire(clock)
        try:
            store.claim_in_one(late, TTL_MS, late_intent, late_first)
        except ExecutionFencedError:
            fenced_insert = store.read_intent(late_intent.idempotency_key)
            require(fenced_insert is None, "P1", "a fenced claim inserted")
        else:
            require(False, "P1", "an expired lease claimed an intent in one statement")


__all__ = [
    "check_a_one_statement_claim_is_fenced_and_claims_once",
    "check_a_one_statement_transition_is_fenced",
    "check_a_one_statement_transition_writes_its_row_with_it",
]
