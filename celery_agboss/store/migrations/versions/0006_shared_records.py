"""Records several executions share: who sent an intent's attempt, who relies on a
business-keyed record and whether it completed on it, the undo that claimed it, the
retry a failure authorises, and the execution that made each history row; and when an
operator dealt with the payment a failed execution left behind.

Existing rows are given the meaning the code before this revision acted on, so that no
execution in flight across the upgrade changes its path:
- every intent was sent by its creator (``sent_by``);
- a creator, and every execution that used a business-keyed record that is there to
  rely on (a completed intent, a fenced effect), relies on it; one that COMPLETED
  completed on it;
- a FAILED intent whose body did not go past its failure may be sent again by its
  creator (``retry_for``), as before; one it went past is replayed, as before.

Adds nullable columns and columns with a constant default (no table rewrite on
PostgreSQL), then one ``UPDATE`` per rule. ``failure_passed`` goes: ``retry_for``
replaces it.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_KEY = sa.String(length=512)
_BATCH = 500


def _sharing_columns() -> list[sa.Column[object]]:
    return [
        sa.Column("reliance", sa.Integer(), server_default="0", nullable=False),
        sa.Column("undo_by", _KEY, nullable=True),
        sa.Column("compensated_at_ms", sa.BigInteger(), nullable=True),
    ]


def _is_business_key(key: str) -> bool:
    """``<tenant>:b:<business key>:<name>``: every component percent-encoded, so the
    second one is ``b`` exactly when the record is business-keyed. Spelled out here: a
    migration keeps what it did when the code moves on."""
    parts = key.split(":")
    return len(parts) == 4 and parts[1] == "b"


def upgrade() -> None:
    with op.batch_alter_table("agboss_outbound_calls") as batch:
        batch.add_column(sa.Column("retry_for", _KEY, nullable=True))
        batch.add_column(
            sa.Column("failure_shared", sa.Boolean(), server_default=sa.false(), nullable=False)
        )
        batch.add_column(sa.Column("sent_by", _KEY, nullable=True))
        for column in _sharing_columns():
            batch.add_column(column)
    with op.batch_alter_table("agboss_fenced_effects") as batch:
        for column in _sharing_columns():
            batch.add_column(column)
    with op.batch_alter_table("agboss_record_uses") as batch:
        batch.add_column(sa.Column("relied_at_ms", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("completed_at_ms", sa.BigInteger(), nullable=True))
    with op.batch_alter_table("agboss_intent_history") as batch:
        batch.add_column(sa.Column("execution_id", _KEY, nullable=True))
    with op.batch_alter_table("agboss_executions") as batch:
        batch.add_column(sa.Column("payments_handled_at_ms", sa.BigInteger(), nullable=True))

    op.execute("UPDATE agboss_outbound_calls SET sent_by = execution_id")
    op.execute(
        "UPDATE agboss_outbound_calls SET retry_for = execution_id "
        "WHERE status = 'FAILED' AND failure_passed = false"
    )
    with op.batch_alter_table("agboss_outbound_calls") as batch:
        batch.alter_column("sent_by", existing_type=_KEY, nullable=False)
        batch.drop_column("failure_passed")
    _reliance_of_existing_records()


def _reliance_of_existing_records() -> None:
    """The creators of business-keyed records (a completed intent, a fenced effect) rely
    on them; so does every execution that used one. An execution that COMPLETED
    completed on it."""
    conn = op.get_bind()
    creators = conn.execute(
        sa.text(
            "SELECT 'intent' AS kind, idempotency_key AS record_key, execution_id, "
            "COALESCE(completed_at_ms, first_attempt_at_ms, 0) AS at_ms "
            "FROM agboss_outbound_calls "
            "WHERE status = 'COMPLETED' AND business_key_handle IS NOT NULL "
            "UNION ALL "
            "SELECT 'effect', key, execution_id, created_at_ms FROM agboss_fenced_effects"
        )
    ).all()
    rows = [
        {"kind": r.kind, "key": r.record_key, "execution": r.execution_id, "at": int(r.at_ms)}
        for r in creators
        if r.kind == "intent" or _is_business_key(str(r.record_key))
    ]
    kind, key, execution = (
        f"CAST(:{name} AS VARCHAR({size}))"
        for name, size in (("kind", 16), ("key", 512), ("execution", 512))
    )
    insert = sa.text(
        "INSERT INTO agboss_record_uses (kind, record_key, execution_id, used_at_ms) "
        f"SELECT {kind}, {key}, {execution}, CAST(:at AS BIGINT) WHERE NOT EXISTS (SELECT 1 "
        f"FROM agboss_record_uses WHERE kind = {kind} AND record_key = {key} "
        f"AND execution_id = {execution})"
    )
    for start in range(0, len(rows), _BATCH):
        conn.execute(insert, rows[start : start + _BATCH])
    op.execute(
        "UPDATE agboss_record_uses SET relied_at_ms = used_at_ms WHERE "
        "(kind = 'intent' AND record_key IN (SELECT idempotency_key FROM "
        "agboss_outbound_calls WHERE status = 'COMPLETED' AND business_key_handle IS NOT NULL))"
        " OR (kind = 'effect' AND record_key IN (SELECT key FROM agboss_fenced_effects))"
    )
    op.execute(
        "UPDATE agboss_record_uses SET completed_at_ms = (SELECT e.terminal_at_ms FROM "
        "agboss_executions e WHERE e.id = agboss_record_uses.execution_id) "
        "WHERE relied_at_ms IS NOT NULL AND execution_id IN "
        "(SELECT id FROM agboss_executions WHERE state = 'COMPLETED')"
    )
    op.execute(
        "UPDATE agboss_outbound_calls SET reliance = (SELECT COUNT(*) FROM agboss_record_uses "
        "u WHERE u.kind = 'intent' AND u.record_key = agboss_outbound_calls.idempotency_key "
        "AND u.relied_at_ms IS NOT NULL)"
    )
    op.execute(
        "UPDATE agboss_fenced_effects SET reliance = (SELECT COUNT(*) FROM agboss_record_uses "
        "u WHERE u.kind = 'effect' AND u.record_key = agboss_fenced_effects.key "
        "AND u.relied_at_ms IS NOT NULL)"
    )


def downgrade() -> None:
    with op.batch_alter_table("agboss_executions") as batch:
        batch.drop_column("payments_handled_at_ms")
    with op.batch_alter_table("agboss_intent_history") as batch:
        batch.drop_column("execution_id")
    with op.batch_alter_table("agboss_record_uses") as batch:
        batch.drop_column("completed_at_ms")
        batch.drop_column("relied_at_ms")
    with op.batch_alter_table("agboss_fenced_effects") as batch:
        for name in ("compensated_at_ms", "undo_by", "reliance"):
            batch.drop_column(name)
    with op.batch_alter_table("agboss_outbound_calls") as batch:
        batch.add_column(
            sa.Column("failure_passed", sa.Boolean(), server_default=sa.false(), nullable=False)
        )
    op.execute(
        "UPDATE agboss_outbound_calls SET failure_passed = true "
        "WHERE status = 'FAILED' AND retry_for IS NULL"
    )
    with op.batch_alter_table("agboss_outbound_calls") as batch:
        for name in (
            "compensated_at_ms",
            "undo_by",
            "reliance",
            "sent_by",
            "failure_shared",
            "retry_for",
        ):
            batch.drop_column(name)
