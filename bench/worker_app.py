"""The Celery app of the end-to-end benchmark, in one of two modes.

``plain``: a plain ``@app.task`` that charges through the gateway over HTTP — what
the task looks like without celery_agboss; this mode imports nothing of
celery_agboss. ``agboss``: the same charge as a ``PaymentTask`` making one
``self.outbound`` call (no fenced effect): the price of protecting one single-charge
task. Both return how long the call itself took (``call_ms``), so the benchmark can
tell what ``self.outbound`` adds over the direct call.

The worker subprocess runs ``celery -A bench.worker_app:app`` with the config in
``AGBOSS_BENCH_CONFIG`` (JSON); the benchmark process builds the same app from the
same config with ``make_app`` to publish (and, in ``agboss`` mode, to record each
execution at publish, as every ``PaymentTask`` publisher does). When the config names
a ``transactions_folder``, the worker counts its store transactions by kind there
(``bench.transaction_kinds``): only in the benchmark, never in the product.
"""

from __future__ import annotations

import json
import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from celery import Celery

from bench.gateway_client import charge_over_http, lookup_over_http

CONFIG_ENV = "AGBOSS_BENCH_CONFIG"
PLAIN_TASK = "bench.plain_charge"
AGBOSS_TASK = "bench.agboss_charge"
PSEUDONYM_KEY = "bench-pseudonym-key-not-a-secret-0123456789"


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
        _plain_tasks(app, gateway)
    elif mode == "agboss":
        if config.get("retention_seconds"):  # the benchmark's own sweep, never the workers'
            seconds = float(config["retention_seconds"])
            app.conf.update(
                agboss_outbound_retention=seconds,
                agboss_fenced_effect_retention=seconds,
                agboss_execution_retention=seconds,
            )
        _agboss_tasks(app, gateway, config["database_url"])
    else:
        raise ValueError(f"unknown benchmark mode {mode!r}")
    return app


def _plain_tasks(app: Celery, gateway: str) -> None:
    @app.task(name=PLAIN_TASK, shared=False)  # type: ignore[untyped-decorator]
    def plain_charge(ref: str, amount: int = 1000) -> dict[str, Any]:
        started = time.perf_counter()
        receipt = charge_over_http(gateway, amount, f"plain:{ref}", ref)
        return {"payment": receipt["id"], "call_ms": (time.perf_counter() - started) * 1000}


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
        started = time.perf_counter()
        receipt = self.outbound(
            charge, {"amount": amount, "order": ref}, business_key=f"order:{ref}"
        )
        return {"payment": receipt["id"], "call_ms": (time.perf_counter() - started) * 1000}


def _count_transactions(config: dict[str, Any]) -> None:
    """Count this worker's store transactions by kind, in every process of it."""
    from celery import signals
    from sqlalchemy.engine import make_url

    from bench.transaction_kinds import TransactionCounter

    counter = TransactionCounter(
        Path(config["transactions_folder"]),
        "worker",
        str(make_url(config["database_url"]).database),
    )
    counter.install()  # every engine: the store is opened lazily, in each child
    for signal in (signals.worker_process_shutdown, signals.worker_shutdown):
        signal.connect(lambda *args, **kwargs: counter.flush(), weak=False)


def _from_environment() -> Celery | None:
    raw = os.environ.get(CONFIG_ENV)
    if not raw:
        return None
    config = json.loads(raw)
    if config.get("transactions_folder") and config["mode"] == "agboss":
        _count_transactions(config)
    return make_app(config)


app = _from_environment()

__all__ = ["AGBOSS_TASK", "CONFIG_ENV", "PLAIN_TASK", "app", "make_app"]
