"""An intent's claim, and its transition by its holder, as one PostgreSQL statement
(design: one round trip per state change).

What a fenced transaction did in several statements between ``BEGIN`` and ``COMMIT``
(the lease checked and extended; the cancel request read and the intent inserted, or
the compare-and-set, the previous history row read and the record use marked relied;
the history row inserted) is one statement sent in autocommit. It is as safe as the
transaction because:

- the lease row is locked by the statement's first part, before the intent's row,
  which is locked only by the compare-and-set that joins the fence's output (one lock
  order: lease, then intent); a lease that is not live and mine gives no fence row, so
  nothing else is written;
- the history row is an ``INSERT … SELECT`` from the compare-and-set's ``RETURNING``:
  written exactly when the intent changed, never on its own;
- the row chains to the last row the holder wrote (its tail): the compare-and-set
  also requires that row to still be the intent's last, and a row another transaction
  committed meanwhile takes the same ``seq``, so the statement fails whole on the
  unique ``(key, seq)`` instead of writing a broken chain. Either way the caller falls
  back to the transaction, which reads the last row;
- the time is the database's, read once by the statement, and stored beside the
  row's digest, not in it (``core.history``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from sqlalchemy import bindparam, exists, func, literal, null, select, true, update
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import IntegrityError

from celery_agboss.core import sabotage
from celery_agboss.core.execution_states import cancel_reason_of
from celery_agboss.core.executions import OneStatementVerdict
from celery_agboss.core.fault_points import (
    FENCED_AFTER_COMMIT,
    FENCED_BEFORE_BEGIN,
    FENCED_BEFORE_COMMIT,
    fault_point,
)
from celery_agboss.core.protections import (
    FENCE_TIMED_BEFORE_LOCK_WAIT,
    ONE_STATEMENT_WITHOUT_FENCE,
    ROLLED_BACK_SETTLE_MOVES_HOLDER_DEADLINE,
)
from celery_agboss.core.store_protocol import (
    INTENT_RECORD,
    HistoryRow,
    IntentTransition,
    LeaseRef,
    NewIntent,
    OneStatementClaim,
    OneStatementTransition,
)
from celery_agboss.store.dialect import insert_or_nothing, inserted_row, now_expr
from celery_agboss.store.execution_updates import cancel_request_statement
from celery_agboss.store.fences import fence_statement, fenced_error, one_statement_parameters
from celery_agboss.store.history import HISTORY_NAMES, history_binds, history_parameters
from celery_agboss.store.intents import (
    cas_guard_and_values,
    cas_parts,
    intent_sealer,
    new_intent_values,
)
from celery_agboss.store.schema import intent_history, outbound_calls, record_uses
from celery_agboss.store.sealed_columns import opened
from celery_agboss.store.statement_cache import autocommit_connection, built_once, run_compiled

ONE_STATEMENT_SWITCHES = (
    ONE_STATEMENT_WITHOUT_FENCE,
    FENCE_TIMED_BEFORE_LOCK_WAIT,
    ROLLED_BACK_SETTLE_MOVES_HOLDER_DEADLINE,
)
"""The protections a one-statement write holds itself (or its holder's bookkeeping of it):
while one is off, it still runs."""

D = TypeVar("D", OneStatementClaim, OneStatementTransition, OneStatementVerdict)

_h = intent_history.c
_i = outbound_calls.c
_u = record_uses.c


def transition_txn(
    conn: Connection,
    lease: LeaseRef,
    ttl_ms: int,
    change: IntentTransition,
    *,
    relied_by: str | None,
    offset_ms: int = 0,
) -> OneStatementTransition:
    """Run the statement on ``conn`` (PostgreSQL, autocommit). ``row`` is the history row
    to write after the holder's tail (its ``at_ms`` is replaced by the statement's
    time); ``relied_by``: the execution whose record use is marked relied with it."""
    key, row = change.key, change.row
    if row.prev_digest is None:
        raise ValueError("a one-statement transition chains to the holder's last history row")
    parts, parameters = cas_parts(change.guard, change.update, intent_sealer(conn, key))
    parameters.update(history_parameters(conn, row, "t_"))
    parameters.update(one_statement_parameters(lease, ttl_ms))
    parameters.update({"g_key": key, "t_prev_seq": row.seq - 1})
    if relied_by is not None:
        parameters.update(
            {"u_kind": INTENT_RECORD, "u_record_key": key, "u_execution_id": relied_by}
        )
    statement = _statement(conn, offset_ms, parts, relied_by is not None)
    try:
        result = run_compiled(conn, statement, parameters).one()
    except IntegrityError as error:
        # The history row lost its seq to a row committed while the statement ran: it
        # failed whole on the unique (key, seq), nothing written, the lease's extension
        # included: no expiry is reported, so the holder's deadline stays where the last
        # kept extension put it; the caller falls back. Any other integrity error is the
        # store's.
        diagnosis = getattr(error.orig, "diag", None)
        if getattr(diagnosis, "table_name", None) != intent_history.name:
            raise
        return OneStatementTransition(
            fenced=False, won=False, chained=False, expires_at_ms=None, now_ms=None
        )
    if result.expires_at_ms is None:
        return OneStatementTransition(True, False, bool(result.chained), None, None)
    return OneStatementTransition(
        fenced=False,
        won=bool(result.written),
        chained=bool(result.chained),
        expires_at_ms=int(result.expires_at_ms),
        now_ms=int(result.now),
    )


def in_one(engine: Engine, lease: LeaseRef, body: Callable[[Connection], D]) -> D | None:
    """``body``'s one statement, standing for a fenced transaction, on a connection of
    its own in autocommit (the statement is its transaction). None on SQLite, and while
    a test has a protection switched off (so its twin runs the transaction it
    exercises) unless the switch is the statement's own. The fenced transaction's fault
    points stand where they did: before it (its begin, then its commit) and after it.
    ``ExecutionFencedError`` when the lease is not live and mine (nothing written)."""
    if engine.dialect.name != "postgresql" or not sabotage.none_but(*ONE_STATEMENT_SWITCHES):
        return None
    where = {"scope": lease.scope, "holder": lease.holder, "token": lease.token}
    fault_point(FENCED_BEFORE_BEGIN, **where)
    fault_point(FENCED_BEFORE_COMMIT, **where)
    with autocommit_connection(engine) as conn:
        done = body(conn)
    if done.fenced:
        raise fenced_error(lease)
    fault_point(FENCED_AFTER_COMMIT, **where)
    return done


@built_once
def _statement(conn: Connection, offset_ms: int, parts: tuple[Any, ...], relied: bool) -> Any:
    fence = fence_statement(conn, offset_ms).cte("agboss_fence")
    tail_is_last = select(
        (
            exists().where(
                _h.idempotency_key == _bind("g_key"),
                _h.seq == _bind("t_prev_seq"),
                _h.digest == _bind("t_prev_digest"),
            )
            & ~exists().where(_h.idempotency_key == _bind("g_key"), _h.seq == _bind("t_seq"))
        ).label("chained")
    ).cte("agboss_chain")
    now = fence.c.renewed_at_ms
    fenced = [now.is_not(None)]  # joins the fence's row: no row, no compare-and-set
    unfenced = sabotage.active(ONE_STATEMENT_WITHOUT_FENCE)
    if unfenced:
        # The time read once (a CTE), so the row and the "now" it reports agree.
        ticked = select(now_expr(conn, offset_ms).label("now")).cte("agboss_unfenced_clock")
        now, fenced = ticked.c.now, [ticked.c.now.is_not(None)]
    where, values = cas_guard_and_values(parts, now)
    cas = (
        update(outbound_calls)
        .where(*where, *fenced, tail_is_last.c.chained)
        .values(**values)
        .returning(_i.idempotency_key, now.label("now"))
        .cte("agboss_cas")
    )
    row = [cas.c.now if bind.key == "t_at_ms" else bind for bind in history_binds("t_")]
    history = (
        intent_history.insert()
        .from_select(HISTORY_NAMES, inserted_row(*row).select_from(cas))
        .returning(_h.seq)
        .cte("agboss_history")
    )
    written = select(func.count()).select_from(history).scalar_subquery()
    joined = tail_is_last.outerjoin(fence, true())
    if unfenced:
        joined = joined.join(ticked, true())
    statement = select(
        fence.c.expires_at_ms,
        (now if unfenced else fence.c.renewed_at_ms).label("now"),
        tail_is_last.c.chained,
        written.label("written"),
    ).select_from(joined)
    if relied:
        use = postgresql.insert(record_uses).from_select(
            ["kind", "record_key", "execution_id", "used_at_ms", "relied_at_ms"],
            select(
                _bind("u_kind"),
                _bind("u_record_key"),
                _bind("u_execution_id"),
                cas.c.now,
                cas.c.now,
            ).select_from(cas),
        )
        upsert = use.on_conflict_do_update(
            index_elements=[_u.kind, _u.record_key, _u.execution_id],
            set_={"relied_at_ms": use.excluded.relied_at_ms},
        )
        statement = statement.add_cte(upsert.cte("agboss_use"))
    return statement


def claim_txn(
    conn: Connection,
    lease: LeaseRef,
    ttl_ms: int,
    intent: NewIntent,
    row: HistoryRow,
    *,
    cancel_of: str | None,
    offset_ms: int = 0,
) -> OneStatementClaim:
    """The claim as one statement on ``conn`` (PostgreSQL, autocommit): the lease checked
    and extended; ``cancel_of``'s cancel request read ``FOR SHARE`` (after the lease
    row, before the intent's: one lock order); the intent inserted ``PENDING`` unless a
    cancel was requested or the key exists, and ``row`` (its first history row, with
    the statement's time) inserted from that insert's ``RETURNING``."""
    values = new_intent_values(conn, intent)
    parameters: dict[str, Any] = {f"n_{name}": value for name, value in values.items()}
    parameters.update(history_parameters(conn, row, "t_"))
    parameters.update(one_statement_parameters(lease, ttl_ms))
    if cancel_of is not None:
        parameters["e_id"] = cancel_of
    statement = _claim_statement(conn, offset_ms, tuple(values), cancel_of is not None)
    result = run_compiled(conn, statement, parameters).one()
    if result.expires_at_ms is None:
        return OneStatementClaim(True, False, None, None, None)
    return OneStatementClaim(
        fenced=False,
        inserted=bool(result.inserted),
        cancel_reason=cancel_reason_of(
            bool(result.cancel_requested),
            None
            if cancel_of is None
            else opened(
                conn, "agboss_executions", "cancel_reason", cancel_of, result.cancel_reason
            ),
        ),
        expires_at_ms=int(result.expires_at_ms),
        now_ms=int(result.now),
    )


@built_once
def _claim_statement(
    conn: Connection, offset_ms: int, columns: tuple[str, ...], reads_cancel: bool
) -> Any:
    fence = fence_statement(conn, offset_ms).cte("agboss_fence")
    now = fence.c.renewed_at_ms
    intent_row = [bindparam(f"n_{name}", type_=_i[name].type) for name in columns]
    chosen = inserted_row(*intent_row, now, now).select_from(fence)  # no fence row, no claim
    joined: Any = select(literal(1).label("one")).subquery("agboss_one")
    unfenced = sabotage.active(ONE_STATEMENT_WITHOUT_FENCE)
    if unfenced:
        # The time read once (a CTE), so the claim's row and the "now" it reports agree.
        ticked = select(now_expr(conn, offset_ms).label("now")).cte("agboss_unfenced_clock")
        now = ticked.c.now
        chosen = inserted_row(*intent_row, now, now).select_from(ticked)
        joined = joined.join(ticked, true())
    outputs: list[Any] = [
        fence.c.expires_at_ms,
        (now if unfenced else fence.c.renewed_at_ms).label("now"),
    ]
    joined = joined.outerjoin(fence, true())
    if reads_cancel:
        # Joined to the fence's row, so the execution's row is locked after the lease's.
        request = cancel_request_statement(conn).add_columns(now.label("fenced_at"))
        cancel = request.where(now.is_not(None)).cte("agboss_cancel")
        chosen = chosen.where(~exists().where(cancel.c.cancel_requested))
        outputs += [cancel.c.cancel_requested, cancel.c.cancel_reason]
        joined = joined.outerjoin(cancel, true())
    else:
        outputs += [literal(False).label("cancel_requested"), null().label("cancel_reason")]
    inserted = (
        insert_or_nothing(conn, outbound_calls)
        .from_select([*columns, "first_attempt_at_ms", "attempt_started_at_ms"], chosen)
        .returning(_i.idempotency_key, _i.first_attempt_at_ms.label("now"))
        .cte("agboss_inserted")
    )
    history_row = [
        inserted.c.now if bind.key == "t_at_ms" else bind for bind in history_binds("t_")
    ]
    history = (
        intent_history.insert()
        .from_select(HISTORY_NAMES, inserted_row(*history_row).select_from(inserted))
        .returning(_h.seq)
        .cte("agboss_first_history")
    )
    written = select(func.count()).select_from(history).scalar_subquery()
    return select(*outputs, written.label("inserted")).select_from(joined)


def _bind(name: str) -> Any:
    column = {
        "g_key": _h.idempotency_key,
        "t_prev_seq": _h.seq,
        "t_prev_digest": _h.digest,
        "t_seq": _h.seq,
        "u_kind": _u.kind,
        "u_record_key": _u.record_key,
        "u_execution_id": _u.execution_id,
    }[name]
    return bindparam(name, type_=column.type)


__all__ = ["ONE_STATEMENT_SWITCHES", "claim_txn", "in_one", "transition_txn"]
