"""The initial celery_agboss schema: leases, intents and their history, fenced effects,
and the Celery layer's executions, audit trail, meta values and pauses.

Revision ID: 0001
Revises:
Create Date: 2025-01-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # In the order Alembic's autogenerate wrote them (by name); split only for length.
    _audit_executions_and_effects()
    _history_leases_and_meta()
    _calls_and_pauses()


def _audit_executions_and_effects() -> None:
    op.create_table(
        "agboss_audit",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("at_ms", sa.BigInteger(), nullable=False),
        sa.Column("actor", sa.String(length=200), nullable=False),
        sa.Column("action", sa.String(length=64), nullable=False),
        sa.Column("target", sa.String(length=512), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("before", sa.Text(), nullable=True),
        sa.Column("after", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_agboss_audit")),
    )
    op.create_index(op.f("ix_agboss_audit_target"), "agboss_audit", ["target"], unique=False)
    op.create_table(
        "agboss_executions",
        sa.Column("id", sa.String(length=512), nullable=False),
        sa.Column("task_name", sa.String(length=200), nullable=False),
        sa.Column("state", sa.String(length=32), nullable=False),
        sa.Column("args", sa.Text(), nullable=False),
        sa.Column("kwargs", sa.Text(), nullable=False),
        sa.Column("options", sa.Text(), nullable=False),
        sa.Column("eta_ms", sa.BigInteger(), nullable=True),
        sa.Column("expires_ms", sa.BigInteger(), nullable=True),
        sa.Column("requested_at_ms", sa.BigInteger(), nullable=False),
        sa.Column("started_at_ms", sa.BigInteger(), nullable=True),
        sa.Column("not_before_ms", sa.BigInteger(), nullable=True),
        sa.Column("wake_requested", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("recovery_count", sa.Integer(), server_default="0", nullable=False),
        sa.Column("deliveries", sa.Integer(), server_default="0", nullable=False),
        sa.Column("cancel_requested", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("cancel_reason", sa.Text(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("result", sa.Text(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("terminal_at_ms", sa.BigInteger(), nullable=True),
        sa.Column("links_dispatched", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("updated_at_ms", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_agboss_executions")),
    )
    op.create_index(
        op.f("ix_agboss_executions_state_not_before_ms"),
        "agboss_executions",
        ["state", "not_before_ms"],
        unique=False,
    )
    op.create_index(
        op.f("ix_agboss_executions_terminal_at_ms"),
        "agboss_executions",
        ["terminal_at_ms"],
        unique=False,
    )
    op.create_table(
        "agboss_fenced_effects",
        sa.Column("key", sa.String(length=512), nullable=False),
        sa.Column("execution_id", sa.String(length=512), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("result", sa.Text(), nullable=False),
        sa.Column("token", sa.BigInteger(), nullable=False),
        sa.Column("created_at_ms", sa.BigInteger(), nullable=False),
        sa.Column("fingerprint", sa.String(length=128), nullable=True),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_agboss_fenced_effects")),
    )
    op.create_index(
        op.f("ix_agboss_fenced_effects_execution_id"),
        "agboss_fenced_effects",
        ["execution_id"],
        unique=False,
    )


def _history_leases_and_meta() -> None:
    op.create_table(
        "agboss_intent_history",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("idempotency_key", sa.String(length=512), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("at_ms", sa.BigInteger(), nullable=False),
        sa.Column("event", sa.String(length=64), nullable=False),
        sa.Column("from_status", sa.String(length=16), nullable=True),
        sa.Column("to_status", sa.String(length=16), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("holder", sa.String(length=64), nullable=True),
        sa.Column("token", sa.BigInteger(), nullable=True),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.Column("prev_digest", sa.String(length=128), nullable=True),
        sa.Column("digest", sa.String(length=128), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_agboss_intent_history")),
        sa.UniqueConstraint(
            "idempotency_key", "seq", name=op.f("uq_agboss_intent_history_idempotency_key_seq")
        ),
    )
    op.create_table(
        "agboss_leases",
        sa.Column("scope", sa.String(length=512), nullable=False),
        sa.Column("holder", sa.String(length=64), nullable=False),
        sa.Column("token", sa.BigInteger(), nullable=False),
        sa.Column("expires_at_ms", sa.BigInteger(), nullable=False),
        sa.Column("released", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("acquired_at_ms", sa.BigInteger(), nullable=False),
        sa.Column("renewed_at_ms", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("scope", name=op.f("pk_agboss_leases")),
    )
    op.create_table(
        "agboss_meta",
        sa.Column("key", sa.String(length=200), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.Column("updated_at_ms", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_agboss_meta")),
    )


def _calls_and_pauses() -> None:
    op.create_table(
        "agboss_outbound_calls",
        sa.Column("idempotency_key", sa.String(length=512), nullable=False),
        sa.Column("execution_id", sa.String(length=512), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("business_key_handle", sa.String(length=128), nullable=True),
        sa.Column("fingerprint", sa.String(length=128), nullable=False),
        sa.Column("request", sa.Text(), nullable=False),
        sa.Column("result", sa.Text(), nullable=False),
        sa.Column("result_stored", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("owner_scope", sa.String(length=512), nullable=True),
        sa.Column("owner_holder", sa.String(length=64), nullable=True),
        sa.Column("owner_token", sa.BigInteger(), nullable=True),
        sa.Column("first_attempt_at_ms", sa.BigInteger(), nullable=True),
        sa.Column("attempt_started_at_ms", sa.BigInteger(), nullable=True),
        sa.Column("completed_at_ms", sa.BigInteger(), nullable=True),
        sa.Column("gateway_transaction_id", sa.String(length=256), nullable=True),
        sa.Column("needs_operator", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("operator_reason", sa.Text(), nullable=True),
        sa.Column("not_sent_confirmed", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("next_lookup_at_ms", sa.BigInteger(), nullable=True),
        sa.Column("lookup_failures", sa.Integer(), server_default="0", nullable=False),
        sa.PrimaryKeyConstraint("idempotency_key", name=op.f("pk_agboss_outbound_calls")),
    )
    op.create_index(
        op.f("ix_agboss_outbound_calls_execution_id"),
        "agboss_outbound_calls",
        ["execution_id"],
        unique=False,
    )
    op.create_index(
        op.f("ix_agboss_outbound_calls_status"), "agboss_outbound_calls", ["status"], unique=False
    )
    op.create_table(
        "agboss_pauses",
        sa.Column("id", sa.String(length=800), nullable=False),
        sa.Column("execution_id", sa.String(length=512), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("payload", sa.Text(), nullable=True),
        sa.Column("answer", sa.Text(), nullable=True),
        sa.Column("created_at_ms", sa.BigInteger(), nullable=False),
        sa.Column("answered_at_ms", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_agboss_pauses")),
    )
    op.create_index(
        op.f("ix_agboss_pauses_execution_id"), "agboss_pauses", ["execution_id"], unique=False
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_agboss_pauses_execution_id"), table_name="agboss_pauses")
    op.drop_table("agboss_pauses")
    op.drop_index(op.f("ix_agboss_outbound_calls_status"), table_name="agboss_outbound_calls")
    op.drop_index(op.f("ix_agboss_outbound_calls_execution_id"), table_name="agboss_outbound_calls")
    op.drop_table("agboss_outbound_calls")
    op.drop_table("agboss_meta")
    op.drop_table("agboss_leases")
    op.drop_table("agboss_intent_history")
    op.drop_index(op.f("ix_agboss_fenced_effects_execution_id"), table_name="agboss_fenced_effects")
    op.drop_table("agboss_fenced_effects")
    op.drop_index(op.f("ix_agboss_executions_terminal_at_ms"), table_name="agboss_executions")
    op.drop_index(op.f("ix_agboss_executions_state_not_before_ms"), table_name="agboss_executions")
    op.drop_table("agboss_executions")
    op.drop_index(op.f("ix_agboss_audit_target"), table_name="agboss_audit")
    op.drop_table("agboss_audit")
