"""Lease statements, each a body that runs on a connection inside the caller's transaction.

Every decision about expiry is made in SQL against the database clock (``now``
below is ``now_expr``: the database clock plus the test-only offset). Each verb is
one guarded statement checked by what it returned, so two deliveries can never
both believe they hold a scope: the database's row lock and re-check decide.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from sqlalchemy import (
    BigInteger,
    bindparam,
    false,
    literal,
    not_,
    or_,
    select,
    true,
    tuple_,
    union_all,
    update,
)
from sqlalchemy.engine import Connection
from sqlalchemy.sql.elements import ColumnElement

from celery_agboss.core import sabotage
from celery_agboss.core.protections import (
    EXPIRY_BY_CALLER_CLOCK,
    LEASE_DECISION_ON_COMMITTED_READ,
    LEASE_LOCK_WAITS,
    RENEW_REVIVES_EXPIRED_LEASE,
)
from celery_agboss.core.store_protocol import LeaseGrant, LeaseRef, LeaseState, RenewOutcome
from celery_agboss.store.columns import KEY
from celery_agboss.store.dialect import (
    CLOCK_ALIAS,
    clock,
    insert_or_nothing,
    is_postgresql,
    now_expr,
)
from celery_agboss.store.fences import IS_MINE_PARAMS, mine_parameters
from celery_agboss.store.schema import leases
from celery_agboss.store.statement_cache import built_once

_c = leases.c


_INSERT_COLUMNS = [
    "scope",
    "holder",
    "token",
    "expires_at_ms",
    "released",
    "acquired_at_ms",
    "renewed_at_ms",
]


def _is_mine(lease: LeaseRef) -> ColumnElement[bool]:
    return (_c.scope == lease.scope) & (_c.holder == lease.holder) & (_c.token == lease.token)


def _caller_clock(caller_skew_ms: int) -> ColumnElement[int]:
    """Sabotage only (design: PS13): the acquiring process's own clock instead of the database's."""
    return bindparam(None, int(time.time() * 1000) + caller_skew_ms, type_=BigInteger)


def acquire_txn(
    conn: Connection,
    scope: str,
    holder: str,
    ttl_ms: int,
    *,
    offset_ms: int = 0,
    caller_skew_ms: int = 0,
) -> LeaseGrant | None:
    """Insert the lease, or take over an expired or released one with token + 1.

    Never re-entrant: a live lease gives None even when ``holder`` holds it.
    """
    insert_new, take_over = _acquire_statements(conn, offset_ms, caller_skew_ms)
    values = {"a_scope": scope, "a_holder": holder, "a_ttl": ttl_ms}
    inserted = conn.execute(insert_new, values).first()
    if inserted is not None:
        return LeaseGrant(
            lease=LeaseRef(scope, holder, int(inserted.token)),
            expires_at_ms=int(inserted.expires_at_ms),
            db_now_ms=int(inserted.acquired_at_ms),
            took_over=False,
        )
    taken = conn.execute(take_over, values).first()
    if taken is None:
        return None
    return LeaseGrant(
        lease=LeaseRef(scope, holder, int(taken.token)),
        expires_at_ms=int(taken.expires_at_ms),
        db_now_ms=int(taken.acquired_at_ms),
        took_over=True,
    )


def first_lease_row(now: ColumnElement[int]) -> list[ColumnElement[Any]]:
    """A lease's first row (token 1, live for ``a_ttl`` from ``now``) for ``a_scope`` and
    ``a_holder``, as the columns of ``first_lease_insert``'s select."""
    return [
        bindparam("a_scope", type_=KEY),
        bindparam("a_holder", type_=_c.holder.type),
        literal(1, BigInteger),
        now + bindparam("a_ttl", type_=BigInteger),
        false(),
        now,
        now,
    ]


def first_lease_insert(conn: Connection, rows: Any) -> Any:
    """Insert the first lease row ``rows`` selects unless the scope has one; what it
    returns is what a grant is made of."""
    return (
        insert_or_nothing(conn, leases)
        .from_select(_INSERT_COLUMNS, rows)
        .returning(_c.token, _c.expires_at_ms, _c.acquired_at_ms)
    )


@built_once
def _acquire_statements(conn: Connection, offset_ms: int, caller_skew_ms: int) -> tuple[Any, Any]:
    """``acquire_txn``'s insert and take-over (the skew matters only to the sabotage)."""
    if sabotage.active(EXPIRY_BY_CALLER_CLOCK):
        clk = select(_caller_clock(caller_skew_ms).label("now")).subquery(CLOCK_ALIAS)
    else:
        clk = clock(conn, offset_ms)
    now = clk.c.now
    ttl = bindparam("a_ttl", type_=BigInteger)
    insert_new = first_lease_insert(
        conn,
        # SQLite: "INSERT … SELECT … ON CONFLICT" needs a WHERE
        select(*first_lease_row(now)).select_from(clk).where(true()),
    )
    take_over = (
        update(leases)
        .where(_c.scope == bindparam("a_scope"), or_(_c.released, _c.expires_at_ms <= now))
        .values(
            holder=bindparam("a_holder"),
            token=_c.token + 1,
            expires_at_ms=now + ttl,
            released=False,
            acquired_at_ms=now,
            renewed_at_ms=now,
        )
        .returning(_c.token, _c.expires_at_ms, _c.acquired_at_ms)
    )
    return insert_new, take_over


def lease_live(now: ColumnElement[int], scope: ColumnElement[str]) -> ColumnElement[bool]:
    """A live lease on ``scope`` exists (``now``: the database clock), as a correlated
    ``EXISTS``: for a listing; a decision re-checks under the lease row's lock."""
    return select(_c.scope).where(_c.scope == scope, live_lease(now)).exists()


def live_lease(now: ColumnElement[int]) -> ColumnElement[bool]:
    """A lease row is live: not released and not expired on the database clock ``now``
    (the one spelling of it, for the lease's own statements and an intent's owner)."""
    return not_(_c.released) & (_c.expires_at_ms > now)


def _live_predicate(now: ColumnElement[int]) -> ColumnElement[bool]:
    """``_live`` — unless a test removed that protection (design: R19)."""
    return not_(_c.released) if sabotage.active(RENEW_REVIVES_EXPIRED_LEASE) else live_lease(now)


def extend_txn(
    conn: Connection, lease: LeaseRef, ttl_ms: int, *, offset_ms: int = 0
) -> tuple[int, int] | None:
    """Check that ``lease`` is live and mine and extend it, in one guarded ``UPDATE``.

    Returns ``(expires_at_ms, db_now_ms)``, or None when the lease is lost. On
    PostgreSQL the row stays locked until the transaction ends, so a take-over waits
    for it and then sees the extended expiry. Used by fenced transactions (always
    with the expiry predicate: a fence never revives) and by renewals.
    """
    row = conn.execute(
        _extend_statement(conn, offset_ms), {**mine_parameters(lease), "ttl": ttl_ms}
    ).first()
    if row is None:
        return None
    return int(row.expires_at_ms), int(row.renewed_at_ms)


@built_once
def _extend_statement(conn: Connection, offset_ms: int) -> Any:
    now = clock(conn, offset_ms).c.now
    return (
        update(leases)
        .where(IS_MINE_PARAMS, live_lease(now))
        .values(expires_at_ms=now + bindparam("ttl", type_=BigInteger), renewed_at_ms=now)
        .returning(_c.expires_at_ms, _c.renewed_at_ms)
    )


def renew_txn(conn: Connection, lease: LeaseRef, ttl_ms: int, *, offset_ms: int = 0) -> int | None:
    """Extend a live lease; the new expiry, or None when it is lost, never revived (design: R19)."""
    now = clock(conn, offset_ms).c.now
    row = conn.execute(
        update(leases)
        .where(_is_mine(lease), _live_predicate(now))
        .values(expires_at_ms=now + ttl_ms, renewed_at_ms=now)
        .returning(_c.expires_at_ms)
    ).first()
    return None if row is None else int(row.expires_at_ms)


def renew_many_txn(
    conn: Connection, refs: Sequence[LeaseRef], ttl_ms: int, *, offset_ms: int = 0
) -> dict[LeaseRef, RenewOutcome]:
    """Renew a process's leases together: one statement for all of them.

    On PostgreSQL it locks the rows no other transaction holds (``FOR UPDATE SKIP
    LOCKED``) and renews among those only. A row it had to skip is locked by a running
    fenced transaction (which extends that lease itself): BUSY while its last committed
    state is still ours and not released — even if that committed expiry has passed,
    since the uncommitted extension is what counts and the holder's own deadline bounds
    it anyway. A row it locked but could not renew (expired, released, taken over) is
    LOST. The lock, the renewal and the read of the skipped rows' committed state are
    one statement (three CTEs on one snapshot), so a renewal round is one round trip
    whatever the number of leases. SQLite has a single writer: the ``UPDATE`` waits its
    turn on the busy timeout, so nothing is ever BUSY there.
    """
    wanted = list(dict.fromkeys(refs))
    if not wanted:
        return {}
    if is_postgresql(conn):
        renewed, busy = _renew_many_postgresql(conn, wanted, ttl_ms, offset_ms)
    else:
        renewed, busy = _renew_rows(conn, wanted, ttl_ms, offset_ms), set()
    outcome: dict[LeaseRef, RenewOutcome] = {}
    for ref in wanted:
        if ref in renewed:
            outcome[ref] = RenewOutcome.RENEWED
        else:
            outcome[ref] = RenewOutcome.BUSY if ref in busy else RenewOutcome.LOST
    return outcome


def _triples(refs: Sequence[LeaseRef]) -> ColumnElement[bool]:
    return tuple_(_c.scope, _c.holder, _c.token).in_([(r.scope, r.holder, r.token) for r in refs])


def _ref(row: Any) -> LeaseRef:
    return LeaseRef(str(row.scope), str(row.holder), int(row.token))


def _renew_rows(
    conn: Connection, refs: Sequence[LeaseRef], ttl_ms: int, offset_ms: int
) -> set[LeaseRef]:
    now = clock(conn, offset_ms).c.now
    rows = conn.execute(
        update(leases)
        .where(_triples(refs), _live_predicate(now))
        .values(expires_at_ms=now + ttl_ms, renewed_at_ms=now)
        .returning(_c.scope, _c.holder, _c.token)
    )
    return {_ref(row) for row in rows}


def _renew_many_postgresql(
    conn: Connection, refs: Sequence[LeaseRef], ttl_ms: int, offset_ms: int
) -> tuple[set[LeaseRef], set[LeaseRef]]:
    """``(renewed, busy)`` in one statement; rows are locked in scope order."""
    scopes = sorted({ref.scope for ref in refs})
    locked = (
        select(_c.scope)
        .where(_c.scope.in_(scopes))
        .order_by(_c.scope)
        .with_for_update(skip_locked=True)
        .cte("agboss_lockable")
    )
    now = clock(conn, offset_ms).c.now
    renewed = (
        update(leases)
        .where(_triples(refs), _c.scope.in_(select(locked.c.scope)), _live_predicate(now))
        .values(expires_at_ms=now + ttl_ms, renewed_at_ms=now)
        .returning(_c.scope, _c.holder, _c.token)
        .cte("agboss_renewed")
    )
    # A plain read does not wait for row locks: it sees the last committed row.
    skipped = (
        select(_c.scope, _c.holder, _c.token)
        .where(_triples(refs), not_(_c.released), _c.scope.not_in(select(locked.c.scope)))
        .cte("agboss_skipped")
    )
    statement = union_all(
        select(
            literal("renewed").label("kind"), renewed.c.scope, renewed.c.holder, renewed.c.token
        ),
        select(literal("busy").label("kind"), skipped.c.scope, skipped.c.holder, skipped.c.token),
    )
    renewed_refs: set[LeaseRef] = set()
    busy: set[LeaseRef] = set()
    for row in conn.execute(statement):
        (renewed_refs if row.kind == "renewed" else busy).add(_ref(row))
    return renewed_refs, busy


def release_txn(conn: Connection, lease: LeaseRef) -> bool:
    """Mark ``lease`` released if it is still this holder's; True when it was."""
    result = conn.execute(
        update(leases).where(_is_mine(lease), not_(_c.released)).values(released=True)
    )
    return result.rowcount == 1


def release_live_txn(conn: Connection, lease: LeaseRef, *, offset_ms: int = 0) -> bool:
    """Release ``lease`` only while it is live and mine (one guarded ``UPDATE``): the last
    statement of a fenced transaction that ends the lease, standing for the extension
    it would otherwise end with."""
    result = conn.execute(_release_live_statement(conn, offset_ms), mine_parameters(lease))
    return result.rowcount == 1


@built_once
def _release_live_statement(conn: Connection, offset_ms: int) -> Any:
    now = clock(conn, offset_ms).c.now
    return (
        update(leases)
        .where(IS_MINE_PARAMS, live_lease(now))
        .values(released=True, renewed_at_ms=now)
    )


def read_txn(conn: Connection, scope: str, *, offset_ms: int = 0) -> LeaseState | None:
    now = now_expr(conn, offset_ms).label("db_now")
    row = conn.execute(
        select(_c.scope, _c.holder, _c.token, _c.expires_at_ms, _c.released, now).where(
            _c.scope == scope
        )
    ).first()
    return None if row is None else _state(row)


def _state(row: Any) -> LeaseState:
    db_now = int(row.db_now)
    released = bool(row.released)
    return LeaseState(
        scope=str(row.scope),
        holder=str(row.holder),
        token=int(row.token),
        expires_at_ms=int(row.expires_at_ms),
        released=released,
        live=not released and int(row.expires_at_ms) > db_now,
        db_now_ms=db_now,
    )


def _judged_by_caller(state: LeaseState | None, caller_skew_ms: int) -> LeaseState | None:
    """Sabotage only, ``EXPIRY_BY_CALLER_CLOCK`` (design: PS13): the decision about a lease row is
    taken on the deciding process's own clock, as ``acquire_txn`` then takes it over."""
    if state is None or not sabotage.active(EXPIRY_BY_CALLER_CLOCK):
        return state
    caller_now = int(time.time() * 1000) + caller_skew_ms
    return replace(state, live=not state.released and state.expires_at_ms > caller_now)


def lock_txn(
    conn: Connection, scope: str, *, offset_ms: int = 0, caller_skew_ms: int = 0
) -> LeaseState | None:
    """The lease of ``scope`` read under its row lock, for a decision about another holder's
    lease (design: another holder's lease): the lock is held until the caller's transaction
    ends.

    On PostgreSQL a plain read sees only the last committed expiry, and a fenced
    transaction's extension stays invisible until it commits: a lease whose committed
    expiry passed may be alive and about to commit a charge. So the row is locked with
    ``FOR UPDATE SKIP LOCKED``; a row another transaction holds locked is live. SQLite
    serialises writers (the caller's ``BEGIN IMMEDIATE`` waited for any fenced
    transaction), so its plain read is current.
    """
    if not is_postgresql(conn) or sabotage.active(LEASE_DECISION_ON_COMMITTED_READ):
        return _judged_by_caller(read_txn(conn, scope, offset_ms=offset_ms), caller_skew_ms)
    rows = conn.execute(_lock_statement(conn, offset_ms), {"scope": scope}).all()
    locked = [row for row in rows if row.locked]
    if locked:
        return _judged_by_caller(_state(locked[0]), caller_skew_ms)
    if not rows:
        return None
    # Locked by a running transaction (a fenced one extends it): live, whatever its
    # committed expiry says.
    return replace(_state(rows[0]), released=False, live=True)


@built_once
def _lock_statement(conn: Connection, offset_ms: int) -> Any:
    """The row locked (``SKIP LOCKED``) and, beside it, its last committed state: which of
    the two came back says whether another transaction holds it, in one round trip."""
    now = now_expr(conn, offset_ms).label("db_now")
    columns = (_c.scope, _c.holder, _c.token, _c.expires_at_ms, _c.released)
    mine = _c.scope == bindparam("scope")
    # Never a wait: the caller holds the execution's row, and a fenced write holding the
    # lease row may be waiting for it (one lock order: lease, then execution).
    skip = not sabotage.active(LEASE_LOCK_WAITS)
    locked = select(*columns).where(mine).with_for_update(skip_locked=skip).cte("agboss_locked")
    return union_all(
        select(true().label("locked"), *locked.c, now),
        select(false().label("locked"), *columns, now).where(mine),
    )


def owner_locked_or_live_txn(conn: Connection, owner: LeaseRef, *, offset_ms: int = 0) -> bool:
    """For a compare-and-set that requires an intent's owner to be dead: True when the
    owner's lease row is locked by a running transaction (PostgreSQL; so live), which
    the guard's own ``NOT EXISTS`` on committed rows cannot see. The row stays locked by
    the caller until its transaction ends, so the owner cannot extend it meanwhile."""
    if not is_postgresql(conn) or sabotage.active(LEASE_DECISION_ON_COMMITTED_READ):
        return False
    mine = _is_mine(owner)
    locked = conn.execute(select(_c.scope).where(mine).with_for_update(skip_locked=True)).first()
    if locked is not None:
        return False
    exists = conn.execute(select(_c.scope).where(mine)).first()
    return exists is not None


def now_txn(conn: Connection, *, offset_ms: int = 0) -> int:
    """The database clock (plus the offset), read on ``conn``."""
    value = conn.execute(select(now_expr(conn, offset_ms))).scalar_one()
    return int(value)


__all__ = [
    "acquire_txn",
    "extend_txn",
    "first_lease_insert",
    "first_lease_row",
    "lease_live",
    "live_lease",
    "lock_txn",
    "now_txn",
    "owner_locked_or_live_txn",
    "read_txn",
    "release_txn",
    "renew_many_txn",
    "renew_txn",
]
