"""One timed round of the end-to-end benchmark: publish, keep the worker fed, collect.

Tasks are published in a rolling window: about ``BACKLOG_SECONDS`` of work at the
rate measured so far is left not yet done (at least ``MIN_WINDOW``, at most
``MAX_WINDOW``), so the worker never waits for work, the broker never holds
thousands of messages, and a round whose time budget is spent (it stops publishing
and says it was cut short) ends soon after, whatever the speed of its side. It then
waits, under a deadline, for what it published. The clock runs from the
first publish until the result backend holds the last result (one ``MGET`` per
poll). Each result carries how long the task's gateway call took (``call_ms``).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import redis
from celery import Celery

from bench.processes import WorkerProcess, WorkerTimeout

BACKLOG_SECONDS = 1.5
MIN_WINDOW = 16
"""Twice what a -c 2 worker prefetches (4 per process)."""
MAX_WINDOW = 200
POLL_SECONDS = 0.02
READY_STATES = frozenset({"SUCCESS", "FAILURE", "REVOKED"})


@dataclass(frozen=True)
class RoundTiming:
    tasks: int
    planned: int
    wall_seconds: float
    call_ms: tuple[float, ...]
    """Per task: the gateway call as the task body timed it (``self.outbound`` or direct)."""

    @property
    def cut_short(self) -> bool:
        return self.tasks < self.planned

    @property
    def per_second(self) -> float:
        return self.tasks / self.wall_seconds if self.wall_seconds > 0 else float("nan")


def run_round(
    app: Celery,
    task_name: str,
    prefix: str,
    planned: int,
    budget_seconds: float,
    drain_seconds: float,
    worker: WorkerProcess,
) -> RoundTiming:
    """Up to ``planned`` tasks, published for at most ``budget_seconds``; every one must
    succeed within ``drain_seconds`` after the last publish."""
    task = app.tasks[task_name]
    client = redis.Redis.from_url(app.conf.result_backend, socket_timeout=10)
    outstanding: dict[str, str] = {}
    call_ms: list[float] = []
    failed: list[str] = []
    published = 0
    start = time.perf_counter()
    stop_publishing = time.monotonic() + budget_seconds
    drain_deadline: float | None = None
    try:
        while True:
            if published < planned and time.monotonic() >= stop_publishing:
                planned_now = published
            else:
                planned_now = planned
            window = _window(published - len(outstanding), time.perf_counter() - start)
            while published < planned_now and len(outstanding) < window:
                task_id = task.apply_async(args=(f"{prefix}-{published}",)).id
                outstanding[app.backend.get_key_for_task(task_id)] = task_id
                published += 1
            if published >= planned_now and drain_deadline is None:
                drain_deadline = time.monotonic() + drain_seconds
            _collect(client, outstanding, call_ms, failed)
            if not outstanding and published >= planned_now:
                break
            if drain_deadline is not None and time.monotonic() >= drain_deadline:
                raise WorkerTimeout(
                    f"{len(outstanding)} of {published} tasks not done {drain_seconds:g} s "
                    f"after the last publish; worker log tail:\n{worker.output()[-3000:]}"
                )
            time.sleep(POLL_SECONDS)
        wall = time.perf_counter() - start
    finally:
        client.close()
    if failed:
        raise RuntimeError(f"{len(failed)} tasks did not succeed, e.g. {failed[0]}")
    return RoundTiming(published, planned, wall, tuple(call_ms))


def _window(done: int, elapsed: float) -> int:
    """How many tasks may be waiting: ``BACKLOG_SECONDS`` of work at the rate so far."""
    if elapsed < 0.5:
        return MIN_WINDOW
    return max(MIN_WINDOW, min(MAX_WINDOW, round(done / elapsed * BACKLOG_SECONDS)))


def _collect(
    client: redis.Redis, outstanding: dict[str, str], call_ms: list[float], failed: list[str]
) -> None:
    """Take every final result the backend holds out of ``outstanding``."""
    if not outstanding:
        return
    pending = list(outstanding)
    for key, raw in zip(pending, client.mget(pending), strict=True):
        if raw is None:
            continue
        meta = json.loads(raw)
        status = meta.get("status")
        if status not in READY_STATES:
            continue
        if status == "SUCCESS":
            call_ms.append(float(meta["result"]["call_ms"]))
        else:
            failed.append(f"{outstanding[key]}: {status} {meta.get('result')}")
        del outstanding[key]


__all__ = ["RoundTiming", "run_round"]
