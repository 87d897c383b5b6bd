"""One test's deployment: the app directory, its environment, its processes, what it reads.

A :class:`Deployment` is what a user has after following README.md: a directory with
the README's ``shop.py`` and the user's own ``payments.py``, an environment holding
only the variables the README names (plus the documented ``AGBOSS_*`` speed-ups), and
the README's commands run from that directory with the fresh venv's ``bin/`` first on
``PATH``. Every process goes through the ``managed_process`` fixture (its own process
group, killed by pid at the end whatever happens).

The test process reads the outcome where it is: the store (``SQLAlchemyExecutionStore``),
the app's own table, and the gateway's own records (``payments``, ``requests``).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import text

from celery_agboss.core.executions import ExecutionRecord
from celery_agboss.store.deployment import read_store_tenant
from celery_agboss.store.execution_store import SQLAlchemyExecutionStore
from celery_agboss.store.sqlalchemy_store import SQLAlchemyStore
from tests.deployment import readme
from tests.deployment.gateway import (
    PAID_TABLE_DDL,
    RecordingGatewayServer,
    idempotency_key,
    payments_source,
)
from tests.deployment.venv import DeployedVenv
from tests.support.processes import ManagedProcess, WaitTimeout, wait_until

PSEUDONYM_KEY = "deployment-tests-pseudonym-key-0123456789"

SPEEDUPS: Mapping[str, str] = {
    # Defaults 30 s / 30 s / 300 s; the README documents every agboss_* setting as an
    # AGBOSS_<NAME> environment variable, which is how a user would shorten them too.
    "AGBOSS_LEASE_TTL": "5",  # a dead worker's lease expires in 5 s (test TTLs stay >= 5 s)
    "AGBOSS_SWEEP_INTERVAL": "2",  # beat sweeps every 2 s; workers sweep after 6 s stale
    "AGBOSS_REQUESTED_GRACE": "3",  # a lost, never-started message is re-published after 3 s
}
"""The speed-ups the recovery scenarios use, and why."""

# Process start-up (interpreter, Celery, the store) on a loaded 2-core machine.
START_SECONDS = 60.0
COMMAND_SECONDS = 60.0
READY_LINE = " ready."
BEAT_STARTED_LINE = "beat: Starting..."

PUBLISH_CODE = (
    "import json, sys\n"
    "from shop import charge_order\n"
    "ids = {o: charge_order.delay(int(o)).id for o in sys.argv[1:]}\n"
    "print('published-task-ids', json.dumps(ids))\n"
)
PROBE_CODE = (
    "import json, sys\n"
    "import celery, celery_agboss, kombu, shop, sqlalchemy\n"
    "print('probe', json.dumps({'celery_agboss': celery_agboss.__file__,"
    " 'celery': celery.__file__, 'kombu': kombu.__file__, 'sqlalchemy': sqlalchemy.__file__,"
    " 'shop': shop.__file__, 'prefix': sys.prefix, 'path': sys.path}))\n"
)

ProcessFactory = Callable[..., ManagedProcess]


def neutral_environment(venv: DeployedVenv) -> dict[str, str]:
    """What the test process's own environment must not leak into the user's processes.

    ``managed_process`` starts from ``os.environ`` and puts the repository on
    ``PYTHONPATH``; here that is emptied (CPython ignores an empty ``PYTHONPATH``), and
    every ``AGBOSS_*``/``CELERY_*`` variable of the test process (the sabotage switch
    ``AGBOSS_ALLOW_SABOTAGE`` above all) is blanked, which the product reads as unset.
    """
    env = {name: "" for name in os.environ if name.startswith(("AGBOSS_", "CELERY_", "PYTHON"))}
    env.pop("PYTHONUNBUFFERED", None)  # harmless, and ManagedProcess sets it anyway
    env.update(
        {
            "PATH": os.pathsep.join([str(venv.bin), os.environ.get("PATH", "")]),
            "VIRTUAL_ENV": str(venv.root),  # as `source <venv>/bin/activate` sets it
            "PYTHONPATH": "",
        }
    )
    return env


@dataclass
class Deployment:
    """A user's deployment of the README's shop, for one test."""

    venv: DeployedVenv
    app_dir: Path
    broker_url: str
    database_url: str
    gateway: RecordingGatewayServer
    start_process: ProcessFactory
    speedups: Mapping[str, str]
    commands: readme.ReadmeCommands = field(default_factory=readme.commands)
    processes: list[ManagedProcess] = field(default_factory=list)
    _store: SQLAlchemyStore | None = None
    _tenant: str | None = None

    # --- setting it up ---------------------------------------------------------------

    @property
    def env(self) -> dict[str, str]:
        """The environment every process of the deployment gets."""
        return {
            **neutral_environment(self.venv),
            "CELERY_BROKER_URL": self.broker_url,
            "AGBOSS_DATABASE_URL": self.database_url,
            "AGBOSS_PSEUDONYM_KEY": PSEUDONYM_KEY,
            **self.speedups,
        }

    def write_app(self) -> None:
        """``shop.py`` (the README's block, unchanged) and the user's ``payments.py``."""
        self.app_dir.mkdir(parents=True, exist_ok=True)
        (self.app_dir / "shop.py").write_text(readme.shop_source(), encoding="utf-8")
        (self.app_dir / "payments.py").write_text(
            payments_source(self.gateway.url), encoding="utf-8"
        )

    def start(self, argv: Sequence[str], name: str) -> ManagedProcess:
        process = self.start_process(list(argv), name=name, env=self.env, cwd=self.app_dir)
        self.processes.append(process)
        return process

    def run(self, argv: Sequence[str], name: str, timeout: float = COMMAND_SECONDS) -> str:
        """Run a command to its end; its output, or AssertionError with that output."""
        process = self.start(argv, name)
        try:
            code = process.wait(timeout)
        except WaitTimeout as exc:
            raise AssertionError(f"{exc}\n{process.describe()}") from None
        assert code == 0, f"{' '.join(argv)} exited with {code}\n{process.describe()}"
        return process.output()

    def migrate(self) -> str:
        """The README's ``celery -A shop agboss migrate``."""
        return self.run(self.commands.migrate, "migrate")

    def create_paid_table(self) -> None:
        """The app's own table, which ``mark_paid`` writes (created before any worker)."""
        with self.store.engine.begin() as conn:
            conn.execute(text(PAID_TABLE_DDL))

    def prepare(self) -> None:
        """What a user does before starting anything: the app, the tables."""
        self.write_app()
        self.migrate()
        self.create_paid_table()

    def start_worker(
        self, argv: Sequence[str] | None = None, name: str = "worker"
    ) -> ManagedProcess:
        """A worker (the README's first worker line by default); not waited for."""
        return self.start(self.commands.worker if argv is None else argv, name)

    def start_second_worker(self) -> ManagedProcess:
        """The README's ``celery -A shop worker -l INFO -n w2@%h``; not waited for."""
        return self.start(self.commands.second_worker, "worker-w2")

    def start_beat(self) -> ManagedProcess:
        return self.start(self.commands.beat, "beat")

    @staticmethod
    def wait_ready(*workers: ManagedProcess, line: str = READY_LINE) -> None:
        """Until each process logged ``line``; fails early if one exits."""
        deadline = time.monotonic() + START_SECONDS
        for worker in workers:
            worker.wait_until(
                lambda w=worker: line in w.output(),  # type: ignore[misc]
                max(0.1, deadline - time.monotonic()),
                interval=0.1,
                message=f"{line!r} in the log of {worker.name}",
            )

    def wait_beat(self, beat: ManagedProcess) -> None:
        self.wait_ready(beat, line=BEAT_STARTED_LINE)

    # --- what a web process does --------------------------------------------------------

    def publish(self, orders: Iterable[int]) -> dict[int, str]:
        """``charge_order.delay(order)`` for each order, from a process of the fresh venv
        in the app directory, as a user's web process would; order -> task id."""
        wanted = [str(order) for order in orders]
        output = self.run([str(self.venv.python), "-c", PUBLISH_CODE, *wanted], "publish")
        for line in output.splitlines():
            if line.startswith("published-task-ids "):
                ids = json.loads(line.split(" ", 1)[1])
                return {int(order): str(task_id) for order, task_id in ids.items()}
        raise AssertionError(f"the publisher printed no task ids:\n{output}")

    def probe(self) -> dict[str, object]:
        """Where the deployment's python finds celery_agboss, celery, shop, ..."""
        output = self.run([str(self.venv.python), "-c", PROBE_CODE], "probe")
        for line in output.splitlines():
            if line.startswith("probe "):
                found: dict[str, object] = json.loads(line.split(" ", 1)[1])
                return found
        raise AssertionError(f"the probe printed nothing:\n{output}")

    # --- what the test reads --------------------------------------------------------------

    @property
    def store(self) -> SQLAlchemyStore:
        if self._store is None:
            self._store = SQLAlchemyStore(self.database_url)
        return self._store

    @property
    def tenant(self) -> str:
        """The store's deployment id, which every key of the README's shop starts with
        (minted by ``migrate``: read it after ``prepare()``)."""
        if self._tenant is None:
            found = read_store_tenant(self.store)
            assert found is not None, "the store holds no deployment id: was it migrated?"
            self._tenant = found
        return self._tenant

    def key_of(self, order: int) -> str:
        """The idempotency key the README's ``charge_order(order)`` sends here."""
        return idempotency_key(order, self.tenant)

    def execution(self, task_id: str) -> ExecutionRecord | None:
        return SQLAlchemyExecutionStore(self.store).read_execution(task_id)

    def states(self, task_ids: Iterable[str]) -> dict[str, str]:
        out = {}
        for task_id in task_ids:
            record = self.execution(task_id)
            out[task_id] = "not recorded" if record is None else record.state.value
        return out

    def paid_rows(self) -> dict[str, str]:
        """``shop_paid_orders``: order id -> payment id."""
        with self.store.engine.connect() as conn:
            rows = conn.execute(text("SELECT order_id, payment FROM shop_paid_orders")).all()
        return {str(order): str(payment) for order, payment in rows}

    def settled(self, ids: Mapping[int, str]) -> bool:
        """Every execution COMPLETED and every order marked paid."""
        states = self.states(ids.values())
        return all(s == "COMPLETED" for s in states.values()) and len(self.paid_rows()) == len(ids)

    def progress(self, ids: Mapping[int, str]) -> str:
        """What a timed-out wait reports: states, rows, the gateway's counts."""
        fake = self.gateway.gateway
        states = self.states(ids.values())
        lines = [f"order {o}: {states[t]} (task {t})" for o, t in sorted(ids.items())]
        lines.append(f"shop_paid_orders: {self.paid_rows()}")
        lines.append(
            "gateway: "
            + ", ".join(
                f"order {o}: {len(fake.payments_for(self.key_of(o)))} payments,"
                f" {len(fake.requests_for(self.key_of(o)))} requests"
                for o in sorted(ids)
            )
        )
        return "\n".join(lines)

    def wait_settled(self, ids: Mapping[int, str], timeout: float) -> float:
        """Until every order settled (polled, never slept through); seconds it took."""
        started = time.monotonic()
        wait_until(
            lambda: self.settled(ids),
            timeout,
            interval=0.25,
            message=lambda: f"every order to settle\n{self.progress(ids)}",
        )
        return time.monotonic() - started

    def assert_each_paid_once(self, ids: Mapping[int, str]) -> None:
        """At the gateway: one payment and one request per order's key, nothing else;
        in the app's table: one row per order, naming that payment; in the store: every
        execution COMPLETED."""
        fake = self.gateway.gateway
        payments = fake.payments
        for order in ids:
            key = self.key_of(order)
            paid = fake.payments_for(key)
            assert len(paid) == 1, f"order {order}: {len(paid)} payments at the gateway"
            sent = fake.requests_for(key)
            assert len(sent) == 1, f"order {order}: {len(sent)} charge requests under its key"
        assert len(payments) == len(ids), (
            f"{len(payments)} payments at the gateway for {len(ids)} orders: "
            f"{[p['idempotency_key'] for p in payments]}"
        )
        rows = self.paid_rows()
        expected = {str(o): fake.payments_for(self.key_of(o))[0]["id"] for o in ids}
        assert rows == expected, f"shop_paid_orders {rows} != the gateway's payments {expected}"
        states = self.states(ids.values())
        assert set(states.values()) == {"COMPLETED"}, states

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None


__all__ = ["SPEEDUPS", "Deployment", "neutral_environment"]
