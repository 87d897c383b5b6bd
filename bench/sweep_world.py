"""What the sweep benchmark runs on: one loaded database, its app, and its sweep passes.

A ``SweptDatabase`` holds one size's history (``bench.sweep_rows``), a Celery app on
an in-memory broker with ``AGBoss`` on that database, and a recorder of the store's
statements. Each ``round`` times a pass over history alone (``idle``), adds the
stranded rows, times the pass that reconciles and re-drives them, then ends those
executions as their re-driven deliveries would, so the next round starts from the
same state. ``plans`` shows every statement of a timed pass with its plan.
"""

from __future__ import annotations

import re
import sqlite3
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from sqlalchemy import event, text
from sqlalchemy.engine import Engine

from bench.sweep_rows import CALL_NAME, load_stranded, load_terminal

TICK_SECONDS = 3.0
"""The sweep claims its tick as beat's does; a short tick lets the next pass claim its own.
Also the reconcile step's time budget (one interval): long enough for the pass's 50
lookups on a loaded machine, which at 1 s sometimes left some for the next pass."""


@dataclass(frozen=True)
class QueryPlan:
    statement: str
    parameters: str
    plan: str

    @property
    def full_scans(self) -> tuple[str, ...]:
        """Tables read whole: PostgreSQL ``Seq Scan on t``, SQLite ``SCAN t`` (also ``USING
        INDEX``: a walk of a whole index is no better, unless it holds sweepers' rows
        only)."""
        found = re.findall(r"Seq Scan on (\w+)", self.plan)
        for table, index in re.findall(
            r"\bSCAN (\w+)(?: USING (?:COVERING )?INDEX (\w+))?", self.plan
        ):
            if index not in SWEEPER_ROW_INDEXES:
                found.append(table)
        return tuple(dict.fromkeys(found))


SWEEPER_ROW_INDEXES = frozenset(
    {"ix_agboss_leases_sweeper_scope", "ix_agboss_outbound_calls_sweeper_owner"}
)
"""Partial indexes of sweepers' rows only (a handful): walking one whole is no scan of
history. The store's other partial indexes grow with history and count."""


@contextmanager
def _runtime(url: str) -> Iterator[Any]:
    """A Celery app on an in-memory broker with ``AGBoss`` set up on ``url``; the lookup of
    the bench call finds every payment (the sweep stores it and never sends)."""
    from celery import Celery

    from celery_agboss import AGBoss, Completed, OutboundCall
    from celery_agboss.signals import disconnect

    def never_send(call: Any) -> Any:  # pragma: no cover - the sweep never sends
        raise AssertionError("the sweep sent a payment")

    def found(call: Any, lookup: Any) -> Any:
        return Completed({"id": f"pay_{call.idempotency_key[-40:]}"})

    app = Celery(f"sweep_bench_{uuid.uuid4().hex[:8]}", broker="memory://")
    app.conf.update(
        agboss_database_url=url,
        agboss_pseudonym_key="sweep-bench-pseudonym-key-not-a-secret",
        task_default_queue="payments",
    )
    agboss = AGBoss(app)
    agboss.register(
        OutboundCall(
            name=CALL_NAME,
            send=never_send,
            reconcile=found,
            key_retention=timedelta(hours=24),
            transaction_id=lambda result: result.get("id"),
        )
    )
    try:
        yield agboss
    finally:
        disconnect(agboss)
        agboss.close()
        app.close()


class _Statements:
    """Every statement the store's engine sends while ``recording``; the first parameters
    of each distinct text are kept for its plan."""

    def __init__(self, engine: Engine) -> None:
        self.recording = False
        self.count = 0
        self.first: dict[str, Any] = {}
        event.listen(engine, "before_cursor_execute", self._seen)

    def _seen(self, conn: Any, cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        if self.recording:
            self.count += 1
            self.first.setdefault(statement, parameters)


def _sweep_once(agboss: Any) -> tuple[float, Any]:
    """One pass, as beat runs it (claiming its tick); timed from its start to its end."""
    from celery_agboss.sweep import run_sweep

    for _ in range(5):
        started = time.perf_counter()
        report = run_sweep(agboss, claim_tick=True, interval_seconds=TICK_SECONDS, by="bench")
        elapsed = time.perf_counter() - started
        if report.ran:
            return elapsed, report
        time.sleep(TICK_SECONDS)  # the previous pass took this tick
    raise RuntimeError("the sweep found its tick taken five times in a row")


# What the re-driven deliveries would do: end their executions (and leases).
_FINISH = (
    "UPDATE agboss_leases SET released = true"
    " WHERE scope IN (SELECT id FROM agboss_executions WHERE state = 'RUNNING')",
    "UPDATE agboss_executions SET state = 'COMPLETED', terminal_at_ms = :now,"
    " updated_at_ms = :now WHERE state = 'RUNNING'",
)


@dataclass
class SweptDatabase:
    """One size: its database loaded, and the passes timed on it so far."""

    backend: str
    terminal: int
    stranded: int
    load_seconds: float
    agboss: Any
    loader: Engine
    recorder: _Statements
    idle_seconds: list[float] = field(default_factory=list)
    sweep_seconds: list[float] = field(default_factory=list)
    reports: list[Any] = field(default_factory=list)
    statements: int = 0

    def round(self, prefix: str) -> None:
        """An idle pass, then the stranded rows and the pass over them (both timed)."""
        idle, _ = _sweep_once(self.agboss)
        self.idle_seconds.append(idle)
        with self.loader.begin() as conn:
            load_stranded(conn, self.stranded, self.agboss.store.now_ms(), prefix)
        self.recorder.recording, self.recorder.count = True, 0
        elapsed, report = _sweep_once(self.agboss)
        self.recorder.recording = False
        self.sweep_seconds.append(elapsed)
        self.reports.append(report)
        self.statements = self.recorder.count
        self._check(report)
        with self.loader.begin() as conn:
            for statement in _FINISH:
                conn.execute(text(statement), {"now": self.agboss.store.now_ms()})

    def _check(self, report: Any) -> None:
        """The pass did its work: every stranded execution re-driven, every intent found."""
        wanted = (self.stranded, self.stranded // 2, 0)
        done = (report.republished, report.reconciled, report.errors)
        if done != wanted:
            raise RuntimeError(
                f"the sweep over {self.terminal} + {self.stranded} did not do its work: "
                f"(republished, reconciled, errors) = {done}, not {wanted}"
            )

    def plans(self, prefix: str) -> list[QueryPlan]:
        """Every statement of the last timed pass, with its plan over a fresh set of
        stranded rows (each in a transaction rolled back: ANALYZE runs the statement)."""
        with self.loader.begin() as conn:
            load_stranded(conn, self.stranded, self.agboss.store.now_ms(), prefix)
        return _plans(self.loader, self.recorder.first, self.backend)


@contextmanager
def swept_database(url: str, backend: str, terminal: int, stranded: int) -> Iterator[SweptDatabase]:
    """``url`` loaded with ``terminal`` executions of history, analysed, with its app."""
    from celery_agboss.store.databases import create_store_engine

    with ExitStack() as stack:
        loader = create_store_engine(url)  # on SQLite: the store's busy timeout and WAL
        stack.callback(loader.dispose)
        agboss = stack.enter_context(_runtime(url))
        started = time.perf_counter()
        with loader.begin() as conn:
            if backend == "postgresql":
                conn.exec_driver_sql("SET LOCAL synchronous_commit = off")
            load_terminal(conn, terminal, agboss.store.now_ms())
        if backend == "postgresql":  # statistics, as autovacuum keeps them
            with loader.connect() as conn:
                conn.exec_driver_sql("ANALYZE")
                conn.commit()
        else:
            # SQLite: no ANALYZE, as the store never runs it (without statistics its
            # planner takes every usable index as selective); the bulk load's write-ahead
            # log folded into the database, as it long would be in production.
            _checkpoint(str(loader.url.database))
        loaded = time.perf_counter() - started
        recorder = _Statements(agboss.store.engine)
        yield SweptDatabase(backend, terminal, stranded, loaded, agboss, loader, recorder)


def _checkpoint(path: str) -> None:
    """Outside any transaction (the store's connections always open one)."""
    connection = sqlite3.connect(path)
    try:
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        connection.close()


def _explain(raw: Any, statement: str, parameters: Any) -> list[Any]:
    cursor = raw.cursor()
    try:
        cursor.execute(statement, parameters)
        return list(cursor.fetchall())
    finally:
        cursor.close()
        raw.rollback()


_EXPLAINABLE = re.compile(r"^\s*(SELECT|INSERT|UPDATE|DELETE|WITH)\b", re.I)


def _plans(engine: Engine, statements: dict[str, Any], backend: str) -> list[QueryPlan]:
    prefix = "EXPLAIN (ANALYZE, BUFFERS) " if backend == "postgresql" else "EXPLAIN QUERY PLAN "
    plans: list[QueryPlan] = []
    raw = engine.raw_connection()
    try:
        for statement, parameters in statements.items():
            if not _EXPLAINABLE.match(statement):
                continue
            note = ""
            try:
                rows = _explain(raw, prefix + statement, parameters)
            except Exception as exc:
                # A write replayed with its first parameters may collide with the row it
                # made (a history row's sequence number): its plan without running it.
                note = f"(plan only: run again it fails with {type(exc).__name__})\n"
                rows = _explain(raw, "EXPLAIN " + statement, parameters)
            # PostgreSQL: one text column; SQLite: (id, parent, notused, detail).
            plan = "\n".join(str(row[0] if backend == "postgresql" else row[-1]) for row in rows)
            plans.append(QueryPlan(" ".join(statement.split()), repr(parameters), note + plan))
    finally:
        raw.close()
    return plans


__all__ = ["TICK_SECONDS", "QueryPlan", "SweptDatabase", "swept_database"]
