"""The end-to-end benchmark: real ``celery worker`` subprocesses, Redis, a gateway over HTTP.

For each gateway latency (0 ms, then 50 ms) a fake gateway process and two prefork
``-c 2`` workers are started, one per side, each on a queue of its own: ``plain`` (a
plain task making the HTTP call) and ``agboss`` (a ``PaymentTask`` making the same
call through one ``self.outbound``). After a few warm-up tasks each, timed rounds
alternate plain, agboss, plain, agboss (``bench.e2e_rounds``), so a background load
slows both sides alike; the idle worker waits on its empty queue meanwhile.

Around every agboss round the run's database counts its transactions
(``bench.pg_counters``: publisher and workers alike, read once the counters stopped
moving) and the processes say which step opened each (``bench.transaction_kinds``).
At the end come the workers' peak memory (``VmHWM``) and the store's rows and bytes
per payment, before and after the benchmark's own retention sweep. Every check is
made: each task charged once at the gateway and ended ``SUCCESS``, or the run fails.
Every worker and gateway is stopped, group and all, whatever happened.
"""

from __future__ import annotations

import re
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from celery import Celery

from bench.cpu_split import cpu_snapshot, cpu_spent, kind_of
from bench.e2e_rounds import RoundTiming, run_round
from bench.gateway_client import payments_over_http
from bench.gateway_http import LISTENING
from bench.pg_counters import TableFootprint, TransactionCounters, store_footprint
from bench.processes import REPO_ROOT, PeakMemory, WorkerProcess, WorkerTimeout, group_pids
from bench.transaction_kinds import TransactionCounter, difference, read_counts
from bench.worker_app import AGBOSS_TASK, CONFIG_ENV, PLAIN_TASK, make_app

WORKER_READY_SECONDS = 60.0
CONCURRENCY = 2
WARMUP_TASKS = 4 * CONCURRENCY
SIDES = ("plain", "agboss")
TASK_OF_SIDE = {"plain": PLAIN_TASK, "agboss": AGBOSS_TASK}
RETENTION_SECONDS = 1.0
"""The benchmark's own sweep deletes what has been terminal this long (7 days by default)."""


@dataclass(frozen=True)
class Setting:
    """One gateway latency and its rounds: ``rounds`` per side of up to ``tasks`` each,
    each round publishing for at most ``round_budget_seconds``."""

    latency_ms: float
    tasks: int
    rounds: int
    round_budget_seconds: float


@dataclass(frozen=True)
class E2ESizes:
    settings: tuple[Setting, ...]
    drain_seconds: float = 120.0
    """After a round's last publish, its tasks must be done within this (or it fails)."""


@dataclass(frozen=True)
class RoundResult:
    side: str
    timing: RoundTiming
    transactions: int | None = None
    """Of the database (PostgreSQL's counters) during an agboss round; None otherwise."""
    settled: bool = True
    kinds: Counter[str] = field(default_factory=Counter)
    """Of the same round, by the step that opened each (``role: kind``)."""
    cpu_seconds: dict[str, float] = field(default_factory=dict)
    """CPU spent during the round, by process kind (``bench.cpu_split``)."""
    timings: Counter[str] = field(default_factory=Counter)
    """Of an agboss round: the store statements' count and wall time by role
    (``role: statements``, ``role: statement_us``; ``bench.transaction_kinds``)."""


@dataclass(frozen=True)
class SettingResult:
    setting: Setting
    rounds: tuple[RoundResult, ...]
    peak: dict[str, PeakMemory]

    def of(self, side: str) -> list[RoundResult]:
        return [r for r in self.rounds if r.side == side]


@dataclass
class E2EResult:
    backend: str
    settings: list[SettingResult] = field(default_factory=list)
    payments: int = 0
    """agboss payments made in the run, warm-ups included: what the store holds."""
    retained: list[TableFootprint] = field(default_factory=list)
    after_retention: list[TableFootprint] = field(default_factory=list)
    retention_note: str = ""


class RemoteGateway:
    """The fake gateway in a process of its own (``python -m bench.gateway_http``)."""

    def __init__(self, folder: Path, latency_ms: float = 0.0) -> None:
        self._process = WorkerProcess(
            [sys.executable, "-m", "bench.gateway_http", "--latency-ms", str(latency_ms)],
            log_path=folder / f"gateway-{uuid.uuid4().hex[:8]}.log",
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

    @property
    def pid(self) -> int:
        return self._process.pid

    def payments(self) -> int:
        return payments_over_http(self.url)

    def __enter__(self) -> RemoteGateway:
        return self

    def __exit__(self, *exc: object) -> None:
        self._process.close()


@dataclass
class E2EWorld:
    """What every run shares: the store's database, the broker database, a folder."""

    database_url: str
    redis_url: str
    folder: Path
    admin_url: str | None = None
    """PostgreSQL only: where to read the run database's transaction counters from."""


def run_e2e_benchmark(
    world: E2EWorld, sizes: E2ESizes, progress: Callable[[str], None] = lambda _: None
) -> E2EResult:
    backend = "postgresql" if world.admin_url is not None else "sqlite"
    result = E2EResult(backend)
    for setting in sizes.settings:
        progress(
            f"  end-to-end at {setting.latency_ms:g} ms gateway latency: {setting.rounds} rounds "
            f"per side of up to {setting.tasks} tasks ({setting.round_budget_seconds:g} s each)"
        )
        outcome, agboss_payments = _one_setting(world, setting, sizes, progress)
        result.settings.append(outcome)
        result.payments += agboss_payments
    if backend == "postgresql":
        progress("  end-to-end: the store's footprint, then the retention sweep")
        result.retained = store_footprint(world.database_url)
        result.retention_note = _retention_sweep(world)
        result.after_retention = store_footprint(world.database_url)
    return result


def _config(world: E2EWorld, side: str, gateway: RemoteGateway, run_id: str) -> dict[str, Any]:
    config: dict[str, Any] = {
        "mode": side,
        "queue": f"bench-{side}-{run_id}",
        "broker_url": world.redis_url,
        "gateway_url": gateway.url,
        "database_url": world.database_url,
    }
    if side == "agboss":
        folder = world.folder / f"transactions-{run_id}"
        folder.mkdir()
        config["transactions_folder"] = str(folder)
    return config


@dataclass(frozen=True)
class _Snapshot:
    transactions: int | None
    settled: bool
    kinds: dict[str, Counter[str]]
    timings: dict[str, Counter[str]]


@dataclass
class _Tally:
    """Readings of the store's transactions, taken while the agboss side is idle: before
    each agboss round and once at the end. The plain round that follows an agboss round
    touches no database, so it gives PostgreSQL the time to flush that round's counts."""

    counters: TransactionCounters | None
    publisher: TransactionCounter
    folder: Path
    idle_since: float = field(default_factory=time.monotonic)
    """When the agboss side last had work (``time.monotonic()``)."""

    def read(self) -> _Snapshot:
        reading = None if self.counters is None else self.counters.settled(self.idle_since)
        self.publisher.flush()
        kinds = _settled_kinds(self.folder)
        timings = read_counts(self.folder, "timings")  # flushed with the kinds
        if reading is None:
            return _Snapshot(None, True, kinds, timings)
        return _Snapshot(reading.transactions, reading.settled, kinds, timings)


def _closed(
    timed: tuple[RoundTiming, dict[str, float]], before: _Snapshot, after: _Snapshot
) -> RoundResult:
    """An agboss round with what the store counted between the readings around it."""
    timing, cpu = timed
    kinds = difference(after.kinds, before.kinds)
    timings = difference(after.timings, before.timings)
    if before.transactions is None or after.transactions is None:
        return RoundResult("agboss", timing, None, True, kinds, cpu, timings)
    spent = after.transactions - before.transactions
    settled = before.settled and after.settled
    return RoundResult("agboss", timing, spent, settled, kinds, cpu, timings)


def _one_setting(
    world: E2EWorld, setting: Setting, sizes: E2ESizes, progress: Callable[[str], None]
) -> tuple[SettingResult, int]:
    run_id = uuid.uuid4().hex[:8]
    with ExitStack() as stack:
        gateway = stack.enter_context(RemoteGateway(world.folder, setting.latency_ms))
        configs = {side: _config(world, side, gateway, run_id) for side in SIDES}
        apps = {side: stack.enter_context(_app(configs[side])) for side in SIDES}
        workers = {side: stack.enter_context(_worker(world, configs[side])) for side in SIDES}
        for worker in workers.values():
            worker.wait_for_output(" ready.", WORKER_READY_SECONDS)
        folder = Path(configs["agboss"]["transactions_folder"])
        counters = None
        if world.admin_url is not None:
            counters = TransactionCounters(world.admin_url, _database_name(world.database_url))
            stack.callback(counters.close)
        publisher = _count_publisher(apps["agboss"], folder, world.database_url)
        tally = _Tally(counters, publisher, folder)

        def timed(
            side: str, name: str, tasks: int, budget: float
        ) -> tuple[RoundTiming, dict[str, float]]:
            worker = workers[side]
            cpu_before = cpu_snapshot()
            timing = run_round(
                apps[side], TASK_OF_SIDE[side], f"{run_id}-{side}-{name}", tasks, budget,
                sizes.drain_seconds, worker,
            )  # fmt: skip
            group = {worker.pid: set(group_pids(worker.pgid))}
            cpu = cpu_spent(
                cpu_before,
                cpu_snapshot(),
                lambda pid, command: kind_of(pid, command, workers=group, gateway=gateway.pid),
            )
            if side == "agboss":
                tally.idle_since = time.monotonic()
            return timing, cpu

        published = sum(timed(side, "warm", WARMUP_TASKS, 60.0)[0].tasks for side in SIDES)
        rounds: list[RoundResult] = []
        unclosed: tuple[int, tuple[RoundTiming, dict[str, float]], _Snapshot] | None = None
        for number in range(setting.rounds):
            for side in SIDES:
                progress(f"    round {number + 1}/{setting.rounds}: {side}")
                before = tally.read() if side == "agboss" else None
                if before is not None and unclosed is not None:
                    rounds[unclosed[0]] = _closed(unclosed[1], unclosed[2], before)
                done = timed(side, str(number), setting.tasks, setting.round_budget_seconds)
                timing = done[0]
                rounds.append(RoundResult(side, timing, cpu_seconds=done[1]))
                if before is not None:
                    unclosed = (len(rounds) - 1, done, before)
                published += timing.tasks
        if unclosed is not None:
            rounds[unclosed[0]] = _closed(unclosed[1], unclosed[2], tally.read())
        peak = {side: workers[side].peak_memory() for side in SIDES}
        made = gateway.payments()
        if made != published:
            raise RuntimeError(
                f"end-to-end run {run_id}: {published} tasks succeeded but the gateway made "
                f"{made} payments"
            )
        agboss_payments = WARMUP_TASKS + sum(r.timing.tasks for r in rounds if r.side == "agboss")
        return SettingResult(setting, tuple(rounds), peak), agboss_payments
    raise AssertionError("unreachable")  # pragma: no cover (ExitStack re-raises)


def _settled_kinds(folder: Path, timeout: float = 10.0) -> dict[str, Counter[str]]:
    """The processes' files once two readings a flush interval apart agree (bounded)."""
    deadline = time.monotonic() + timeout
    reading = read_counts(folder)
    while time.monotonic() < deadline:
        time.sleep(0.6)
        latest = read_counts(folder)
        if latest == reading:
            break
        reading = latest
    return reading


def _count_publisher(app: Celery, folder: Path, database_url: str) -> TransactionCounter:
    """The benchmark process publishes: its store transactions (publish records) count."""
    from celery_agboss import AGBoss

    counter = TransactionCounter(folder, "publisher", _database_name(database_url))
    counter.install(AGBoss.of(app).store.engine)
    return counter


def _database_name(url: str) -> str:
    from sqlalchemy.engine import make_url

    return str(make_url(url).database)


@contextmanager
def _app(config: dict[str, Any]) -> Iterator[Celery]:
    app = make_app(config)
    try:
        yield app
    finally:
        if config["mode"] == "agboss":
            _close_agboss(app)
        app.close()


def _close_agboss(app: Celery) -> None:
    from celery_agboss.app import AGBoss
    from celery_agboss.signals import disconnect

    agboss = AGBoss.of(app)
    disconnect(agboss)
    agboss.close()


@contextmanager
def _worker(world: E2EWorld, config: dict[str, Any]) -> Iterator[WorkerProcess]:
    """A prefork ``-c 2`` worker on the config's queue; waited for by the caller."""
    worker = WorkerProcess.celery_worker(
        "bench.worker_app:app",
        CONFIG_ENV,
        config,
        pool="prefork",
        concurrency=CONCURRENCY,
        log_path=world.folder / f"worker-{config['queue']}.log",
    )
    try:
        yield worker
    finally:
        worker.close()


def _retention_sweep(world: E2EWorld) -> str:
    """Run the sweep with a 1 s retention until it deletes nothing more (bounded)."""
    from celery_agboss import AGBoss
    from celery_agboss.sweep import run_sweep

    config = {
        "mode": "agboss",
        "queue": f"bench-sweep-{uuid.uuid4().hex[:8]}",
        "broker_url": world.redis_url,
        "gateway_url": "http://127.0.0.1:9",  # the sweep never sends; nothing is stranded
        "database_url": world.database_url,
        "retention_seconds": RETENTION_SECONDS,
    }
    time.sleep(RETENTION_SECONDS + 0.5)  # what ended last must be older than the retention
    deleted = Counter[str]()
    with _app(config) as app:
        for _ in range(200):
            report = run_sweep(AGBoss.of(app), batch_size=2000)
            if report.errors:
                return f"the retention sweep failed ({report.errors} errors): see the log"
            done = {
                "intents": report.intents_deleted,
                "fenced effects": report.effects_deleted,
                "executions": report.executions_deleted,
            }
            deleted.update(done)
            if not any(done.values()):
                break
    return "deleted " + ", ".join(f"{n} {what}" for what, n in deleted.items())


__all__ = [
    "E2EResult",
    "E2ESizes",
    "E2EWorld",
    "RemoteGateway",
    "RoundResult",
    "Setting",
    "SettingResult",
    "run_e2e_benchmark",
]
