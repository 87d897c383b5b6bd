"""The sweep's and the operators' execution verbs: listing, re-driving, expiring,
cancelling, moving by hand, the audit trail, meta values and pause answers.

Every claim is a compare-and-set under the execution row's lock that re-checks
that no lease is live, so several sweepers (two beats) and operators at once
decide one after the other and only one of them re-publishes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import and_, case, not_, or_, select, update

from celery_agboss.core.executions import (
    REDRIVABLE_STATES,
    AuditEntry,
    ExecutionRecord,
    ExecutionState,
    RedriveDecision,
    execution_scope,
)
from celery_agboss.errors import NotPausedError
from celery_agboss.store.dialect import insert_or_nothing
from celery_agboss.store.execution_rows import (
    TERMINAL_VALUES,
    ExecutionRows,
    lease_live,
    record_of,
)
from celery_agboss.store.schema_executions import audit, executions, meta, pauses

_e = executions.c
_p = pauses.c
_REDRIVABLE = [state.value for state in REDRIVABLE_STATES]
_NOT_RUNNING = [
    ExecutionState.REQUESTED.value,
    ExecutionState.WAITING.value,
    ExecutionState.PAUSED.value,
    ExecutionState.WAITING_OPERATOR.value,
    ExecutionState.PARKED.value,
]


class ExecutionAdminVerbs(ExecutionRows):
    """Sweep and operator verbs (see ``core.executions.ExecutionStore``)."""

    # --- reads -------------------------------------------------------------------------

    def read_execution(self, execution_id: str) -> ExecutionRecord | None:
        with self.store.read_transaction() as tx:
            return self._read(tx, execution_id)

    def list_executions(
        self,
        states: Sequence[ExecutionState] | None = None,
        limit: int = 100,
        after_id: str | None = None,
    ) -> list[ExecutionRecord]:
        with self.store.read_transaction() as tx:
            statement = select(executions, tx.now_expr().label("read_at_ms"))
            if states:
                statement = statement.where(_e.state.in_([s.value for s in states]))
            if after_id is not None:
                statement = statement.where(_e.id > after_id)
            rows = tx.execute(statement.order_by(_e.id).limit(limit)).all()
            return [record_of(row) for row in rows]

    def has_pending_intent(self, execution_id: str) -> bool:
        with self.store.read_transaction() as tx:
            return self._pending_intent(tx, execution_id)

    # --- the sweep ---------------------------------------------------------------------

    def find_redrivable(self, limit: int, requested_grace_ms: int) -> list[ExecutionRecord]:
        with self.store.read_transaction() as tx:
            now = tx.now_expr()
            started_from = case(
                (and_(_e.eta_ms.is_not(None), _e.eta_ms > _e.requested_at_ms), _e.eta_ms),
                else_=_e.requested_at_ms,
            )
            due = or_(
                _e.state != ExecutionState.REQUESTED.value,
                started_from + requested_grace_ms <= now,
            )
            rows = tx.execute(
                select(executions, now.label("read_at_ms"))
                .where(
                    _e.state.in_(_REDRIVABLE),
                    or_(_e.not_before_ms.is_(None), _e.not_before_ms <= now),
                    due,
                    not_(lease_live(tx, _e.id)),
                )
                .order_by(_e.updated_at_ms, _e.id)
                .limit(limit)
            ).all()
            return [record_of(row) for row in rows]

    def claim_redrive(
        self,
        execution_id: str,
        expected_updated_at_ms: int,
        max_recovery_attempts: int,
        *,
        next_redrive_delay_ms: int = 0,
    ) -> RedriveDecision:
        with self.store.transaction() as tx:
            record = self._read(tx, execution_id, lock=True)
            if (
                record is None
                or record.updated_at_ms != expected_updated_at_ms
                or record.state not in REDRIVABLE_STATES
            ):
                return RedriveDecision(False, False, None)
            lease = tx.read_lease(execution_scope(execution_id))
            if lease is not None and lease.live:
                return RedriveDecision(False, False, None)
            if record.recovery_count + 1 > max_recovery_attempts:
                self._park(tx, execution_id, record.recovery_count, max_recovery_attempts)
                return RedriveDecision(False, True, self._require(tx, execution_id))
            # A RUNNING execution's delivery died: the take-over that this re-publish
            # causes counts it (once). Anything else counts here.
            counted = record.state not in (ExecutionState.RUNNING, ExecutionState.COMPENSATING)
            self._set(
                tx,
                execution_id,
                recovery_count=_e.recovery_count + (1 if counted else 0),
                wake_requested=False,
                not_before_ms=tx.now_expr() + max(0, next_redrive_delay_ms),
            )
            return RedriveDecision(True, False, self._require(tx, execution_id))

    def expire_due(self, limit: int) -> list[ExecutionRecord]:
        changed: list[ExecutionRecord] = []
        with self.store.transaction() as tx:
            now = tx.now_expr()
            rows = tx.execute(
                select(_e.id)
                .where(
                    _e.state.in_([ExecutionState.REQUESTED.value, ExecutionState.WAITING.value]),
                    _e.expires_ms.is_not(None),
                    _e.expires_ms <= now,
                    not_(lease_live(tx, _e.id)),
                )
                .order_by(_e.expires_ms)
                .limit(limit)
            ).all()
            for row in rows:
                execution_id = str(row.id)
                if self._pending_intent(tx, execution_id):
                    continue
                self._terminal(tx, execution_id, ExecutionState.EXPIRED, reason="expired")
                changed.append(self._require(tx, execution_id))
        return changed

    def find_terminal_before(self, cutoff_ms: int, limit: int) -> list[str]:
        with self.store.read_transaction() as tx:
            rows = tx.execute(
                select(_e.id)
                .where(_e.state.in_(TERMINAL_VALUES), _e.terminal_at_ms < cutoff_ms)
                .order_by(_e.terminal_at_ms)
                .limit(limit)
            ).all()
            return [str(row.id) for row in rows]

    # --- operators ---------------------------------------------------------------------

    def request_cancel(self, execution_id: str, reason: str) -> ExecutionRecord | None:
        with self.store.transaction() as tx:
            record = self._read(tx, execution_id, lock=True)
            if record is None or record.terminal:
                return record
            lease = tx.read_lease(execution_scope(execution_id))
            live = lease is not None and lease.live
            if (
                record.state.value in _NOT_RUNNING
                and not live
                and not self._pending_intent(tx, execution_id)
            ):
                self._terminal(
                    tx,
                    execution_id,
                    ExecutionState.CANCELLED,
                    cancel_requested=True,
                    cancel_reason=reason,
                    reason=reason,
                )
            else:
                self._set(tx, execution_id, cancel_requested=True, cancel_reason=reason)
            return self._require(tx, execution_id)

    def move(
        self,
        execution_id: str,
        from_states: Sequence[ExecutionState],
        to_state: ExecutionState,
        reason: str,
        *,
        not_before_delay_ms: int | None = None,
        reset_recovery_count: bool = False,
    ) -> ExecutionRecord | None:
        with self.store.transaction() as tx:
            record = self._read(tx, execution_id, lock=True)
            if record is None or record.state not in from_states:
                return None
            lease = tx.read_lease(execution_scope(execution_id))
            if lease is not None and lease.live:
                return None
            values: dict[str, Any] = {"state": to_state.value, "reason": reason}
            if not_before_delay_ms is not None:
                values["not_before_ms"] = tx.now_expr() + max(0, not_before_delay_ms)
            if reset_recovery_count:
                values["recovery_count"] = 0
            if to_state.value in TERMINAL_VALUES:
                values["terminal_at_ms"] = tx.now_expr()
                values["wake_requested"] = False
            self._set(tx, execution_id, **values)
            return self._require(tx, execution_id)

    def answer_pause(self, pause_id: str, answer: str) -> ExecutionRecord:
        """Answer a PENDING pause once (``NotPausedError`` otherwise) and move its PAUSED
        execution to WAITING, due now; the caller re-publishes it."""
        with self.store.transaction() as tx:
            row = tx.execute(select(_p.execution_id).where(_p.id == pause_id)).first()
            if row is None:
                raise NotPausedError(f"no pause {pause_id!r}", pause_id=pause_id)
            execution_id = str(row.execution_id)
            self._read(tx, execution_id, lock=True)
            won = tx.execute(
                update(pauses)
                .where(_p.id == pause_id, _p.status == "PENDING")
                .values(status="ANSWERED", answer=answer, answered_at_ms=tx.now_expr())
            ).rowcount
            if won != 1:
                raise NotPausedError(
                    f"the pause {pause_id!r} was already answered", pause_id=pause_id
                )
            tx.execute(
                update(executions)
                .where(_e.id == execution_id, _e.state == ExecutionState.PAUSED.value)
                .values(
                    state=ExecutionState.WAITING.value,
                    not_before_ms=tx.now_expr(),
                    reason="pause answered",
                    updated_at_ms=tx.now_expr(),
                )
            )
            return self._require(tx, execution_id)

    def list_pauses(self, limit: int = 100) -> list[tuple[str, str, str]]:
        """``(pause_id, execution_id, status)`` of pending pauses, oldest first."""
        with self.store.read_transaction() as tx:
            rows = tx.execute(
                select(_p.id, _p.execution_id, _p.status)
                .where(_p.status == "PENDING")
                .order_by(_p.created_at_ms)
                .limit(limit)
            ).all()
            return [(str(r.id), str(r.execution_id), str(r.status)) for r in rows]

    def append_audit(
        self,
        actor: str,
        action: str,
        target: str,
        reason: str,
        before: str | None = None,
        after: str | None = None,
    ) -> None:
        with self.store.transaction() as tx:
            tx.execute(
                audit.insert().values(
                    at_ms=tx.now_expr(),
                    actor=actor,
                    action=action,
                    target=target,
                    reason=reason,
                    before=before,
                    after=after,
                )
            )

    def list_audit(self, target: str | None = None, limit: int = 100) -> list[AuditEntry]:
        with self.store.read_transaction() as tx:
            statement = select(audit)
            if target is not None:
                statement = statement.where(audit.c.target == target)
            rows = tx.execute(statement.order_by(audit.c.id.desc()).limit(limit)).all()
            return [
                AuditEntry(
                    id=int(r.id),
                    at_ms=int(r.at_ms),
                    actor=r.actor,
                    action=r.action,
                    target=r.target,
                    reason=r.reason,
                    before=r.before,
                    after=r.after,
                )
                for r in rows
            ]

    def set_meta(self, key: str, value: str) -> None:
        with self.store.transaction() as tx:
            now = tx.now_expr()
            changed = tx.execute(
                update(meta).where(meta.c.key == key).values(value=value, updated_at_ms=now)
            ).rowcount
            if not changed:
                tx.execute(
                    insert_or_nothing(tx.connection, meta).values(
                        key=key, value=value, updated_at_ms=now
                    )
                )

    def get_meta(self, key: str) -> tuple[str, int] | None:
        with self.store.read_transaction() as tx:
            row = tx.execute(
                select(meta.c.value, meta.c.updated_at_ms).where(meta.c.key == key)
            ).first()
            return None if row is None else (str(row.value), int(row.updated_at_ms))


__all__ = ["ExecutionAdminVerbs"]
