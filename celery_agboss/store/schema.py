"""The tables of leases, outbound-call intents, their history and fenced effects.

Times are integer milliseconds on the database clock (BIGINT), JSON is canonical
JSON stored as text (the same bytes on SQLite and PostgreSQL). The execution,
audit and meta tables are declared in ``schema_executions`` on the same metadata.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Index,
    Integer,
    String,
    Table,
    Text,
    UniqueConstraint,
    false,
)

import celery_agboss.store.schema_executions  # noqa: F401 (its tables join the same metadata)
from celery_agboss.store.columns import KEY, NAME, partial_index
from celery_agboss.store.metadata import metadata

__all__ = [
    "SETTLED_ONLY_EXCLUDES",
    "SWEEPER_SCOPE_PATTERN",
    "SWEEPER_SCOPE_PREFIX",
    "fenced_effects",
    "intent_history",
    "leases",
    "metadata",
    "outbound_calls",
    "record_uses",
]

SWEEPER_SCOPE_PREFIX = "agboss.sweeper:"
"""The scope of every sweeper's own lease: the prefix, then a uuid."""
SWEEPER_SCOPE_PATTERN = f"{SWEEPER_SCOPE_PREFIX}%"


SETTLED_ONLY_EXCLUDES = "PENDING"
"""The status the partial index of settled intents leaves out."""


def _sweeper_rows(column: str) -> str:
    """A partial index's predicate over sweeper leases only: a handful of rows among one
    per execution (``retention.sweeper_scope`` spells the same predicate)."""
    return f"{column} LIKE '{SWEEPER_SCOPE_PATTERN}'"


def _sharing_columns() -> list[Column[object]]:
    """What a business-keyed record says about the executions that share it (an intent's
    and a fenced effect's alike): ``reliance`` counts the times its result was handed to
    an execution that had not relied on it yet (each in the compare-and-set that hands it
    out), and an undo starts only by a compare-and-set that matches the count it read,
    with ``undo_by`` still empty; ``compensated_at_ms``: that undo is done."""
    return [
        Column("reliance", Integer, nullable=False, server_default="0"),
        Column("undo_by", KEY, nullable=True),
        Column("compensated_at_ms", BigInteger, nullable=True),
    ]


leases = Table(
    "agboss_leases",
    metadata,
    Column("scope", KEY, primary_key=True),
    Column("holder", String(64), nullable=False),
    Column("token", BigInteger, nullable=False),
    Column("expires_at_ms", BigInteger, nullable=False),
    Column("released", Boolean, nullable=False, server_default=false()),
    Column("acquired_at_ms", BigInteger, nullable=False),
    Column("renewed_at_ms", BigInteger, nullable=False),
    # The sweep's clean-up of dead sweepers' leases reads these, never the table. Keyed
    # on ``scope`` (never updated), so renewals, which change ``expires_at_ms`` and
    # ``renewed_at_ms`` only, stay heap-only (HOT) updates on PostgreSQL.
    partial_index("ix_agboss_leases_sweeper_scope", "scope", where=_sweeper_rows("scope")),
)

outbound_calls = Table(
    "agboss_outbound_calls",
    metadata,
    Column("idempotency_key", KEY, primary_key=True),
    Column("execution_id", KEY, nullable=False, index=True),
    Column("name", NAME, nullable=False),
    Column("business_key_handle", String(128), nullable=True),
    Column("fingerprint", String(128), nullable=False),
    Column("request", Text, nullable=False),
    Column("result", Text, nullable=False),
    Column("result_stored", Boolean, nullable=False, server_default=false()),
    Column("status", String(16), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("owner_scope", KEY, nullable=True),
    Column("owner_holder", String(64), nullable=True),
    Column("owner_token", BigInteger, nullable=True),
    Column("first_attempt_at_ms", BigInteger, nullable=True),
    Column("attempt_started_at_ms", BigInteger, nullable=True),
    Column("completed_at_ms", BigInteger, nullable=True),
    Column("gateway_transaction_id", String(256), nullable=True),
    Column("needs_operator", Boolean, nullable=False, server_default=false()),
    Column("operator_reason", Text, nullable=True),
    Column("not_sent_confirmed", Boolean, nullable=False, server_default=false()),
    Column("next_lookup_at_ms", BigInteger, nullable=True),
    Column("lookup_failures", Integer, nullable=False, server_default="0"),
    # A definite failure as the store keeps it (type, masked text, masked arguments): a
    # re-run raises it again rather than sending again ("what a re-run replays"), unless
    # ``retry_for`` names the execution a retry authorised to send it again; once it was
    # handed to another execution than its sender (``failure_shared``), never.
    Column("failure", Text, nullable=True),
    Column("retry_for", KEY, nullable=True),
    Column("failure_shared", Boolean, nullable=False, server_default=false()),
    # The execution whose delivery sent the current attempt: it moved the money when
    # that attempt completed (docs/design.md, "records several executions share").
    Column("sent_by", KEY, nullable=False),
    *_sharing_columns(),
    Index(None, "status"),
    # Retention reads settled intents old enough to go in this order, never the whole
    # history. Partial: the sweep's look-up of PENDING ones keeps its index on status.
    partial_index(
        "ix_agboss_outbound_calls_settled_first_attempt_at_ms",
        "first_attempt_at_ms",
        where=f"status <> '{SETTLED_ONLY_EXCLUDES}'",
    ),
    # Whether a dead sweeper's lease still owns an intent (the lease row must stay). An
    # update of the owner alone is no longer heap-only (HOT) on PostgreSQL: take-overs
    # are rare, and a settle changes ``status``, indexed already.
    partial_index(
        "ix_agboss_outbound_calls_sweeper_owner",
        "owner_scope",
        "owner_holder",
        "owner_token",
        where=_sweeper_rows("owner_scope"),
    ),
)

intent_history = Table(
    "agboss_intent_history",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("idempotency_key", KEY, nullable=False),
    Column("seq", Integer, nullable=False),
    Column("at_ms", BigInteger, nullable=False),
    Column("event", String(64), nullable=False),
    Column("from_status", String(16), nullable=True),
    Column("to_status", String(16), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("holder", String(64), nullable=True),
    Column("token", BigInteger, nullable=True),
    Column("detail", Text, nullable=False),
    # The execution whose delivery made the transition (NULL: the sweep, an operator, or a
    # row written before executions were named); covered by the digest when set.
    Column("execution_id", KEY, nullable=True),
    Column("prev_digest", String(128), nullable=True),
    Column("digest", String(128), nullable=False),
    UniqueConstraint("idempotency_key", "seq"),
)

fenced_effects = Table(
    "agboss_fenced_effects",
    metadata,
    Column("key", KEY, primary_key=True),
    Column("execution_id", KEY, nullable=False, index=True),
    Column("name", NAME, nullable=False),
    Column("result", Text, nullable=False),
    Column("token", BigInteger, nullable=False),
    Column("created_at_ms", BigInteger, nullable=False),
    Column("fingerprint", String(128), nullable=True),
    *_sharing_columns(),
    # Retention reads records old enough to go in this order, never the whole history.
    Index(None, "created_at_ms"),
)


record_uses = Table(
    "agboss_record_uses",
    metadata,
    # An intent (``kind = "intent"``, keyed by its idempotency key) or a fenced effect
    # (``"effect"``) an execution used: replayed, joined, took over, reconciled, or relied
    # on. Retention keeps the record while any of them is not terminal, and resolving the
    # record re-drives every one of them that waits on it. ``relied_at_ms``: the record's
    # result was handed to this execution (a business-keyed record only; its creator
    # too); ``completed_at_ms``: the execution then completed, so the record is kept for
    # it — both outlive the execution's own row.
    Column("kind", String(16), primary_key=True),
    Column("record_key", KEY, primary_key=True),
    Column("execution_id", KEY, primary_key=True),
    Column("used_at_ms", BigInteger, nullable=False),
    Column("relied_at_ms", BigInteger, nullable=True),
    Column("completed_at_ms", BigInteger, nullable=True),
    Index(None, "execution_id"),
)
