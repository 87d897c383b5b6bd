"""Which executions, besides its creator, used an intent or a fenced effect.

A record is used when an execution replays it, joins its send, takes it over for
reconcile, or replays a fenced effect another execution recorded under a shared
business key (a double click makes two executions of one order). Two rules read
these rows: retention keeps a record while any execution that used it is not terminal
(design: retention), and resolving an intent re-drives every execution waiting on it.
Bodies on a connection, inside the caller's transaction.

A use is written only while its record exists, and on PostgreSQL the statement that
writes it holds the record ``FOR KEY SHARE`` until the transaction ends: retention
locks what it deletes ``FOR UPDATE SKIP LOCKED``, so it skips a record whose use is
being noted, and a use noted while retention deletes the record waits, then writes
nothing (the record is gone).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Table, bindparam, delete, select, true
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection
from sqlalchemy.sql.elements import ColumnElement

from celery_agboss.core import sabotage
from celery_agboss.core.protections import RETENTION_DELETES_WHAT_IT_LISTED
from celery_agboss.core.store_protocol import EFFECT_RECORD as EFFECT
from celery_agboss.core.store_protocol import INTENT_RECORD as INTENT
from celery_agboss.store.dialect import clock, is_postgresql
from celery_agboss.store.schema import fenced_effects, outbound_calls, record_uses
from celery_agboss.store.statement_cache import built_once

_u = record_uses.c


def record_table(kind: str) -> tuple[Table, ColumnElement[str]]:
    """The table of a kind of shared record, and its key column."""
    if kind == INTENT:
        return outbound_calls, outbound_calls.c.idempotency_key
    if kind == EFFECT:
        return fenced_effects, fenced_effects.c.key
    raise ValueError(f"a record is an {INTENT!r} or an {EFFECT!r}, not {kind!r}")


def held_against_retention(conn: Connection) -> bool:
    """Whether a read that hands a record out holds it ``FOR KEY SHARE`` (PostgreSQL):
    the lock conflicts only with retention's ``FOR UPDATE`` and its ``DELETE``, never
    with a compare-and-set, so two replays never wait for each other. SQLite needs none:
    its write transactions run one at a time (design: retention)."""
    return is_postgresql(conn) and not sabotage.active(RETENTION_DELETES_WHAT_IT_LISTED)


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
    ``relied``, that it relies on the record's result from now on as well. Nothing is
    written when the record is gone (see the module doc)."""
    values = _use_values(kind, record_key, execution_id)
    conn.execute(_use_statements(conn, offset_ms, relied, kind)[0], values)


def note_relied_txn(
    conn: Connection, kind: str, record_key: str, execution_id: str, *, offset_ms: int = 0
) -> None:
    """The use, relied on from now: inserted, or its ``relied_at_ms`` set when the
    execution used the record before. One statement (an upsert), not an update and then
    an insert."""
    values = _use_values(kind, record_key, execution_id)
    conn.execute(_use_statements(conn, offset_ms, True, kind)[1], values)


def _use_values(kind: str, record_key: str, execution_id: str) -> dict[str, str]:
    if kind not in (INTENT, EFFECT):
        raise ValueError(f"a record use is of an {INTENT!r} or an {EFFECT!r}, not {kind!r}")
    return {"u_kind": kind, "u_record_key": record_key, "u_execution_id": execution_id}


@built_once
def _use_statements(conn: Connection, offset_ms: int, relied: bool, kind: str) -> tuple[Any, Any]:
    """One use's ``INSERT … SELECT`` from the record's row (held, see the module doc):
    doing nothing on a conflict, and setting ``relied_at_ms`` on one (the second only
    with ``relied``)."""
    clk = clock(conn, offset_ms)
    record_key = bindparam("u_record_key", type_=_u.record_key.type)
    _, key_column = record_table(kind)
    record = select(key_column).where(key_column == record_key)
    if held_against_retention(conn):
        record = record.with_for_update(read=True, key_share=True)
    columns = ["kind", "record_key", "execution_id", "used_at_ms"]
    values: list[Any] = [
        bindparam("u_kind", type_=_u.kind.type),
        record_key,
        bindparam("u_execution_id", type_=_u.execution_id.type),
        clk.c.now,
    ]
    if relied:
        columns.append("relied_at_ms")
        values.append(clk.c.now)
    insert = postgresql.insert if is_postgresql(conn) else sqlite.insert
    # SQLite: "INSERT … SELECT … ON CONFLICT" needs a WHERE.
    statement = insert(record_uses).from_select(
        columns,
        select(*values).select_from(clk.join(record.subquery("agboss_used"), true())).where(true()),
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
    "held_against_retention",
    "note_relied_txn",
    "record_table",
    "record_use_txn",
    "users_of_txn",
]
