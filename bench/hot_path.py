"""The hot path of one single-charge delivery on PostgreSQL, measured in one process.

A ``PaymentTask`` making one ``self.outbound`` charge (the end-to-end benchmark's task,
with the gateway in-process so that its HTTP does not blur the store's share) is
published, which records it ``REQUESTED`` as every publisher does, then delivered in
this thread with ``apply`` under the published id: start, claim, settle, verdict and
release, the store calls a worker makes, without Celery's broker and pool around them.
Publishing happens before each measured stretch, so only deliveries are measured.

After a warm-up, three passes over fresh deliveries:

- counted: every exchange with the server, from libpq's trace of the wire
  (``bench.wire_trace``): BEGIN, COMMIT, ROLLBACK, pool pings and prepares included;
- timed, interleaved in blocks with the floor: per delivery its wall time, its thread
  CPU, the wall and CPU time while the store holds a pooled connection (checkout to
  checkin: every transaction, statement and ping of the store, and the Python that runs
  while it is held), and the in-process gateway's own time; the floor is the same
  number of single-row ``INSERT`` + ``COMMIT`` transactions as a delivery makes (from
  the counted pass), on one psycopg connection of the store's pool to the same
  database, right after each block, so both see the same load;
- profiled: cProfile (wall clock) of the same deliveries, each function's own time
  given to its package, and the time of stdlib and builtins to the package that
  called them: where the time goes, and ``python_ms_per_delivery``, the time of
  celery_agboss's own code (engine and store, with the hashing, JSON and logging they
  call). The profiler slows every Python call, so that figure is higher than without
  it: compare it between runs, not with the timed pass.
"""

from __future__ import annotations

import cProfile
import math
import pstats
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.pool import Pool

from bench.stats import fmt, percentile, ratio, table
from bench.wire_trace import KINDS, WireCount, WireTrace

PSEUDONYM_KEY = "bench-pseudonym-key-not-a-secret-0123456789"
TASK_NAME = "bench.hot_path_charge"
BLOCK = 25
"""Deliveries timed before the floor's transactions for them."""
FLOOR_TABLE = "bench_floor"


@dataclass(frozen=True)
class HotPathSizes:
    deliveries: int
    """Timed (fewer if the time budget ends first)."""
    counted: int
    profiled: int
    warmup: int
    budget_seconds: float


DEFAULT_HOT_PATH_SIZES = HotPathSizes(300, 50, 50, 20, 60.0)
QUICK_HOT_PATH_SIZES = HotPathSizes(25, 10, 10, 8, 20.0)
"""Warm-ups: psycopg prepares a statement at its sixth use, a round trip counted once."""


@dataclass(frozen=True)
class Timed:
    """One timed delivery, milliseconds."""

    wall: float
    cpu: float
    store_wall: float
    store_cpu: float
    gateway_wall: float
    """The send runs in a thread of its own (its timeout): its CPU is not this thread's."""
    gaps: tuple[float, ...] = ()
    """Before each store checkout, ms since the delivery began or the store last
    gave its connection back: the pacing the paced floor repeats."""

    @property
    def python_cpu(self) -> float:
        """CPU of this thread outside the store's connections."""
        return self.cpu - self.store_cpu


@dataclass
class HotPathResult:
    wire: WireCount
    counted: int
    timed: list[Timed] = field(default_factory=list)
    floor_ms: list[float] = field(default_factory=list)
    """Single-row INSERT + COMMIT transactions, each, run back to back."""
    paced_floor_ms: list[float] = field(default_factory=list)
    """Per timed delivery: one such transaction per store checkout it made, each after
    the same gap that delivery had before that checkout (spun, as its Python is CPU)."""
    autocommit_ms: list[float] = field(default_factory=list)
    """Single-row INSERTs in autocommit (one round trip each), for reference."""
    profile: dict[str, float] = field(default_factory=dict)
    """Seconds by package over ``profiled`` deliveries."""
    profiled: int = 0
    cut_short: bool = False

    def per_delivery(self, value: float) -> float:
        return value / self.counted if self.counted else math.nan

    @property
    def round_trips(self) -> float:
        return self.per_delivery(self.wire.round_trips)

    @property
    def transactions(self) -> float:
        return self.per_delivery(self.wire.transactions)

    def _mean(self, values: list[float]) -> float:
        return sum(values) / len(values) if values else math.nan

    @property
    def store_ms(self) -> float:
        return self._mean([t.store_wall for t in self.timed])

    @property
    def python_ms(self) -> float:
        """celery_agboss's own code per delivery, from the profile (its store included)."""
        if not self.profiled:
            return math.nan
        own = sum(s for name, s in self.profile.items() if name.startswith(OWN_CODE))
        return own * 1000 / self.profiled

    @property
    def floor_per_delivery_ms(self) -> float:
        return self._mean(self.floor_ms) * self.transactions

    @property
    def paced_floor_per_delivery_ms(self) -> float:
        return self._mean(self.paced_floor_ms)

    def metrics(self) -> dict[str, float]:
        return {
            "round_trips_per_delivery": self.round_trips,
            "store_transactions_per_delivery": self.transactions,
            "floor_ms": self.floor_per_delivery_ms,
            "store_ms_per_delivery": self.store_ms,
            "store_to_floor_ratio": ratio(self.store_ms, self.floor_per_delivery_ms),
            "paced_floor_ms": self.paced_floor_per_delivery_ms,
            "store_to_paced_floor_ratio": ratio(self.store_ms, self.paced_floor_per_delivery_ms),
            "python_ms_per_delivery": self.python_ms,
        }

    def lines(self) -> list[str]:
        n = len(self.timed)
        wire = self.wire
        parts = " + ".join(
            f"{kind} {fmt(self.per_delivery(wire.exchanges[kind]), 2)}" for kind in KINDS
        )
        lines = [
            "Hot path of one single-charge delivery on PostgreSQL, in one process: a published "
            "PaymentTask delivered by apply(),",
            f"one self.outbound to an in-process fake gateway; {self.counted} deliveries counted "
            f"on the wire, {n} timed, {self.profiled} profiled",
            f"round trips per delivery (libpq trace: one per ReadyForQuery): "
            f"{fmt(self.round_trips, 2)} = {parts}",
            f"transactions per delivery: {fmt(self.transactions, 2)} "
            f"({fmt(self.per_delivery(wire.autocommit), 2)} of them autocommit statements), "
            f"on {wire.connections} traced connection(s)",
        ]
        rows = [
            self._row("delivery (wall)", [t.wall for t in self.timed]),
            self._row("  its thread's CPU", [t.cpu for t in self.timed]),
            self._row("  of which outside the store", [t.python_cpu for t in self.timed]),
            self._row("store: a pooled connection held (wall)", [t.store_wall for t in self.timed]),
            self._row("  of which CPU in this thread", [t.store_cpu for t in self.timed]),
            self._row("gateway fake's send (wall)", [t.gateway_wall for t in self.timed]),
            self._row(
                f"floor: {fmt(self.transactions, 2)} x one INSERT + COMMIT",
                [ms * self.transactions for ms in self.floor_ms],
            ),
            self._row("  one INSERT + COMMIT (BEGIN, INSERT, COMMIT)", self.floor_ms),
            self._row("  one autocommit INSERT (reference)", self.autocommit_ms),
            self._row("paced floor: the same, each after the delivery's gap", self.paced_floor_ms),
            self._row("  the gaps it repeats (sum)", [sum(t.gaps) for t in self.timed]),
        ]
        lines += [
            table(["per delivery", "mean ms", "p50 ms", "p95 ms"], rows),
            f"ratio: store / floor {fmt(ratio(self.store_ms, self.floor_per_delivery_ms), 2)}x"
            f" ({fmt(self.store_ms, 2)} ms against {fmt(self.floor_per_delivery_ms, 2)} ms)",
            f"ratio: store / paced floor "
            f"{fmt(ratio(self.store_ms, self.paced_floor_per_delivery_ms), 2)}x"
            f" ({fmt(self.store_ms, 2)} ms against {fmt(self.paced_floor_per_delivery_ms, 2)} ms)",
        ]
        if self.profile and self.profiled:
            total = sum(self.profile.values())
            prows = [
                [name, fmt(seconds * 1000 / self.profiled, 2), f"{seconds / total:.0%}"]
                for name, seconds in sorted(self.profile.items(), key=lambda kv: -kv[1])
                if seconds * 1000 / self.profiled >= 0.005
            ]
            lines += [
                f"Where a profiled delivery's time goes (cProfile, wall clock, "
                f"{fmt(total * 1000 / self.profiled, 1)} ms per delivery under the profiler; "
                "stdlib and builtins counted to their caller's package):",
                table(["package", "ms/delivery", "share"], prows),
                f"python_ms_per_delivery {fmt(self.python_ms, 2)}: the celery_agboss rows above "
                "(its own code, store included, and the stdlib it calls), under the profiler",
            ]
        return [*lines, ""]

    def _row(self, name: str, values: list[float]) -> list[str]:
        return [
            name,
            fmt(self._mean(values), 2),
            fmt(percentile(values, 0.5), 2),
            fmt(percentile(values, 0.95), 2),
        ]


class _Accounts:
    """Wall and CPU time of this thread while a pooled connection to ``database`` is
    checked out (the store's), and the wall time of the gateway's sends."""

    def __init__(self, database: str) -> None:
        self.database = database
        self.thread = threading.get_ident()
        self.active = False
        self.store_wall = self.store_cpu = 0.0
        self.gateway_wall = 0.0
        self.gaps: list[float] = []
        self.last_release = 0.0
        self._open: dict[int, tuple[float, float]] = {}
        # First checkout listener: the store's ping of an idle connection is inside.
        event.listen(Pool, "checkout", self._checkout, insert=True)
        event.listen(Pool, "checkin", self._checkin)

    def close(self) -> None:
        event.remove(Pool, "checkout", self._checkout)
        event.remove(Pool, "checkin", self._checkin)

    def _ours(self, dbapi_connection: Any) -> bool:
        driver = getattr(dbapi_connection, "driver_connection", dbapi_connection)
        info = getattr(driver, "info", None)
        return (
            self.active
            and threading.get_ident() == self.thread
            and getattr(info, "dbname", None) == self.database
        )

    def _checkout(self, dbapi_connection: Any, record: Any, proxy: Any) -> None:
        if self._ours(dbapi_connection):
            now = time.perf_counter()
            self.gaps.append((now - self.last_release) * 1000)
            self._open[id(record)] = (now, time.thread_time())

    def _checkin(self, dbapi_connection: Any, record: Any) -> None:
        started = self._open.pop(id(record), None)
        if started is not None and threading.get_ident() == self.thread:
            self.last_release = time.perf_counter()
            self.store_wall += self.last_release - started[0]
            self.store_cpu += time.thread_time() - started[1]

    @contextmanager
    def gateway(self) -> Iterator[None]:
        wall = time.perf_counter()
        try:
            yield
        finally:
            if self.active:
                self.gateway_wall += time.perf_counter() - wall

    def reset(self) -> None:
        self.store_wall = self.store_cpu = self.gateway_wall = 0.0
        self.gaps = []
        self.last_release = time.perf_counter()


class _World:
    """The app, its task and the in-process gateway, on the database at ``url``."""

    def __init__(self, url: str) -> None:
        from celery import Celery

        from celery_agboss import AGBoss, Completed, NotSent, OutboundCall, PaymentTask
        from celery_agboss.testing.gateway import FakeGateway

        self.database = str(make_url(url).database)
        self.accounts = _Accounts(self.database)
        self.gateway = FakeGateway()
        self.run_id = uuid.uuid4().hex[:8]
        gateway, accounts = self.gateway, self.accounts

        def send(call: Any) -> Any:
            with accounts.gateway():
                return gateway.charge(
                    call.request["amount"], call.idempotency_key, reference=call.request["order"]
                )

        def reconcile(call: Any, lookup: Any) -> Any:
            found = gateway.lookup(lookup.idempotency_key)
            return NotSent() if found is None else Completed(found)

        self.app = Celery(f"agboss_bench_hot_path_{self.run_id}", broker="memory://")
        self.app.conf.update(
            task_default_queue=f"bench-hot-path-{self.run_id}",
            agboss_database_url=url,
            agboss_pseudonym_key=PSEUDONYM_KEY,
            agboss_sweep_interval=0,
        )
        self.agboss = AGBoss(self.app)
        charge = self.agboss.register(
            OutboundCall(
                name="bench.hot_path.charge",
                send=send,
                reconcile=reconcile,
                key_retention=timedelta(hours=24),
            )
        )

        @self.app.task(base=PaymentTask, bind=True, shared=False, name=TASK_NAME)  # type: ignore[untyped-decorator]
        def hot_path_charge(self: Any, ref: str, amount: int = 1000) -> str:
            receipt = self.outbound(
                charge, {"amount": amount, "order": ref}, business_key=f"order:{ref}"
            )
            return str(receipt["id"])

        self.task = hot_path_charge
        self.made = 0

    def publish(self, count: int) -> list[str]:
        """``count`` tasks published (recorded ``REQUESTED``); their ids."""
        ids = []
        for _ in range(count):
            task_id = f"hot-{self.run_id}-{self.made}"
            self.task.apply_async(args=(task_id,), task_id=task_id)
            ids.append(task_id)
            self.made += 1
        return ids

    def deliver(self, task_id: str) -> None:
        result = self.task.apply(args=(task_id,), task_id=task_id)
        if result.state != "SUCCESS":
            raise RuntimeError(f"hot path delivery {task_id} ended {result.state}: {result.result}")

    def close(self) -> None:
        from celery_agboss.signals import disconnect

        self.accounts.close()
        disconnect(self.agboss)
        self.agboss.close()
        self.app.close()
        self.gateway.close()


class _Floor:
    """Single-row INSERT + COMMIT transactions on one psycopg connection of ``engine``'s
    pool: the store's database, server and connection settings, no SQLAlchemy between."""

    def __init__(self, engine: Any) -> None:
        self._raw = engine.raw_connection()
        self.conn: Any = self._raw.driver_connection
        self.conn.execute(
            f"CREATE TABLE IF NOT EXISTS {FLOOR_TABLE} "
            "(id bigserial PRIMARY KEY, ref text NOT NULL, at timestamptz NOT NULL DEFAULT now())"
        )
        self.conn.commit()
        self.made = 0

    def transaction(self) -> float:
        """One ``BEGIN``, single-row ``INSERT``, ``COMMIT`` (psycopg's default); ms."""
        self.made += 1
        started = time.perf_counter()
        self.conn.execute(f"INSERT INTO {FLOOR_TABLE} (ref) VALUES (%s)", (f"f{self.made}",))
        self.conn.commit()
        return (time.perf_counter() - started) * 1000

    def paced(self, gaps: tuple[float, ...]) -> float:
        """One transaction after each gap, the gap spent on this thread's CPU; ms, the
        transactions only."""
        total = 0.0
        for gap in gaps:
            until = time.perf_counter() + gap / 1000
            while time.perf_counter() < until:
                pass
            total += self.transaction()
        return total

    def autocommit(self) -> float:
        self.made += 1
        self.conn.autocommit = True
        try:
            started = time.perf_counter()
            self.conn.execute(f"INSERT INTO {FLOOR_TABLE} (ref) VALUES (%s)", (f"a{self.made}",))
            return (time.perf_counter() - started) * 1000
        finally:
            self.conn.autocommit = False

    def close(self) -> None:
        self._raw.close()


def _timed_delivery(world: _World, task_id: str) -> Timed:
    accounts = world.accounts
    accounts.reset()
    accounts.active = True
    wall, cpu = time.perf_counter(), time.thread_time()
    try:
        world.deliver(task_id)
    finally:
        accounts.active = False
    return Timed(
        (time.perf_counter() - wall) * 1000,
        (time.thread_time() - cpu) * 1000,
        accounts.store_wall * 1000,
        accounts.store_cpu * 1000,
        accounts.gateway_wall * 1000,
        tuple(accounts.gaps),
    )


OWN_CODE = "celery_agboss"
PACKAGES = (
    ("/celery_agboss/testing/", "gateway fake"),
    ("/celery_agboss/store/", "celery_agboss.store"),
    ("/celery_agboss/", "celery_agboss: engine, delivery, task"),
    ("/sqlalchemy/", "SQLAlchemy"),
    ("/psycopg", "psycopg (and waiting on the server)"),
    ("/celery/", "Celery, kombu"),
    ("/kombu/", "Celery, kombu"),
    ("/billiard/", "Celery, kombu"),
    ("/vine/", "Celery, kombu"),
    ("/bench/", "the benchmark's loop"),
)

FunctionKey = tuple[str, int, str]


def _package(key: FunctionKey) -> str | None:
    filename, _, name = key
    if filename == "~":
        return "psycopg (and waiting on the server)" if "psycopg" in name else None
    path = filename.replace("\\", "/")
    for marker, package in PACKAGES:
        if marker in path:
            return package
    return None  # stdlib or another library: its caller's


def profile_by_package(stats: pstats.Stats) -> dict[str, float]:
    """Own time by package; a function of no listed package gives its own time to its
    callers' packages in proportion to the time spent on each call edge."""
    raw: dict[FunctionKey, Any] = stats.stats  # type: ignore[attr-defined]
    owners: dict[FunctionKey, dict[str, float]] = {}

    def owner(key: FunctionKey, path: frozenset[FunctionKey]) -> dict[str, float]:
        if key in owners:
            return owners[key]
        package = _package(key)
        if package is not None:
            owners[key] = {package: 1.0}
            return owners[key]
        callers: dict[FunctionKey, tuple[Any, ...]] = raw[key][4] if key in raw else {}
        weights = {c: float(edge[2]) for c, edge in callers.items() if c not in path}
        if not weights or sum(weights.values()) <= 0:
            weights = {c: float(edge[1]) for c, edge in callers.items() if c not in path}
        total = sum(weights.values())
        if total <= 0:
            return {"other (no caller)": 1.0}
        share: dict[str, float] = {}
        for caller, weight in weights.items():
            for name, part in owner(caller, path | {key}).items():
                share[name] = share.get(name, 0.0) + part * weight / total
        owners[key] = share
        return share

    found: dict[str, float] = {}
    for key, entry in raw.items():
        for name, part in owner(key, frozenset()).items():
            found[name] = found.get(name, 0.0) + entry[2] * part
    found.pop("the benchmark's loop", None)
    return dict(found)


def run_hot_path_benchmark(
    url: str,
    folder: Path,
    sizes: HotPathSizes,
    progress: Callable[[str], None] = lambda _: None,
) -> HotPathResult:
    """Measure the hot path on the PostgreSQL database at ``url`` (migrated)."""
    world = _World(url)
    wire = WireTrace(world.database, folder)
    try:
        for task_id in world.publish(sizes.warmup):
            world.deliver(task_id)
        progress(f"  hot path: {sizes.counted} deliveries counted on the wire")
        ids = world.publish(sizes.counted)
        wire.start()
        for task_id in ids:
            world.deliver(task_id)
        result = HotPathResult(wire.stop(), sizes.counted)
        per = max(1, round(result.transactions)) if not math.isnan(result.transactions) else 1
        progress(f"  hot path: {sizes.deliveries} deliveries timed, {per} floor transactions each")
        floor = _Floor(world.agboss.store.engine)
        try:
            for _ in range(5):  # the floor's statement prepared, like the store's
                floor.transaction()
            ids = world.publish(sizes.deliveries)
            deadline = time.monotonic() + sizes.budget_seconds
            for start in range(0, len(ids), BLOCK):
                if time.monotonic() >= deadline:
                    result.cut_short = True
                    break
                block = ids[start : start + BLOCK]
                timed = [_timed_delivery(world, task_id) for task_id in block]
                result.timed += timed
                result.floor_ms += [floor.transaction() for _ in range(per * len(block))]
                result.paced_floor_ms += [floor.paced(t.gaps) for t in timed]
                result.autocommit_ms += [floor.autocommit() for _ in block]
        finally:
            floor.close()
        progress(f"  hot path: {sizes.profiled} deliveries profiled")
        ids = world.publish(sizes.profiled)
        profiler = cProfile.Profile()
        profiler.enable()
        try:
            for task_id in ids:
                world.deliver(task_id)
        finally:
            profiler.disable()
        result.profile = profile_by_package(pstats.Stats(profiler))
        result.profiled = len(ids)
        delivered = sizes.warmup + sizes.counted + sizes.profiled + len(result.timed)
        payments = len(world.gateway.payments)
        if payments != delivered:
            raise RuntimeError(
                f"hot path: {delivered} deliveries succeeded but the gateway made {payments} "
                "payments"
            )
        return result
    finally:
        wire.close()
        world.close()


__all__ = [
    "DEFAULT_HOT_PATH_SIZES",
    "QUICK_HOT_PATH_SIZES",
    "HotPathResult",
    "HotPathSizes",
    "profile_by_package",
    "run_hot_path_benchmark",
]
