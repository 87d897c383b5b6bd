"""Record uses (which other executions used an intent or a fenced effect) and planned
re-drives (a re-publish that is not a recovery).

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "agboss_record_uses",
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("record_key", sa.String(length=512), nullable=False),
        sa.Column("execution_id", sa.String(length=512), nullable=False),
        sa.Column("used_at_ms", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint(
            "kind", "record_key", "execution_id", name=op.f("pk_agboss_record_uses")
        ),
    )
    op.create_index(
        op.f("ix_agboss_record_uses_execution_id"),
        "agboss_record_uses",
        ["execution_id"],
        unique=False,
    )
    with op.batch_alter_table("agboss_executions") as batch:
        batch.add_column(
            sa.Column("redrive_planned", sa.Boolean(), server_default=sa.false(), nullable=False)
        )


def downgrade() -> None:
    with op.batch_alter_table("agboss_executions") as batch:
        batch.drop_column("redrive_planned")
    op.drop_index(op.f("ix_agboss_record_uses_execution_id"), table_name="agboss_record_uses")
    op.drop_table("agboss_record_uses")
