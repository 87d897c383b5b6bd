"""What every table declaration shares: the key's column type, a name's, partial indexes."""

from __future__ import annotations

from sqlalchemy import Index, String, text

from celery_agboss.core.keys import KEY_COLUMN_LENGTH

# Identifiers we mint or receive: task ids (execution ids), holders (uuid4), idempotency
# keys. The length is core's (``core.step_identity`` fits every step's key to it; a longer
# task id is refused at publish, ``runtime.messages``); changing it needs a migration.
KEY = String(KEY_COLUMN_LENGTH)
NAME = String(200)


def partial_index(name: str, *columns: str, where: str) -> Index:
    """An index over the rows ``where`` holds, the same text on both databases. A query
    reaches it only when it spells the same predicate with literals, not parameters (the
    planner cannot prove a parameter's value implies it): see ``retention``."""
    predicate = text(where)
    return Index(name, *columns, postgresql_where=predicate, sqlite_where=predicate)


__all__ = ["KEY", "NAME", "partial_index"]
