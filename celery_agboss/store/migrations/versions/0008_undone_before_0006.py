"""Steps undone before revision 0006 are marked undone.

Before 0006 an undo that finished left one record: its done mark, a fenced effect named
``agboss.compensation`` keyed ``<step key>:compensation`` (the whole key's digest past
200 characters). 0006 added ``undo_by`` and ``compensated_at_ms`` to the intents and
fenced effects, which is what today's code reads before it hands a business-keyed
record to another execution, but left them empty on steps undone earlier: a charge
refunded before the upgrade was then replayed as paid to the next execution of the same
order (a second click, a late duplicate), which shipped it unpaid.

Each such record whose done mark exists gets the mark's execution as ``undo_by`` and the
mark's time as ``compensated_at_ms``: a replay then refuses it, as for a step undone
since. Only the first undo of a step (``n = 1``) existed before 0006. In batches; no
schema change. Downgrading keeps the values (the older code does not read them).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-06
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Spelled out rather than imported: a migration keeps what it did when the code moves on.
_DONE_MARK = "agboss.compensation"
_SUFFIX = ":compensation"
_MARK_KEY_LIMIT = 200
_BATCH = 500
_RECORDS = (("agboss_outbound_calls", "idempotency_key"), ("agboss_fenced_effects", "key"))


def _mark_key(step_key: str) -> str:
    """The done mark's key of ``step_key``: the key itself when it fits in 200
    characters, else the unpadded base64url SHA-256 of the whole key."""
    key = step_key + _SUFFIX
    if len(key) <= _MARK_KEY_LIMIT:
        return key
    digest = hashlib.sha256(key.encode("utf-8")).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")[:_MARK_KEY_LIMIT]


def upgrade() -> None:
    conn = op.get_bind()
    marks = {
        str(row.key): (str(row.execution_id), int(row.created_at_ms))
        for row in conn.execute(
            sa.text(
                "SELECT key, execution_id, created_at_ms FROM agboss_fenced_effects "
                "WHERE name = :name"
            ),
            {"name": _DONE_MARK},
        )
    }
    if not marks:
        return
    for table, key_column in _RECORDS:
        keys = [
            str(row[0])
            for row in conn.execute(
                sa.text(f"SELECT {key_column} FROM {table} WHERE undo_by IS NULL")
            )
        ]
        undone = [
            {"key": key, "by": marks[mark][0], "at": marks[mark][1]}
            for key in keys
            if (mark := _mark_key(key)) in marks
        ]
        update = sa.text(
            f"UPDATE {table} SET undo_by = :by, compensated_at_ms = :at "
            f"WHERE {key_column} = :key AND undo_by IS NULL"
        )
        for start in range(0, len(undone), _BATCH):
            conn.execute(update, undone[start : start + _BATCH])


def downgrade() -> None:
    """Nothing to undo: the values stay true, and 0006's downgrade drops the columns."""
