"""Code that runs in spawned processes for the store's multi-process tests.

A spawned child imports this module by name, so it lives outside the test files
(which pytest imports by path) and imports nothing from pytest. Every child opens its
own ``SQLAlchemyStore`` on the URL it is given, waits on a shared barrier so that
all children hit the database at the same instant, and reports through a queue.
"""

from __future__ import annotations

import traceback
import uuid
from collections.abc import Sequence
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier
from typing import Any

from celery_agboss.core.store import EffectRecord, NewIntent

BARRIER_SECONDS = 60.0

GrantRow = tuple[str, int, str, "int | None", "str | None"]


def _open_store(url: str, offset_ms: Any) -> Any:
    from celery_agboss.store.sqlalchemy_store import SQLAlchemyStore

    return SQLAlchemyStore(url, clock_offset_source=lambda: int(offset_ms.value))


def acquire_rounds(
    url: str,
    scope: str,
    ttl_ms: int,
    rounds: int,
    offset_ms: Any,
    barrier: Barrier,
    results: Queue[GrantRow],
) -> None:
    """Contend for ``scope`` in ``rounds`` rounds. Each round starts and ends on
    ``barrier``, whose last party is the parent: it checks the round and then moves
    the database clock or releases the lease before the next one starts.

    Reports ``("grant", round, holder, token or None, None)`` per round, or an error row.
    """
    store = None
    try:
        store = _open_store(url, offset_ms)
        store.now_ms()  # connect before the race, not during it
        for number in range(rounds):
            holder = uuid.uuid4().hex  # one per delivery
            barrier.wait(BARRIER_SECONDS)
            grant = store.acquire_lease(scope, holder, ttl_ms)
            token = None if grant is None else grant.lease.token
            results.put(("grant", number, holder, token, None))
            barrier.wait(BARRIER_SECONDS)
    except BaseException:
        results.put(("error", -1, "", None, traceback.format_exc()))
        barrier.abort()  # the others, and the parent, stop waiting for this one
    finally:
        if store is not None:
            store.close()


def insert_keys(
    url: str,
    scope: str,
    keys: Sequence[str],
    ttl_ms: int,
    offset_ms: Any,
    barrier: Barrier,
    results: Queue[dict[str, Any]],
) -> None:
    """Under a lease of its own, insert an intent and an effect under each of ``keys``,
    one key per round, the instant ``barrier`` opens; report whether this process won
    and what it read back in the same transaction."""
    store = None
    try:
        store = _open_store(url, offset_ms)
        grant = store.acquire_lease(scope, uuid.uuid4().hex, ttl_ms)
        if grant is None:
            raise RuntimeError(f"could not acquire {scope}")
        lease = grant.lease
        for key in keys:
            intent = NewIntent(
                idempotency_key=key,
                execution_id=scope,
                name="race.charge",
                business_key_handle=None,
                fingerprint=scope,
                request={"by": scope},
                owner=lease,
            )
            effect = EffectRecord(key, scope, "race.effect", {"by": scope}, lease.token, 0)
            barrier.wait(BARRIER_SECONDS)
            with store.fenced(lease, ttl_ms) as tx:
                intent_won = tx.insert_intent(intent)
                row = tx.read_intent(key)
                effect_won = tx.insert_effect(effect)
                stored = tx.read_effect(key)
            results.put(
                {
                    "key": key,
                    "racer": scope,
                    "intent_won": intent_won,
                    "intent_seen": None if row is None else row.fingerprint,
                    "effect_won": effect_won,
                    "effect_seen": None if stored is None else stored.result,
                    "error": None,
                }
            )
    except BaseException as exc:
        barrier.abort()
        results.put(
            {
                "racer": scope,
                "error": f"{type(exc).__module__}.{type(exc).__name__}: {exc}\n"
                f"{traceback.format_exc()}",
            }
        )
    finally:
        if store is not None:
            store.close()
