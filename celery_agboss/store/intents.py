"""Intent and history statements: bodies on a connection, inside the caller's transaction.

Every compare-and-set is one ``UPDATE … WHERE <the full guard>`` whose row count
says whether it won. Whether an intent's owner is live is decided in the same
statement, against the lease row, on the database clock.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import BigInteger, and_, bindparam, delete, exists, not_, select, true, update
from sqlalchemy.engine import Connection, Row
from sqlalchemy.sql.elements import ColumnElement

from celery_agboss.core.store_protocol import (
    UNSET,
    HistoryRow,
    IntentGuard,
    IntentRecord,
    IntentStatus,
    IntentUpdate,
    LeaseRef,
    NewIntent,
)
from celery_agboss.store.codec import dumps, loads
from celery_agboss.store.dialect import clock, insert_or_nothing, is_postgresql
from celery_agboss.store.history import (
    HISTORY_NAMES,
    append_history_txn,
    history_binds,
    history_parameters,
)
from celery_agboss.store.leases import live_lease, owner_locked_or_live_txn
from celery_agboss.store.record_uses import held_against_retention
from celery_agboss.store.schema import intent_history, leases, outbound_calls
from celery_agboss.store.sealed_columns import opened, sealed
from celery_agboss.store.statement_cache import built_once

_i = outbound_calls.c
_l = leases.c
_h = intent_history.c


def owner_live_expr(now: ColumnElement[int]) -> ColumnElement[bool]:
    """True when the intent's owner triple names a live lease (database clock)."""
    return exists().where(
        _l.scope == _i.owner_scope,
        _l.holder == _i.owner_holder,
        _l.token == _i.owner_token,
        live_lease(now),
    )


def _select_intents(conn: Connection, offset_ms: int) -> Any:
    """Intents with ``owner_live`` and ``read_at_ms`` decided on one reading of the clock."""
    clk = clock(conn, offset_ms)
    return select(
        outbound_calls,
        owner_live_expr(clk.c.now).label("owner_live"),
        clk.c.now.label("read_at_ms"),
    ).select_from(outbound_calls.join(clk, true()))


TABLE = outbound_calls.name
Seal = Callable[[str, "str | None"], "str | None"]
"""Seals one column's text for one intent's row (``intent_sealer``)."""


def intent_sealer(conn: Connection, key: str) -> Seal:
    def seal(column: str, text: str | None) -> str | None:
        return sealed(conn, TABLE, column, key, text)

    return seal


def _record(row: Row[Any], conn: Connection) -> IntentRecord:
    m = row._mapping

    def open_(column: str) -> Any:
        return loads(opened(conn, TABLE, column, m["idempotency_key"], m[column]))

    owner = None
    if m["owner_holder"] is not None:
        owner = LeaseRef(str(m["owner_scope"]), str(m["owner_holder"]), int(m["owner_token"]))
    return IntentRecord(
        idempotency_key=m["idempotency_key"],
        execution_id=m["execution_id"],
        name=m["name"],
        business_key_handle=m["business_key_handle"],
        fingerprint=m["fingerprint"],
        request=open_("request"),
        result=open_("result"),
        result_stored=bool(m["result_stored"]),
        status=IntentStatus(m["status"]),
        attempt=int(m["attempt"]),
        owner=owner,
        owner_live=bool(m["owner_live"]),
        first_attempt_at_ms=m["first_attempt_at_ms"],
        attempt_started_at_ms=m["attempt_started_at_ms"],
        completed_at_ms=m["completed_at_ms"],
        gateway_transaction_id=m["gateway_transaction_id"],
        needs_operator=bool(m["needs_operator"]),
        operator_reason=opened(
            conn, TABLE, "operator_reason", m["idempotency_key"], m["operator_reason"]
        ),
        not_sent_confirmed=bool(m["not_sent_confirmed"]),
        read_at_ms=int(m["read_at_ms"]),
        next_lookup_at_ms=m["next_lookup_at_ms"],
        lookup_failures=int(m["lookup_failures"]),
        failure=None if m["failure"] is None else open_("failure"),
        retry_for=m["retry_for"],
        failure_shared=bool(m["failure_shared"]),
        sent_by=m["sent_by"],
        reliance=int(m["reliance"]),
        undo_by=m["undo_by"],
        compensated_at_ms=m["compensated_at_ms"],
    )


def read_txn(conn: Connection, key: str, *, offset_ms: int = 0) -> IntentRecord | None:
    """The intent, held ``FOR KEY SHARE`` on PostgreSQL until the transaction ends: what a
    replay read stays there while it notes its use and relies on it, and a read that
    meets retention deleting the row waits and finds nothing, so the caller claims anew
    (design: retention). The lock never waits for a compare-and-set, nor one for it."""
    row = conn.execute(_read_statement(conn, offset_ms), {"i_key": key}).first()
    return None if row is None else _record(row, conn)


@built_once
def _read_statement(conn: Connection, offset_ms: int) -> Any:
    statement = _select_intents(conn, offset_ms).where(_i.idempotency_key == bindparam("i_key"))
    if held_against_retention(conn):
        statement = statement.with_for_update(read=True, key_share=True, of=outbound_calls)
    return statement


def insert_txn(
    conn: Connection,
    intent: NewIntent,
    *,
    offset_ms: int = 0,
    first_history: HistoryRow | None = None,
) -> bool:
    """Insert as PENDING, attempt 1, both attempt times = now; True when this call inserted.

    ``first_history`` is written only when the intent was: on PostgreSQL both in one
    statement (the history row an ``INSERT … SELECT`` from the intent insert's
    ``RETURNING``), on SQLite in two, in the caller's transaction either way."""
    values = new_intent_values(conn, intent)
    parameters = {f"n_{name}": value for name, value in values.items()}
    if first_history is not None and is_postgresql(conn):
        parameters.update(history_parameters(conn, first_history, "f_"))
        statement = _insert_with_history_statement(conn, offset_ms, tuple(values))
        return conn.execute(statement, parameters).first() is not None
    inserted = conn.execute(_insert_statement(conn, offset_ms, tuple(values)), parameters)
    if inserted.first() is None:
        return False
    if first_history is not None:
        append_history_txn(conn, first_history)
    return True


def new_intent_values(conn: Connection, intent: NewIntent) -> dict[str, Any]:
    """A claimed intent's columns (its two attempt times are the statement's clock)."""
    seal = intent_sealer(conn, intent.idempotency_key)
    values: dict[str, Any] = {
        "idempotency_key": intent.idempotency_key,
        "execution_id": intent.execution_id,
        "name": intent.name,
        "business_key_handle": intent.business_key_handle,
        "fingerprint": intent.fingerprint,
        "request": seal("request", dumps(intent.request)),
        "result": seal("result", dumps(None)),
        "result_stored": False,
        "status": IntentStatus.PENDING.value,
        "attempt": 1,
        "owner_scope": intent.owner.scope,
        "owner_holder": intent.owner.holder,
        "owner_token": intent.owner.token,
        "sent_by": intent.execution_id,
        "needs_operator": False,
        "not_sent_confirmed": False,
        "lookup_failures": 0,
    }
    return values


@built_once
def _insert_statement(conn: Connection, offset_ms: int, columns: tuple[str, ...]) -> Any:
    clk = clock(conn, offset_ms)
    row = [bindparam(f"n_{name}", type_=outbound_calls.c[name].type) for name in columns]
    return (
        insert_or_nothing(conn, outbound_calls)
        .from_select(
            [*columns, "first_attempt_at_ms", "attempt_started_at_ms"],
            select(*row, clk.c.now, clk.c.now).select_from(clk).where(true()),
        )
        .returning(_i.idempotency_key)
    )


@built_once
def _insert_with_history_statement(
    conn: Connection, offset_ms: int, columns: tuple[str, ...]
) -> Any:
    inserted = _insert_statement(conn, offset_ms, columns).cte("agboss_inserted_intent")
    return (
        intent_history.insert()
        .from_select(HISTORY_NAMES, select(*history_binds("f_")).select_from(inserted))
        .returning(_h.seq)
    )


Part = tuple[str, str]
"""One piece of a compare-and-set: its parameter's name and what it does, ``op:column``."""


def cas_parts(
    guard: IntentGuard, update_: IntentUpdate, seal: Seal
) -> tuple[tuple[Part, ...], dict[str, Any]]:
    """A compare-and-set as its shape (which conjuncts and which columns to set, the
    key of its statement, built once) and its parameters. ``cas_guard_and_values`` reads the
    shape: ``eq``/``null`` conjuncts, ``owner_not_live``, ``max_key_age``; ``set``,
    ``set_now``, ``set_now_plus`` and ``add_one`` values."""
    parts: list[Part] = []
    params: dict[str, Any] = {}

    def part(name: str, op: str, value: Any = None) -> None:
        parts.append((name, op))
        params[name] = value

    part("g_status", "eq:status", guard.status.value)
    part("g_attempt", "eq:attempt", guard.attempt)
    if not guard.any_owner:
        owner = guard.owner
        for column in ("owner_scope", "owner_holder", "owner_token"):
            if owner is None:
                parts.append((f"g_{column}", f"null:{column}"))
            else:
                part(f"g_{column}", f"eq:{column}", getattr(owner, column.removeprefix("owner_")))
    if guard.owner_not_live:
        parts.append(("g_owner_not_live", "owner_not_live:"))
    if guard.max_key_age_ms is not None:
        part("g_max_key_age", "max_key_age:", guard.max_key_age_ms)
    if guard.sent_by is not None:
        part("g_sent_by", "eq:sent_by", guard.sent_by)
    if guard.failure_shared is not None:
        part("g_failure_shared", "eq:failure_shared", guard.failure_shared)
    if guard.retry_for is not UNSET:
        if guard.retry_for is None:
            parts.append(("g_retry_for", "null:retry_for"))
        else:
            part("g_retry_for", "eq:retry_for", guard.retry_for)

    for name, value in _set_values(update_, seal).items():
        part(f"v_{name}", f"set:{name}", value)
    if update_.start_attempt:
        parts.append(("v_attempt_started_at_ms", "set_now:attempt_started_at_ms"))
    if update_.complete:
        parts.append(("v_completed_at_ms", "set_now:completed_at_ms"))
    if update_.clear_next_lookup:
        part("v_next_lookup_at_ms", "set:next_lookup_at_ms", None)
    elif update_.next_lookup_delay_ms is not None:
        part("v_next_lookup_at_ms", "set_now_plus:next_lookup_at_ms", update_.next_lookup_delay_ms)
    if update_.rely:
        parts.append(("v_reliance", "add_one:reliance"))
    return tuple(parts), params


# Fields of ``IntentUpdate`` written as they are to the column of the same name: those
# whose "leave it alone" is None, and those whose "leave it alone" is UNSET (None is a value).
_AS_IS_UNLESS_NONE = (
    "attempt",
    "result_stored",
    "needs_operator",
    "not_sent_confirmed",
    "lookup_failures",
    "failure_shared",
)
_AS_IS_UNLESS_UNSET = ("gateway_transaction_id", "operator_reason", "retry_for", "sent_by")


def _set_values(update_: IntentUpdate, seal: Seal) -> dict[str, Any]:
    """The columns ``update_`` sets to a value of its own (not to the clock); request,
    result and failure sealed (``seal``)."""
    values: dict[str, Any] = {}
    for name in _AS_IS_UNLESS_NONE:
        if getattr(update_, name) is not None:
            values[name] = getattr(update_, name)
    for name in _AS_IS_UNLESS_UNSET:
        if getattr(update_, name) is not UNSET:
            values[name] = getattr(update_, name)
    if update_.status is not None:
        values["status"] = update_.status.value
    if update_.owner is not UNSET:
        owner = update_.owner
        values["owner_scope"] = None if owner is None else owner.scope
        values["owner_holder"] = None if owner is None else owner.holder
        values["owner_token"] = None if owner is None else owner.token
    if isinstance(values.get("operator_reason"), str):  # a reconcile's masked text
        values["operator_reason"] = seal("operator_reason", values["operator_reason"])
    if update_.result is not UNSET:
        values["result"] = seal("result", dumps(update_.result))
    if update_.request is not UNSET:
        values["request"] = seal("request", dumps(update_.request))
    if update_.failure is not UNSET:
        failure = update_.failure
        values["failure"] = None if failure is None else seal("failure", dumps(failure))
    return values


@built_once
def _cas_statement(conn: Connection, offset_ms: int, parts: tuple[Part, ...]) -> Any:
    """The ``UPDATE … WHERE <guard>`` of one shape (``cas_parts``)."""
    where, values = cas_guard_and_values(parts, clock(conn, offset_ms).c.now)
    return update(outbound_calls).where(*where).values(**values)


def cas_guard_and_values(
    parts: tuple[Part, ...], now: ColumnElement[int]
) -> tuple[list[ColumnElement[bool]], dict[str, Any]]:
    """The one place a compare-and-set's shape (``cas_parts``) becomes SQL: its
    ``WHERE`` conjuncts and ``SET`` values, reading the clock as ``now``."""
    where: list[ColumnElement[bool]] = [_i.idempotency_key == bindparam("g_key")]
    values: dict[str, Any] = {}
    for name, kind in parts:
        op, _, column = kind.partition(":")
        param = bindparam(name, type_=_i[column].type) if column else bindparam(name)
        if op == "eq":
            where.append(_i[column] == param)
        elif op == "null":
            where.append(_i[column].is_(None))
        elif op == "owner_not_live":
            where.append(not_(owner_live_expr(now)))
        elif op == "max_key_age":
            where.append(_i.first_attempt_at_ms.is_not(None))
            where.append(now - _i.first_attempt_at_ms < bindparam(name, type_=BigInteger))
        elif op == "set":
            values[column] = param
        elif op == "set_now":
            values[column] = now
        elif op == "set_now_plus":
            values[column] = now + bindparam(name, type_=BigInteger)
        elif op == "add_one":
            values[column] = _i[column] + 1
        else:  # pragma: no cover - cas_parts makes no other
            raise ValueError(f"unknown compare-and-set part {kind!r}")
    if not values:
        # Nothing to set: still a compare, so it must not claim a row it did not check.
        values = {"idempotency_key": _i.idempotency_key}
    return where, values


def update_txn(
    conn: Connection,
    key: str,
    guard: IntentGuard,
    update_: IntentUpdate,
    *,
    offset_ms: int = 0,
) -> bool:
    """One ``UPDATE … WHERE <guard>``; True when exactly one row matched.

    A guard that requires the owner's lease to be dead first locks that lease row
    (``leases.owner_locked_or_live_txn``): an owner inside a fenced transaction is live
    although its committed expiry passed, which the guard's own subquery cannot see.
    """
    if (
        guard.owner_not_live
        and guard.owner is not None
        and owner_locked_or_live_txn(conn, guard.owner, offset_ms=offset_ms)
    ):
        return False
    parts, params = cas_parts(guard, update_, intent_sealer(conn, key))
    params["g_key"] = key
    result = conn.execute(_cas_statement(conn, offset_ms, parts), params)
    return result.rowcount == 1


def list_for_execution_txn(
    conn: Connection, execution_id: str, *, offset_ms: int = 0
) -> list[IntentRecord]:
    statement = (
        _select_intents(conn, offset_ms)
        .where(_i.execution_id == execution_id)
        .order_by(_i.first_attempt_at_ms, _i.idempotency_key)
    )
    return [_record(row, conn) for row in conn.execute(statement)]


def delete_settled_returning_txn(
    conn: Connection, keys: Sequence[str], *, only_if: ColumnElement[bool] | None = None
) -> list[str]:
    """Retention: delete these intents, if settled and ``only_if`` still holds on the row
    the ``DELETE`` reads, then the history of exactly those; the keys deleted.

    The intent's ``DELETE`` is the one statement that decides: a condition retention
    listed on an earlier snapshot is judged again there (design: retention), and what it
    kept keeps its history. A PENDING intent is never deleted (design: P4).
    """
    wanted = list(keys)
    if not wanted:
        return []
    settled = and_(_i.idempotency_key.in_(wanted), _i.status != IntentStatus.PENDING.value)
    if only_if is not None:
        settled = and_(settled, only_if)
    gone = conn.execute(delete(outbound_calls).where(settled).returning(_i.idempotency_key))
    deleted = [str(key) for key in gone.scalars()]
    if deleted:
        conn.execute(delete(intent_history).where(_h.idempotency_key.in_(deleted)))
    return deleted


__all__ = [
    "cas_guard_and_values",
    "cas_parts",
    "delete_settled_returning_txn",
    "insert_txn",
    "list_for_execution_txn",
    "new_intent_values",
    "owner_live_expr",
    "read_txn",
    "update_txn",
]
