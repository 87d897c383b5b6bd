"""Indexes that keep every sweep read to the work at hand, not the history: retention
walks intents and fenced-effect records oldest first on an index and stops at the
cutoff; the clean-up of dead sweepers' lease rows reads partial indexes over those few
rows instead of one lease and one intent per execution ever run.

On PostgreSQL, ``CREATE INDEX`` holds a lock that blocks writes to the table while it
builds (it reads the table once: a few seconds per million rows).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Spelled out rather than imported: a migration keeps what it did when the code moves on.
_SWEEPER_PATTERN = "agboss.sweeper:%"


def _partial(name: str, table: str, columns: list[str], predicate: str) -> None:
    """A partial index, the same ``WHERE`` on both databases."""
    op.create_index(
        name,
        table,
        columns,
        unique=False,
        postgresql_where=sa.text(predicate),
        sqlite_where=sa.text(predicate),
    )


def upgrade() -> None:
    _partial(
        "ix_agboss_outbound_calls_settled_first_attempt_at_ms",
        "agboss_outbound_calls",
        ["first_attempt_at_ms"],
        "status <> 'PENDING'",
    )
    op.create_index(
        op.f("ix_agboss_fenced_effects_created_at_ms"),
        "agboss_fenced_effects",
        ["created_at_ms"],
        unique=False,
    )
    op.create_index(
        "ix_agboss_executions_cancel_requested_state",
        "agboss_executions",
        ["state"],
        unique=False,
        postgresql_where=sa.text("cancel_requested"),
        sqlite_where=sa.text("cancel_requested = 1"),
    )
    _partial(
        "ix_agboss_leases_sweeper_scope",
        "agboss_leases",
        ["scope"],
        f"scope LIKE '{_SWEEPER_PATTERN}'",
    )
    _partial(
        "ix_agboss_outbound_calls_sweeper_owner",
        "agboss_outbound_calls",
        ["owner_scope", "owner_holder", "owner_token"],
        f"owner_scope LIKE '{_SWEEPER_PATTERN}'",
    )


def downgrade() -> None:
    op.drop_index("ix_agboss_outbound_calls_sweeper_owner", table_name="agboss_outbound_calls")
    op.drop_index("ix_agboss_leases_sweeper_scope", table_name="agboss_leases")
    op.drop_index(
        op.f("ix_agboss_fenced_effects_created_at_ms"), table_name="agboss_fenced_effects"
    )
    op.drop_index(
        "ix_agboss_outbound_calls_settled_first_attempt_at_ms",
        table_name="agboss_outbound_calls",
    )
    op.drop_index("ix_agboss_executions_cancel_requested_state", table_name="agboss_executions")
