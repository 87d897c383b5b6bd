"""A partial index for the sweep's read of completed executions whose links may never
have gone out: by state and completion time, over the executions whose message names a
link option and whose ``links_dispatched`` is false.

Only such rows enter it: a link-less execution (nearly all of them) never does, so the
sweep's read stays the size of the work at hand, not of the history. On PostgreSQL,
``CREATE INDEX`` blocks writes to the table while it builds (it reads the table once: a
few seconds per million rows).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Spelled out rather than imported: a migration keeps what it did when the code moves on.
_PREDICATE = (
    "NOT links_dispatched AND ("
    "options LIKE '%\"link\"%' OR options LIKE '%\"link_error\"%' OR "
    "options LIKE '%\"chain\"%' OR options LIKE '%\"chord\"%')"
)


def upgrade() -> None:
    op.create_index(
        "ix_agboss_executions_unsent_links",
        "agboss_executions",
        ["state", "terminal_at_ms"],
        unique=False,
        postgresql_where=sa.text(_PREDICATE),
        sqlite_where=sa.text(_PREDICATE),
    )


def downgrade() -> None:
    op.drop_index("ix_agboss_executions_unsent_links", table_name="agboss_executions")
