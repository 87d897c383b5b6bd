"""One run's world: a data directory, the fake Stripe, real worker processes and beat.

The scenario runner owns the ``FakeGatewayServer`` (so it counts every payment the SDK
made, whichever worker sent it), and starts the shop's worker and beat as a user would
(``celery -A … worker``, no ``-Q``, ``celery -A … beat``), each in its own process group,
killed by pid whatever happens. What differs from a deployment is the speed: a 3 s lease
(``AGBOSS_LEASE_TTL``), a 1 s sweep (``AGBOSS_SWEEP_INTERVAL``), short retry and outbox
delays, printed when the run starts.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from celery_agboss.testing.dialects.stripe import StripeDialect
from celery_agboss.testing.gateway import FakeGateway
from celery_agboss.testing.gateway_server import FakeGatewayServer

T = TypeVar("T")
REPO_ROOT = Path(__file__).resolve().parents[2]
WORKER_APP = "example_project.scenarios.worker_app"
READY_SECONDS = 60.0

SPEED_UPS = {
    "AGBOSS_LEASE_TTL": "3",
    "AGBOSS_SWEEP_INTERVAL": "1",
    "AGBOSS_RETRY_DELAY": "0.3",
    "AGBOSS_OUTBOX_GRACE": "1",
}


WORKER_LOST_WAIT_SECONDS = 1.0
"""Celery's ``worker_lost_wait`` in the demo's workers (10 s by default)."""


class ScenarioFailed(Exception):
    """Something a scenario waited for did not happen in time."""


@dataclass
class Process:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def children(self) -> list[int]:
        """The pool processes of a prefork worker (its process group minus itself)."""
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == self.pid:
                continue
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[1]) == self.pid and fields[0] != "Z":  # ppid, not a zombie
                found.append(int(entry.name))
        return sorted(found)

    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill(self) -> None:
        """SIGKILL the whole group (the worker and its pool), and reap it."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=10)


@dataclass
class World:
    root: Path
    broker_url: str | None = None
    database_url: str | None = None
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:6])
    gateway: FakeGatewayServer | None = None
    processes: list[Process] = field(default_factory=list)
    workers: list[Process] = field(default_factory=list)
    shop: Any = None
    web_url: str | None = None

    # --- setting up -----------------------------------------------------------------

    def open(self) -> World:
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "logs").mkdir(exist_ok=True)
        fake = FakeGateway(capabilities=StripeDialect.documented_capabilities, hold_timeout=30.0)
        self.gateway = FakeGatewayServer(fake, dialect=StripeDialect(), hold_timeout=30.0).start()
        os.environ.update(self.environment())
        from example_project import migrate, shop

        migrate.run()
        self.shop = shop
        self.start_worker()
        self.start_worker()
        self.start_beat()
        return self

    def environment(self) -> dict[str, str]:
        assert self.gateway is not None
        env = {
            "EXAMPLE_DATA_DIR": str(self.root),
            "STRIPE_API_BASE": self.gateway.url,
            **SPEED_UPS,
        }
        if self.broker_url:
            env["CELERY_BROKER_URL"] = self.broker_url
        if self.database_url:
            env["AGBOSS_DATABASE_URL"] = self.database_url
        return env

    def _spawn(self, name: str, argv: list[str], extra: dict[str, str] | None = None) -> Process:
        log = self.root / "logs" / f"{name}.log"
        env = {**os.environ, **self.environment(), "PYTHONPATH": str(REPO_ROOT), **(extra or {})}
        with open(log, "wb") as out:
            popen = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=str(self.root),
                start_new_session=True,
            )
        process = Process(name, popen, log)
        self.processes.append(process)
        return process

    def start_worker(
        self, *, concurrency: int = 2, queue: str | None = None, env: dict[str, str] | None = None
    ) -> Process:
        """A worker as the README starts one; ``queue`` (``-Q``) only for a scenario that
        must reach one particular worker (PS13's skewed host), which is then not one of
        the run's two workers."""
        name = f"{queue or 'worker'}{len(self.processes) + 1}-{self.run_id}"
        argv = [sys.executable, "-m", "celery", "-A", WORKER_APP, "worker", "-l", "INFO"]
        argv += ["-c", str(concurrency), "-n", f"{name}@%h"]
        if queue is not None:
            argv += ["-Q", queue]
        worker = self._spawn(name, argv, env)
        if queue is None:
            self.workers.append(worker)
        self.wait(
            lambda: " ready." in worker.output() or not worker.alive(),
            READY_SECONDS,
            f"{name} to be ready",
        )
        if not worker.alive():
            raise ScenarioFailed(f"{name} exited at start:\n{worker.output()[-2000:]}")
        return worker

    def start_beat(self) -> Process:
        schedule = self.root / f"beat-{self.run_id}"
        argv = [sys.executable, "-m", "celery", "-A", WORKER_APP, "beat", "-l", "INFO"]
        argv += ["-s", str(schedule)]
        return self._spawn(f"beat-{self.run_id}", argv)

    def start_web(self) -> str:
        """The shop's HTTP entry point (``python -m example_project.web``); its URL."""
        if self.web_url is not None:
            return self.web_url
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        argv = [sys.executable, "-m", "example_project.web", "--port", str(port)]
        web = self._spawn(f"web-{self.run_id}", argv)
        url = f"http://127.0.0.1:{port}"

        def healthy() -> bool:
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as answer:
                    return bool(answer.status == 200)
            except OSError:
                if not web.alive():
                    raise ScenarioFailed(
                        f"the web entry point exited:\n{web.output()[-2000:]}"
                    ) from None
                return False

        self.wait(healthy, READY_SECONDS, "the web entry point to answer")
        self.web_url = url
        return url

    def replace_worker(self, worker: Process) -> Process:
        """Kill ``worker`` (if it still runs) and start a new one in its place."""
        worker.kill()
        if worker in self.workers:
            self.workers.remove(worker)
        return self.start_worker()

    def close(self) -> None:
        for process in reversed(self.processes):
            process.kill()
        if self.gateway is not None:
            self.gateway.stop()
        if self.shop is not None:
            self.shop.agboss.close()

    # --- doing ------------------------------------------------------------------------

    def order(self, label: str, amount: int = 1000, **fields: Any) -> str:
        """A new order row; its id names the scenario, so the logs read."""
        order_id = f"{label}-{self.run_id}-{uuid.uuid4().hex[:4]}"
        from example_project import orders

        with self.shop.agboss.store.engine.begin() as conn:
            orders.place(conn, order_id, amount, **fields)
        return order_id

    def publish(self, name: str, *args: Any, task_id: str | None = None, **kwargs: Any) -> str:
        result = self.shop.app.signature(name, args=args, kwargs=kwargs).apply_async(
            task_id=task_id
        )
        return str(result.id)

    def arm(self, point: str, order_id: str, *, times: int = 1) -> None:
        from example_project.scenarios import crash_points

        crash_points.arm(self.root, point, order_id, times=times)

    def wait_frozen(
        self, point: str, order_id: str, count: int = 1, timeout: float = 30.0
    ) -> list[int]:
        from example_project.scenarios import crash_points

        return self.wait(
            lambda: (
                pids
                if len(pids := crash_points.frozen(self.root, point, order_id)) >= count
                else None
            ),
            timeout,
            f"a worker to stop at {point} for {order_id}",
        )

    def kill(self, pid: int) -> None:
        self.signal(pid, signal.SIGKILL)

    def stop(self, pid: int) -> None:
        self.signal(pid, signal.SIGSTOP)

    @staticmethod
    def cont(pid: int) -> None:
        """Unchecked: a SIGCONT harms no bystander, and a frozen process whose worker is
        gone (no longer a child of it) must still be woken."""
        os.kill(pid, signal.SIGCONT)

    def signal(self, pid: int, signum: signal.Signals) -> None:
        """Signal one of this run's worker processes, and nothing else: a pid read from a
        request that did not come from a worker is refused (ScenarioFailed), never sent."""
        self.worker_of(pid)
        os.kill(pid, signum)

    @staticmethod
    def observe(predicate: Callable[[], object], timeout: float) -> bool:
        """Until ``predicate`` holds or ``timeout`` passes; whether it held (no error)."""
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    @staticmethod
    def wait(predicate: Callable[[], T | None], timeout: float, what: str) -> T:
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() >= deadline:
                raise ScenarioFailed(f"waited {timeout:.0f} s for {what}")
            time.sleep(0.05)

    def logged(self, text: str, timeout: float = 30.0) -> None:
        """Until a line with ``text`` is in any worker's log."""
        self.wait(
            lambda: any(text in worker.output() for worker in self.processes),
            timeout, f"{text!r} in a worker's log",
        )  # fmt: skip

    def worker_of(self, pid: int) -> Process:
        """The worker whose pool process ``pid`` is."""
        for worker in self.workers:
            if pid == worker.pid or pid in worker.children():
                return worker
        raise ScenarioFailed(f"no worker of this run has a process {pid}")

    @contextmanager
    def searches_held(self) -> Iterator[threading.Event]:
        """Stripe's search (what reconcile asks) waits while the block runs; the event is
        set once a search arrived."""
        assert self.gateway is not None
        path = ("GET", "/v1/payment_intents/search")
        original = self.gateway.route_at(*path)
        arrived, released = threading.Event(), threading.Event()

        def held(call: Any) -> Any:
            arrived.set()
            released.wait(30)
            return original.endpoint(call)

        self.gateway.route(*path, held, sends=original.sends)
        try:
            yield arrived
        finally:
            released.set()
            self.gateway.route(*path, original.endpoint, sends=original.sends)

    # --- what happened ---------------------------------------------------------------

    @property
    def fake(self) -> FakeGateway:
        assert self.gateway is not None
        return self.gateway.gateway

    def payments(self, order_id: str) -> list[dict[str, Any]]:
        """The payments the gateway made for the order, whoever sent them."""
        return [p for p in self.fake.payments if p.get("reference") == order_id]

    def requests(self, operation: str, payment_ids: set[str] | None = None) -> list[Any]:
        return [
            r
            for r in self.fake.requests
            if r.operation == operation and (payment_ids is None or r.payment_id in payment_ids)
        ]

    def ledger(self, order_id: str) -> list[tuple[str, str | None]]:
        from example_project import orders

        with self.shop.agboss.store.engine.connect() as conn:
            return orders.entries(conn, order_id)

    def count(self, order_id: str, entry: str) -> int:
        return sum(1 for name, _ in self.ledger(order_id) if name == entry)

    def status(self, order_id: str) -> str:
        from example_project import orders

        with self.shop.agboss.store.engine.connect() as conn:
            return str(orders.load(conn, order_id)["status"])

    def execution(self, task_id: str) -> Any:
        return self.shop.agboss.executions.read_execution(task_id)

    def state(self, task_id: str) -> str | None:
        record = self.execution(task_id)
        return None if record is None else str(record.state.value)

    def wait_state(self, task_id: str, *states: str, timeout: float = 30.0) -> str:
        return self.wait(
            lambda: s if (s := self.state(task_id)) in states else None,
            timeout,
            f"{task_id} to be {' or '.join(states)} (is {self.state(task_id)})",
        )
