"""The Celery layer's tables: executions, the operators' audit trail, meta values, pauses,
the outbox.

One row per execution (a Celery task id), from its publish to its terminal state.
It keeps the message as the broker held it (arguments and publish options as
JSON text) so the sweep and a woken release can re-publish it with the same id,
and it keeps the result or failure so a late duplicate returns it without running
the body. Times are integer milliseconds on the database clock.
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
    false,
    text,
)

from celery_agboss.store.columns import KEY, NAME, partial_index
from celery_agboss.store.metadata import metadata

LINK_OPTIONS = ("link", "link_error", "chain", "chord")
"""The publish options of a stored message that a delivery's end sends or counts (its
callbacks, errbacks, the chain's next step, its chord part), as ``runtime.messages``
keeps them: a key is there only when it holds something."""

UNSENT_LINKS = (
    "NOT links_dispatched AND ("
    + " OR ".join(f"options LIKE '%\"{name}\"%'" for name in LINK_OPTIONS)
    + ")"
)
"""An execution whose message may have links not recorded as sent: its options' JSON text
names a link option (a custom header of that name too, which the sweep marks once it
has read it). Link-less executions, nearly all of them, never enter the partial index
on it, so the sweep's read of it stays the size of the work at hand. The same text in
the index and in the query: SQLite uses a partial index only for a ``WHERE`` that
repeats its terms; the state is the index's first column, so that SQLite prefers it to
the index on ``state`` alone."""


def _message_columns() -> list[Column[object]]:
    """A message as the broker holds it (an execution's, an outbox row's): JSON text
    (kombu's JSON, so dates and decimals survive), published as is."""
    return [
        Column("args", Text, nullable=False),
        Column("kwargs", Text, nullable=False),
        Column("options", Text, nullable=False),
    ]


executions = Table(
    "agboss_executions",
    metadata,
    Column("id", KEY, primary_key=True),
    Column("task_name", NAME, nullable=False),
    Column("state", String(32), nullable=False),
    *_message_columns(),
    Column("eta_ms", BigInteger, nullable=True),
    Column("expires_ms", BigInteger, nullable=True),
    Column("requested_at_ms", BigInteger, nullable=False),
    Column("started_at_ms", BigInteger, nullable=True),
    Column("not_before_ms", BigInteger, nullable=True),
    Column("wake_requested", Boolean, nullable=False, server_default=false()),
    Column("recovery_count", Integer, nullable=False, server_default="0"),
    Column("deliveries", Integer, nullable=False, server_default="0"),
    Column("cancel_requested", Boolean, nullable=False, server_default=false()),
    Column("cancel_reason", Text, nullable=True),
    # Why the execution waits (WAITING, WAITING_OPERATOR, PARKED): never a business key.
    Column("reason", Text, nullable=True),
    Column("result", Text, nullable=True),
    Column("error", Text, nullable=True),
    Column("terminal_at_ms", BigInteger, nullable=True),
    # The terminal delivery's links (chain, callbacks, errbacks) went out: a later
    # duplicate that replays the stored outcome must not send them again.
    Column("links_dispatched", Boolean, nullable=False, server_default=false()),
    # The next re-publish is the planned continuation (a long wait's end, an answered
    # pause, an operator's decision), not the recovery of a lost message: it does not
    # count toward agboss_max_recovery_attempts.
    Column("redrive_planned", Boolean, nullable=False, server_default=false()),
    # An operator dealt with the payment a FAILED or CANCELLED execution left behind
    # (refunded at the gateway, or kept): ``agboss pending`` stops listing it.
    Column("payments_handled_at_ms", BigInteger, nullable=True),
    Column("updated_at_ms", BigInteger, nullable=False),
    Index(None, "state", "not_before_ms"),
    Index(None, "terminal_at_ms"),
    # The sweep's look-up of cancel requests to end: executions with one, by state. On
    # SQLite the index above looks too broad for a list of states and the table is read.
    Index(
        "ix_agboss_executions_cancel_requested_state",
        "state",
        postgresql_where=text("cancel_requested"),
        sqlite_where=text("cancel_requested = 1"),
    ),
    # The sweep's read of completed executions whose links may never have gone out.
    partial_index(
        "ix_agboss_executions_unsent_links", "state", "terminal_at_ms", where=UNSENT_LINKS
    ),
)

audit = Table(
    "agboss_audit",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("at_ms", BigInteger, nullable=False),
    Column("actor", String(200), nullable=False),
    Column("action", String(64), nullable=False),
    Column("target", KEY, nullable=False),
    Column("reason", Text, nullable=False),
    Column("before", Text, nullable=True),
    Column("after", Text, nullable=True),
    Index(None, "target"),
)

meta = Table(
    "agboss_meta",
    metadata,
    Column("key", String(200), primary_key=True),
    Column("value", Text, nullable=False),
    Column("updated_at_ms", BigInteger, nullable=False),
)

pauses = Table(
    "agboss_pauses",
    metadata,
    Column("id", String(800), primary_key=True),  # "<execution id>:<name>"
    Column("execution_id", KEY, nullable=False, index=True),
    Column("name", NAME, nullable=False),
    Column("status", String(16), nullable=False),  # PENDING, ANSWERED
    Column("payload", Text, nullable=True),
    Column("answer", Text, nullable=True),
    Column("created_at_ms", BigInteger, nullable=False),
    Column("answered_at_ms", BigInteger, nullable=True),
)

outbox = Table(
    "agboss_outbox",
    metadata,
    # One follow-up task to publish once the transaction that wrote this row committed
    # (celery_agboss.outbox): its stable task id, and its message.
    Column("task_id", KEY, primary_key=True),
    Column("task_name", NAME, nullable=False),
    *_message_columns(),
    Column("execution_id", KEY, nullable=True),  # whose fenced effect enqueued it
    Column("created_at_ms", BigInteger, nullable=False),
    # The sweep publishes an unpublished row from then on (moved on at each claim).
    Column("publish_after_ms", BigInteger, nullable=False),
    Column("published_at_ms", BigInteger, nullable=True),
    Column("sweep_publishes", Integer, nullable=False, server_default="0"),
    # The sweep reads the few unpublished rows that are due, never the published history.
    partial_index(
        "ix_agboss_outbox_unpublished_publish_after_ms",
        "publish_after_ms",
        where="published_at_ms IS NULL",
    ),
    Index(None, "published_at_ms"),
)

__all__ = ["LINK_OPTIONS", "UNSENT_LINKS", "audit", "executions", "meta", "outbox", "pauses"]
