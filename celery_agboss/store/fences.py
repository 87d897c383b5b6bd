"""The fence: a holder's lease checked live and its own, locked, and extended, as the first
part of whatever it guards (a fenced transaction's first statement, a one-statement
write's first CTE), with the statement's time read once the row is locked.

A row's own ``WHERE`` is checked before the statement waits for the row, and checked
again only if the row changed meanwhile: a fence that waited behind a long transaction
of its holder would judge the lease by the time before the wait. So the row is locked
first, the time read after, and the lease judged and extended at that time.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import BigInteger, bindparam, func, not_, select, true, update
from sqlalchemy.engine import Connection

from celery_agboss.core import sabotage
from celery_agboss.core.protections import (
    FENCE_TIMED_BEFORE_LOCK_WAIT,
    FENCED_TRANSACTION_IDLE_UNBOUNDED,
)
from celery_agboss.core.store_protocol import LeaseRef
from celery_agboss.errors import ExecutionFencedError
from celery_agboss.store.dialect import CLOCK_ALIAS, now_expr
from celery_agboss.store.schema import leases
from celery_agboss.store.statement_cache import built_once

_c = leases.c


def lock_timeout_ms(ttl_ms: int) -> int:
    """A fenced transaction's lock timeout: well below ttl/3, so one slow effect cannot
    hold up another execution's fence long enough to lose it its lease."""
    return max(50, ttl_ms // 4)


def postgres_transaction_bounds(ttl_ms: int) -> tuple[str, str]:
    """A fenced transaction's two bounds on PostgreSQL: its lock timeout, and an
    idle-in-transaction timeout of one TTL. A session idle that long in a fenced
    transaction is a frozen holder (SIGSTOP, a VM paused): its commit would be refused
    anyway, since its lease expired on the database clock meanwhile, so the server ends
    the session and frees the lease row for a take-over."""
    idle = "0" if sabotage.active(FENCED_TRANSACTION_IDLE_UNBOUNDED) else f"{ttl_ms}ms"
    return f"{lock_timeout_ms(ttl_ms)}ms", idle


def postgres_transaction_bounds_sql(ttl_ms: int) -> str:
    """The bounds as a statement of their own (a fence checked in a separate round trip,
    which only a sabotage twin does)."""
    lock, idle = postgres_transaction_bounds(ttl_ms)
    return (
        f"SELECT set_config('lock_timeout', '{lock}', true),"
        f" set_config('idle_in_transaction_session_timeout', '{idle}', true)"
    )


def one_statement_parameters(lease: LeaseRef, ttl_ms: int) -> dict[str, Any]:
    """The fence's parameters in a write sent as one autocommit statement: the lease, its
    extension, the statement's lock timeout, and no idle bound (no transaction stays
    open around it)."""
    return {
        **mine_parameters(lease),
        "ttl": ttl_ms,
        "lock_timeout": postgres_transaction_bounds(ttl_ms)[0],
        "idle": "0",
    }


def mine_parameters(lease: LeaseRef) -> dict[str, Any]:
    """The values of ``IS_MINE_PARAMS`` for ``lease``."""
    return {"l_scope": lease.scope, "l_holder": lease.holder, "l_token": lease.token}


IS_MINE_PARAMS = (
    (_c.scope == bindparam("l_scope"))
    & (_c.holder == bindparam("l_holder"))
    & (_c.token == bindparam("l_token"))
)


def fenced_error(lease: LeaseRef) -> ExecutionFencedError:
    """What a fenced write of ``lease`` raises once the lease is not live and its own."""
    return ExecutionFencedError(
        f"lease {lease.scope!r} (token {lease.token}) is no longer held by {lease.holder}",
        scope=lease.scope,
        holder=lease.holder,
        token=lease.token,
    )


def fence_txn(
    conn: Connection,
    lease: LeaseRef,
    ttl_ms: int,
    *,
    offset_ms: int = 0,
    lock_timeout: str,
    idle_timeout: str,
) -> tuple[int, int] | None:
    """PostgreSQL's first statement of a fenced transaction: ``extend_txn``, whose clock
    relation also sets the transaction's two bounds (``set_config(…, true)``: local to
    the transaction). The relation is read before the UPDATE locks the lease row, so the
    statement's own wait for that row is already bounded by ``lock_timeout``: the bounds
    and the fence in one round trip instead of two."""
    row = conn.execute(
        fence_statement(conn, offset_ms),
        {
            **mine_parameters(lease),
            "ttl": ttl_ms,
            "lock_timeout": lock_timeout,
            "idle": idle_timeout,
        },
    ).first()
    if row is None:
        return None
    return int(row.expires_at_ms), int(row.renewed_at_ms)


def _bounded_clock(conn: Connection, offset_ms: int) -> Any:
    """The clock relation of a fenced statement, which also sets its transaction's two
    bounds (``lock_timeout`` and ``idle``, local to the transaction)."""
    return select(
        now_expr(conn, offset_ms).label("now"),
        func.set_config("lock_timeout", bindparam("lock_timeout"), true()).label("lock"),
        func.set_config("idle_in_transaction_session_timeout", bindparam("idle"), true()).label(
            "idle"
        ),
    ).subquery(CLOCK_ALIAS)


def _locked_then_timed(conn: Connection, offset_ms: int) -> Any:
    """The lease row locked while it is mine and not released, then the time read once
    it is locked (``now``): a lock wait ends before the clock is read, so a lease that
    expired while the statement waited for its row is seen expired. (The expiry in a
    row's own ``WHERE`` is checked before the wait, and checked again only if the row
    changed meanwhile.) The clock relation beside the lock sets the statement's bounds
    first, so the wait is bounded by ``lock_timeout``."""
    bounded = _bounded_clock(conn, offset_ms)
    mine = [IS_MINE_PARAMS, not_(_c.released)]
    if sabotage.active(FENCE_TIMED_BEFORE_LOCK_WAIT):
        # The time of the clock relation, read before the wait: the fence as it was.
        early = select(_c.scope, _c.expires_at_ms, bounded.c.now.label("now"))
        early = early.select_from(leases.join(bounded, true())).where(*mine)
        return early.with_for_update(of=leases).cte("agboss_lease_timed")
    locked = (
        select(_c.scope, _c.expires_at_ms)
        .select_from(leases.join(bounded, true()))
        .where(*mine)
        .with_for_update(of=leases)
        .cte("agboss_lease_locked")
    )
    # A CTE with a volatile function is evaluated once, after the row it reads is locked.
    after = now_expr(conn, offset_ms).label("now")
    return select(locked.c.scope, locked.c.expires_at_ms, after).cte("agboss_lease_timed")


def fence_lock_statement(conn: Connection, offset_ms: int) -> Any:
    """The fence as a locking read, for a statement that ends the lease in a later part
    (a row cannot be updated twice by one statement): the lease row locked, and kept
    while it is live and mine at the time read once it is locked (``now``); no row
    otherwise."""
    timed = _locked_then_timed(conn, offset_ms)
    return select(timed.c.scope, timed.c.now).where(timed.c.expires_at_ms > timed.c.now)


def release_after_fence(now: Any, joined: Any) -> Any:
    """The lease released (``l_*``), joined to ``joined``: no joined row, no release."""
    return (
        update(leases)
        .where(IS_MINE_PARAMS, joined)
        .values(released=True, renewed_at_ms=now)
        .returning(_c.scope)
    )


@built_once
def fence_statement(conn: Connection, offset_ms: int) -> Any:
    """Check and extend the lease (``l_*``) in one statement: locked, then checked live at
    the time read once locked (``_locked_then_timed``), then extended from that time."""
    timed = _locked_then_timed(conn, offset_ms)
    now = timed.c.now
    return (
        update(leases)
        .where(_c.scope == timed.c.scope, timed.c.expires_at_ms > now)
        .values(expires_at_ms=now + bindparam("ttl", type_=BigInteger), renewed_at_ms=now)
        .returning(_c.expires_at_ms, _c.renewed_at_ms)
    )


__all__ = [
    "IS_MINE_PARAMS",
    "fence_lock_statement",
    "fence_statement",
    "fence_txn",
    "fenced_error",
    "lock_timeout_ms",
    "mine_parameters",
    "one_statement_parameters",
    "postgres_transaction_bounds",
    "postgres_transaction_bounds_sql",
    "release_after_fence",
]
