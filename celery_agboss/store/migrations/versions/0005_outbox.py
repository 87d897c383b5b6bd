"""The transactional outbox: follow-up tasks written in the transaction of a fenced
effect (or the application's own), published once it committed, re-published by the
sweep when the process that committed it died first.

A new table and its two indexes: nothing existing is rewritten or locked.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-09
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Spelled out rather than imported: a migration keeps what it did when the code moves on.
_UNPUBLISHED = "published_at_ms IS NULL"


def upgrade() -> None:
    op.create_table(
        "agboss_outbox",
        sa.Column("task_id", sa.String(length=512), nullable=False),
        sa.Column("task_name", sa.String(length=200), nullable=False),
        sa.Column("args", sa.Text(), nullable=False),
        sa.Column("kwargs", sa.Text(), nullable=False),
        sa.Column("options", sa.Text(), nullable=False),
        sa.Column("execution_id", sa.String(length=512), nullable=True),
        sa.Column("created_at_ms", sa.BigInteger(), nullable=False),
        sa.Column("publish_after_ms", sa.BigInteger(), nullable=False),
        sa.Column("published_at_ms", sa.BigInteger(), nullable=True),
        sa.Column("sweep_publishes", sa.Integer(), server_default="0", nullable=False),
        sa.PrimaryKeyConstraint("task_id", name=op.f("pk_agboss_outbox")),
    )
    op.create_index(
        "ix_agboss_outbox_unpublished_publish_after_ms",
        "agboss_outbox",
        ["publish_after_ms"],
        unique=False,
        postgresql_where=sa.text(_UNPUBLISHED),
        sqlite_where=sa.text(_UNPUBLISHED),
    )
    op.create_index(
        op.f("ix_agboss_outbox_published_at_ms"),
        "agboss_outbox",
        ["published_at_ms"],
        unique=False,
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_agboss_outbox_published_at_ms"), table_name="agboss_outbox")
    op.drop_index("ix_agboss_outbox_unpublished_publish_after_ms", table_name="agboss_outbox")
    op.drop_table("agboss_outbox")
