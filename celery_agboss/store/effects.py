"""Fenced-effect records: bodies on a connection, inside the caller's (fenced) transaction."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import and_, delete, select
from sqlalchemy.engine import Connection
from sqlalchemy.sql.elements import ColumnElement

from celery_agboss.core.store_protocol import EffectRecord
from celery_agboss.store.codec import dumps, loads
from celery_agboss.store.dialect import insert_or_nothing, now_expr
from celery_agboss.store.record_uses import held_against_retention
from celery_agboss.store.schema import fenced_effects
from celery_agboss.store.sealed_columns import opened, sealed

_e = fenced_effects.c
TABLE = fenced_effects.name


def read_txn(conn: Connection, key: str) -> EffectRecord | None:
    """The effect, held ``FOR KEY SHARE`` on PostgreSQL until the transaction ends, as an
    intent's read is: a replay keeps what it read until its use is noted, and retention
    skips it meanwhile (design: retention)."""
    statement = select(fenced_effects).where(_e.key == key)
    if held_against_retention(conn):
        statement = statement.with_for_update(read=True, key_share=True)
    row = conn.execute(statement).first()
    if row is None:
        return None
    return EffectRecord(
        key=row.key,
        execution_id=row.execution_id,
        name=row.name,
        result=loads(opened(conn, TABLE, "result", row.key, row.result)),
        token=int(row.token),
        created_at_ms=int(row.created_at_ms),
        fingerprint=row.fingerprint,
        reliance=int(row.reliance),
        undo_by=row.undo_by,
        compensated_at_ms=row.compensated_at_ms,
    )


def insert_txn(conn: Connection, record: EffectRecord, *, offset_ms: int = 0) -> bool:
    """``INSERT … ON CONFLICT DO NOTHING`` (created_at = now); True when inserted."""
    inserted = conn.execute(
        insert_or_nothing(conn, fenced_effects)
        .values(
            key=record.key,
            execution_id=record.execution_id,
            name=record.name,
            result=sealed(conn, TABLE, "result", record.key, dumps(record.result)),
            token=record.token,
            fingerprint=record.fingerprint,
            reliance=record.reliance,
            created_at_ms=now_expr(conn, offset_ms),
        )
        .returning(_e.key)
    ).first()
    return inserted is not None


def delete_returning_txn(
    conn: Connection, keys: Sequence[str], *, only_if: ColumnElement[bool] | None = None
) -> list[str]:
    """Retention: delete these fenced-effect records, each only if ``only_if`` still holds
    on the row the ``DELETE`` reads (design: retention); the keys deleted."""
    wanted = list(keys)
    if not wanted:
        return []
    listed = _e.key.in_(wanted)
    where = listed if only_if is None else and_(listed, only_if)
    gone = conn.execute(delete(fenced_effects).where(where).returning(_e.key))
    return [str(key) for key in gone.scalars()]
