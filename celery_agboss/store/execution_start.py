"""An execution's first writes: its publish record, and a delivery's start, each on
PostgreSQL as one statement in its common case (design: one round trip per state change).

The publish record inserts the execution ``REQUESTED`` unless its row is there: one
``INSERT … ON CONFLICT DO NOTHING`` that is its own transaction. When the row is there
(a retry, a second publish of one id), it writes nothing and the transaction decides
(``record_requested``), as it always did.

``start_delivery`` reads the execution under its row lock, decides (``core.execution_states``)
and writes: a transaction of four statements. Most deliveries are the first of an
execution its publisher recorded, with nothing to decide: the row is ``REQUESTED``, no
cancel was asked, the message is the one recorded, and no lease row exists yet. Every
rule of the transaction answers "start, no take-over" for that row, so one statement
does it in autocommit: it locks the execution's row (``FOR UPDATE``, as the transaction
does), inserts the lease only from the locked row, and updates the row only from the
inserted lease, with the values the transaction writes (``start_values``). For any
other row it writes nothing, and the transaction runs and decides. It is as safe as
the transaction because:

- the plain case is checked on the row it locked: after a lock wait, on the row as the
  other writer committed it;
- a lease row that exists, even one another transaction is inserting, makes the insert
  write nothing, and then nothing else is written;
- the lease's and the row's times are the one the lease insert read from the clock.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import bindparam, literal, not_, select, update
from sqlalchemy.engine import Connection, Engine

from celery_agboss.core import sabotage
from celery_agboss.core.execution_states import delivery_state
from celery_agboss.core.executions import (
    DeliveryStart,
    ExecutionMessage,
    ExecutionState,
    StartKind,
    execution_scope,
)
from celery_agboss.core.protections import ONE_STATEMENT_START_UNLOCKED
from celery_agboss.core.store_protocol import LeaseGrant, LeaseRef
from celery_agboss.store.dialect import clock
from celery_agboss.store.execution_rows import (
    MESSAGE_COLUMNS,
    first_attempt_recorded,
    insert_requested_statement,
    message_values,
    record_of,
    requested_parameters,
    sealed_values,
)
from celery_agboss.store.execution_updates import Computed, computed_value
from celery_agboss.store.leases import first_lease_insert, first_lease_row
from celery_agboss.store.schema_executions import executions
from celery_agboss.store.statement_cache import autocommit_connection, built_once, run_compiled

_e = executions.c

PLAIN_STATE = ExecutionState.REQUESTED
"""The state of a row whose start the one statement may write."""


def start_values(
    state: ExecutionState, took_over: bool, message: ExecutionMessage | None
) -> dict[str, Any]:
    """What a started delivery writes on its execution's row, both ways: ``state`` is the
    row's as read; ``message`` is given when it replaces the recorded one."""
    values: dict[str, Any] = {
        "state": delivery_state(state).value,
        "started_at_ms": Computed("first_start"),
        "not_before_ms": None,
        "wake_requested": False,
        "redrive_planned": False,
        "reason": None,
        "deliveries": Computed("one_more_delivery"),
    }
    if took_over:
        values["recovery_count"] = Computed("one_more_recovery")
    if message is not None:
        values.update(message_values(message))
    return values


def record_requested_in_one(engine: Engine, message: ExecutionMessage, offset_ms: int) -> bool:
    """The publish record as one autocommit statement on PostgreSQL: True when it inserted
    the row. False when the row was there (nothing written: the transaction decides), on
    SQLite, and while a test has a protection switched off (its twin runs the
    transaction)."""
    if engine.dialect.name != "postgresql" or sabotage.any_active():
        return False
    with autocommit_connection(engine) as conn:
        statement = insert_requested_statement(conn, offset_ms)
        parameters = requested_parameters(conn, message)
        return run_compiled(conn, statement, parameters).first() is not None


def start_plain_in_one(
    engine: Engine, message: ExecutionMessage, holder: str, ttl_ms: int, offset_ms: int
) -> DeliveryStart | None:
    """The plain start as one autocommit statement on PostgreSQL; None when the row is
    not plain (nothing was written: the transaction decides), on SQLite, and while a test
    has a protection switched off (its twin exercises the transaction)."""
    if engine.dialect.name != "postgresql" or not sabotage.none_but(ONE_STATEMENT_START_UNLOCKED):
        return None
    parameters: dict[str, Any] = {
        "e_id": message.execution_id,
        "s_task": message.task_name,
        "a_scope": execution_scope(message.execution_id),
        "a_holder": holder,
        "a_ttl": ttl_ms,
    }
    with autocommit_connection(engine) as conn:
        sealed = sealed_values(conn, message.execution_id, message_values(message))
        parameters.update({f"s_{name}": value for name, value in sealed.items()})
        statement = _start_statement(conn, offset_ms)
        row = run_compiled(conn, statement, parameters).first()
        record = None if row is None else record_of(row, conn)
    if row is None or record is None:
        return None
    lease = LeaseRef(parameters["a_scope"], holder, int(row.lease_token))
    grant = LeaseGrant(
        lease=lease,
        expires_at_ms=int(row.lease_expires_at_ms),
        db_now_ms=int(row.read_at_ms),
        took_over=False,
    )
    return DeliveryStart(StartKind.STARTED, record, grant, took_over=False)


@built_once
def _start_statement(conn: Connection, offset_ms: int) -> Any:
    """Lock the row if plain; insert the lease from it; update the row from the lease."""
    check = select(_e.id).where(
        _e.id == bindparam("e_id", type_=_e.id.type),
        _e.task_name == bindparam("s_task", type_=_e.task_name.type),
        _e.state == PLAIN_STATE.value,
        not_(_e.cancel_requested),
        first_attempt_recorded(),
    )
    if not sabotage.active(ONE_STATEMENT_START_UNLOCKED):
        # Checked on the row as it is once locked, not on the statement's snapshot.
        check = check.with_for_update(of=executions)
    plain = check.cte("agboss_plain")
    clk = clock(conn, offset_ms)
    # Selected from the locked row: no plain row, no lease.
    rows = select(*first_lease_row(clk.c.now)).select_from(plain.join(clk, literal(True)))
    granted = first_lease_insert(conn, rows).cte("agboss_granted")
    at = granted.c.acquired_at_ms
    values = start_values(PLAIN_STATE, False, None)
    # The delivered message replaces the recorded one, as ``newer_or_same`` says of any
    # message once the recorded one is a first attempt.
    values.update({name: bindparam(f"s_{name}", type_=_e[name].type) for name in MESSAGE_COLUMNS})
    values["updated_at_ms"] = at
    resolved = {
        name: computed_value(value, at) if isinstance(value, Computed) else value
        for name, value in values.items()
    }
    return (
        update(executions)
        .where(_e.id == bindparam("e_id", type_=_e.id.type), granted.c.token.is_not(None))
        .values(**resolved)
        .returning(
            *executions.c,
            at.label("read_at_ms"),
            granted.c.token.label("lease_token"),
            granted.c.expires_at_ms.label("lease_expires_at_ms"),
        )
    )


__all__ = ["PLAIN_STATE", "record_requested_in_one", "start_plain_in_one", "start_values"]
