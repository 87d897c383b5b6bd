"""The Celery app of the end-to-end benchmark, in one of two modes.

``plain``: a plain ``@app.task`` that charges through the gateway and INSERTs the
payment row in its own transaction — what the task looks like without
celery_agboss; this mode imports nothing of celery_agboss. ``agboss``: the same
work as a ``PaymentTask``: one ``self.outbound`` call and one ``self.fenced_effect``.

The worker subprocess runs ``celery -A bench.worker_app:app`` with the config in
``AGBOSS_BENCH_CONFIG`` (JSON); the benchmark process builds the same app from the
same config with ``make_app`` to publish (and, in ``agboss`` mode, to record each
execution at publish, as every ``PaymentTask`` publisher does).
"""

from __future__ import annotations

import json
import os
import threading
from datetime import timedelta
from typing import Any

from celery import Celery
from sqlalchemy import create_engine, event, insert
from sqlalchemy.engine import Connection, Engine

from bench.databases import bench_payments
from bench.gateway_client import charge_over_http, lookup_over_http

CONFIG_ENV = "AGBOSS_BENCH_CONFIG"
PLAIN_TASK = "bench.plain_charge"
AGBOSS_TASK = "bench.agboss_charge"
PSEUDONYM_KEY = "bench-pseudonym-key-not-a-secret-0123456789"


def insert_row(conn: Connection, ref: str, receipt: dict[str, Any]) -> str:
    conn.execute(
        insert(bench_payments).values(ref=ref, payment_id=receipt["id"], amount=receipt["amount"])
    )
    return str(receipt["id"])


class _PlainEngine:
    """A plain app's SQLAlchemy engine, made in each process on first use (never
    inherited across the prefork pool's fork)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._lock = threading.Lock()
        self._pid = 0
        self._engine: Engine | None = None

    def get(self) -> Engine:
        with self._lock:
            if self._engine is None or self._pid != os.getpid():
                self._engine = self._make()
                self._pid = os.getpid()
            return self._engine

    def _make(self) -> Engine:
        if not self.url.startswith("sqlite"):
            return create_engine(self.url)
        engine = create_engine(self.url, connect_args={"timeout": 30, "check_same_thread": False})

        @event.listens_for(engine, "connect")
        def _wal(dbapi_connection: Any, _record: Any) -> None:
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode = WAL")
            cursor.execute("PRAGMA busy_timeout = 30000")
            cursor.close()

        return engine


def make_app(config: dict[str, Any]) -> Celery:
    mode = config["mode"]
    gateway = config["gateway_url"]
    app = Celery(f"agboss_bench_{mode}", broker=config["broker_url"])
    app.conf.update(
        result_backend=config["broker_url"],
        task_default_queue=config["queue"],
        broker_connection_retry_on_startup=True,
    )
    if mode == "plain":
        _plain_tasks(app, gateway, _PlainEngine(config["database_url"]))
    elif mode == "agboss":
        _agboss_tasks(app, gateway, config["database_url"])
    else:
        raise ValueError(f"unknown benchmark mode {mode!r}")
    return app


def _plain_tasks(app: Celery, gateway: str, engine: _PlainEngine) -> None:
    @app.task(name=PLAIN_TASK, shared=False)  # type: ignore[untyped-decorator]
    def plain_charge(ref: str, amount: int = 1000) -> dict[str, Any]:
        receipt = charge_over_http(gateway, amount, f"plain:{ref}", ref)
        with engine.get().begin() as conn:
            insert_row(conn, ref, receipt)
        return {"payment": receipt["id"]}


def _agboss_tasks(app: Celery, gateway: str, database_url: str) -> None:
    from celery_agboss import AGBoss, Completed, NotSent, OutboundCall, PaymentTask

    app.conf.update(
        agboss_database_url=database_url,
        agboss_pseudonym_key=PSEUDONYM_KEY,
        agboss_sweep_interval=0,
    )
    agboss = AGBoss(app)

    def send(call: Any) -> Any:
        request = call.request
        return charge_over_http(gateway, request["amount"], call.idempotency_key, request["order"])

    def reconcile(call: Any, lookup: Any) -> Any:
        found = lookup_over_http(gateway, lookup.idempotency_key)
        return NotSent() if found is None else Completed(found)

    charge = agboss.register(
        OutboundCall(
            name="bench.charge",
            send=send,
            reconcile=reconcile,
            key_retention=timedelta(hours=24),
        )
    )

    @app.task(base=PaymentTask, bind=True, shared=False, name=AGBOSS_TASK)  # type: ignore[untyped-decorator]
    def agboss_charge(self: Any, ref: str, amount: int = 1000) -> dict[str, Any]:
        key = f"order:{ref}"
        receipt = self.outbound(charge, {"amount": amount, "order": ref}, business_key=key)
        self.fenced_effect("mark-paid", lambda conn: insert_row(conn, ref, receipt), key)
        return {"payment": receipt["id"]}


def _from_environment() -> Celery | None:
    raw = os.environ.get(CONFIG_ENV)
    return make_app(json.loads(raw)) if raw else None


app = _from_environment()

__all__ = ["AGBOSS_TASK", "CONFIG_ENV", "PLAIN_TASK", "app", "make_app"]
