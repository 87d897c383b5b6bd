"""Counts of what waits in the store, for the metrics read at scrape time.

Each is one ``COUNT`` on an indexed column (intents by ``status``, executions by
``state``), in one read transaction: a scrape every few seconds costs little. An
execution in a state a newer version of the package wrote (a rolling upgrade) is
counted too, apart (``newer_states``, up to a cap per state): the state is not one
this version knows (``store.unopened.state_known`` decides), so it is in no state's
count, yet it may be live and wait for a person under the newer version's name. What
counts as pending is the predicate ``agboss pending`` lists with. "Failed after a
payment" is ``agboss pending``'s listing itself, counted up to a cap: core's rule
decides each candidate, and it pages past every candidate that is not one.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import CompoundSelect, Select, case, func, literal, select, union_all

from celery_agboss.core.executions import TERMINAL_STATES, ExecutionState
from celery_agboss.store.execution_store import SQLAlchemyExecutionStore
from celery_agboss.store.intent_listings import unsettled_intent
from celery_agboss.store.schema import outbound_calls
from celery_agboss.store.schema_executions import executions
from celery_agboss.store.sqlalchemy_store import SQLAlchemyStore
from celery_agboss.store.unopened import shown_state, state_known

LIVE_STATES = tuple(state for state in ExecutionState if state not in TERMINAL_STATES)
"""The states counted: the terminal ones only grow until retention deletes them."""

_LIVE_VALUES = [state.value for state in LIVE_STATES]
_KNOWN_VALUES = [state.value for state in ExecutionState]  # what state_known takes


@dataclass(frozen=True)
class StoreCounts:
    pending_intents: int  # what ``agboss pending`` lists
    intents_needing_operator: int  # of those, the ones an operator must resolve
    executions: dict[ExecutionState, int]  # every state of LIVE_STATES, zero included
    # FAILED/CANCELLED with a payment left behind, not handled (at most the cap)
    failed_after_payment: int = 0
    newer_states: int = 0  # in a state this version does not know (each at most its cap)


def read_counts(store: SQLAlchemyStore) -> StoreCounts:
    """The counts: intents and executions in one read transaction, then "failed after a
    payment" by its listing (read transactions of its own, one per batch)."""
    with store.read_transaction() as tx:
        pending, needing = tx.execute(unsettled_counted()).one()
        rows = tx.execute(executions_counted()).all()
    by_state = {state: 0 for state in LIVE_STATES}
    newer = 0
    for stored, count in rows:
        state = shown_state(str(stored))
        if state_known(state):
            by_state[state] = int(count)
        else:
            newer += int(count)
    left = len(SQLAlchemyExecutionStore(store).failed_after_payment(FAILED_AFTER_PAYMENT_CAP))
    return StoreCounts(int(pending), int(needing or 0), by_state, left, newer)


def executions_counted() -> CompoundSelect[tuple[str, int]]:
    """``(state, executions in it)``: each live state this version knows that the table
    holds, exactly; then each state a newer version wrote, up to ``NEWER_STATE_CAP``.

    One statement. ``state NOT IN (known)`` would read every row, the terminal ones
    included (they only grow until retention deletes them): the states a newer version
    wrote are found on the state index instead, one step per distinct state (the next
    one in the index's own order), and each is counted there, up to the cap (so that
    PostgreSQL, which cannot know how many rows an unknown state holds, never plans
    the count as a large one)."""
    e = executions.c
    later, counted = executions.alias("later"), executions.alias("counted")
    states = select(func.min(e.state).label("state")).cte("states", recursive=True)
    following = (
        select(later.c.state)
        .where(later.c.state > states.c.state)
        .order_by(later.c.state)
        .limit(1)
        .scalar_subquery()
    )
    states = states.union_all(select(following).where(states.c.state.is_not(None)))
    capped = (
        select(literal(1).label("one"))
        .where(counted.c.state == states.c.state)
        .limit(NEWER_STATE_CAP)
        .correlate(states)
        .subquery("capped")
    )
    newer = select(states.c.state, select(func.count()).select_from(capped).scalar_subquery())
    return union_all(
        select(e.state, func.count()).where(e.state.in_(_LIVE_VALUES)).group_by(e.state),
        newer.where(states.c.state.is_not(None), states.c.state.not_in(_KNOWN_VALUES)),
    )


NEWER_STATE_CAP = 1000
"""The most executions one scrape counts in one state a newer version wrote: any is
worth a look, and a gauge at the cap already says enough."""


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
