"""Counts of what waits in the store, for the metrics read at scrape time.

Each is one ``COUNT`` on an indexed column (intents by ``status``, executions by
``state``), in one read transaction: a scrape every few seconds costs little. What
counts as pending is the predicate ``agboss pending`` lists with. "Failed after a
payment" is ``agboss pending``'s listing itself, counted up to a cap: core's rule
decides each candidate, and it pages past every candidate that is not one.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Select, case, func, select

from celery_agboss.core.executions import TERMINAL_STATES, ExecutionState
from celery_agboss.store.execution_store import SQLAlchemyExecutionStore
from celery_agboss.store.intent_listings import unsettled_intent
from celery_agboss.store.schema import outbound_calls
from celery_agboss.store.schema_executions import executions
from celery_agboss.store.sqlalchemy_store import SQLAlchemyStore

LIVE_STATES = tuple(state for state in ExecutionState if state not in TERMINAL_STATES)
"""The states counted: the terminal ones only grow until retention deletes them."""


@dataclass(frozen=True)
class StoreCounts:
    pending_intents: int  # what ``agboss pending`` lists
    intents_needing_operator: int  # of those, the ones an operator must resolve
    executions: dict[ExecutionState, int]  # every state of LIVE_STATES, zero included
    # FAILED/CANCELLED with a payment left behind, not handled (at most the cap)
    failed_after_payment: int = 0


def read_counts(store: SQLAlchemyStore) -> StoreCounts:
    """The counts: intents and executions in one read transaction, then "failed after a
    payment" by its listing (read transactions of its own, one per batch)."""
    e = executions.c
    with store.read_transaction() as tx:
        pending, needing = tx.execute(unsettled_counted()).one()
        rows = tx.execute(
            select(e.state, func.count())
            .where(e.state.in_([state.value for state in LIVE_STATES]))
            .group_by(e.state)
        ).all()
    by_state = {state: 0 for state in LIVE_STATES}
    for state, count in rows:
        by_state[ExecutionState(state)] = int(count)
    left = len(SQLAlchemyExecutionStore(store).failed_after_payment(FAILED_AFTER_PAYMENT_CAP))
    return StoreCounts(int(pending), int(needing or 0), by_state, left)


def unsettled_counted() -> Select[tuple[int, int]]:
    """``(unsettled intents, of them flagged for an operator)``: what ``agboss pending``
    lists, counted (the gauges, and the note of ``pending --operator-only`` on the
    others, which may be payments)."""
    i = outbound_calls.c
    return select(
        func.count(),
        func.coalesce(func.sum(case((i.needs_operator, 1), else_=0)), 0),
    ).where(unsettled_intent())


FAILED_AFTER_PAYMENT_CAP = 1000
"""The most "failed after a payment" executions one scrape counts: each is a person's
work, so a gauge at the cap already says enough. It bounds the executions counted,
never the candidates looked at: however many older failures only look like one (an
undo refunded, a second click completed on the charge), every one below the cap is
counted."""


__all__ = ["LIVE_STATES", "StoreCounts", "read_counts", "unsettled_counted"]
