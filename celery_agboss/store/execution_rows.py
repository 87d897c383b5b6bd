"""Row plumbing shared by the execution verbs: decoding, locking, guarded updates."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from sqlalchemy import and_, bindparam, exists, literal, not_, or_, select, true, update
from sqlalchemy.engine import Connection, Row
from sqlalchemy.sql.elements import ColumnElement

from celery_agboss.core import compensation, sabotage
from celery_agboss.core.execution_states import Verdict
from celery_agboss.core.executions import (
    Audit,
    ExecutionMessage,
    ExecutionRecord,
    ExecutionState,
    execution_scope,
    execution_summary,
)
from celery_agboss.core.protections import (
    AUDIT_AFTER_THE_CHANGE,
    PENDING_INTENT_BY_CREATOR,
    PENDING_INTENT_NARROW,
    TASK_NAME_NOT_CHECKED,
)
from celery_agboss.core.store_protocol import IntentStatus, SharedRecord, StoreTransaction
from celery_agboss.errors import ExecutionIdConflictError
from celery_agboss.store.audit_trail import insert_audit_txn
from celery_agboss.store.codec import loads
from celery_agboss.store.dialect import clock, insert_or_nothing, is_postgresql, now_expr
from celery_agboss.store.execution_updates import (
    TERMINAL_VALUES,
    build_state_change,
    state_change_shape,
    state_change_statement,
)
from celery_agboss.store.schema import fenced_effects, leases, outbound_calls
from celery_agboss.store.schema_executions import executions
from celery_agboss.store.sealed_columns import (
    SEALED_COLUMNS,
    opened,
    sealed,
    sealer_of,
    without_argument_reprs,
)
from celery_agboss.store.statement_cache import built_once
from celery_agboss.store.transactions import SQLTransaction

_e = executions.c
_l = leases.c
_i = outbound_calls.c
_f = fenced_effects.c

SHARED_WAIT_MS = 30_000


SEALED = SEALED_COLUMNS[executions.name][1]
"""The execution's columns sealed at rest, as ``store.sealed_columns`` lists them: its
reasons too, as an undo's failure quotes its (masked) error and a cancel the canceller's
words."""


def sealed_values(conn: Connection, execution_id: str, values: dict[str, Any]) -> dict[str, Any]:
    """``values`` with the texts of the sealed columns sealed for row ``execution_id``."""
    out = dict(values)
    for name in SEALED:
        value = out.get(name)
        if isinstance(value, str):
            out[name] = sealed(conn, executions.name, name, execution_id, value)
    options = out.get("options")
    if isinstance(options, str) and sealer_of(conn).enabled:
        out["options"] = without_argument_reprs(options)
    return out


def record_of(row: Row[Any], conn: Connection) -> ExecutionRecord:
    m = row._mapping

    def open_(name: str) -> Any:
        return opened(conn, executions.name, name, m["id"], m[name])

    return ExecutionRecord(
        id=m["id"],
        task_name=m["task_name"],
        state=ExecutionState(m["state"]),
        args=open_("args"),
        kwargs=open_("kwargs"),
        options=m["options"],
        eta_ms=m["eta_ms"],
        expires_ms=m["expires_ms"],
        requested_at_ms=int(m["requested_at_ms"]),
        started_at_ms=m["started_at_ms"],
        not_before_ms=m["not_before_ms"],
        wake_requested=bool(m["wake_requested"]),
        recovery_count=int(m["recovery_count"]),
        deliveries=int(m["deliveries"]),
        cancel_requested=bool(m["cancel_requested"]),
        cancel_reason=open_("cancel_reason"),
        reason=open_("reason"),
        result=open_("result"),
        error=open_("error"),
        terminal_at_ms=m["terminal_at_ms"],
        links_dispatched=bool(m["links_dispatched"]),
        redrive_planned=bool(m["redrive_planned"]),
        payments_handled_at_ms=m["payments_handled_at_ms"],
        updated_at_ms=int(m["updated_at_ms"]),
        read_at_ms=int(m["read_at_ms"]),
    )


def message_values(message: ExecutionMessage) -> dict[str, Any]:
    return {
        "args": message.args,
        "kwargs": message.kwargs,
        "options": message.options,
        "eta_ms": message.eta_ms,
        "expires_ms": message.expires_ms,
    }


def _retries(options: str) -> int:
    try:
        value = json.loads(options).get("retries", 0)
    except (ValueError, AttributeError):
        return 0
    return value if isinstance(value, int) else 0


def terminal_values(state: ExecutionState, now: Any, values: dict[str, Any]) -> dict[str, Any]:
    """What an execution's end writes on its row (``now``: the statement's time)."""
    return {
        "state": state.value,
        "terminal_at_ms": now,
        "not_before_ms": None,
        "wake_requested": False,
        **values,
    }


def verdict_values(verdict: Verdict, now: Any, values: dict[str, Any]) -> dict[str, Any]:
    """What a delivery's verdict writes on the row, with ``values`` (the result or the
    error); a state that is not an end is due now unless ``values`` say when."""
    if verdict.terminal:
        return terminal_values(verdict.state, now, {"reason": verdict.reason, **values})
    return {"not_before_ms": None, **values, "state": verdict.state.value, "reason": verdict.reason}


def first_attempt_recorded() -> ColumnElement[bool]:
    """The recorded message is a first attempt, so any message is ``newer_or_same`` than
    it: its options' text does not even contain ``"retries"`` (``_retries`` is then 0,
    whatever the rest says). A statement that cannot parse JSON uses it; a row it leaves
    out is decided by ``newer_or_same``."""
    return not_(_e.options.contains('"retries"', autoescape=True))


def newer_or_same(message: ExecutionMessage, record: ExecutionRecord) -> bool:
    """Keep the newest message of an execution: a retry's (more ``retries``) is never
    replaced by a late copy of the message it retried."""
    return _retries(message.options) >= _retries(record.options)


def _pending_predicate(execution_id: Any) -> ColumnElement[bool]:
    if sabotage.active(PENDING_INTENT_NARROW):
        owned = or_(
            _i.owner_scope == execution_id,
            and_(_i.owner_scope.is_(None), _i.execution_id == execution_id),
        )
    elif sabotage.active(PENDING_INTENT_BY_CREATOR):
        owned = or_(_i.execution_id == execution_id, _i.owner_scope == execution_id)
    else:
        # The lease scope of an execution is its id, so "owns through its lease" is
        # ``owner_scope == id``; "held on its behalf" (by the sweep, or another
        # execution that took it over for reconcile) keeps ``execution_id`` (the
        # creator) and ``sent_by`` (the execution whose attempt is on the wire) its own.
        owned = or_(
            _i.execution_id == execution_id,
            _i.owner_scope == execution_id,
            _i.sent_by == execution_id,
        )
    return and_(_i.status == IntentStatus.PENDING.value, owned)


def pending_intent_of(execution_id: Any) -> ColumnElement[bool]:
    """The pending intent of an execution (design: pending intent), the one definition every verb
    uses (fail, cancel, expire, and the sweep's and the operators' verbs): a ``PENDING``
    intent it created, sent the current attempt of, owns through its lease, or that is
    held on its behalf.
    ``execution_id`` is a value or a column (an ``EXISTS`` correlated to it). While one
    exists the execution never becomes ``FAILED``, ``CANCELLED`` or ``EXPIRED``."""
    return exists().where(_pending_predicate(execution_id))


def refuse_another_task(record: ExecutionRecord, task_name: str) -> None:
    """An execution id belongs to one task name (design: one task per id)."""
    if record.task_name != task_name and not sabotage.active(TASK_NAME_NOT_CHECKED):
        raise ExecutionIdConflictError(
            f"the execution id {record.id!r} belongs to the task {record.task_name!r}, not "
            f"to {task_name!r}: nothing of {task_name!r} ran under it and nothing of "
            f"{record.task_name!r} is returned. Give each task run an id of its own",
            execution_id=record.id,
            task=task_name,
            recorded_task=record.task_name,
        )


def sql(tx: StoreTransaction) -> SQLTransaction:
    """The SQLAlchemy transaction behind a protocol transaction (one store, one backend)."""
    if not isinstance(tx, SQLTransaction):
        raise TypeError(f"the execution verbs need a SQLAlchemyStore transaction, not {tx!r}")
    return tx


@built_once
def _read_statement(conn: Connection, offset_ms: int, lock: bool) -> Any:
    statement = select(executions, now_expr(conn, offset_ms).label("read_at_ms")).where(
        _e.id == bindparam("e_id")
    )
    if lock and conn.dialect.name == "postgresql":
        statement = statement.with_for_update(of=executions)
    return statement


@built_once
def _read_with_pending_statement(conn: Connection, offset_ms: int) -> Any:
    return select(
        executions,
        now_expr(conn, offset_ms).label("read_at_ms"),
        pending_intent_of(bindparam("e_id")).label("pending"),
    ).where(_e.id == bindparam("e_id"))


MESSAGE_COLUMNS = ("args", "kwargs", "options", "eta_ms", "expires_ms")
"""The message's columns on the execution row (``message_values``' keys)."""


def requested_parameters(conn: Connection, message: ExecutionMessage) -> dict[str, Any]:
    """The values of ``insert_requested_statement`` for ``message``."""
    values = sealed_values(conn, message.execution_id, message_values(message))
    return {
        "r_id": message.execution_id,
        "r_task_name": message.task_name,
        **{f"r_{name}": value for name, value in values.items()},
    }


@built_once
def insert_requested_statement(conn: Connection, offset_ms: int) -> Any:
    """The publish record: the execution inserted ``REQUESTED``, or nothing when its row
    is there (``RETURNING`` says which). The clock is read once (``clock``), so the row's
    requested and updated times are one instant."""
    now = clock(conn, offset_ms).c.now
    values: dict[str, Any] = {
        "id": bindparam("r_id", type_=_e.id.type),
        "task_name": bindparam("r_task_name", type_=_e.task_name.type),
        "state": literal(ExecutionState.REQUESTED.value, type_=_e.state.type),
        "requested_at_ms": now,
        "updated_at_ms": now,
        "wake_requested": literal(False, type_=_e.wake_requested.type),
        "recovery_count": literal(0, type_=_e.recovery_count.type),
        "deliveries": literal(0, type_=_e.deliveries.type),
        "cancel_requested": literal(False, type_=_e.cancel_requested.type),
        "links_dispatched": literal(False, type_=_e.links_dispatched.type),
        **{name: bindparam(f"r_{name}", type_=_e[name].type) for name in MESSAGE_COLUMNS},
    }
    # ``WHERE true``: SQLite would read the upsert's ON after a FROM as a join's.
    chosen = select(*values.values()).where(true())
    return insert_or_nothing(conn, executions).from_select(list(values), chosen).returning(_e.id)


def execution_lease_live(tx: SQLTransaction, execution_id: str) -> bool:
    """Whether the execution runs under a live lease, decided under its row lock (held
    until ``tx`` ends, so the answer stays true while the caller writes its decision)."""
    lease = tx.lock_lease(execution_scope(execution_id))
    return lease is not None and lease.live


def read_execution_txn(
    tx: SQLTransaction, execution_id: str, *, lock: bool = False
) -> ExecutionRecord | None:
    statement = _read_statement(tx.connection, tx.offset_ms, lock)
    row = tx.execute(statement, {"e_id": execution_id}).first()
    return None if row is None else record_of(row, tx.connection)


def require_execution_txn(tx: SQLTransaction, execution_id: str) -> ExecutionRecord:
    record = read_execution_txn(tx, execution_id)
    if record is None:  # pragma: no cover - rows are never deleted under a lease
        raise LookupError(f"execution {execution_id!r} disappeared")
    return record


def require_with_pending_txn(tx: SQLTransaction, execution_id: str) -> tuple[ExecutionRecord, bool]:
    """``require_execution_txn`` and ``has_pending_intent_txn`` in one statement: a
    verdict's two reads."""
    statement = _read_with_pending_statement(tx.connection, tx.offset_ms)
    row = tx.execute(statement, {"e_id": execution_id}).first()
    if row is None:  # pragma: no cover - rows are never deleted under a lease
        raise LookupError(f"execution {execution_id!r} disappeared")
    return record_of(row, tx.connection), bool(row.pending)


def set_execution_txn(tx: SQLTransaction, execution_id: str, **values: Any) -> int:
    values = sealed_values(tx.connection, execution_id, values)
    values.setdefault("updated_at_ms", tx.now_expr())
    result = tx.execute(update(executions).where(_e.id == execution_id).values(**values))
    return int(result.rowcount)


def set_and_read_txn(
    tx: SQLTransaction,
    execution_id: str,
    *,
    unless_terminal: bool = False,
    completes_records: bool = False,
    **values: Any,
) -> ExecutionRecord:
    """``set_execution_txn`` (``set_unless_terminal_txn`` with ``unless_terminal``), and
    the row as it then is, from the same statement (``RETURNING``): a state change and its record in
    one round trip, not an update and a read. A terminal row left alone is read.
    ``completes_records``: the execution completed, and on PostgreSQL the same
    statement marks the records it relies on (``completed_on_records``) in a
    data-modifying CTE; the caller marks them itself on SQLite.

    Values that are plain Python values or the database clock give a statement built
    once for their names; others (column expressions) build one for this call."""
    values = sealed_values(tx.connection, execution_id, values)
    now = tx.now_expr()
    values.setdefault("updated_at_ms", now)
    shape = state_change_shape(values, now)
    key = (tx.offset_ms, unless_terminal, completes_records)
    if shape is None:
        statement = build_state_change(tx.connection, *key, values)
        params = {"e_id": execution_id}
    else:
        statement = state_change_statement(tx.connection, *key, shape)
        params = {f"v_{name}": values[name] for name, kind in shape if kind == "bind"}
        params["e_id"] = execution_id
    row = tx.execute(statement, params).first()
    return require_execution_txn(tx, execution_id) if row is None else record_of(row, tx.connection)


def set_unless_terminal_txn(tx: SQLTransaction, execution_id: str, **values: Any) -> int:
    values = sealed_values(tx.connection, execution_id, values)
    values.setdefault("updated_at_ms", tx.now_expr())
    result = tx.execute(
        update(executions)
        .where(_e.id == execution_id, _e.state.not_in(TERMINAL_VALUES))
        .values(**values)
    )
    return int(result.rowcount)


def has_pending_intent_txn(tx: SQLTransaction, execution_id: str) -> bool:
    """The execution has a pending intent (``pending_intent_of``)."""
    return bool(tx.execute(select(pending_intent_of(execution_id))).scalar())


def pending_intent_keys_txn(tx: SQLTransaction, execution_id: str) -> list[str]:
    """The idempotency keys of the execution's pending intents, oldest first."""
    rows = tx.execute(
        select(_i.idempotency_key)
        .where(_pending_predicate(execution_id))
        .order_by(_i.first_attempt_at_ms, _i.idempotency_key)
    ).all()
    return [str(row.idempotency_key) for row in rows]


def _marks_txn(tx: SQLTransaction, execution_id: str, name: str) -> list[Any]:
    """The results of the execution's fenced-effect records named ``name``, opened."""
    rows = tx.execute(
        select(_f.key, _f.result).where(_f.execution_id == execution_id, _f.name == name)
    ).all()
    conn = tx.connection
    return [loads(opened(conn, fenced_effects.name, "result", row.key, row.result)) for row in rows]


def undo_declarations_txn(
    tx: SQLTransaction, execution_id: str
) -> list[compensation.UndoDeclaration]:
    """The undos the execution declared (``core.compensation``'s declaration records)."""
    values = _marks_txn(tx, execution_id, compensation.UNDO_RECORD)
    return [compensation.declaration_of(0, value) for value in values if isinstance(value, dict)]


def intents_made_by_undos_txn(
    tx: SQLTransaction,
    execution_id: str,
    records: Sequence[SharedRecord],
    declarations: Sequence[compensation.UndoDeclaration],
) -> set[str]:
    """The intents among ``records`` (the execution's) its undos made: core's rule
    (``compensation.intents_made_by_undos``), over its start mark and done marks."""
    marks = _marks_txn(tx, execution_id, compensation.STARTED_RECORD)
    started = compensation.started_of(marks[0]) if marks else None
    return compensation.intents_made_by_undos(tx, declarations, started, records)


def insert_requested_txn(tx: SQLTransaction, message: ExecutionMessage) -> bool:
    """Record the execution ``REQUESTED`` unless it is there (the publish record)."""
    statement = insert_requested_statement(tx.connection, tx.offset_ms)
    parameters = requested_parameters(tx.connection, message)
    return tx.execute(statement, parameters).first() is not None


def terminal_txn(
    tx: SQLTransaction, execution_id: str, state: ExecutionState, **values: Any
) -> ExecutionRecord:
    # A completed execution's records are kept for it: on PostgreSQL in the same
    # statement as its verdict.
    completed = state is ExecutionState.COMPLETED
    record = set_and_read_txn(
        tx,
        execution_id,
        completes_records=completed,
        **terminal_values(state, tx.now_expr(), values),
    )
    if completed and not is_postgresql(tx.connection):
        tx.completed_on_records(execution_id)
    return record


def write_verdict_txn(
    tx: SQLTransaction, execution_id: str, verdict: Verdict, **values: Any
) -> ExecutionRecord:
    """Write the state ``core.execution_states`` answered, with its reason: a terminal
    one with its end time; any other due now unless ``values`` say when."""
    if verdict.terminal:
        return terminal_txn(tx, execution_id, verdict.state, reason=verdict.reason, **values)
    return set_and_read_txn(tx, execution_id, **verdict_values(verdict, None, values))


def audit_change_txn(
    tx: SQLTransaction,
    audit: Audit | None,
    target: str,
    before: ExecutionRecord | None,
    after: ExecutionRecord | None,
) -> None:
    """An operator's decision, in the transaction that makes the change (nothing
    without ``audit``): the change and its row commit together, or neither does."""
    if audit is None or sabotage.active(AUDIT_AFTER_THE_CHANGE):
        return
    insert_audit_txn(
        tx,
        actor=audit.actor,
        action=audit.action,
        target=target,
        reason=audit.reason,
        before=None if before is None else execution_summary(before),
        after=None if after is None else execution_summary(after),
    )


def park_txn(tx: SQLTransaction, execution_id: str, count: int, cap: int) -> None:
    set_execution_txn(
        tx,
        execution_id,
        state=ExecutionState.PARKED.value,
        wake_requested=False,
        reason=(
            f"recovery cap reached: {count} take-overs and re-publishes "
            f"(agboss_max_recovery_attempts={cap})"
        ),
    )


__all__ = [
    "MESSAGE_COLUMNS",
    "SHARED_WAIT_MS",
    "audit_change_txn",
    "execution_lease_live",
    "first_attempt_recorded",
    "has_pending_intent_txn",
    "insert_requested_statement",
    "insert_requested_txn",
    "intents_made_by_undos_txn",
    "message_values",
    "newer_or_same",
    "park_txn",
    "pending_intent_keys_txn",
    "pending_intent_of",
    "read_execution_txn",
    "record_of",
    "refuse_another_task",
    "requested_parameters",
    "require_execution_txn",
    "require_with_pending_txn",
    "set_and_read_txn",
    "set_execution_txn",
    "set_unless_terminal_txn",
    "sql",
    "terminal_txn",
    "terminal_values",
    "undo_declarations_txn",
    "verdict_values",
    "write_verdict_txn",
]
