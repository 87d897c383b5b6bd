"""An execution's state change as one ``UPDATE … RETURNING``, built once per shape.

``execution_rows.set_and_read_txn`` writes every state change of an execution; a statement
whose values are plain values, the database clock or a named ``Computed`` value is built
once for their names (``statement_cache.built_once``) and run with parameters, since
building it costs more than running it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import bindparam, case, exists, false, or_, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.sql.elements import ClauseElement, ColumnElement

from celery_agboss.core import compensation, sabotage
from celery_agboss.core.executions import TERMINAL_STATES, ExecutionState
from celery_agboss.core.protections import (
    BODY_CALLS_AFTER_COMPENSATION_START,
    BODY_CLAIM_AFTER_THE_START_MARK,
    UNDO_PAUSE_TAKEN_FOR_THE_BODYS,
)
from celery_agboss.store.dialect import is_postgresql, now_expr
from celery_agboss.store.schema import fenced_effects
from celery_agboss.store.schema_executions import executions
from celery_agboss.store.shared_records import completed_on_records_statement
from celery_agboss.store.statement_cache import built_once

_e = executions.c
_f = fenced_effects.c

TERMINAL_VALUES = [state.value for state in TERMINAL_STATES]


@dataclass(frozen=True)
class Computed:
    """A value the database computes from the row and its clock, named so that a state
    change using it is still built once (``_COMPUTED``)."""

    name: str


_COMPUTED: dict[str, Callable[[ColumnElement[int]], ColumnElement[Any]]] = {
    # The first start's time, kept by every later delivery.
    "first_start": lambda now: case((_e.started_at_ms.is_(None), now), else_=_e.started_at_ms),
    "one_more_delivery": lambda now: _e.deliveries + 1,
    "one_more_recovery": lambda now: _e.recovery_count + 1,
}


def computed_value(value: Computed, now: ColumnElement[int]) -> ColumnElement[Any]:
    """The expression a ``Computed`` value names, at the database time ``now``."""
    return _COMPUTED[value.name](now)


def state_change_shape(values: dict[str, Any], now: Any) -> tuple[tuple[str, str], ...] | None:
    """Each value's name and kind (``"now"``, ``"bind"`` or a ``Computed`` name), or None
    when one is a column expression that a cached statement cannot take as a parameter."""
    shape = []
    for name in sorted(values):
        value = values[name]
        if value is now:
            shape.append((name, "now"))
        elif isinstance(value, Computed):
            shape.append((name, f"computed:{value.name}"))
        elif isinstance(value, ClauseElement):
            return None
        else:
            shape.append((name, "bind"))
    return tuple(shape)


def build_state_change(
    conn: Connection,
    offset_ms: int,
    unless_terminal: bool,
    completes_records: bool,
    values: dict[str, Any],
) -> Any:
    """``execution_rows.set_and_read_txn``'s ``UPDATE … RETURNING`` of the execution ``e_id``."""
    now = now_expr(conn, offset_ms)
    execution_id = bindparam("e_id", type_=_e.id.type)
    where = [_e.id == execution_id]
    if unless_terminal:
        where.append(_e.state.not_in(TERMINAL_VALUES))
    statement = (
        update(executions)
        .where(*where)
        .values(**values)
        .returning(*executions.c, now.label("read_at_ms"))
    )
    if completes_records and is_postgresql(conn):
        along = completed_on_records_statement(conn, execution_id, offset_ms=offset_ms)
        statement = statement.add_cte(along.cte("agboss_along"))
    return statement


@built_once
def state_change_statement(
    conn: Connection,
    offset_ms: int,
    unless_terminal: bool,
    completes_records: bool,
    shape: tuple[tuple[str, str], ...],
) -> Any:
    now = now_expr(conn, offset_ms)
    values: dict[str, Any] = {}
    for name, kind in shape:
        if kind == "now":
            values[name] = now
        elif kind.startswith("computed:"):
            values[name] = computed_value(Computed(kind.removeprefix("computed:")), now)
        else:
            values[name] = bindparam(f"v_{name}", type_=_e[name].type)
    return build_state_change(conn, offset_ms, unless_terminal, completes_records, values)


def undoing(execution_id: Any) -> ColumnElement[bool]:
    """SQL: the execution's compensation started — its start mark
    (``core.compensation.STARTED_RECORD``) exists. The one test of it for every verb that
    meets a ``PAUSED`` execution (``paused_in_undo_txn``, ``find_cancel_requested``,
    ``pauses``), and for the claims of its body (``cancel_request_statement``): paused
    inside an undo, it is part of its compensation, which a cancel never stops
    (design: compensating)."""
    if sabotage.active(UNDO_PAUSE_TAKEN_FOR_THE_BODYS):
        return false()
    return exists().where(_f.execution_id == execution_id, _f.name == compensation.STARTED_RECORD)


@built_once
def cancel_request_statement(conn: Connection) -> Any:
    """An execution's cancel request (``e_id``), read ``FOR SHARE`` on PostgreSQL: a
    cancel being recorded waits for the reader's transaction (or statement).

    The body's claims and writes read it (design: cancel request), and it also stops them
    once the compensation started: ``cancel_requested`` is true then too, with no reason
    of its own. A thread of the body that passed the delivery's check just before the start
    mark would otherwise claim just after it, and its charge pass as an undo's refund. Both
    are read here: the mark, committed before this statement began, and ``COMPENSATING``,
    written with the mark, from the row this statement waits for when that commit is
    under way (the newest row is what PostgreSQL's lock returns)."""
    stops: ColumnElement[bool] = executions.c.cancel_requested
    if not (
        sabotage.active(BODY_CLAIM_AFTER_THE_START_MARK)
        or sabotage.active(BODY_CALLS_AFTER_COMPENSATION_START)
    ):
        compensating = executions.c.state == ExecutionState.COMPENSATING.value
        stops = or_(stops, compensating, undoing(executions.c.id))
    statement = select(stops.label("cancel_requested"), executions.c.cancel_reason).where(
        executions.c.id == bindparam("e_id")
    )
    if conn.dialect.name == "postgresql":
        statement = statement.with_for_update(read=True, of=executions)
    return statement


__all__ = [
    "TERMINAL_VALUES",
    "Computed",
    "build_state_change",
    "cancel_request_statement",
    "computed_value",
    "state_change_shape",
    "state_change_statement",
    "undoing",
]
