"""The renewal benchmark: how many statements a worker sends to keep its leases alive.

A worker process renews all the leases its running deliveries hold in one round per
renewal interval (TTL/3), whatever their number (issue 11, goal 4). A real
``celery worker -P threads -c 50`` (Redis broker, a throwaway PostgreSQL store,
``agboss_lease_ttl = 3`` s, so a renewal every second) runs ``PaymentTask`` bodies that
only sleep inside their lease: first one at a time, then 50 at once. The worker writes
every statement its renewer thread sends (``bench.renewal_worker``); counted over the
time every body of the batch was running, divided by the renewal intervals in it.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import databases, redis_db
from bench.processes import WorkerProcess
from bench.renewal_worker import CONFIG_ENV, TASK_NAME, make_app
from bench.stats import fmt, table

Progress = Callable[[str], None]
WORKER_READY_SECONDS = 60.0
CONCURRENCY = 50


@dataclass(frozen=True)
class RenewalSizes:
    batches: tuple[int, ...] = (1, 50)
    hold_seconds: float = 8.0
    lease_ttl_seconds: float = 3.0

    @property
    def interval_seconds(self) -> float:
        return self.lease_ttl_seconds / 3


DEFAULT_RENEWAL_SIZES = RenewalSizes()
QUICK_RENEWAL_SIZES = RenewalSizes((1, 10), 5.0)


@dataclass(frozen=True)
class RenewalRun:
    """One batch of tasks running at once, counted while every one of them ran."""

    tasks: int
    interval_seconds: float
    window_seconds: float  # from the last body's start to the first body's end
    updates: int  # renewal UPDATEs of agboss_leases in the window
    update_span_seconds: float  # from the first of them to the last
    statements: int  # everything the renewer sent in the window (UPDATEs, row locks)
    leases_renewed: int  # rows those UPDATEs renewed
    processes: int  # worker processes that sent them

    @property
    def updates_per_interval(self) -> float:
        """The renewal rate, from the first to the last UPDATE of the window (the window's
        edges cut a round in two), in UPDATEs per renewal interval."""
        if self.updates < 2 or self.update_span_seconds <= 0:
            return float("nan")
        return (self.updates - 1) * self.interval_seconds / self.update_span_seconds

    @property
    def statements_per_interval(self) -> float:
        if not self.updates:
            return float("nan")
        return self.updates_per_interval * self.statements / self.updates

    @property
    def leases_per_update(self) -> float:
        return self.leases_renewed / self.updates if self.updates else float("nan")


@dataclass(frozen=True)
class RenewalResult:
    backend: str
    pool: str
    lease_ttl_seconds: float
    runs: tuple[RenewalRun, ...]

    def lines(self) -> list[str]:
        rows = [
            [
                str(run.tasks),
                fmt(run.window_seconds, 1),
                str(run.updates),
                fmt(run.updates_per_interval, 2),
                fmt(run.statements_per_interval, 2),
                fmt(run.leases_per_update, 1),
                str(run.processes),
            ]
            for run in self.runs
        ]
        headers = ["tasks", "window s", "UPDATEs", "UPDATE/interval"]
        return [
            f"Lease renewals: one celery worker {self.pool}, store on {self.backend},"
            f" lease TTL {self.lease_ttl_seconds:g} s (a renewal interval every"
            f" {self.lease_ttl_seconds / 3:g} s);",
            "counted while every task of the batch was running inside its lease; per interval:"
            " the rate from the first to the last UPDATE of that window",
            table([*headers, "SQL/interval", "leases/UPDATE", "procs"], rows),
            "",
        ]

    def metrics(self) -> dict[str, float]:
        """``renewal_statements_per_interval``: every statement the renewer sent, per
        process per interval, with the most tasks at once; per batch size too."""
        largest = max(self.runs, key=lambda run: run.tasks)
        out = {
            "renewal_statements_per_interval": round(
                largest.statements_per_interval / max(1, largest.processes), 3
            )
        }
        for run in self.runs:
            out[f"renewal_updates_per_interval_{run.tasks}"] = round(run.updates_per_interval, 3)
            out[f"renewal_sql_per_interval_{run.tasks}"] = round(run.statements_per_interval, 3)
            out[f"renewal_leases_per_update_{run.tasks}"] = round(run.leases_per_update, 2)
        return out


def _events(path: Path) -> list[dict[str, Any]]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in lines if line.strip()]


def _wait_for_ends(path: Path, ids: set[str], deadline: float, worker: WorkerProcess) -> None:
    while True:
        ended = {e["task"] for e in _events(path) if e["kind"] == "end"}
        if ids <= ended:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"{len(ids - ended)} of {len(ids)} tasks did not finish in time:\n"
                + worker.output()[-3000:]
            )
        time.sleep(0.1)


def _count(events: list[dict[str, Any]], ids: set[str], interval: float) -> RenewalRun:
    starts = [e["t"] for e in events if e["kind"] == "start" and e["task"] in ids]
    ends = [e["t"] for e in events if e["kind"] == "end" and e["task"] in ids]
    opened, closed = max(starts), min(ends)
    inside = [e for e in events if e["kind"] == "statement" and opened <= e["t"] <= closed]
    # The renewal is an UPDATE of agboss_leases, alone (SQLite) or inside one statement
    # that also locks the rows and reads the skipped ones (PostgreSQL: WITH … UPDATE).
    updates = [e for e in inside if e.get("renews")]
    times = [e["t"] for e in updates]
    return RenewalRun(
        tasks=len(ids),
        interval_seconds=interval,
        window_seconds=max(0.0, closed - opened),
        updates=len(updates),
        update_span_seconds=max(times) - min(times) if times else 0.0,
        statements=len(inside),
        leases_renewed=sum(max(0, int(e["rows"])) for e in updates),
        processes=len({e["pid"] for e in inside}),
    )


def _measure(
    config: dict[str, Any], sizes: RenewalSizes, folder: Path, progress: Progress
) -> list[RenewalRun]:
    from celery_agboss import AGBoss
    from celery_agboss.signals import disconnect

    worker = WorkerProcess.celery_worker(
        "bench.renewal_worker:app",
        CONFIG_ENV,
        config,
        pool="threads",
        concurrency=CONCURRENCY,
        log_path=folder / "renewal-worker.log",
    )
    app = make_app(config)
    try:
        worker.wait_for_output(" ready.", WORKER_READY_SECONDS)
        task = app.tasks[TASK_NAME]
        log = Path(config["log"])
        runs: list[RenewalRun] = []
        for count in sizes.batches:
            if count > CONCURRENCY:
                raise ValueError(f"at most {CONCURRENCY} tasks run at once, not {count}")
            progress(f"  {count} task(s) holding a lease for {sizes.hold_seconds:g} s")
            ids = {str(task.apply_async((sizes.hold_seconds,)).id) for _ in range(count)}
            deadline = time.monotonic() + sizes.hold_seconds + 60.0
            _wait_for_ends(log, ids, deadline, worker)
            runs.append(_count(_events(log), ids, sizes.interval_seconds))
        return runs
    finally:
        worker.close()
        agboss = AGBoss.of(app)
        disconnect(agboss)
        agboss.close()
        app.close()


def run_renewal_benchmark(
    admin_url: str,
    redis_base_url: str,
    sizes: RenewalSizes = DEFAULT_RENEWAL_SIZES,
    progress: Progress = print,
    *,
    redis_db_number: int = 13,
) -> RenewalResult:
    """Renewal statements of one threads-pool worker, for each batch size (PostgreSQL
    store in a throwaway database, Redis broker on a leased database)."""
    progress(
        f"renewal benchmark: celery worker -P threads -c {CONCURRENCY}, batches {sizes.batches}"
    )
    with (
        tempfile.TemporaryDirectory(prefix="agboss-renewal-bench-") as name,
        databases.postgres_database(admin_url) as url,
        redis_db.leased_database(redis_base_url, redis_db_number) as broker,
    ):
        folder = Path(name)
        config = {
            "broker_url": broker,
            "database_url": url,
            "queue": f"bench-renewal-{uuid.uuid4().hex[:8]}",
            "lease_ttl": sizes.lease_ttl_seconds,
            "log": str(folder / "events.jsonl"),
        }
        runs = _measure(config, sizes, folder, progress)
    return RenewalResult(
        "postgresql", f"-P threads -c {CONCURRENCY}", sizes.lease_ttl_seconds, tuple(runs)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.renewal_bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="1 then 10 tasks, 5 s each")
    args = parser.parse_args(argv)
    sizes = QUICK_RENEWAL_SIZES if args.quick else DEFAULT_RENEWAL_SIZES

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    result = run_renewal_benchmark(
        databases.postgres_admin_url(), redis_db.redis_base_url(), sizes, progress
    )
    print("\n".join(result.lines()))
    for name, value in result.metrics().items():
        print(f"{name}={value:g}")
    return 0


__all__ = [
    "DEFAULT_RENEWAL_SIZES",
    "QUICK_RENEWAL_SIZES",
    "RenewalResult",
    "RenewalRun",
    "RenewalSizes",
    "run_renewal_benchmark",
]

if __name__ == "__main__":
    raise SystemExit(main())
