"""P1 across processes: 20 worker processes race for one lease, round after round.

Each process opens its own ``SQLAlchemyStore`` on the database (spawned, so nothing
is shared but the URL), and a multiprocessing barrier releases all of them at once.
Every round has exactly one winner; the token grows by exactly one per take-over;
after a take-over the previous winner is fenced, so there are never two live holders.
Between rounds the parent moves the database clock past the lease (even rounds) or
releases it (odd rounds).
"""

from __future__ import annotations

import multiprocessing
import queue
import threading
import uuid
from typing import Any

import pytest

from celery_agboss.core.store_protocol import LeaseRef
from celery_agboss.errors import ExecutionFencedError
from celery_agboss.store.sqlalchemy_store import SQLAlchemyStore
from tests.faults import workers

PROCESSES = 20
ROUNDS = 4
TTL_MS = 10_000
RESULT_SECONDS = 60.0


def _errors(results: Any) -> str:
    """Whatever error rows the children left in the queue."""
    found: list[str] = []
    while True:
        try:
            row = results.get(timeout=1)
        except queue.Empty:
            return "\n".join(found) or "(no child reported an error)"
        if row[0] == "error":
            found.append(str(row[4]))


def test_twenty_processes_racing_for_one_lease_get_one_winner_per_strictly_growing_token(
    store_url: str,
) -> None:
    ctx = multiprocessing.get_context("spawn")
    offset_ms = ctx.Value("q", 0)
    barrier = ctx.Barrier(PROCESSES + 1)
    results = ctx.Queue()
    scope = f"race:{uuid.uuid4().hex}"
    parent = SQLAlchemyStore(store_url, clock_offset_source=lambda: int(offset_ms.value))
    processes = [
        ctx.Process(
            target=workers.acquire_rounds,
            args=(store_url, scope, TTL_MS, ROUNDS, offset_ms, barrier, results),
            name=f"acquirer-{i}",
            daemon=True,
        )
        for i in range(PROCESSES)
    ]
    try:
        for process in processes:
            process.start()
        previous: LeaseRef | None = None
        for number in range(ROUNDS):
            try:
                barrier.wait(workers.BARRIER_SECONDS)  # every process is ready: go
            except threading.BrokenBarrierError:
                pytest.fail(f"round {number}: an acquirer gave up:\n{_errors(results)}")
            rows: list[Any] = []
            for _ in range(PROCESSES):
                missing = f"round {number}: only {len(rows)} of {PROCESSES} answered"
                row = workers.next_row(results, RESULT_SECONDS, missing)
                assert row[0] == "grant", f"an acquirer failed:\n{row[4]}"
                rows.append(row)
            assert {row[1] for row in rows} == {number}
            winners = [LeaseRef(scope, row[2], row[3]) for row in rows if row[3] is not None]
            assert len(winners) == 1, f"round {number}: {len(winners)} winners: {winners}"
            winner = winners[0]
            if previous is None:
                assert winner.token == 1
            else:
                assert winner.token == previous.token + 1
                # The old holder writes nothing.
                with pytest.raises(ExecutionFencedError), parent.fenced(previous, TTL_MS):
                    pass
            state = parent.read_lease(scope)
            assert state is not None and state.live
            assert (state.holder, state.token) == (winner.holder, winner.token)
            if number % 2 == 0:
                with offset_ms.get_lock():
                    offset_ms.value += TTL_MS + 1_000
            else:
                assert parent.release_lease(winner)
            previous = winner
            barrier.wait(workers.BARRIER_SECONDS)  # the next round may start
    finally:
        barrier.abort()
        workers.stop_all(processes)
        parent.close()
    assert all(process.exitcode == 0 for process in processes)
