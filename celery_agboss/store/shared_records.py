"""What a record several executions share says about them, read and written in SQL.

The rules over it are ``celery_agboss.core.shared_records``; these bodies (on a
connection, inside the caller's transaction) only read the record with every
execution that used it, and write the three guarded changes the rules need:
a reliance (``reliance`` + 1, only while no undo claimed the record), an undo's claim
(only while the reliance is the one its decision read), and an undo's end. Every
guard reads only the row it writes, so it holds at READ COMMITTED: a reliance
committed while an undo's claim waited for the row changes ``reliance``, and the
claim's predicate, evaluated again on the new row, no longer matches.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from sqlalchemy import all_, and_, bindparam, select, union, update
from sqlalchemy.engine import Connection, Row
from sqlalchemy.sql.dml import Update

from celery_agboss.core import sabotage
from celery_agboss.core.protections import RELIANCE_OFF_THE_RECORD
from celery_agboss.core.store_protocol import (
    INTENT_RECORD,
    IntentStatus,
    RecordUser,
    Reliance,
    SharedRecord,
)
from celery_agboss.store.dialect import now_expr
from celery_agboss.store.record_uses import note_relied_txn, record_table
from celery_agboss.store.schema import fenced_effects, outbound_calls, record_uses
from celery_agboss.store.schema_executions import executions
from celery_agboss.store.statement_cache import built_once

_i = outbound_calls.c
_f = fenced_effects.c
_u = record_uses.c
_e = executions.c


# --- reads ----------------------------------------------------------------------------


@built_once
def _users_statement(conn: Connection, kind: str) -> Any:
    """Every use of the records ``u_keys``, with the user's state (NULL once its row is
    gone)."""
    return (
        select(
            _u.record_key,
            _u.execution_id,
            _u.relied_at_ms,
            _u.completed_at_ms,
            _e.state,
            _e.cancel_requested,
        )
        .select_from(record_uses.outerjoin(executions, _e.id == _u.execution_id))
        .where(_u.kind == kind, _u.record_key.in_(bindparam("u_keys", expanding=True)))
        .order_by(_u.used_at_ms, _u.execution_id)
    )


def _with_creator(kind: str) -> Any:
    """The records' columns and their creator's state, read with them (an outer join:
    a creator's row may be gone), so the records and their creators cost one round trip."""
    table, _ = record_table(kind)
    return select(
        *_columns(kind),
        _e.state.label("creator_state"),
        _e.cancel_requested.label("creator_cancel"),
    ).select_from(table.outerjoin(executions, _e.id == table.c.execution_id))


def _records(conn: Connection, kind: str, rows: Sequence[Row[Any]]) -> list[SharedRecord]:
    """The records of ``rows`` with their users: the creator first, then every other."""
    if not rows:
        return []
    column = "idempotency_key" if kind == INTENT_RECORD else "key"
    keys = [str(r._mapping[column]) for r in rows]
    uses: dict[str, list[Row[Any]]] = {}
    for use in conn.execute(_users_statement(conn, kind), {"u_keys": keys}).all():
        uses.setdefault(str(use.record_key), []).append(use)
    made: list[SharedRecord] = []
    for key, row in zip(keys, rows, strict=True):
        creator = str(row.execution_id)
        found = {str(u.execution_id): u for u in uses.get(key, [])}
        state = None if row.creator_state is None else str(row.creator_state)
        cancel = bool(row.creator_cancel)
        own = found.pop(creator, None)
        users = [
            RecordUser(
                creator,
                relied=own is not None and own.relied_at_ms is not None,
                completed_on=own is not None and own.completed_at_ms is not None,
                state=state,
                cancel_requested=cancel,
            )
        ]
        users += [
            RecordUser(
                execution_id,
                relied=use.relied_at_ms is not None,
                completed_on=use.completed_at_ms is not None,
                state=None if use.state is None else str(use.state),
                cancel_requested=bool(use.cancel_requested),
            )
            for execution_id, use in found.items()
        ]
        if kind == INTENT_RECORD:
            status = IntentStatus(row.status)
            sent_by = None if row.sent_by is None else str(row.sent_by)
        else:
            status, sent_by = IntentStatus.COMPLETED, None
        made.append(
            SharedRecord(
                kind=kind,
                key=key,
                name=str(row.name),
                status=status,
                creator=creator,
                sent_by=sent_by,
                reliance=int(row.reliance),
                undo_by=None if row.undo_by is None else str(row.undo_by),
                compensated=row.compensated_at_ms is not None,
                users=tuple(users),
            )
        )
    return made


def _columns(kind: str) -> list[Any]:
    if kind == INTENT_RECORD:
        return [
            _i.idempotency_key,
            _i.execution_id,
            _i.name,
            _i.status,
            _i.sent_by,
            _i.reliance,
            _i.undo_by,
            _i.compensated_at_ms,
            _i.first_attempt_at_ms,
        ]
    return [
        _f.key,
        _f.execution_id,
        _f.name,
        _f.reliance,
        _f.undo_by,
        _f.compensated_at_ms,
    ]


def read_shared_txn(conn: Connection, kind: str, record_key: str) -> SharedRecord | None:
    _, key_column = record_table(kind)
    rows = conn.execute(_with_creator(kind).where(key_column == record_key)).all()
    found = _records(conn, kind, rows)
    return found[0] if found else None


def shared_records_of_txn(
    conn: Connection, execution_id: str, *, excluding: Collection[str] = ()
) -> list[SharedRecord]:
    """Every intent the execution created or used (a use is noted before an execution
    sends an attempt of an intent it did not create), oldest first, but those whose keys
    are in ``excluding``: when that leaves none, their users are not read either."""
    parameters: dict[str, Any] = {"s_execution_id": execution_id}
    if excluding:
        parameters["s_excluding"] = sorted(excluding)
    statement = _records_of_statement(conn, bool(excluding))
    rows = conn.execute(statement, parameters).all()
    return _records(conn, INTENT_RECORD, rows)


def records_of(execution_id: Any, excluding: Any = None, *, array: bool = False) -> Any:
    """The keys of the intents ``execution_id`` (a value or a column) created or used,
    but those in ``excluding`` (an expanding parameter, or with ``array`` a PostgreSQL
    array): ``shared_records_of_txn``'s records, as a subquery a statement can test with
    ``EXISTS``."""
    keys = union(
        select(_i.idempotency_key.label("key")).where(_i.execution_id == execution_id),
        select(_u.record_key.label("key")).where(
            _u.kind == INTENT_RECORD, _u.execution_id == execution_id
        ),
    ).subquery()
    # Its own alias of the intents: never correlated to a statement that reads them too.
    key = outbound_calls.alias("agboss_record").c.idempotency_key
    found = select(key).where(key.in_(select(keys.c.key)))
    if excluding is not None:
        found = found.where(key != all_(excluding) if array else key.not_in(excluding))
    return found


@built_once
def _records_of_statement(conn: Connection, excluding: bool) -> Any:
    execution_id = bindparam("s_execution_id", type_=_i.execution_id.type)
    left_out = (
        bindparam("s_excluding", expanding=True, type_=_i.idempotency_key.type)
        if excluding
        else None
    )
    return (
        _with_creator(INTENT_RECORD)
        .where(_i.idempotency_key.in_(records_of(execution_id, left_out)))
        .order_by(_i.first_attempt_at_ms, _i.idempotency_key)
    )


# --- writes ---------------------------------------------------------------------------


def _relied(conn: Connection, kind: str, record_key: str, execution_id: str) -> bool:
    row = conn.execute(
        select(_u.relied_at_ms).where(
            _u.kind == kind, _u.record_key == record_key, _u.execution_id == execution_id
        )
    ).first()
    return row is not None and row.relied_at_ms is not None


def rely_on_txn(
    conn: Connection,
    kind: str,
    record_key: str,
    execution_id: str,
    *,
    counted: bool = False,
    offset_ms: int = 0,
) -> Reliance:
    """Write that the record's result is handed to ``execution_id`` (see the module doc):
    ``reliance`` + 1 by a compare-and-set that fails once an undo claimed the record,
    then the use marked relied. An execution that relied already changes nothing.
    ``ABSENT``: no such completed record — retention deleted it while this transaction
    waited for its row (a caller that did not hold it from its read): nothing is noted,
    and its result must not be handed out (design: retention)."""
    table, key_column = record_table(kind)
    if not counted and not sabotage.active(RELIANCE_OFF_THE_RECORD):
        if _relied(conn, kind, record_key, execution_id):
            return Reliance.RELIED
        guard = [key_column == record_key, table.c.undo_by.is_(None)]
        if kind == INTENT_RECORD:
            guard.append(_i.status == IntentStatus.COMPLETED.value)
        changed = conn.execute(
            update(table).where(*guard).values(reliance=table.c.reliance + 1)
        ).rowcount
        if changed != 1:
            claimed = and_(key_column == record_key, table.c.undo_by.is_not(None))
            undone = conn.execute(select(table.c.undo_by).where(claimed)).first()
            return Reliance.UNDONE if undone is not None else Reliance.ABSENT
    _note_relied(conn, kind, record_key, execution_id, offset_ms)
    return Reliance.RELIED


def _note_relied(
    conn: Connection, kind: str, record_key: str, execution_id: str, offset_ms: int
) -> None:
    note_relied_txn(conn, kind, record_key, execution_id, offset_ms=offset_ms)


def claim_undo_txn(
    conn: Connection, kind: str, record_key: str, execution_id: str, reliance: int
) -> bool:
    table, key_column = record_table(kind)
    guard = [key_column == record_key, table.c.undo_by.is_(None)]
    if not sabotage.active(RELIANCE_OFF_THE_RECORD):
        guard.append(table.c.reliance == bindparam("seen", reliance))
    changed = conn.execute(update(table).where(*guard).values(undo_by=execution_id)).rowcount
    return bool(changed == 1)


def lock_shared_txn(conn: Connection, kind: str, record_key: str) -> None:
    """The record's row ``FOR NO KEY UPDATE`` until the transaction ends (PostgreSQL;
    SQLite's writers run one at a time, and SQLAlchemy leaves the clause out there): what
    makes two undos' ends judging one step from each other's marks see each other
    (``StoreTransaction.lock_shared``). Not ``FOR UPDATE``: a replay's ``FOR KEY SHARE``
    read of the record (a later click) never waits for an undo's end."""
    _, key_column = record_table(kind)
    locked = select(key_column).where(key_column == record_key).with_for_update(key_share=True)
    conn.execute(locked).all()


def mark_compensated_txn(
    conn: Connection, kind: str, record_key: str, execution_id: str, *, offset_ms: int = 0
) -> None:
    table, key_column = record_table(kind)
    conn.execute(
        update(table)
        .where(
            key_column == record_key,
            table.c.undo_by == execution_id,
            table.c.compensated_at_ms.is_(None),
        )
        .values(compensated_at_ms=now_expr(conn, offset_ms))
    )


def completed_on_records_txn(conn: Connection, execution_id: str, *, offset_ms: int = 0) -> None:
    """The execution completed: every record it relies on is kept for it, on the record
    (its use), so that this outlives the execution's own row."""
    conn.execute(completed_on_records_statement(conn, execution_id, offset_ms=offset_ms))


def completed_on_records_statement(
    conn: Connection, execution_id: Any, *, offset_ms: int = 0
) -> Update:
    """``completed_on_records_txn``'s ``UPDATE``, for a caller that sends it with another
    (as a data-modifying CTE on PostgreSQL: one round trip)."""
    return (
        update(record_uses)
        .where(
            and_(
                _u.execution_id == execution_id,
                _u.relied_at_ms.is_not(None),
                _u.completed_at_ms.is_(None),
            )
        )
        .values(completed_at_ms=now_expr(conn, offset_ms))
    )


__all__ = [
    "claim_undo_txn",
    "completed_on_records_statement",
    "completed_on_records_txn",
    "lock_shared_txn",
    "mark_compensated_txn",
    "read_shared_txn",
    "records_of",
    "rely_on_txn",
    "shared_records_of_txn",
]
