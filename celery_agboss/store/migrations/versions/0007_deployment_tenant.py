"""The store's deployment id: the tenant every idempotency key starts with.

A **new** store gets a short id of its own (10 characters of ``a-z2-7``, 50 random
bits), so two deployments with their own stores never send one key, even on one
gateway account. A store that already holds executions or records keeps ``"default"``,
the tenant its keys in flight were made with: changing it would make a redelivery
compute another key and send the payment again. So does a store that existed below
this revision when ``migrate`` began (its ``_REVISION_AT_START``), even an empty one:
workers of the version before may still be running on it through a rolling deploy,
keying with ``"default"``, and a payment one of them starts after this commits would
be keyed differently by this version's (its twin: ``tenant-minted-for-an-idle-store``).
Run by hand (``alembic upgrade``, no such attribute), only the tables decide. One
``INSERT … SELECT`` decides, insert-if-absent (``ON CONFLICT DO NOTHING``); on
PostgreSQL the tables it looks at are locked (SHARE) until the migration commits, so
no row can slip in between the look and the insert. The id is a row of
``agboss_meta``, so a restored or moved store keeps it.

No schema change. Downgrading keeps the row: the versions before this one never read it,
and the keys in flight were made with it. Had the downgrade removed it, upgrading again
would find a store in use and pin ``"default"``: a redelivery after a rollback and a
re-deploy would compute another key and send the payment again.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-14
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from celery_agboss.core import sabotage
from celery_agboss.core.protections import (
    TENANT_MINTED_FOR_AN_IDLE_STORE,
    TENANT_MINTED_WHILE_IN_USE,
)

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Spelled out rather than imported: a migration keeps what it did when the code moves on.
_KEY = "deployment.tenant"
_IN_USE = "default"
_ALPHABET = "abcdefghijklmnopqrstuvwxyz234567"
_LENGTH = 10
_KEYED_TABLES = ("agboss_executions", "agboss_outbound_calls", "agboss_fenced_effects")


def _minted() -> str:
    return "".join(secrets.choice(_ALPHABET) for _ in range(_LENGTH))


# The attribute ``celery_agboss.store.migrate`` sets (spelled out, as above).
_REVISION_AT_START = "agboss.revision_at_start"


def _existed_before() -> bool:
    """Whether ``migrate`` found this store at a revision already (below this one) when
    it began: then older workers may be running on it (see the module doc)."""
    config = op.get_context().config
    if config is None or _REVISION_AT_START not in config.attributes:
        return False  # run by hand: the tables alone decide
    if sabotage.active(TENANT_MINTED_FOR_AN_IDLE_STORE):
        return False
    return config.attributes[_REVISION_AT_START] is not None


def upgrade() -> None:
    if op.get_context().dialect.name == "postgresql":
        op.execute(f"LOCK TABLE {', '.join(_KEYED_TABLES)} IN SHARE MODE")
    in_use = " OR ".join(f"EXISTS (SELECT 1 FROM {table})" for table in _KEYED_TABLES)
    if _existed_before():
        in_use = "1 = 1"
    if sabotage.active(TENANT_MINTED_WHILE_IN_USE):
        in_use = "1 = 0"
    op.execute(
        sa.text(
            "INSERT INTO agboss_meta (key, value, updated_at_ms) "
            f"SELECT :key, CASE WHEN {in_use} THEN :in_use ELSE :minted END, :now "
            "WHERE NOT EXISTS (SELECT 1 FROM agboss_meta WHERE key = :key) "
            "ON CONFLICT (key) DO NOTHING"
        ).bindparams(key=_KEY, in_use=_IN_USE, minted=_minted(), now=time.time_ns() // 1_000_000)
    )


def downgrade() -> None:
    """Nothing to undo: the deployment id outlives a rollback (see the module doc)."""
