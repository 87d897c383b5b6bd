"""A delivery's verdict and its lease's release as one PostgreSQL statement
(design: one round trip per state change).

The fenced transaction that ends a delivery (``conclude``) checks the lease, reads the
execution with its pending flag and, to find a divergence, the records it created or
used; asks ``core.execution_states``; writes the verdict; and releases the lease at its
commit. Here it is first sent as the plain end, with no read before it: the verdict
the rules give a running execution with nothing pending and nothing diverged (``Plain``),
written only while the statement finds exactly that. Otherwise the reads are sent in
autocommit and decided by the transaction's own code
(``SQLAlchemyExecutionStore._finish_verdict``). Either way one statement writes:

- the lease row, locked first while it is live and mine (``fence_lock_statement``): no
  fence row, nothing written;
- the verdict on the execution's row, joined to the fence's row, and only while the
  pending flag the verdict was decided on is still the same (else nothing is written,
  and the fenced transaction decides again);
- the lease released, joined to the verdict's row; a completed execution's record uses
  marked completed, joined to it too.

Reading before the fence is no weaker than the transaction's reads after it: neither
locks the rows it reads, and the lease row is locked by the statement before any write.
One lock order: lease, then execution.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    bindparam,
    exists,
    func,
    literal,
    literal_column,
    not_,
    select,
    true,
    update,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Connection, Engine

from celery_agboss.core import sabotage
from celery_agboss.core.execution_states import Verdict
from celery_agboss.core.executions import ExecutionState, OneStatementVerdict
from celery_agboss.core.protections import ONE_STATEMENT_WITHOUT_FENCE
from celery_agboss.core.store_protocol import LeaseRef
from celery_agboss.store.dialect import now_expr
from celery_agboss.store.execution_rows import (
    pending_intent_of,
    record_of,
    sealed_values,
    verdict_values,
)
from celery_agboss.store.execution_updates import TERMINAL_VALUES, state_change_shape
from celery_agboss.store.fences import (
    fence_lock_statement,
    one_statement_parameters,
    release_after_fence,
)
from celery_agboss.store.intent_transitions import ONE_STATEMENT_SWITCHES
from celery_agboss.store.schema import leases
from celery_agboss.store.schema_executions import executions
from celery_agboss.store.shared_records import completed_on_records_statement, records_of
from celery_agboss.store.statement_cache import built_once, run_compiled

_e = executions.c

_NOW = object()
"""Stands for the statement's time in a verdict's values while its shape is taken."""


def possible(engine: Engine) -> bool:
    """PostgreSQL, and no protection switched off but the statement's own (every other
    twin exercises the transaction it was written for)."""
    return engine.dialect.name == "postgresql" and sabotage.none_but(*ONE_STATEMENT_SWITCHES)


def conclude_txn(
    conn: Connection,
    lease: LeaseRef,
    ttl_ms: int,
    verdict: Verdict,
    values: dict[str, Any],
    *,
    pending: bool,
    plain: Plain | None = None,
    offset_ms: int = 0,
) -> OneStatementVerdict:
    """Write ``verdict`` (with ``values``) and release ``lease`` in one statement on
    ``conn`` (autocommit), unless the lease is not live and mine (``fenced``) or the
    execution's pending flag is no longer ``pending`` (no record: decide again). With
    ``plain``, nothing was read first: the row is also required to be running, with no
    intent pending and, when ``plain.reached`` is given, no record outside it."""
    written = sealed_values(conn, lease.scope, verdict_values(verdict, _NOW, values))
    written["wake_requested"] = False  # the release's; a verdict here never wakes
    written["updated_at_ms"] = _NOW
    shape = state_change_shape(written, _NOW)
    if shape is None:  # pragma: no cover - a verdict's values are plain
        raise TypeError(f"a verdict's values must be plain values: {sorted(written)}")
    parameters: dict[str, Any] = {
        f"v_{name}": written[name] for name, kind in shape if kind == "bind"
    }
    parameters.update(one_statement_parameters(lease, ttl_ms))
    parameters["e_id"] = lease.scope
    checks_reached = plain is not None and plain.reached is not None
    if plain is not None and plain.reached:
        parameters["p_reached"] = sorted(plain.reached)
    completes = verdict.state is ExecutionState.COMPLETED
    guard = (pending, plain is not None, checks_reached, bool(parameters.get("p_reached")))
    statement = _statement(conn, offset_ms, shape, guard, completes)
    row = run_compiled(conn, statement, parameters).one()
    if row.fenced_at is None:
        return OneStatementVerdict(True, None)
    if row.id is None:
        return OneStatementVerdict(False, None)
    return OneStatementVerdict(False, record_of(row, conn))


@dataclass(frozen=True)
class Plain:
    """A verdict sent before any read, for the end every rule answers alike: the row
    running (not ended), no intent pending, and, with ``reached``, no record the
    execution created or used outside those keys (so nothing diverged)."""

    reached: Collection[str] | None


@built_once
def _statement(
    conn: Connection,
    offset_ms: int,
    shape: tuple[tuple[str, str], ...],
    guard: tuple[bool, bool, bool, bool],
    completes: bool,
) -> Any:
    pending, plain, checks_reached, reached_any = guard
    fence = fence_lock_statement(conn, offset_ms).cte("agboss_fence")
    now: Any = fence.c.now
    fenced = [fence.c.scope == _e.id]  # joins the fence's row: no row, no verdict
    if sabotage.active(ONE_STATEMENT_WITHOUT_FENCE):
        now, fenced = now_expr(conn, offset_ms), []
    values: dict[str, Any] = {}
    for name, kind in shape:
        values[name] = now if kind == "now" else bindparam(f"v_{name}", type_=_e[name].type)
    execution_id = bindparam("e_id", type_=_e.id.type)
    still = pending_intent_of(_e.id)
    guards = [still if pending else not_(still)]
    if plain:
        # Not ended: one comparison per state (a list parameter would be expanded per call).
        guards.extend(_e.state != literal(value) for value in TERMINAL_VALUES)
    if checks_reached:
        reached: Any = None
        if reached_any:
            reached = bindparam("p_reached", type_=postgresql.ARRAY(_e.id.type))
        guards.append(not_(exists(records_of(execution_id, reached, array=True))))
    verdict = (
        update(executions)
        .where(_e.id == execution_id, *fenced, *guards)
        .values(**values)
        # Every column as ``*``, here and below: named one by one, the statement passed
        # the 4,096 bytes psycopg caches its parsing for, and was parsed on every call.
        .returning(
            literal_column(f"{executions.name}.*"),
            _e.id.label("verdict_of"),
            now.label("read_at_ms"),
        )
        .cte("agboss_verdict")
    )
    # Joined to the verdict's row: no verdict, no release.
    released = release_after_fence(
        verdict.c.read_at_ms, leases.c.scope == verdict.c.verdict_of
    ).cte("agboss_released")
    statement = select(
        fence.c.now.label("fenced_at"),
        literal_column(f"{verdict.name}.*"),
        select(func.count()).select_from(released).scalar_subquery().label("released"),
    ).select_from(
        select(literal(1).label("one"))
        .subquery("agboss_one")
        .outerjoin(fence, true())
        .outerjoin(verdict, true())
    )
    if completes:
        along = completed_on_records_statement(conn, verdict.c.verdict_of, offset_ms=offset_ms)
        statement = statement.add_cte(along.cte("agboss_along"))
    return statement


__all__ = ["Plain", "conclude_txn", "possible"]
