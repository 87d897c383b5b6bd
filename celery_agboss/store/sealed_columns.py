"""The columns sealed at rest, and the two calls every statement that writes or reads
them goes through (design: sealed at rest).

The sealer travels on the store transaction's connection (``StoreConnection.
agboss_sealer``, set by ``SQLAlchemyStore._begin``); a connection the store did not open
(the application's own, for ``outbox.enqueue``) is given one by its caller. The first
value a process seals on a store also settles ``agboss_meta``'s ``encryption`` row, in
the same transaction: a process with keys records ``on``, one without reads it and from
then on refuses to write in clear.
"""

from __future__ import annotations

import json
import weakref

from sqlalchemy import select
from sqlalchemy.engine import Connection, Engine

from celery_agboss.core.sealing import (
    ENCRYPTION_META_KEY,
    ENVELOPE_START,
    PLAINTEXT,
    SealedAt,
    Sealer,
)
from celery_agboss.store.dialect import insert_or_nothing
from celery_agboss.store.schema_executions import meta

SEALED_COLUMNS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    # table: (the row's own key columns, joined by ":" into the associated data; sealed columns)
    "agboss_outbound_calls": (
        ("idempotency_key",),
        ("request", "result", "failure", "operator_reason"),
    ),
    "agboss_intent_history": (("idempotency_key", "seq"), ("detail",)),
    "agboss_fenced_effects": (("key",), ("result",)),
    "agboss_executions": (
        ("id",),
        ("args", "kwargs", "result", "error", "reason", "cancel_reason"),
    ),
    "agboss_pauses": (("id",), ("payload", "answer")),
    "agboss_outbox": (("task_id",), ("args", "kwargs")),
}


_ENGINE_SEALERS: weakref.WeakKeyDictionary[Engine, Sealer] = weakref.WeakKeyDictionary()
"""The store's sealer by engine, for the one-statement paths' own autocommit connections."""


def use_sealer(engine: Engine, sealer: Sealer) -> None:
    _ENGINE_SEALERS[engine] = sealer


def sealer_of(conn: Connection) -> Sealer:
    sealer = getattr(conn, "agboss_sealer", None)
    if isinstance(sealer, Sealer) and sealer is not PLAINTEXT:
        return sealer
    return _ENGINE_SEALERS.get(conn.engine, PLAINTEXT)


def sealed(
    conn: Connection, table: str, column: str, row_key: object, text: str | None
) -> str | None:
    """``text`` as ``table.column`` of the row ``row_key`` stores it."""
    return sealed_with(sealer_of(conn), conn, table, column, row_key, text)


def sealed_with(
    sealer: Sealer,
    conn: Connection,
    table: str,
    column: str,
    row_key: object,
    text: str | None,
) -> str | None:
    if text is None:
        return None
    if sealer.writes_plaintext and not text.startswith(ENVELOPE_START):
        return text  # the common case without keys: no object made, nothing looked up
    if sealer.needs_store_check():
        settle_encryption_flag(conn, sealer)
    return sealer.seal(text, SealedAt(table, column, str(row_key)))


def opened(
    conn: Connection, table: str, column: str, row_key: object, stored: str | None
) -> str | None:
    """The plaintext of what ``table.column`` of the row ``row_key`` holds."""
    if stored is None or not stored.startswith(ENVELOPE_START):
        return stored  # plaintext (no keys, or written before them): read as it is
    return sealer_of(conn).open(stored, SealedAt(table, column, str(row_key)))


def settle_encryption_flag(conn: Connection, sealer: Sealer) -> None:
    """Once per process and store: record that the store is sealed, or learn it."""
    if sealer.enabled:
        conn.execute(
            insert_or_nothing(conn, meta).values(
                key=ENCRYPTION_META_KEY, value="on", updated_at_ms=0
            )
        )
        sealer.store_checked(True)
        return
    value = conn.execute(select(meta.c.value).where(meta.c.key == ENCRYPTION_META_KEY)).scalar()
    sealer.store_checked(value == "on")


def without_argument_reprs(options: str) -> str:
    """Options stay in clear (statements read ``retries`` in them), so the arguments'
    repr Celery copies into them (``argsrepr``, ``kwargsrepr``: display only, made again
    from the arguments on a publish) is not kept where the arguments are sealed."""
    if "argsrepr" not in options and "kwargsrepr" not in options:
        return options
    try:
        parsed = json.loads(options)
    except ValueError:
        return options
    if not isinstance(parsed, dict):
        return options
    parsed.pop("argsrepr", None)
    parsed.pop("kwargsrepr", None)
    return json.dumps(parsed, separators=(",", ":"))


__all__ = [
    "SEALED_COLUMNS",
    "opened",
    "sealed",
    "sealed_with",
    "sealer_of",
    "settle_encryption_flag",
    "use_sealer",
    "without_argument_reprs",
]
