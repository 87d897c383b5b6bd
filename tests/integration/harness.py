"""Real ``celery worker`` subprocesses, their shop app, a sweeper, and what tests read.

The in-thread test worker (design: trap 14) cannot be killed alone and
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
with a 60 s visibility timeout and a 1 s unacked-restore interval (design: trap 14).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

import redis
from celery import Celery
from kombu import Connection

from celery_agboss.app import AGBoss
from celery_agboss.core.executions import ExecutionRecord
from celery_agboss.core.store_protocol import IntentRecord
from celery_agboss.signals import disconnect
from tests.integration.apps import shop as shop_app
from tests.integration.broker_proxy import BrokerProxy
from tests.integration.gateway_http import GatewayHTTPServer, wait_for
from tests.support.processes import ManagedProcess, assert_stays, every, signal_process

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
    app_module: ModuleType = shop_app
    """The module the workers run (``-A <module>:app``): its ``make_app(config)`` built
    ``app``, and its ``CONFIG_ENV`` carries the config to them."""

    @property
    def agboss(self) -> AGBoss:
        return AGBoss.of(self.app)

    def publish(self, name: str, *args: Any, **kwargs: Any) -> str:
        """Publish ``name(*args, **kwargs)`` from the test process; the task id (which is
        also its execution id) that the waits and reads of this class take."""
        return str(self.app.signature(name, args=args, kwargs=kwargs).apply_async().id)

    # --- workers --------------------------------------------------------------------

    def start_worker(
        self,
        *,
        pool: str = "prefork",
        concurrency: int = 2,
        name: str | None = None,
        sabotage: tuple[str, ...] = (),
        config: dict[str, Any] | None = None,
        ready: bool = True,
    ) -> ManagedProcess:
        """A worker of ``app_module`` consuming this test's queue; ``sabotage`` switches
        protections off in it; ``config`` overrides this worker's config only (e.g. its
        broker URL, via a proxy); ``ready=False`` returns before it is ready (then
        ``wait_ready``), so that several workers start side by side."""
        node = f"{name or 'w'}{len(self.workers) + 1}-{uuid.uuid4().hex[:6]}@%h"
        argv = [
            sys.executable,
            *("-m", "celery", "-A", f"{self.app_module.__name__}:app", "worker"),
            *("-P", pool, "-c", str(concurrency), "-Q", self.config["queue"], "-n", node),
            *("--without-heartbeat", "--without-gossip", "--without-mingle", "-l", "info"),
            "-E",  # task events, as a worker watched by Flower sends them
        ]
        env = {
            self.app_module.CONFIG_ENV: json.dumps({**self.config, **(config or {})}),
            "PYTHONPATH": str(REPO_ROOT),
            "AGBOSS_ALLOW_SABOTAGE": "1" if sabotage else "0",
            "AGBOSS_SABOTAGE_SUBPROCESS": str(os.getpid()) if sabotage else "",
            "AGBOSS_SABOTAGE": ",".join(sabotage),
        }
        process = self.start_process(argv, name=f"worker-{pool}", env=env, cwd=str(REPO_ROOT))
        self.workers.append(process)
        if ready:
            self.wait_ready(process)
        return process

    @staticmethod
    def wait_ready(process: ManagedProcess) -> None:
        process.wait_until(
            lambda: " ready." in process.output(),
            WORKER_READY_SECONDS,
            message="the worker to be ready",
        )

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

    assert_stays = staticmethod(assert_stays)

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

    def a_killed_child_reconciled(self, order: str) -> tuple[str, ExecutionRecord]:
        """Trap 4 with celery_agboss: a worker (and the sweep) run
        ``it.charge_order(order)`` and its pool child is killed holding the answer; the
        execution completes, its result stored, on one payment from one request
        (reconciled by a lookup, never sent again). The task id and its record."""
        self.start_worker()
        with self.sweeping():
            task_id = self.kill_the_child_holding_the_answer("it.charge_order", order)
            record = self.wait_state(task_id, "COMPLETED", timeout=45)
        self.wait_backend(task_id, "SUCCESS")
        assert len(self.gateway.gateway.payments) == 1
        assert len(self.gateway.gateway.requests) == 1, "reconciled by a lookup, never sent again"
        return task_id, record

    def a_killed_child_without_agboss_pays_twice(self, order: str) -> None:
        """The twin of ``a_killed_child_reconciled``: plain Celery's redelivery of the
        killed charge charges the order a second time."""
        self.start_worker()
        task_id = self.kill_the_child_holding_the_answer("it.plain_charge", order)
        self.wait_backend(task_id, "SUCCESS")
        assert len(self.gateway.gateway.payments) == 2

    # --- a broker that drops the worker's connections ------------------------------------

    def cut_under_a_running_charge(
        self, proxy: BrokerProxy, order: str, timeout: float
    ) -> tuple[str, ExecutionRecord]:
        """``it.charge_order(order)`` runs, its charge processed and the answer held; the
        worker's broker connections are cut, so the broker gives the message back while
        the body runs. Waits (``timeout``) for the returned copy to meet the live lease
        and be deferred, then lets the answer through. The task id and its COMPLETED record."""
        hold = self.gateway.gateway.hold(operation="charge")  # processed; the answer waits
        task_id = self.publish("it.charge_order", order)
        hold.wait_reached(timeout=20)
        assert proxy.cut_all() > 0, "the worker's broker connections were cut"
        wait_for(
            lambda: f"execution.deferred execution_id={task_id}" in self.worker_log(),
            timeout,
            "the returned copy to meet the live lease",
        )
        hold.release()
        return task_id, self.wait_state(task_id, "COMPLETED", timeout=30)

    def cut_under_a_plain_charge(
        self, proxy: BrokerProxy, order: str, timeout: float
    ) -> tuple[str, list[Any]]:
        """The twin, without celery_agboss: ``it.plain_charge(order)`` waits at its gate
        when the connections are cut; the returned copy runs the body beside the original
        (waited for ``timeout``), and with the gate open both charge. The task id and the
        bodies that waited at the gate."""
        plain = self.app.signature("it.plain_charge", args=(order,), kwargs={"gate_name": order})
        task_id = str(plain.apply_async().id)
        wait_for(lambda: self.gateway.gate_waiters(order), 20, "the body at the gate")
        assert proxy.cut_all() > 0
        waiters: list[Any] = wait_for(
            lambda: len(self.gateway.gate_waiters(order)) >= 2 and self.gateway.gate_waiters(order),
            timeout,
            "the returned copy to run the body beside the original",
        )
        self.gateway.open_gate(order)
        wait_for(lambda: len(self.gateway.gateway.payments) == 2, 20, "the second payment")
        return task_id, waiters

    @staticmethod
    def kill(pid: int) -> None:
        signal_process(pid, signal.SIGKILL)

    @staticmethod
    def stop(pid: int) -> None:
        signal_process(pid, signal.SIGSTOP)

    @staticmethod
    def cont(pid: int) -> None:
        signal_process(pid, signal.SIGCONT)

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

    def sweeping(self, period: float = SWEEP_PERIOD_SECONDS) -> AbstractContextManager[None]:
        """Run ``sweep_once`` in the background (a beat that fires every ``period``)."""
        return every(period, self.sweep_once, "it-sweeper")

    def beating(self, period: float = 0.5) -> AbstractContextManager[None]:
        """Send the sweep task to the worker every ``period`` seconds, as beat would: the
        sweep (and what it reconciles) then runs in a pool child."""
        from celery_agboss.sweep import SWEEP_TASK_NAME

        def beat() -> None:
            self.app.send_task(SWEEP_TASK_NAME, queue=self.config["queue"])

        return every(period, beat, "it-beat")

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
ShopT = TypeVar("ShopT", bound=Shop)


def shop_config(
    *, broker_url: str, backend_url: str, database_url: str, gateway_url: str, **overrides: Any
) -> dict[str, Any]:
    """What every integration app's ``make_app(config)`` reads: a queue of the test's own,
    the services, and the speed-ups of this module's docstring (``overrides`` win)."""
    return {
        "queue": f"it-{uuid.uuid4().hex[:10]}",
        "broker_url": broker_url,
        "backend_url": backend_url,
        "database_url": database_url,
        "gateway_url": gateway_url,
        "lease_ttl": 5,
        "visibility_timeout": 60,
        "retry_delay": 1,
        **overrides,
    }


def make_shop(
    *,
    broker_url: str,
    backend_url: str,
    database_url: str,
    gateway: GatewayHTTPServer,
    start_process: Callable[..., ManagedProcess],
    app_module: ModuleType = shop_app,
    kind: type[ShopT] = Shop,  # type: ignore[assignment]
    **overrides: Any,
) -> ShopT:
    """A ``kind`` of shop whose app, here and in its workers, is ``app_module``'s."""
    config = shop_config(
        broker_url=broker_url,
        backend_url=backend_url,
        database_url=database_url,
        gateway_url=gateway.url,
        **overrides,
    )
    return kind(
        config=config,
        app=app_module.make_app(config),
        gateway=gateway,
        start_process=start_process,
        app_module=app_module,
    )


__all__ = ["Shop", "ShopFactory", "make_shop", "shop_config"]
