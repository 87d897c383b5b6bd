"""The engine-level micro benchmark: no broker, no Celery, one thread.

One celery_agboss execution is what a ``PaymentTask`` delivery does below Celery:
``ExecutionContext.start`` (acquire the lease), one ``outbound`` call against an
in-process ``FakeGateway`` (intent recorded, sent, settled), one ``fenced_effect``
(an INSERT in the transaction that checks the lease), and the release on leaving
the ``with`` block. The plain side does the same useful work with no protection:
one direct ``gateway.charge`` and one plain INSERT of the same row in its own
transaction, on an engine configured like the store's (same WAL and fsync
settings on SQLite), so the ratio is the protocol's price, not a pragma's.

The two sides run interleaved in blocks, so a background load slows both alike.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import event, func, insert, select
from sqlalchemy.engine import Connection, Engine

from bench.databases import bench_payments
from bench.stats import LatencySample

PSEUDONYM_KEY = b"bench-pseudonym-key-not-a-secret-0123456789"
BLOCK = 25
"""Executions of one side before switching to the other."""


@dataclass(frozen=True)
class SqlCount:
    """SQL statements and transactions per execution (averaged over the timed ones)."""

    statements: float
    transactions: float


@dataclass(frozen=True)
class EngineResult:
    backend: str
    plain: LatencySample
    agboss: LatencySample
    cut_short: bool
    """True when the time budget ended the run before ``executions`` per side."""
    plain_sql: SqlCount
    agboss_sql: SqlCount


class _SqlCounter:
    """Counts what one engine sends: statements (BEGIN on SQLite included) and commits."""

    def __init__(self, engine: Engine) -> None:
        self.statements = 0
        self.commits = 0
        event.listen(engine, "before_cursor_execute", self._statement)
        event.listen(engine, "commit", self._commit)

    def _statement(self, *args: Any) -> None:
        self.statements += 1

    def _commit(self, *args: Any) -> None:
        self.commits += 1

    def reset(self) -> None:
        self.statements = self.commits = 0

    def per(self, executions: int) -> SqlCount:
        if executions == 0:
            return SqlCount(float("nan"), float("nan"))
        return SqlCount(self.statements / executions, self.commits / executions)


@dataclass(frozen=True)
class EngineSizes:
    executions: int
    warmup: int
    budget_seconds: float


def _insert_row(conn: Connection, ref: str, receipt: dict[str, Any]) -> str:
    conn.execute(
        insert(bench_payments).values(ref=ref, payment_id=receipt["id"], amount=receipt["amount"])
    )
    return str(receipt["id"])


class _Sides:
    """The two ways of doing one payment, against one store and one gateway."""

    def __init__(self, url: str) -> None:
        from celery_agboss.core.engine_settings import EngineSettings
        from celery_agboss.core.outbound import Completed, NotSent, OutboundCall
        from celery_agboss.store.databases import create_store_engine
        from celery_agboss.store.sqlalchemy_store import SQLAlchemyStore
        from celery_agboss.testing.gateway import FakeGateway

        self.run_id = uuid.uuid4().hex[:8]
        self.gateway = FakeGateway()
        gateway = self.gateway

        def send(call: Any) -> Any:
            return gateway.charge(
                call.request["amount"], call.idempotency_key, reference=call.request["order"]
            )

        def reconcile(call: Any, lookup: Any) -> Any:
            found = gateway.lookup(lookup.idempotency_key)
            return NotSent() if found is None else Completed(found)

        self.call = OutboundCall(
            name="bench.charge",
            send=send,
            reconcile=reconcile,
            key_retention=timedelta(hours=24),
            transaction_id=lambda result: result.get("id") if isinstance(result, dict) else None,
        )
        self.settings = EngineSettings(
            pseudonym_key=PSEUDONYM_KEY,
            lease_ttl_ms=30_000,
            attempt_timeout_ms=10_000,
            registry={self.call.name: self.call},
        )
        self.store = SQLAlchemyStore(url)
        self.plain_engine = create_store_engine(url)
        self.plain_sql = _SqlCounter(self.plain_engine)
        self.agboss_sql = _SqlCounter(self.store.engine)

    def close(self) -> None:
        self.store.close()
        self.plain_engine.dispose()
        self.gateway.close()

    def plain(self, i: int) -> None:
        ref = f"plain-{self.run_id}-{i}"
        receipt = self.gateway.charge(1000, f"plain:{ref}", reference=ref)
        with self.plain_engine.begin() as conn:
            _insert_row(conn, ref, receipt)

    def agboss(self, i: int) -> None:
        from celery_agboss.core.execution_context import ExecutionContext

        ref = f"agboss-{self.run_id}-{i}"
        key = f"order:{ref}"
        with ExecutionContext.start(self.store, f"exec-{ref}", self.settings) as ctx:
            receipt = ctx.outbound(self.call, {"amount": 1000, "order": ref}, business_key=key)
            ctx.fenced_effect("mark-paid", lambda conn: _insert_row(conn, ref, receipt), key)

    def rows(self) -> int:
        with self.plain_engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(bench_payments)).scalar_one())


def _timed(fn: Callable[[int], None], i: int, into: list[float]) -> None:
    start = time.perf_counter()
    fn(i)
    into.append(time.perf_counter() - start)


def run_engine_benchmark(backend: str, url: str, sizes: EngineSizes) -> EngineResult:
    """``sizes.executions`` per side (fewer if the time budget ends first), interleaved."""
    sides = _Sides(url)
    try:
        discard: list[float] = []
        for i in range(sizes.warmup):
            _timed(sides.plain, -1 - i, discard)
            _timed(sides.agboss, -1 - i, discard)
        plain: list[float] = []
        agboss: list[float] = []
        sides.plain_sql.reset()
        sides.agboss_sql.reset()
        deadline = time.monotonic() + sizes.budget_seconds
        done = 0
        cut_short = False
        while done < sizes.executions:
            if time.monotonic() >= deadline:
                cut_short = True
                break
            block = range(done, min(done + BLOCK, sizes.executions))
            for i in block:
                _timed(sides.plain, i, plain)
            for i in block:
                _timed(sides.agboss, i, agboss)
            done = block.stop
        plain_sql, agboss_sql = sides.plain_sql.per(done), sides.agboss_sql.per(done)
        expected = 2 * (sizes.warmup + done)
        made, rows = len(sides.gateway.payments), sides.rows()
        if made != expected or rows != expected:
            raise RuntimeError(
                f"engine benchmark on {backend}: expected {expected} payments and rows, "
                f"found {made} payments and {rows} rows"
            )
        return EngineResult(
            backend,
            LatencySample(tuple(plain)),
            LatencySample(tuple(agboss)),
            cut_short,
            plain_sql,
            agboss_sql,
        )
    finally:
        sides.close()


__all__ = ["EngineResult", "EngineSizes", "run_engine_benchmark"]
