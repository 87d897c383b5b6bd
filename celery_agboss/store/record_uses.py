"""Which executions, besides its creator, used an intent or a fenced effect.

A record is used when an execution replays it, joins its send, takes it over for
reconcile, or replays a fenced effect another execution recorded under a shared
business key (a double click makes two executions of one order). Two rules read
these rows: retention keeps a record while any execution that used it is not terminal
(design: retention), and resolving an intent re-drives every execution waiting on it.
Bodies on a connection, inside the caller's transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import bindparam, delete, select, true
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

from celery_agboss.core.store_protocol import EFFECT_RECORD as EFFECT
from celery_agboss.core.store_protocol import INTENT_RECORD as INTENT
from celery_agboss.store.dialect import clock, is_postgresql
from celery_agboss.store.schema import record_uses
from celery_agboss.store.statement_cache import built_once

_u = record_uses.c


def record_use_txn(
    conn: Connection,
    kind: str,
    record_key: str,
    execution_id: str,
    *,
    offset_ms: int = 0,
    relied: bool = False,
) -> None:
    """Note that ``execution_id`` used the record (once: ``ON CONFLICT DO NOTHING``); with
    ``relied``, that it relies on the record's result from now on as well."""
    statement = _use_statements(conn, offset_ms, relied)[0]
    conn.execute(statement, _use_values(kind, record_key, execution_id))


def note_relied_txn(
    conn: Connection, kind: str, record_key: str, execution_id: str, *, offset_ms: int = 0
) -> None:
    """The use, relied on from now: inserted, or its ``relied_at_ms`` set when the
    execution used the record before. One statement (an upsert), not an update and then
    an insert."""
    statement = _use_statements(conn, offset_ms, True)[1]
    conn.execute(statement, _use_values(kind, record_key, execution_id))


def _use_values(kind: str, record_key: str, execution_id: str) -> dict[str, str]:
    if kind not in (INTENT, EFFECT):
        raise ValueError(f"a record use is of an {INTENT!r} or an {EFFECT!r}, not {kind!r}")
    return {"u_kind": kind, "u_record_key": record_key, "u_execution_id": execution_id}


@built_once
def _use_statements(conn: Connection, offset_ms: int, relied: bool) -> tuple[Any, Any]:
    """One use's ``INSERT … SELECT``: doing nothing on a conflict, and setting
    ``relied_at_ms`` on one (the second only with ``relied``)."""
    clk = clock(conn, offset_ms)
    columns = ["kind", "record_key", "execution_id", "used_at_ms"]
    values: list[Any] = [
        bindparam("u_kind", type_=_u.kind.type),
        bindparam("u_record_key", type_=_u.record_key.type),
        bindparam("u_execution_id", type_=_u.execution_id.type),
        clk.c.now,
    ]
    if relied:
        columns.append("relied_at_ms")
        values.append(clk.c.now)
    insert = postgresql.insert if is_postgresql(conn) else sqlite.insert
    # SQLite: "INSERT … SELECT … ON CONFLICT" needs a WHERE.
    statement = insert(record_uses).from_select(
        columns, select(*values).select_from(clk).where(true())
    )
    upsert = statement.on_conflict_do_update(
        index_elements=[_u.kind, _u.record_key, _u.execution_id],
        set_={"relied_at_ms": statement.excluded.relied_at_ms},
    )
    return statement.on_conflict_do_nothing(), upsert


def users_of_txn(conn: Connection, kind: str, record_key: str) -> list[str]:
    """The executions other than its creator that used the record."""
    rows = conn.execute(
        select(_u.execution_id)
        .where(_u.kind == kind, _u.record_key == record_key)
        .order_by(_u.used_at_ms, _u.execution_id)
    ).all()
    return [str(row.execution_id) for row in rows]


def delete_uses_txn(conn: Connection, kind: str, record_keys: Sequence[str]) -> int:
    """Forget the uses of records that retention deleted."""
    keys = list(record_keys)
    if not keys:
        return 0
    result = conn.execute(delete(record_uses).where(_u.kind == kind, _u.record_key.in_(keys)))
    return int(result.rowcount)


__all__ = [
    "EFFECT",
    "INTENT",
    "delete_uses_txn",
    "note_relied_txn",
    "record_use_txn",
    "users_of_txn",
]
