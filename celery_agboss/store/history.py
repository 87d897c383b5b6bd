"""An intent's history rows: the hash-chained record of every transition it made.

Appended in the transaction (or the one statement) that changes the intent, never
rewritten; ``append_history_after_txn`` chains a row only while the row it follows is
still the last.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import bindparam, exists, select
from sqlalchemy.engine import Connection, Row

from celery_agboss.core.store_protocol import (
    HistoryRow,
)
from celery_agboss.store.codec import dumps, loads
from celery_agboss.store.dialect import insert_or_nothing
from celery_agboss.store.schema import intent_history
from celery_agboss.store.sealed_columns import opened, sealed
from celery_agboss.store.statement_cache import built_once

_h = intent_history.c


TABLE = intent_history.name


def _detail_sealed(conn: Connection, row: HistoryRow) -> str | None:
    """The row's detail as stored: canonical JSON (its digest is over that), sealed."""
    return sealed(conn, TABLE, "detail", f"{row.idempotency_key}:{row.seq}", dumps(row.detail))


def _history(row: Row[Any], conn: Connection) -> HistoryRow:
    """A history row; its ``detail`` opened when it was read (``last_link_txn`` does not)."""
    m = row._mapping
    row_key = f"{m['idempotency_key']}:{m['seq']}"
    stored = m.get("detail")
    return HistoryRow(
        idempotency_key=m["idempotency_key"],
        seq=int(m["seq"]),
        at_ms=int(m["at_ms"]),
        event=m["event"],
        from_status=m["from_status"],
        to_status=m["to_status"],
        attempt=int(m["attempt"]),
        holder=m["holder"],
        token=None if m["token"] is None else int(m["token"]),
        detail=None if stored is None else loads(opened(conn, TABLE, "detail", row_key, stored)),
        prev_digest=m["prev_digest"],
        digest=m["digest"],
        execution_id=m["execution_id"],
    )


_HISTORY_COLUMNS = [
    _h.idempotency_key,
    _h.seq,
    _h.at_ms,
    _h.event,
    _h.from_status,
    _h.to_status,
    _h.attempt,
    _h.holder,
    _h.token,
    _h.detail,
    _h.prev_digest,
    _h.digest,
    _h.execution_id,
]


def last_history_txn(conn: Connection, key: str) -> HistoryRow | None:
    row = conn.execute(_LAST_HISTORY, {"h_key": key}).first()
    return None if row is None else _history(row, conn)


_LAST_HISTORY = (
    select(*_HISTORY_COLUMNS)
    .where(_h.idempotency_key == bindparam("h_key"))
    .order_by(_h.seq.desc())
    .limit(1)
)


def last_link_txn(conn: Connection, key: str) -> HistoryRow | None:
    """The intent's last history row with its detail left unread (None): a link to chain
    the next row to, never a record to show or verify; it opens no sealed value."""
    row = conn.execute(_LAST_LINK, {"h_key": key}).first()
    return None if row is None else _history(row, conn)


_LAST_LINK = (
    select(*(column for column in _HISTORY_COLUMNS if column is not _h.detail))
    .where(_h.idempotency_key == bindparam("h_key"))
    .order_by(_h.seq.desc())
    .limit(1)
)


def read_history_txn(conn: Connection, key: str) -> list[HistoryRow]:
    rows = conn.execute(select(*_HISTORY_COLUMNS).where(_h.idempotency_key == key).order_by(_h.seq))
    return [_history(row, conn) for row in rows]


def append_history_txn(conn: Connection, row: HistoryRow) -> None:
    """Append one row; a second row with the same (key, seq) fails (a lost race)."""
    # The row's fields are the table's columns; only ``detail`` is stored as JSON text.
    conn.execute(_APPEND_HISTORY, {**vars(row), "detail": _detail_sealed(conn, row)})


_APPEND_HISTORY = intent_history.insert()


def append_history_after_txn(conn: Connection, row: HistoryRow) -> bool:
    """Append ``row`` only while the row it chains to (``seq - 1``, ``prev_digest``) is
    the intent's last, in one statement and without reading it first; False (nothing
    written) when that row is not there or another row took ``seq`` meanwhile. The
    unique (key, seq) is judged on committed rows, not the statement's snapshot, so a
    row appended during a lock wait is seen."""
    if row.prev_digest is None:
        raise ValueError("append_history_after_txn chains to a previous row; it has none")
    parameters = history_parameters(conn, row, "a_")
    parameters["a_prev_seq"] = row.seq - 1
    return conn.execute(_append_after_statement(conn), parameters).first() is not None


@built_once
def _append_after_statement(conn: Connection) -> Any:
    previous = exists().where(
        _h.idempotency_key == bindparam("a_idempotency_key"),
        _h.seq == bindparam("a_prev_seq"),
        _h.digest == bindparam("a_prev_digest"),
    )
    return (
        insert_or_nothing(conn, intent_history)
        .from_select(HISTORY_NAMES, select(*history_binds("a_")).where(previous))
        .returning(_h.seq)
    )


HISTORY_NAMES = [column.name for column in _HISTORY_COLUMNS]


def history_binds(prefix: str) -> list[Any]:
    return [bindparam(f"{prefix}{column.name}", type_=column.type) for column in _HISTORY_COLUMNS]


def history_parameters(conn: Connection, row: HistoryRow, prefix: str) -> dict[str, Any]:
    values = {**vars(row), "detail": _detail_sealed(conn, row)}
    return {f"{prefix}{name}": value for name, value in values.items()}


__all__ = [
    "HISTORY_NAMES",
    "append_history_after_txn",
    "append_history_txn",
    "history_binds",
    "history_parameters",
    "last_history_txn",
    "last_link_txn",
    "read_history_txn",
]
