"""P2/P3 across processes: two processes insert one key at the same instant.

Each process holds a lease of its own (two executions for one business key, PS8) and,
released together by a barrier, inserts an intent and a fenced-effect record under
the same key in one fenced transaction. One insert wins; the other reads the
winner's row in its own transaction; no unique violation escapes to either.
"""

from __future__ import annotations

import multiprocessing
import uuid
from typing import Any

from celery_agboss.core.store_protocol import IntentStatus
from celery_agboss.store.sqlalchemy_store import SQLAlchemyStore
from tests.faults import workers

RACERS = 2
KEYS = 5
TTL_MS = 30_000


def test_two_processes_inserting_one_key_at_once_get_one_winner_and_read_its_row(
    store_url: str,
) -> None:
    ctx = multiprocessing.get_context("spawn")
    offset_ms = ctx.Value("q", 0)
    barrier = ctx.Barrier(RACERS)
    results = ctx.Queue()
    keys = [f"default:b:order-{uuid.uuid4().hex}:stripe.charge" for _ in range(KEYS)]
    racers = [f"race-exec-{i}-{uuid.uuid4().hex[:8]}" for i in range(RACERS)]
    processes = [
        ctx.Process(
            target=workers.insert_keys,
            args=(store_url, racer, keys, TTL_MS, offset_ms, barrier, results),
            daemon=True,
        )
        for racer in racers
    ]
    rows: list[dict[str, Any]] = []
    try:
        for process in processes:
            process.start()
        for _ in range(RACERS * KEYS):
            missing = f"only {len(rows)} of {RACERS * KEYS} inserts reported"
            row = workers.next_row(results, 60, missing)
            assert row["error"] is None, f"a racer failed:\n{row['error']}"
            rows.append(row)
    finally:
        barrier.abort()
        workers.stop_all(processes)
    store = SQLAlchemyStore(store_url)
    try:
        for key in keys:
            mine = [row for row in rows if row["key"] == key]
            assert len(mine) == RACERS
            intent_winners = [row["racer"] for row in mine if row["intent_won"]]
            effect_winners = [row["racer"] for row in mine if row["effect_won"]]
            assert len(intent_winners) == 1, f"{key}: intent inserted by {intent_winners}"
            assert len(effect_winners) == 1, f"{key}: effect inserted by {effect_winners}"
            assert {row["intent_seen"] for row in mine} == {intent_winners[0]}
            assert {row["effect_seen"]["by"] for row in mine} == {effect_winners[0]}
            stored = store.read_intent(key)
            assert stored is not None and stored.fingerprint == intent_winners[0]
            assert stored.status is IntentStatus.PENDING and stored.attempt == 1
            assert stored.owner is not None and stored.owner.scope == intent_winners[0]
    finally:
        store.close()
