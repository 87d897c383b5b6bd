"""The end-to-end benchmark: real ``celery worker`` subprocesses, Redis, a gateway over HTTP.

For each pool (threads ``-c 4``, prefork ``-c 2``) and each side (``plain``, then
``agboss``), a fresh worker is started on a queue of its own; a few warm-up tasks
run first (imports, connections, the first statements), then ``tasks`` tasks are
published at once and the clock runs until the result backend holds a result for
every one of them (polled with one ``MGET`` per round, under a deadline). The
worker's memory is read right after: the summed ``VmRSS`` of its process group.
Every worker is stopped, group and all, whatever happened.
"""

from __future__ import annotations

import json
import re
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
from celery import Celery
from sqlalchemy import create_engine, func, select

from bench.databases import bench_payments
from bench.gateway_client import payments_over_http
from bench.gateway_http import LISTENING
from bench.processes import GroupMemory, WorkerProcess, WorkerTimeout
from bench.worker_app import AGBOSS_TASK, CONFIG_ENV, PLAIN_TASK, make_app

REPO_ROOT = Path(__file__).resolve().parents[1]
WORKER_READY_SECONDS = 60.0
POLL_SECONDS = 0.02
READY_STATES = frozenset({"SUCCESS", "FAILURE", "REVOKED"})
SIDES = ("plain", "agboss")


@dataclass(frozen=True)
class PoolSpec:
    pool: str
    concurrency: int

    @property
    def label(self) -> str:
        return f"{self.pool} -c {self.concurrency}"


POOLS = (PoolSpec("threads", 4), PoolSpec("prefork", 2))


@dataclass(frozen=True)
class E2ESizes:
    tasks: int
    budget_seconds: float
    """Deadline for one side's timed tasks to be done (then the run fails)."""


@dataclass(frozen=True)
class E2ERun:
    spec: PoolSpec
    side: str
    tasks: int
    publish_seconds: float
    """Of ``wall_seconds``: publishing them all (a ``PaymentTask`` is recorded at publish)."""
    wall_seconds: float
    memory: GroupMemory

    @property
    def per_second(self) -> float:
        return self.tasks / self.wall_seconds if self.wall_seconds > 0 else float("nan")


class RemoteGateway:
    """The fake gateway in a process of its own (``python -m bench.gateway_http``)."""

    def __init__(self, folder: Path) -> None:
        self._process = WorkerProcess(
            [sys.executable, "-m", "bench.gateway_http"],
            log_path=folder / "gateway.log",
            env={"PYTHONPATH": str(REPO_ROOT)},
            cwd=REPO_ROOT,
        )
        try:
            self._process.wait_for_output("\n", 30.0)
            found = re.search(rf"{re.escape(LISTENING)} (http://\S+)", self._process.output())
            if found is None:
                raise WorkerTimeout(f"the gateway did not say where: {self._process.output()}")
            self.url = found.group(1)
        except BaseException:
            self._process.close()
            raise

    def payments(self) -> int:
        return payments_over_http(self.url)

    def __enter__(self) -> RemoteGateway:
        return self

    def __exit__(self, *exc: object) -> None:
        self._process.close()


@dataclass
class E2EWorld:
    """What every run shares: the store's database, the broker database, the gateway."""

    database_url: str
    redis_url: str
    gateway: RemoteGateway
    folder: Path


def run_e2e_benchmark(
    world: E2EWorld,
    sizes: E2ESizes,
    pools: tuple[PoolSpec, ...] = POOLS,
    progress: Callable[[str], None] = lambda _: None,
) -> list[E2ERun]:
    runs: list[E2ERun] = []
    for spec in pools:
        for side in SIDES:
            progress(f"  end-to-end: {spec.label}, {side} ({sizes.tasks} tasks)")
            runs.append(_one_run(world, spec, side, sizes))
    return runs


def _one_run(world: E2EWorld, spec: PoolSpec, side: str, sizes: E2ESizes) -> E2ERun:
    run_id = uuid.uuid4().hex[:8]
    config = {
        "mode": side,
        "queue": f"bench-{side}-{spec.pool}-{run_id}",
        "broker_url": world.redis_url,
        "gateway_url": world.gateway.url,
        "database_url": world.database_url,
    }
    app = make_app(config)
    worker: WorkerProcess | None = None
    try:
        worker = _start_worker(world, spec, config, run_id)
        task = app.tasks[PLAIN_TASK if side == "plain" else AGBOSS_TASK]
        payments_before = world.gateway.payments()
        warmup = [f"{run_id}-w{i}" for i in range(spec.concurrency * 2)]
        _wait_done(app, [task.apply_async(args=(ref,)).id for ref in warmup], 60.0, worker)
        refs = [f"{run_id}-{i}" for i in range(sizes.tasks)]
        start = time.perf_counter()
        ids = [task.apply_async(args=(ref,)).id for ref in refs]
        published = time.perf_counter() - start
        _wait_done(app, ids, sizes.budget_seconds, worker)
        wall = time.perf_counter() - start
        memory = worker.memory()
        _check_work_done(world, run_id, payments_before, len(warmup) + len(refs))
        return E2ERun(spec, side, len(refs), published, wall, memory)
    finally:
        if worker is not None:
            worker.close()
        _close_app(app, side)


def _start_worker(
    world: E2EWorld, spec: PoolSpec, config: dict[str, Any], run_id: str
) -> WorkerProcess:
    argv = [
        sys.executable, "-m", "celery", "-A", "bench.worker_app:app", "worker",
        "-P", spec.pool, "-c", str(spec.concurrency),
        "--without-heartbeat", "--without-gossip", "--without-mingle",
        "-Q", config["queue"], "-n", f"bench-{config['mode']}-{run_id}@%h", "-l", "info",
    ]  # fmt: skip
    worker = WorkerProcess(
        argv,
        log_path=world.folder / f"worker-{config['mode']}-{spec.pool}-{run_id}.log",
        env={CONFIG_ENV: json.dumps(config), "PYTHONPATH": str(REPO_ROOT)},
        cwd=REPO_ROOT,
    )
    try:
        worker.wait_for_output(" ready.", WORKER_READY_SECONDS)
    except BaseException:
        worker.close()
        raise
    return worker


def _wait_done(app: Celery, task_ids: list[str], timeout: float, worker: WorkerProcess) -> None:
    """Poll the result backend until every task has a final state; fail on any FAILURE."""
    keys = {app.backend.get_key_for_task(task_id): task_id for task_id in task_ids}
    client = redis.Redis.from_url(app.conf.result_backend, socket_timeout=10)
    deadline = time.monotonic() + timeout
    failed: list[str] = []
    try:
        while keys:
            pending = list(keys)
            for key, raw in zip(pending, client.mget(pending), strict=True):
                if raw is None:
                    continue
                meta = json.loads(raw)
                if meta.get("status") in READY_STATES:
                    if meta["status"] != "SUCCESS":
                        failed.append(f"{keys[key]}: {meta['status']} {meta.get('result')}")
                    del keys[key]
            if not keys:
                break
            if time.monotonic() >= deadline:
                raise WorkerTimeout(
                    f"{len(keys)} of {len(task_ids)} tasks not done after {timeout:g} s; "
                    f"worker log tail:\n{worker.output()[-3000:]}"
                )
            time.sleep(POLL_SECONDS)
    finally:
        client.close()
    if failed:
        raise RuntimeError(f"{len(failed)} tasks did not succeed, e.g. {failed[0]}")


def _check_work_done(world: E2EWorld, run_id: str, payments_before: int, expected: int) -> None:
    """Each task charged once and wrote its row once: else the numbers mean nothing."""
    made = world.gateway.payments() - payments_before
    engine = create_engine(world.database_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                select(func.count())
                .select_from(bench_payments)
                .where(bench_payments.c.ref.like(f"{run_id}-%"))
            ).scalar_one()
    finally:
        engine.dispose()
    if made != expected or rows != expected:
        raise RuntimeError(
            f"end-to-end run {run_id}: expected {expected} payments and rows, "
            f"found {made} payments and {rows} rows"
        )


def _close_app(app: Celery, side: str) -> None:
    if side == "agboss":
        from celery_agboss.app import AGBoss
        from celery_agboss.signals import disconnect

        agboss = AGBoss.of(app)
        disconnect(agboss)
        agboss.close()
    app.close()


__all__ = [
    "POOLS",
    "E2ERun",
    "E2ESizes",
    "E2EWorld",
    "PoolSpec",
    "RemoteGateway",
    "run_e2e_benchmark",
]
