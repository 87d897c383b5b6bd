"""Definite failures a re-run replays: the failure as stored, and whether the body went
past it.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("agboss_outbound_calls") as batch:
        batch.add_column(sa.Column("failure", sa.Text(), nullable=True))
        batch.add_column(
            sa.Column("failure_passed", sa.Boolean(), server_default=sa.false(), nullable=False)
        )


def downgrade() -> None:
    with op.batch_alter_table("agboss_outbound_calls") as batch:
        batch.drop_column("failure_passed")
        batch.drop_column("failure")
