"""The transactional outbox: follow-up tasks published if and only if a transaction committed.

``publishing`` writes, publishes and sweeps the rows (docs/outbox.md);
``undo_tasks`` publishes an undo declared as a Celery signature through it. The
public names (docs/api.md) are importable from ``celery_agboss.outbox``.
"""

from __future__ import annotations

from celery_agboss.outbox.publishing import (
    CANVAS_TASK_NAME,
    DEFAULT_GRACE,
    OutboxMessage,
    OutboxRow,
    count_unpublished,
    enqueue,
    publish,
    read,
)

__all__ = [
    "CANVAS_TASK_NAME",
    "DEFAULT_GRACE",
    "OutboxMessage",
    "OutboxRow",
    "count_unpublished",
    "enqueue",
    "publish",
    "read",
]
