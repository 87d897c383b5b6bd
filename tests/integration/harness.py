"""Real ``celery worker`` subprocesses, their shop app, a sweeper, and what tests read.

DESIGN §2.3 trap 14: the in-thread test worker cannot be killed alone and
pytest-celery needs Docker, so every test here starts ``python -m celery … worker``
in its own process group (killed by pid, whatever happens), with a queue of its
own, on a Redis database (or RabbitMQ) of its own, and a store of its own. The test
process builds the same app from the same config to publish, to read the store and
the result backend, and to run the real sweep as a beat would.

Speed-ups a deployment does not use (the README's deployment itself, with none of
them, is tests/deployment/): every worker is started with ``-Q <the test's queue>``
(isolation: tests share one RabbitMQ vhost; so it does not consume
``agboss.sweep``), ``--without-heartbeat --without-gossip --without-mingle``
(start-up time) and ``-E``; the app sets ``agboss_sweep_interval = 0`` and a test that
needs the sweep runs the real one itself (``Shop.sweeping``), a 5 s lease
(``agboss_lease_ttl``), a 1 s retry delay, and on Redis ``broker_transport_options``
with a 60 s visibility timeout and a 1 s unacked-restore interval (trap 14).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from celery import Celery
from kombu import Connection

from celery_agboss.app import AGBoss
from celery_agboss.core.executions import ExecutionRecord
from celery_agboss.core.store import IntentRecord
from celery_agboss.signals import disconnect
from tests.integration.apps.shop import CONFIG_ENV, make_app
from tests.integration.gateway_http import GatewayHTTPServer, wait_for
from tests.support.processes import ManagedProcess

REPO_ROOT = Path(__file__).resolve().parents[2]
WORKER_READY_SECONDS = 30.0
SWEEP_PERIOD_SECONDS = 0.5


@dataclass
class Shop:
    """One test's world: config, its app in the test process, the gateway, the workers."""

    config: dict[str, Any]
    app: Celery
    gateway: GatewayHTTPServer
    start_process: Callable[..., ManagedProcess]
    workers: list[ManagedProcess] = field(default_factory=list)

    @property
    def agboss(self) -> AGBoss:
        return AGBoss.of(self.app)

    # --- workers --------------------------------------------------------------------

    def start_worker(
        self,
        *,
        pool: str = "prefork",
        concurrency: int = 2,
        name: str | None = None,
        sabotage: tuple[str, ...] = (),
        config: dict[str, Any] | None = None,
    ) -> ManagedProcess:
        """A worker consuming this test's queue; ``sabotage`` switches protections off in it;
        ``config`` overrides this worker's config only (e.g. its broker URL, via a proxy)."""
        node = f"{name or 'w'}{len(self.workers) + 1}-{uuid.uuid4().hex[:6]}@%h"
        argv = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "tests.integration.apps.shop:app",
            "worker",
            "-P",
            pool,
            "-c",
            str(concurrency),
            "--without-heartbeat",
            "--without-gossip",
            "--without-mingle",
            "-Q",
            self.config["queue"],
            "-n",
            node,
            "-l",
            "info",
            "-E",  # task events, as a worker watched by Flower sends them
        ]
        env = {
            CONFIG_ENV: json.dumps({**self.config, **(config or {})}),
            "PYTHONPATH": str(REPO_ROOT),
            "AGBOSS_ALLOW_SABOTAGE": "1" if sabotage else "0",
            "AGBOSS_SABOTAGE_SUBPROCESS": str(os.getpid()) if sabotage else "",
            "AGBOSS_SABOTAGE": ",".join(sabotage),
        }
        process = self.start_process(argv, name=f"worker-{pool}", env=env, cwd=str(REPO_ROOT))
        self.workers.append(process)
        process.wait_until(
            lambda: " ready." in process.output(),
            WORKER_READY_SECONDS,
            message="the worker to be ready",
        )
        return process

    @staticmethod
    def children(worker: ManagedProcess) -> list[int]:
        """The pool processes of a prefork worker (the group minus its main process)."""
        return [pid for pid in worker.group_pids() if pid != worker.pid]

    # --- what tests read ------------------------------------------------------------

    def execution(self, execution_id: str) -> ExecutionRecord | None:
        return self.agboss.executions.read_execution(execution_id)

    def wait_state(self, execution_id: str, state: str, timeout: float = 30.0) -> ExecutionRecord:
        def reached() -> ExecutionRecord | None:
            record = self.execution(execution_id)
            return record if record is not None and record.state.value == state else None

        record: ExecutionRecord = wait_for(
            reached,
            timeout,
            lambda: f"{execution_id} to be {state} (is {self._state(execution_id)})",
        )
        return record

    def _state(self, execution_id: str) -> str:
        record = self.execution(execution_id)
        return "unknown" if record is None else record.state.value

    def backend_state(self, task_id: str) -> str:
        return str(self.app.AsyncResult(task_id).state)

    def wait_backend(self, task_id: str, state: str, timeout: float = 30.0) -> None:
        wait_for(
            lambda: self.backend_state(task_id) == state,
            timeout,
            lambda: (
                f"{task_id} to be {state} in the result backend (is {self.backend_state(task_id)})"
            ),
        )

    @staticmethod
    def assert_stays(predicate: Callable[[], bool], seconds: float) -> None:
        """``predicate`` holds now and for ``seconds`` (a negative claim needs a window)."""
        deadline = time.monotonic() + seconds
        while True:
            assert predicate(), "the condition stopped holding"
            if time.monotonic() >= deadline:
                return
            time.sleep(0.1)

    def broker_holds_nothing(self) -> bool:
        """Redis only: the test queue is empty and no message is waiting unacked."""
        client = redis.Redis.from_url(self.config["broker_url"])
        try:
            return client.llen(self.config["queue"]) == 0 and client.hlen("unacked") == 0
        finally:
            client.close()

    def worker_log(self) -> str:
        return "\n".join(worker.output() for worker in self.workers)

    def wait_logged(self, text: str, timeout: float = 15.0) -> None:
        """A worker writes its log line after the store change a test waited for: wait
        for the line too, never assert it at once."""
        wait_for(lambda: text in self.worker_log(), timeout, f"{text!r} in the worker log")

    @contextmanager
    def capturing_events(self) -> Iterator[list[dict[str, Any]]]:
        """Every task event on the broker while the block runs (what Flower would get)."""
        events: list[dict[str, Any]] = []
        ready = threading.Event()
        receivers: list[Any] = []

        def run() -> None:
            with self.app.connection_for_read() as connection:
                receiver = self.app.events.Receiver(
                    connection, handlers={"*": events.append}, app=self.app
                )
                receiver.on_consume_ready = lambda *args, **kwargs: ready.set()
                receivers.append(receiver)
                receiver.capture(limit=None, timeout=None, wakeup=False)

        thread = threading.Thread(target=run, name="it-events", daemon=True)
        thread.start()
        assert ready.wait(10), "the event receiver did not start"
        try:
            yield events
        finally:
            for receiver in receivers:
                receiver.should_stop = True
            thread.join(10)

    @staticmethod
    def flower_state(events: list[dict[str, Any]], task_id: str) -> list[str]:
        """The states Flower's event state machine gives the task, event by event."""
        from celery.events.state import State

        state = State()
        seen: list[str] = []
        for event in events:
            if event.get("uuid") == task_id:
                state.event(dict(event))
                seen.append(str(state.tasks[task_id].state))
        return seen

    # --- signals ------------------------------------------------------------------------

    def kill_the_child_holding_the_answer(self, name: str, order: str) -> str:
        """Publish ``name(order)``; SIGKILL the pool child whose charge the gateway has
        processed while its answer is held back; the task id."""
        hold = self.gateway.gateway.hold(operation="charge")
        result = self.app.signature(name, args=(order,)).apply_async()
        hold.wait_reached(timeout=20)
        self.kill(self.gateway.charge_pids[-1])
        hold.release()
        return str(result.id)

    @staticmethod
    def kill(pid: int) -> None:
        os.kill(pid, signal.SIGKILL)

    @staticmethod
    def stop(pid: int) -> None:
        os.kill(pid, signal.SIGSTOP)

    @staticmethod
    def cont(pid: int) -> None:
        os.kill(pid, signal.SIGCONT)

    # --- the sweep's re-drive -------------------------------------------------------------

    def wait_cancel_requested(self, execution_id: str, timeout: float = 10.0) -> ExecutionRecord:
        def requested() -> ExecutionRecord | None:
            record = self.execution(execution_id)
            return record if record is not None and record.cancel_requested else None

        record: ExecutionRecord = wait_for(
            requested, timeout, f"a cancel request on {execution_id}"
        )
        return record

    def intents_of(self, execution_id: str) -> list[IntentRecord]:
        """Every outbound-call intent the execution created, oldest first."""
        with self.agboss.store.read_transaction() as tx:
            return tx.list_intents(execution_id)

    def lease_of(self, execution_id: str) -> Any:
        """The execution's lease row as the store sees it now (``LeaseState`` or None)."""
        return self.agboss.store.read_lease(execution_id)

    def wait_lease_dead(self, execution_id: str, timeout: float = 30.0) -> None:
        """Until the execution's lease is no longer live (expired or released)."""
        wait_for(
            lambda: not getattr(self.lease_of(execution_id), "live", False),
            timeout,
            f"the lease of {execution_id} to expire",
        )

    def sweep_once(self) -> None:
        """One run of the real sweep (``celery_agboss.sweep.run_sweep``), as a beat would."""
        from celery_agboss.sweep import run_sweep

        run_sweep(self.agboss, claim_tick=False)

    @contextmanager
    def sweeping(self, period: float = SWEEP_PERIOD_SECONDS) -> Iterator[None]:
        """Run ``sweep_once`` in the background (a beat that fires every ``period``)."""
        stop = threading.Event()
        errors: list[BaseException] = []

        def loop() -> None:
            while not stop.wait(period):
                try:
                    self.sweep_once()
                except Exception as exc:  # reported when the block ends
                    errors.append(exc)
                    return

        thread = threading.Thread(target=loop, name="it-sweeper", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(10)
        if errors:
            raise errors[0]

    def close(self) -> None:
        for worker in self.workers:
            worker.close()
        if self.config["broker_url"].startswith("amqp"):
            with Connection(self.config["broker_url"], connect_timeout=5) as connection:
                connection.default_channel.queue_delete(self.config["queue"])
        agboss = AGBoss.of(self.app)
        disconnect(agboss)
        agboss.close()
        self.app.close()


ShopFactory = Callable[..., Shop]


def make_shop(
    *,
    broker_url: str,
    backend_url: str,
    database_url: str,
    gateway: GatewayHTTPServer,
    start_process: Callable[..., ManagedProcess],
    **overrides: Any,
) -> Shop:
    config: dict[str, Any] = {
        "queue": f"it-{uuid.uuid4().hex[:10]}",
        "broker_url": broker_url,
        "backend_url": backend_url,
        "database_url": database_url,
        "gateway_url": gateway.url,
        "lease_ttl": 5,
        "visibility_timeout": 60,
        "retry_delay": 1,
    }
    config.update(overrides)
    return Shop(config=config, app=make_app(config), gateway=gateway, start_process=start_process)


__all__ = ["Shop", "ShopFactory", "make_shop"]
