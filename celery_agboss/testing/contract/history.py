"""Contract cases of an intent's history (the quarantine record): its first row is written
with the intent or not at all, and a row written after a known last row, without
reading it, lands only while that row is still the last."""

from __future__ import annotations

import threading

from celery_agboss.core.history import HistoryEvent, next_history_row, verify_history
from celery_agboss.core.store_protocol import HistoryRow, IntentStatus
from celery_agboss.testing.clock import VirtualClock
from celery_agboss.testing.contract.base import (
    JOIN_SECONDS,
    StoreFactory,
    acquire,
    new_intent,
    new_scope,
    open_stores,
    require,
    run_threads,
)

GUARANTEE = "quarantine record"
_KEY = b"contract-history-pseudonym-key-32b"


def _row(previous: HistoryRow | None, key: str, event: HistoryEvent, by: str) -> HistoryRow:
    return next_history_row(
        _KEY,
        previous,
        idempotency_key=key,
        at_ms=1,
        event=event,
        from_status=None if previous is None else IntentStatus.PENDING.value,
        to_status=IntentStatus.PENDING.value,
        attempt=1,
        holder=by,
        token=1,
        detail={"by": by},
    )


def check_a_first_history_row_is_written_with_its_intent(factory: StoreFactory) -> None:
    """The claim's insert and its first history row: both written, or (the key existed)
    neither; a losing claim leaves the winner's history as it was."""
    with open_stores(factory, 1, VirtualClock()) as (store,):
        lease = acquire(store, new_scope("first-history"))
        key = f"{lease.scope}:charge"
        first = _row(None, key, HistoryEvent.CLAIMED, "winner")
        with store.transaction() as tx:
            won = tx.insert_intent(new_intent(key, lease), first_history=first)
        require(won, "P3", "the first claim of a new key did not insert")
        loser = _row(None, key, HistoryEvent.CLAIMED, "loser")
        with store.transaction() as tx:
            again = tx.insert_intent(new_intent(key, lease), first_history=loser)
        require(not again, "P3", "a second claim of one key inserted")
        rows = store.read_history(key)
        require(
            rows == [first],
            GUARANTEE,
            f"history after a lost claim: {[row.holder for row in rows]} (want the winner's row)",
        )


def check_a_row_chains_only_to_the_last_row(factory: StoreFactory) -> None:
    """``append_history_after`` writes a row only while the row it chains to is the last:
    refused after another row took its place (committed while the write waited, too)
    and after a row that is not there; the chain stays whole."""
    with open_stores(factory, 2, VirtualClock()) as (store, other):
        lease = acquire(store, new_scope("chained-history"))
        key = f"{lease.scope}:charge"
        first = _row(None, key, HistoryEvent.CLAIMED, "claim")
        with store.transaction() as tx:
            tx.insert_intent(new_intent(key, lease), first_history=first)
        second = _row(first, key, HistoryEvent.COMPLETED, "settle")
        with store.transaction() as tx:
            require(tx.append_history_after(second), GUARANTEE, "a row after the last was refused")
        stale = _row(first, key, HistoryEvent.COMPLETED, "stale")
        with store.transaction() as tx:
            require(
                not tx.append_history_after(stale),
                GUARANTEE,
                "a row chained to a row that is no longer the last was written",
            )
        forged = _row(
            HistoryRow(**{**vars(second), "digest": "0" * 64}), key, HistoryEvent.COMPLETED, "x"
        )
        with store.transaction() as tx:
            require(
                not tx.append_history_after(forged),
                GUARANTEE,
                "a row chained to a digest the store does not hold was written",
            )
        third = _row(second, key, HistoryEvent.COMPLETED, "committed-first")
        racing = _row(second, key, HistoryEvent.COMPLETED, "waited")
        appended, about_to_write = threading.Event(), threading.Event()
        outcome: dict[str, bool] = {}

        def commits_first() -> None:
            with store.transaction() as tx:
                tx.append_history(third)
                appended.set()
                about_to_write.wait(JOIN_SECONDS)  # the other write is on its way, or waiting

        def waits_then_writes() -> None:
            appended.wait(JOIN_SECONDS)
            about_to_write.set()
            with other.transaction() as tx:
                outcome["wrote"] = tx.append_history_after(racing)

        run_threads([commits_first, waits_then_writes], "history-race")
        require(
            outcome.get("wrote") is False,
            GUARANTEE,
            "a row chained to a row another transaction had just followed was written",
        )
        rows = store.read_history(key)
        require(
            [row.holder for row in rows] == ["claim", "settle", "committed-first"],
            GUARANTEE,
            f"history holders {[row.holder for row in rows]}",
        )
        verdict = verify_history(_KEY, rows, idempotency_key=key)
        require(verdict.ok, GUARANTEE, f"the chain broke: {verdict}")


__all__ = [
    "check_a_first_history_row_is_written_with_its_intent",
    "check_a_row_chains_only_to_the_last_row",
]
