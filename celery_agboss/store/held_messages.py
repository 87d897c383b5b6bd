"""Which messages each worker holds unstarted, and when it last said so.

A worker's main process holds messages no delivery has started: prefetched behind the
running bodies, or waiting for their ETA. Killed with them on Redis, they stay hidden
among the unacked for the visibility timeout (an hour by default), and only the sweep's
``agboss_requested_grace`` would bring them back. So each worker keeps one
``agboss_meta`` row, ``worker.held:<worker id>``, whose value is the JSON list of the
execution ids it holds and whose ``updated_at_ms`` is its heartbeat (database clock);
the sweep treats a row older than a lease TTL as a dead worker's
(``celery_agboss.worker.held_messages``, ``SweepRun.held``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from sqlalchemy import delete, select

from celery_agboss.store.audit_trail import set_meta_txn
from celery_agboss.store.schema_executions import meta
from celery_agboss.store.sqlalchemy_store import SQLAlchemyStore

HELD_KEY_PREFIX = "worker.held:"
MAX_HELD_IDS = 1000
"""Ids one row lists at most; a worker holding more leaves the rest to the grace."""

_m = meta.c


@dataclass(frozen=True)
class HeldRow:
    """One worker's row: the ids it held unstarted when it last wrote, and how long ago."""

    worker: str
    execution_ids: tuple[str, ...]
    updated_at_ms: int
    age_ms: int


def write_held(store: SQLAlchemyStore, worker: str, execution_ids: list[str]) -> None:
    """This worker's held ids, and its heartbeat: now."""
    key = HELD_KEY_PREFIX + worker
    value = json.dumps(sorted(execution_ids)[:MAX_HELD_IDS])
    with store.transaction() as tx:
        set_meta_txn(tx, key, value)


def forget_held(store: SQLAlchemyStore, worker: str) -> None:
    """The worker holds nothing (it gave its messages back, or holds none now)."""
    with store.transaction() as tx:
        tx.execute(delete(meta).where(_m.key == HELD_KEY_PREFIX + worker))


def read_held(store: SQLAlchemyStore) -> list[HeldRow]:
    """Every worker's row (a handful: one per worker process that holds messages)."""
    with store.read_transaction() as tx:
        now = tx.now_expr()
        rows = tx.execute(
            select(_m.key, _m.value, _m.updated_at_ms, now.label("now_ms")).where(
                _m.key.startswith(HELD_KEY_PREFIX, autoescape=True)
            )
        ).all()
    found = []
    for row in rows:
        try:
            ids = tuple(str(item) for item in json.loads(row.value))
        except (ValueError, TypeError):
            ids = ()
        found.append(
            HeldRow(
                worker=str(row.key)[len(HELD_KEY_PREFIX) :],
                execution_ids=ids,
                updated_at_ms=int(row.updated_at_ms),
                age_ms=int(row.now_ms) - int(row.updated_at_ms),
            )
        )
    return found


def forget_held_if_unchanged(store: SQLAlchemyStore, row: HeldRow) -> bool:
    """Delete a dead worker's row once its ids were dealt with, unless the worker wrote
    again meanwhile (it was frozen, not dead): a compare-and-set on the heartbeat."""
    with store.transaction() as tx:
        return bool(
            tx.execute(
                delete(meta).where(
                    _m.key == HELD_KEY_PREFIX + row.worker,
                    _m.updated_at_ms == row.updated_at_ms,
                )
            ).rowcount
        )


__all__ = [
    "HELD_KEY_PREFIX",
    "MAX_HELD_IDS",
    "HeldRow",
    "forget_held",
    "forget_held_if_unchanged",
    "read_held",
    "write_held",
]
