"""Pauses in a real worker: answered once whoever answers at the same time, never re-driven
by the sweep, and what came before them kept however long they wait.

PS11: two approvers answer one pause at the same instant from two OS processes (forked,
each with an app and a store connection of its own, released together by a barrier):
one wins, the other gets ``NotPausedError``, the task runs on once and charges once.
PS21: the 3-D Secure return page and the webhook answer one pause the same way, and the
order is captured once; a return page that beats the pause is kept for it (early
answers). A pause answered after the fenced-effect and outbound
retention passed (the database clock of a second app on the same store is moved):
nothing before the pause runs again. Each guarantee has a sabotage twin that fails.

One worker per store backend serves every test of the module (they use orders of their
own), so the module pays for two worker starts. Harness speed-ups as in
tests/integration/harness.py (``-Q``, a 5 s lease, no beat).
"""

from __future__ import annotations

import multiprocessing
import uuid
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select, text

from celery_agboss import AGBoss, answer_pause
from celery_agboss.core.protections import (
    PAUSE_ANSWER_WITHOUT_COMPARE_AND_SET,
    PAUSED_RECORDS_EXPIRE,
)
from celery_agboss.errors import NotPausedError
from celery_agboss.signals import disconnect
from celery_agboss.store.migrate import migrate
from celery_agboss.store.schema import fenced_effects
from celery_agboss.sweep import SweepReport, run_sweep
from celery_agboss.testing import sabotage
from celery_agboss.testing.clock import VirtualClock
from celery_agboss.testing.gateway import FakeGateway
from celery_agboss.testing.gateway_types import GatewayRequestOutcome
from celery_agboss.testing.stores import sqlite_store_url
from tests.integration.apps import pause_app
from tests.integration.apps.pause_app import create_orders_table, install_routes
from tests.integration.apps.pause_app import make_app as make_pause_app
from tests.integration.gateway_http import GatewayHTTPServer, wait_for
from tests.integration.harness import Shop, make_shop
from tests.support import databases, services
from tests.support.processes import ManagedProcess
from tests.support.redis_databases import RedisDatabaseLeases
from tests.support.stores import STORE_BACKENDS

pytestmark = [pytest.mark.worker, pytest.mark.redis]

_FORK = multiprocessing.get_context("fork")
ANSWER_SECONDS = 20.0

RETENTION_PASSED_SECONDS = 8 * 24 * 3600.0
"""Past the default outbound and fenced-effect retention (7 days)."""


@dataclass
class PauseWorld:
    """One backend's store, its worker, and a second app whose database clock moves."""

    backend: str
    shop: Shop
    clocked: AGBoss
    clock: VirtualClock
    logs: Path
    processes: list[ManagedProcess] = field(default_factory=list)

    @property
    def gateway(self) -> FakeGateway:
        return self.shop.gateway.gateway

    def publish(self, task: str) -> tuple[str, str]:
        """``task(order)`` published for a new order; (task id, order)."""
        order = f"{self.backend}-{uuid.uuid4().hex[:8]}"
        return self.shop.publish(task, order), order

    def paused(self, task: str) -> tuple[str, str]:
        """Published, run up to its pause, its lease released."""
        task_id, order = self.publish(task)
        self.shop.wait_state(task_id, "PAUSED")
        self.shop.wait_lease_dead(task_id, timeout=10)
        return task_id, order

    def captures_of(self, order: str) -> list[GatewayRequestOutcome]:
        """What became of each capture the gateway saw on the order's one payment."""
        (payment,) = [p for p in self.gateway.payments if p["reference"] == order]
        captures = self.gateway.requests
        return [
            r.outcome
            for r in captures
            if r.operation == "capture" and r.payment_id == payment["id"]
        ]

    def notes(self, event: str, task_id: str) -> int:
        return len(self.shop.gateway.notes_of(event, task_id))

    def result(self, task_id: str) -> Any:
        self.shop.wait_backend(task_id, "SUCCESS")
        return self.shop.app.AsyncResult(task_id).result

    def one_answer_wins(self, pause_id: str, answers: list[Any]) -> tuple[int, dict[str, Any]]:
        """``answers`` to one pause, sent at once (``answer_together``): exactly one
        wins. The index of the winning answer, and what the other process said."""
        said = self.answer_together([(pause_id, answer) for answer in answers])
        assert sorted(s["won"] for s in said) == [False, True], said
        (lost,) = [s for s in said if not s["won"]]
        return [s["won"] for s in said].index(True), lost

    def answer_together(self, answers: list[tuple[str, Any]]) -> list[dict[str, Any]]:
        """Each ``(pause_id, answer)`` from an OS process of its own (forked: no start-up
        to wait for), each with an app and a store connection of its own, released at
        once by a barrier; what each said, in the order given. A protection switched off
        in this process is off in them too."""
        barrier = _FORK.Barrier(len(answers))
        started = []
        for pause_id, answer in answers:
            mine, theirs = _FORK.Pipe(duplex=False)
            process = _FORK.Process(
                target=_answer_at_the_barrier,
                args=(self.shop.config, pause_id, answer, barrier, theirs),
                daemon=True,
            )
            with warnings.catch_warnings():  # the children start no thread and take no lock
                warnings.filterwarnings("ignore", ".*multi-threaded.*fork", DeprecationWarning)
                process.start()
            theirs.close()
            started.append((process, mine))
        said = []
        for process, mine in started:
            assert mine.poll(ANSWER_SECONDS), "an answerer said nothing"
            said.append(mine.recv())
            mine.close()
            process.join(ANSWER_SECONDS)
            assert process.exitcode == 0, said
        assert all(s["won"] is not None for s in said), said
        return said

    def sweep_later(self, seconds: float) -> SweepReport:
        """One real sweep, run ``seconds`` later on the database clock."""
        self.clock.advance(seconds)
        return run_sweep(self.clocked, claim_tick=False)

    def kept_for(self, task_id: str) -> tuple[int, int]:
        """How many intents and fenced-effect records of the execution the store holds."""
        with self.shop.agboss.store.read_transaction() as tx:
            effects = tx.execute(
                select(func.count())
                .select_from(fenced_effects)
                .where(fenced_effects.c.execution_id == task_id)
            ).scalar()
        return len(self.shop.intents_of(task_id)), int(effects or 0)

    def orders_recorded(self, order: str) -> int:
        with self.shop.agboss.store.engine.connect() as conn:
            found = conn.execute(
                text("select count(*) from ps_orders where order_id = :o"), {"o": order}
            ).scalar()
        return int(found or 0)

    def requests_under(self, task_id: str, call: str) -> int:
        """Requests the gateway received under the key of the execution's ``call``."""
        (key,) = [i.idempotency_key for i in self.shop.intents_of(task_id) if i.name == call]
        return len(self.gateway.requests_for(key))

    def start_worker(self) -> None:
        self.shop.start_process = self._start
        self.shop.start_worker(name=f"ps-{self.backend}-")

    def _start(self, argv: list[str], **options: Any) -> ManagedProcess:
        """A process of this module-wide world (not of one test's ``managed_process``)."""
        process = ManagedProcess(argv, log_dir=self.logs, **options)
        self.processes.append(process.start())
        return process

    def close(self) -> None:
        for process in self.processes:
            process.close()
        disconnect(self.clocked)
        self.clocked.close()
        self.clocked.app.close()
        self.shop.close()


@pytest.fixture(scope="module")
def worlds(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[[str], PauseWorld]]:
    """``worlds(backend)``: that backend's world, built on first use, shared by the module."""
    made: dict[str, PauseWorld] = {}
    clones: list[tuple[str, str]] = []
    server = GatewayHTTPServer(FakeGateway(hold_timeout=60))
    install_routes(server)
    leases: RedisDatabaseLeases | None = None

    def get(backend: str) -> PauseWorld:
        nonlocal leases
        if backend not in services.selected_backends():
            pytest.skip(f"{backend} not in {services.BACKENDS_ENV_VAR}")
        if backend in made:
            return made[backend]
        if leases is None:
            leases = RedisDatabaseLeases(services.require(services.REDIS))
        logs = tmp_path_factory.mktemp(f"pauses-{backend}")
        if backend == "sqlite":
            url = sqlite_store_url(logs)
            migrate(url)
        else:
            template = request.getfixturevalue("postgres_templates")(
                "integration-migrated", migrate
            )
            url = databases.clone_database(template)
            clones.append((template.admin_url, url))
        shop = make_shop(
            broker_url=leases.lease(),
            backend_url=leases.lease(),
            database_url=url,
            gateway=server,
            start_process=_no_shop_workers,
            app_module=pause_app,
        )
        config = shop.config
        with shop.agboss.store.engine.begin() as conn:
            create_orders_table(conn)
        clock = VirtualClock()
        clocked = AGBoss.of(make_pause_app(config))
        clocked.clock_offset_source = clock.offset_ms
        world = made[backend] = PauseWorld(backend, shop, clocked, clock, logs)
        world.start_worker()
        return world

    try:
        yield get
    finally:
        for world in made.values():
            world.close()
        for admin_url, url in clones:
            databases.drop_database(admin_url, databases.database_name(url))
        if leases is not None:
            leases.release_all()
        server.stop()


@pytest.fixture(params=STORE_BACKENDS)
def world(request: pytest.FixtureRequest, worlds: Callable[[str], PauseWorld]) -> PauseWorld:
    """Each store backend's world in turn (``worlds`` builds each once for the module)."""
    return worlds(request.param)


def _answer_at_the_barrier(
    config: dict[str, Any], pause_id: str, answer: Any, barrier: Any, report: Connection
) -> None:
    """One answerer: its own app and store connection, opened before the barrier."""
    app = make_pause_app(config)
    try:
        AGBoss.of(app).executions.list_pauses(1)
        barrier.wait(ANSWER_SECONDS)
        try:
            republished = answer_pause(app, pause_id, answer)
        except NotPausedError as exc:
            report.send({"won": False, "error": str(exc)})
        else:
            report.send({"won": True, "republished": republished})
    except BaseException as exc:  # said to the test, which fails with it
        report.send({"won": None, "error": repr(exc)})
    finally:
        report.close()


def _no_shop_workers(*args: Any, **kwargs: Any) -> ManagedProcess:
    raise AssertionError("this module starts its workers with PauseWorld.start_worker")


# --- two approvers at once (design: PS11) -----------------------------------------------


def test_two_approvers_at_once_on_two_processes_one_answer_wins(
    world: PauseWorld,
) -> None:
    task_id, order = world.paused("ps.approve_then_charge")
    pause_id = f"{task_id}:approve"
    won, lost = world.one_answer_wins(pause_id, [{"by": "alice"}, {"by": "bob"}])
    winner = ["alice", "bob"][won]
    assert "already answered" in lost["error"]
    record = world.shop.wait_state(task_id, "COMPLETED")
    assert record.deliveries == 2, "the pause's delivery, and one re-run"
    assert world.result(task_id)["by"] == winner, "the task acted on the answer that won"
    assert world.notes("after-pause", task_id) == 1, "the task ran on from its pause once"
    assert len([p for p in world.gateway.payments if p["reference"] == order]) == 1
    # A third approver, late: refused, and nothing runs again.
    with pytest.raises(NotPausedError, match="already answered"):
        answer_pause(world.shop.app, pause_id, {"by": "carol"})
    world.shop.assert_stays(lambda: world.notes("after-pause", task_id) == 1, 0.5)
    assert world.shop.execution(task_id).state.value == "COMPLETED"  # type: ignore[union-attr]


def test_answers_without_the_compare_and_set_all_win_and_run_the_task_on_again(
    worlds: Callable[[str], PauseWorld],
) -> None:
    """The twin: an unconditional answer lets both approvers win, and a late one starts
    the steps after the pause again on a completed payment."""
    world = worlds("sqlite")
    task_id, _ = world.paused("ps.approve_then_charge")
    pause_id = f"{task_id}:approve"
    with sabotage(PAUSE_ANSWER_WITHOUT_COMPARE_AND_SET):
        said = world.answer_together([(pause_id, {"by": "alice"}), (pause_id, {"by": "bob"})])
    assert [s["won"] for s in said] == [True, True], said
    world.shop.wait_state(task_id, "COMPLETED")
    with sabotage(PAUSE_ANSWER_WITHOUT_COMPARE_AND_SET):
        answer_pause(world.shop.app, pause_id, {"by": "carol"})
    wait_for(lambda: world.notes("after-pause", task_id) >= 2, 15, "the task to run on again")
    record = world.shop.wait_state(task_id, "COMPLETED")
    assert record.deliveries >= 3 and "carol" in (record.result or ""), "it acted on carol's"


# --- the return page and the webhook (design: PS21) -------------------------------------


def test_the_return_page_and_the_webhook_answer_one_3ds_pause_and_capture_once(
    world: PauseWorld,
) -> None:
    task_id, order = world.paused("ps.checkout_3ds")
    pause_id = f"{task_id}:3ds"
    sources = ["return-page", "webhook"]
    won, _ = world.one_answer_wins(
        pause_id, [{"source": "return-page"}, {"source": "webhook", "id": "evt_1"}]
    )
    winner = sources[won]
    world.shop.wait_state(task_id, "COMPLETED")
    assert world.result(task_id) == {"order": order, "status": "succeeded", "source": winner}
    assert world.captures_of(order) == [GatewayRequestOutcome.PROCESSED]
    assert world.notes("after-pause", task_id) == 1
    # The browser loads the return page again.
    with pytest.raises(NotPausedError):
        answer_pause(world.shop.app, pause_id, {"source": "return-page"})


def test_a_3ds_answer_that_beats_its_pause_is_taken_in_the_same_delivery(
    world: PauseWorld,
) -> None:
    """The return page answers while the task still waits for its authorisation: the
    answer is kept early, the pause (``accept_early=True``) takes it, and the task goes on
    to capture once, in its first delivery, with no operator (design: early answers)."""
    hold = world.gateway.hold(operation="charge", timeout=30)  # the authorisation's answer
    task_id, order = world.publish("ps.checkout_3ds_early")
    pause_id = f"{task_id}:3ds"
    try:
        hold.wait_reached(timeout=20)
        assert answer_pause(world.shop.app, pause_id, {"source": "return-page"}) is False
        assert world.shop.execution(task_id).state.value == "RUNNING"  # type: ignore[union-attr]
    finally:
        hold.release()
    record = world.shop.wait_state(task_id, "COMPLETED")
    assert record.deliveries == 1, "taken in the delivery that reached the pause"
    assert world.result(task_id) == {"order": order, "status": "succeeded", "source": "return-page"}
    assert world.captures_of(order) == [GatewayRequestOutcome.PROCESSED]
    # The webhook comes second, as it does: told so, nothing moves.
    with pytest.raises(NotPausedError, match="already answered"):
        answer_pause(world.shop.app, pause_id, {"source": "webhook"})


# --- the sweep and the retention ------------------------------------------------------------


def test_the_sweep_never_re_drives_a_paused_execution(
    world: PauseWorld,
) -> None:
    task_id, _ = world.paused("ps.approve_then_charge")
    for later in (60.0, 3600.0, 86400.0):  # past the lease, the grace, the sweep's own delays
        report = world.sweep_later(later)
        assert report.ran and task_id not in report.republished_ids
    record = world.shop.execution(task_id)
    assert record is not None and record.state.value == "PAUSED" and record.deliveries == 1
    assert world.notes("before-pause", task_id) == 1
    assert answer_pause(world.shop.app, f"{task_id}:approve", {"by": "ops"})
    world.shop.wait_state(task_id, "COMPLETED")


def test_a_pause_answered_after_the_retention_runs_nothing_before_it_again(
    world: PauseWorld,
) -> None:
    task_id, order = world.paused("ps.charge_record_then_pause")
    assert world.kept_for(task_id) == (1, 1)
    world.sweep_later(RETENTION_PASSED_SECONDS)
    assert world.kept_for(task_id) == (1, 1), "a paused execution's records are kept"
    answer_pause(world.shop.app, f"{task_id}:ship", {"by": "ops"})
    world.shop.wait_state(task_id, "COMPLETED")
    assert world.result(task_id)["by"] == "ops"
    assert world.requests_under(task_id, "ps.charge") == 1, "the charge was replayed, not sent"
    assert world.orders_recorded(order) == 1, "the fenced effect was replayed, not run"


def test_a_retention_that_deletes_a_paused_executions_records_runs_its_steps_again(
    worlds: Callable[[str], PauseWorld],
) -> None:
    """The twin: retention that counts a long-paused execution as done."""
    world = worlds("sqlite")
    task_id, order = world.paused("ps.charge_record_then_pause")
    with sabotage(PAUSED_RECORDS_EXPIRE):
        world.sweep_later(RETENTION_PASSED_SECONDS)
    assert world.kept_for(task_id) == (0, 0)
    answer_pause(world.shop.app, f"{task_id}:ship", {"by": "ops"})
    world.shop.wait_state(task_id, "COMPLETED")
    assert world.requests_under(task_id, "ps.charge") == 2, "the charge was sent again"
    assert world.orders_recorded(order) == 2, "the order was recorded twice"
