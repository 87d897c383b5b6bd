"""What an operator is shown of a row one of whose values no key of this process opens:
a key dropped before ``agboss rotate-keys`` reached the row, or a new first key a
worker sealed with and this process was not given yet (design: sealed at rest).

A listing for a person never stops on such a row, nor leaves it out: the operator needs
exactly that row. Every value that opens is shown; each one that does not reads as the
text ``unopened_text`` makes, naming the key that sealed it, never as empty. Only what
is shown is read so (``showing_unopened``): a verb re-reads its row under its lock, and
meets the error there. So is a state a newer version of the package wrote
(``shown_state``): shown as its text, never read as one this version knows.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, cast

from sqlalchemy import or_, select
from sqlalchemy.engine import Connection, Row

from celery_agboss.core.executions import ExecutionRecord, ExecutionState
from celery_agboss.core.sealing import ENVELOPE_START, KeyRing, SealedAt, Sealer
from celery_agboss.core.store_protocol import HistoryRow, IntentRecord
from celery_agboss.errors import SealedValueUnopenableError
from celery_agboss.store.codec import dumps
from celery_agboss.store.execution_rows import record_of
from celery_agboss.store.history import read_history_txn
from celery_agboss.store.schema_executions import executions
from celery_agboss.store.sealed_columns import SEALED_COLUMNS, sealer_of
from celery_agboss.store.sqlalchemy_store import SQLAlchemyStore

UNOPENED_START = "[sealed under key "
"""How a value this process could not open begins, where a listing shows it."""

_DECODED_AS_JSON = {
    "agboss_outbound_calls": frozenset({"request", "result", "failure"}),
    "agboss_intent_history": frozenset({"detail"}),
}
"""The sealed columns their readers decode as JSON: the text stands there as a JSON
string, so the reader gives it back as it is."""


def unopened_text(error: SealedValueUnopenableError, ring: KeyRing | None) -> str:
    """What stands in a listing for a value ``error`` says did not open."""
    key_id = str(getattr(error, "key_id", "?"))
    why = (
        "which does not open it (moved from another row, or altered)"
        if ring is not None and key_id in ring.key_ids
        else "not held by this process"
    )
    return f"{UNOPENED_START}{key_id!r}, {why}]"


def unopened_fields(record: object, table: str) -> dict[str, str]:
    """The sealed fields of ``record`` (a row of ``table``) a listing could not open,
    each with the text that says so; empty when every one opened."""
    found: dict[str, str] = {}
    for name in SEALED_COLUMNS[table][1]:
        value = getattr(record, name, None)
        if isinstance(value, str) and value.startswith(UNOPENED_START):
            found[name] = value
    return found


class _Showing(Sealer):
    """Opens as ``base`` does; a value it cannot open reads as ``unopened_text``."""

    def __init__(self, base: Sealer) -> None:
        super().__init__(base.ring, store_sealed=base.store_sealed)

    def open(self, stored: str | None, where: SealedAt) -> str | None:
        try:
            return super().open(stored, where)
        except SealedValueUnopenableError as error:
            text = unopened_text(error, self.ring)
            return dumps(text) if where.column in _DECODED_AS_JSON.get(where.table, ()) else text


@contextmanager
def showing_unopened(conn: Connection) -> Iterator[None]:
    """Within it, the records read on ``conn`` are for a person to look at: a value no key
    of this process opens reads as ``unopened_text``. Nothing may decide on them."""
    had = "agboss_sealer" in vars(conn)
    previous = getattr(conn, "agboss_sealer", None)
    setattr(conn, "agboss_sealer", _Showing(sealer_of(conn)))  # noqa: B010 - a Connection's
    try:
        yield
    finally:
        if had:
            setattr(conn, "agboss_sealer", previous)  # noqa: B010
        else:
            delattr(conn, "agboss_sealer")


def shown_state(stored: str) -> ExecutionState:
    """The state ``stored``; one this version does not know (a newer version wrote it)
    as a stand-in that reads as its text and is none of the known states, so no rule
    takes it for terminal or for any other. For showing only."""
    try:
        return ExecutionState(stored)
    except ValueError:
        stand_in = str.__new__(ExecutionState, stored)
        stand_in._value_ = stored
        stand_in._name_ = stored
        return stand_in


def state_known(state: ExecutionState) -> bool:
    """False for ``shown_state``'s stand-in of a state a newer version wrote."""
    return any(state is member for member in ExecutionState)


class _StateShown:
    """A row whose state reads as ``shown_state`` makes it (``record_of`` reads only
    ``_mapping``)."""

    def __init__(self, row: Row[Any]) -> None:
        self._mapping = {**row._mapping, "state": shown_state(str(row._mapping["state"]))}


def list_executions_shown(
    store: SQLAlchemyStore,
    states: Sequence[ExecutionState] | None = None,
    limit: int = 100,
    after_id: str | None = None,
    *,
    execution_id: str | None = None,
    oldest_first: bool = False,
    reason_starts: Sequence[str] | None = None,
) -> list[ExecutionRecord]:
    """Executions by id for a person (``execution_admin.list_executions``), or the one
    ``execution_id``: a value no key opens, or a state this version does not know, is
    shown as such, its row listed with the others. ``oldest_first``: by request time
    instead (a wait list cut at its limit leaves out the youngest, never the oldest;
    ``after_id`` does not page it). ``reason_starts``: only rows whose reason may start
    with one of these, filtered before the limit; a sealed reason cannot be read in SQL,
    so it stays for the caller to judge once opened."""
    with store.read_transaction() as tx:
        statement = select(executions, tx.now_expr().label("read_at_ms"))
        if states:
            statement = statement.where(executions.c.state.in_([s.value for s in states]))
        if after_id is not None:
            statement = statement.where(executions.c.id > after_id)
        if execution_id is not None:
            statement = statement.where(executions.c.id == execution_id)
        if reason_starts is not None:
            starts = (*reason_starts, ENVELOPE_START)
            statement = statement.where(
                or_(*(executions.c.reason.startswith(p, autoescape=True) for p in starts))
            )
        order = (executions.c.requested_at_ms,) if oldest_first else ()
        rows = tx.execute(statement.order_by(*order, executions.c.id).limit(limit)).all()
        with showing_unopened(tx.connection):
            return [record_of(cast("Row[Any]", _StateShown(row)), tx.connection) for row in rows]


def read_intent_shown(store: SQLAlchemyStore, idempotency_key: str) -> IntentRecord | None:
    """The intent, for a person: a value no key opens is shown as such."""
    with store.read_transaction() as tx, showing_unopened(tx.connection):
        return tx.read_intent(idempotency_key)


def read_history_shown(store: SQLAlchemyStore, idempotency_key: str) -> list[HistoryRow]:
    """An intent's history, for a person: a ``detail`` no key opens is shown as such,
    every other row whole."""
    with store.read_transaction() as tx, showing_unopened(tx.connection):
        return read_history_txn(tx.connection, idempotency_key)


__all__ = [
    "UNOPENED_START",
    "list_executions_shown",
    "read_history_shown",
    "read_intent_shown",
    "showing_unopened",
    "shown_state",
    "state_known",
    "unopened_fields",
    "unopened_text",
]
