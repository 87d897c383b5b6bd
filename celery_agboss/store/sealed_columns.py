"""The columns sealed at rest, and the two calls every statement that writes or reads
them goes through (design: sealed at rest).

The sealer travels on the store transaction's connection (``StoreConnection.
agboss_sealer``, set by ``SQLAlchemyStore._begin``); a connection the store did not open
(the application's own, for ``outbox.enqueue``) is given one by its caller, or else a
keyless one of its engine's that reads ``agboss_meta`` once. The first value a process
seals on a store also settles ``agboss_meta``'s ``encryption`` row: a process with keys
writes ``on`` in the transaction of that value (the row commits with it) and holds it
settled once a later transaction reads it committed; one without keys reads it and
from then on refuses to write in clear.
"""

from __future__ import annotations

import json
import weakref
from typing import Any

from sqlalchemy import select
from sqlalchemy.engine import Connection, Engine

from celery_agboss.core import sabotage
from celery_agboss.core.protections import ENCRYPTION_FLAG_SETTLED_BEFORE_COMMIT
from celery_agboss.core.sealing import (
    ENCRYPTION_META_KEY,
    ENVELOPE_START,
    PLAINTEXT,
    SealedAt,
    Sealer,
)
from celery_agboss.store.commit_guard import is_store_engine
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
"""The store's sealer by engine, for the one-statement paths' own autocommit connections;
and the keyless sealer of an engine no store runs on (``sealer_of``)."""


def use_sealer(engine: Engine, sealer: Sealer) -> None:
    _ENGINE_SEALERS[engine] = sealer


def sealer_of(conn: Connection) -> Sealer:
    sealer = getattr(conn, "agboss_sealer", None)
    if isinstance(sealer, Sealer) and sealer is not PLAINTEXT:
        return sealer
    engine = conn.engine
    found = _ENGINE_SEALERS.get(engine)
    if found is not None:
        return found
    if sealer is PLAINTEXT or is_store_engine(engine):
        return PLAINTEXT  # a store opened without the runtime (tests, tools)
    # The application's own engine, where the caller gave no sealer (``outbox.enqueue``
    # outside a fenced effect, the current Celery app without an ``AGBoss``): without
    # keys, and not knowing the store, it reads ``agboss_meta`` at its first seal. A sealed
    # store then refuses (EncryptionKeysMissingError), one in clear goes on as it is;
    # kept per engine (one read per engine and process, as a keyless process reads it once).
    return _ENGINE_SEALERS.setdefault(engine, Sealer())


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


_FLAG_WRITTEN = "agboss_encryption_flag_written"
"""``conn.info``: weak references to the transaction, and to the innermost transaction or
savepoint, in which this connection last wrote ``encryption`` = ``on``."""


def settle_encryption_flag(conn: Connection, sealer: Sealer) -> None:
    """Record that the store is sealed, or learn it: once per process and store.

    Without keys: read the row. With keys: write it in the transaction of the value about
    to be sealed, so it commits with that value (never a sealed value committed without
    it), and hold it settled only once a transaction that did not write it reads it:
    then it is committed. Until then each transaction that seals writes it again (one
    whose row rolled back with it leaves the next to write it): a process never believes,
    nor hands a forked child the belief, that a row is there that is not.
    """
    if not sealer.enabled:
        sealer.store_checked(_flag_is_on(conn))
        return
    root = conn.get_transaction()
    written: Any = conn.info.get(_FLAG_WRITTEN)
    if root is None or written is None or written[0]() is not root:
        if _flag_is_on(conn):  # not written by this transaction: committed
            sealer.store_checked(True)
            return
    elif _active(written[1]()):
        return  # this transaction wrote it: it commits with what the transaction seals
    # (else written in a savepoint since ended, perhaps rolled back: write it again)
    conn.execute(
        insert_or_nothing(conn, meta).values(key=ENCRYPTION_META_KEY, value="on", updated_at_ms=0)
    )
    now = conn.get_transaction()
    assert now is not None  # the insert began it, if nothing had
    innermost = conn.get_nested_transaction() or now
    conn.info[_FLAG_WRITTEN] = (weakref.ref(now), weakref.ref(innermost))
    if sabotage.active(ENCRYPTION_FLAG_SETTLED_BEFORE_COMMIT):
        sealer.store_checked(True)


def _flag_is_on(conn: Connection) -> bool:
    value = conn.execute(select(meta.c.value).where(meta.c.key == ENCRYPTION_META_KEY)).scalar()
    return value == "on"


def _active(transaction: Any) -> bool:
    return transaction is not None and bool(transaction.is_active)


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
