"""The Celery app of the renewal benchmark: a ``PaymentTask`` that holds its lease.

``bench.hold_lease(seconds)`` does nothing but sleep inside its delivery, so the only
statements its worker sends while it sleeps are the lease renewals. Every statement
the worker process sends from the renewer's thread is written, with its time, to the
JSON-lines file named in the config (``AGBOSS_RENEWAL_BENCH_CONFIG``), and so are the
start and the end of each task body: the benchmark counts from that file.

The worker runs ``celery -A bench.renewal_worker:app worker -P threads -c 50``; the
benchmark builds the same app with ``make_app`` to publish (a ``PaymentTask`` is
recorded in the store at publish).
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

from celery import Celery
from sqlalchemy import event
from sqlalchemy.engine import Engine

CONFIG_ENV = "AGBOSS_RENEWAL_BENCH_CONFIG"
TASK_NAME = "bench.hold_lease"
RENEWER_THREAD = "agboss-lease-renewer"  # the name celery_agboss.core.lease gives it


class EventLog:
    """Appends one JSON line per event; shared by the worker's threads."""

    def __init__(self, path: str) -> None:
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - lives as the process
        self._lock = threading.Lock()

    def write(self, **fields: Any) -> None:
        line = json.dumps({"t": time.time(), "pid": os.getpid(), **fields})
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()


def _count_renewer_statements(log: EventLog) -> None:
    """Every statement any engine of this process sent from the renewer's thread, with the
    rows it touched (for the renewal ``UPDATE``: how many leases it renewed)."""

    def seen(conn: Any, cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        if threading.current_thread().name != RENEWER_THREAD:
            return
        words = statement.split()
        log.write(
            kind="statement",
            verb=words[0].upper() if words else "",
            table=next((w for w in words if w.startswith("agboss_")), ""),
            renews="UPDATE agboss_leases" in " ".join(words),
            rows=cursor.rowcount,
        )

    event.listen(Engine, "after_cursor_execute", seen)


def make_app(config: dict[str, Any], *, worker: bool = False) -> Celery:
    from celery_agboss import AGBoss
    from celery_agboss.task import PaymentTask

    app = Celery("agboss_renewal_bench", broker=config["broker_url"])
    app.conf.update(
        task_default_queue=config["queue"],
        task_ignore_result=True,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        agboss_database_url=config["database_url"],
        agboss_pseudonym_key="renewal-bench-pseudonym-key-not-a-secret",
        agboss_lease_ttl=config["lease_ttl"],
        agboss_sweep_interval=0,  # no beat, no workers' own sweeps: renewals only
    )
    AGBoss(app)
    log = EventLog(config["log"]) if worker else None
    if log is not None:
        _count_renewer_statements(log)

    @app.task(base=PaymentTask, bind=True, name=TASK_NAME, shared=False)  # type: ignore[untyped-decorator]
    def hold_lease(self: Any, seconds: float) -> str:
        """Sleep inside the delivery's lease; the renewer keeps it alive meanwhile."""
        if log is not None:
            log.write(kind="start", task=self.request.id)
        time.sleep(seconds)
        if log is not None:
            log.write(kind="end", task=self.request.id)
        return "held"

    return app


def _app_from_env() -> Celery | None:
    raw = os.environ.get(CONFIG_ENV)
    return None if raw is None else make_app(json.loads(raw), worker=True)


app = _app_from_env()

__all__ = ["CONFIG_ENV", "RENEWER_THREAD", "TASK_NAME", "app", "make_app"]
