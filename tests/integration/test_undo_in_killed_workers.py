"""Undo once (design: PS10) in real prefork workers: refunded once, never again, never on a crash.

- s12: a real failure after the charge runs the charge's undo in the delivery: one
  refund, then ``FAILED`` (and Celery's FAILURE) with the original exception;
- s12b: the pool child is SIGKILLed inside an undo while its refund's answer is held
  at the gateway; the next delivery continues the undo, never the body: the refund is
  reconciled (one refund), and the undo that was already marked done (a plain refund,
  which would show a second run) is not run again;
- a hard time limit after the charge never starts undo: the execution continues and
  completes, nothing is refunded (P5: a crash is a hand-over, never a failure); a soft
  time limit the body lets through between calls is its failure: ``FAILED``, one refund;
- nor does a fence: a child frozen (SIGSTOP) mid-body past its lease, its order taken
  over and completed by the other child, then continued (SIGCONT) into a failure, is
  fenced — no ``COMPENSATING``, no undo run, the paid order not refunded.

Each runs on SQLite and on PostgreSQL, beside its sabotage twin (on SQLite: the
protection it removes is the same on both stores). Speed-ups a deployment does not
use: the harness's (``-Q``, no beat: the test runs the sweep), a 3 s lease, one pool
child (two where a frozen child is taken over by the other).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from celery_agboss.core.compensation import read_started
from celery_agboss.core.protections import (
    FAILURE_SKIPS_UNDO,
    FENCED_HOLDER_STARTS_UNDO,
    UNDO_NOT_MARKED_DONE,
    UNDO_ON_ANY_FAILURE,
)
from celery_agboss.store.migrate import migrate
from celery_agboss.testing.gateway_server import GatewayCall, Reply
from celery_agboss.testing.gateway_types import FakeGatewayError
from tests.integration.apps import undo_app
from tests.integration.gateway_http import GatewayHTTPServer, wait_for
from tests.integration.harness import Shop, ShopFactory
from tests.support.processes import ManagedProcess

pytestmark = [pytest.mark.worker, pytest.mark.redis]

LEASE_TTL_SECONDS = 3
TIME_LIMIT_SECONDS = 1


class UndoShop(Shop):
    """The harness's shop, with the undo app in its workers."""

    refund_hold: RefundHold

    def start_worker(self, *, concurrency: int = 1, **options: Any) -> ManagedProcess:
        """A worker of the undo app, one pool child unless said otherwise."""
        return super().start_worker(concurrency=concurrency, **options)

    @property
    def refunds(self) -> list[dict[str, Any]]:
        return self.gateway.gateway.refunds


class RefundHold:
    """Holds the answers to the next ``count`` refunds made under a key (an outbound
    call's): the gateway has refunded, each sender waits; released once the test has
    killed them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0
        self.pids: list[int] = []
        self.released = threading.Event()

    def keep(self, call: GatewayCall) -> None:
        with self._lock:
            if self.count <= 0 or not call.body.get("idempotency_key"):
                return
            self.count -= 1
            self.pids.append(call.pid or 0)
        self.released.wait(30)

    def wait_reached(self, count: int) -> list[int]:
        pids: list[int] = wait_for(
            lambda: len(self.pids) >= count and list(self.pids),
            20,
            f"{count} refunds to reach the gateway",
        )
        return pids


def _refund_route(server: GatewayHTTPServer, hold: RefundHold) -> Callable[[GatewayCall], Reply]:
    def refund(call: GatewayCall) -> Reply:
        body = call.body
        try:
            receipt = server.gateway.refund(
                str(body["payment"]), body.get("idempotency_key"), amount=body.get("amount")
            )
        except FakeGatewayError as exc:
            return server.error_reply(exc)
        hold.keep(call)
        return Reply(200, receipt)

    return refund


@pytest.fixture
def undo_shop(
    shop_factory: ShopFactory, gateway: GatewayHTTPServer, tmp_path: Path
) -> Callable[..., UndoShop]:
    """``undo_shop(database_url=None)``: a shop on its own queue and (by default) its own
    SQLite store, so a test can run a protected worker and its twin side by side."""
    hold = RefundHold()
    gateway.route("POST", "/refund", _refund_route(gateway, hold))
    stores = itertools.count()

    def build(database_url: str | None = None) -> UndoShop:
        if database_url is None:
            database_url = f"sqlite:///{(tmp_path / f'undo-{next(stores)}.db').resolve()}"
            migrate(database_url)
        shop: UndoShop = shop_factory(
            database_url=database_url,
            app_module=undo_app,
            kind=UndoShop,
            lease_ttl=LEASE_TTL_SECONDS,
        )
        shop.refund_hold = hold
        return shop

    return build


# --- s12 -------------------------------------------------------------------------------------


def _fail_after_the_charge(shop: UndoShop, order: str) -> str:
    task_id = shop.publish("undo_it.charge_then_fail", order)
    shop.wait_state(task_id, "FAILED", timeout=20)
    shop.wait_backend(task_id, "FAILURE")
    return task_id


def test_s12_a_real_failure_after_the_charge_is_refunded_once(
    undo_shop: Callable[..., UndoShop], database_url: str
) -> None:
    shop = undo_shop(database_url)
    shop.start_worker()
    task_id = _fail_after_the_charge(shop, "s12")
    [payment] = shop.gateway.gateway.payments
    assert [r["payment"] for r in shop.refunds] == [payment["id"]]
    assert len(shop.gateway.notes_of("undo-end", task_id)) == 1
    error = shop.app.AsyncResult(task_id).result
    assert isinstance(error, ValueError) and "cannot be fulfilled" in str(error)


def test_s12_twin_without_undo_a_failed_order_stays_charged(
    undo_shop: Callable[..., UndoShop],
) -> None:
    shop = undo_shop()
    shop.start_worker(sabotage=(FAILURE_SKIPS_UNDO,))
    _fail_after_the_charge(shop, "s12-twin")
    assert len(shop.gateway.gateway.payments) == 1
    assert shop.refunds == [], "charged for an order that failed"


# --- s12b: killed inside the undo --------------------------------------------------------
#
# A protected worker and its sabotaged twin run side by side (one test, two queues).


def _refunds_of(shop: UndoShop, order: str) -> list[dict[str, Any]]:
    charged = {p["id"]: p for p in shop.gateway.gateway.payments}
    return [r for r in shop.refunds if charged[r["payment"]]["reference"] == order]


def _refunded_orders(shop: UndoShop) -> list[str]:
    """The order of each refund the gateway made, in order (both shops share it)."""
    charged = {p["id"]: p["reference"] for p in shop.gateway.gateway.payments}
    return [charged[r["payment"]] for r in shop.refunds]


def _shop_and_twin(
    undo_shop: Callable[..., UndoShop], database_url: str, switch: str
) -> tuple[UndoShop, UndoShop]:
    """The protected shop on ``database_url`` and its twin with ``switch`` off, each with
    its worker started."""
    shop, twin = undo_shop(database_url), undo_shop()
    shop.start_worker()
    twin.start_worker(sabotage=(switch,))
    return shop, twin


def _published_on_both(
    shop: UndoShop, twin: UndoShop, task: str, order: str, *args: Any, **options: Any
) -> list[str]:
    """``task(order, *args)`` on the shop and ``task(order + "-twin", *args)`` on its twin,
    each published with ``options``; the two task ids."""
    return [
        str(s.app.signature(task, args=(o, *args)).apply_async(**options).id)
        for s, o in ((shop, order), (twin, f"{order}-twin"))
    ]


def test_s12b_killed_inside_an_undo_it_continues_and_a_marked_undo_is_not_run_again(
    undo_shop: Callable[..., UndoShop], database_url: str
) -> None:
    """Goods (an outbound refund) then shipping (a plain refund): the shipping's undo runs
    and is marked done; the goods' refund is processed, its answer held, and the child
    that sent it is killed. The next delivery (the sweep's, after the lease expired)
    continues the undo: the goods' refund is reconciled, the shipping's is not redone.
    The twin, without done marks, refunds the shipping twice."""
    shop, twin = _shop_and_twin(undo_shop, database_url, UNDO_NOT_MARKED_DONE)
    shop.refund_hold.count = 2
    task_ids = _published_on_both(shop, twin, "undo_it.two_charges_then_fail", "s12b")
    pids = shop.refund_hold.wait_reached(2)
    for s, task_id in zip((shop, twin), task_ids, strict=True):
        record = s.execution(task_id)
        assert record is not None and record.state.value == "COMPENSATING"
    for pid in pids:
        shop.kill(pid)
    shop.refund_hold.released.set()
    with shop.sweeping(), twin.sweeping():  # the dead children's leases expire
        for s, task_id in zip((shop, twin), task_ids, strict=True):
            s.wait_state(task_id, "FAILED", timeout=30)
            s.wait_backend(task_id, "FAILURE")
    assert len(_refunds_of(shop, "s12b:goods")) == 1, "the held refund was reconciled"
    assert len(_refunds_of(shop, "s12b:shipping")) == 1, "the undo marked done ran once"
    assert len(shop.gateway.notes_of("body-start", task_ids[0])) == 1, "no body re-run"
    record = shop.execution(task_ids[0])
    assert record is not None and record.recovery_count == 1
    assert len(_refunds_of(twin, "s12b-twin:goods")) == 1
    assert len(_refunds_of(twin, "s12b-twin:shipping")) == 2, "the twin refunded twice"


# --- a hard time limit never starts undo -------------------------------------------------


def test_a_hard_time_limit_after_the_charge_never_starts_undo(
    undo_shop: Callable[..., UndoShop], database_url: str
) -> None:
    """P5: the child is killed past its time limit after the charge; the next delivery
    continues the body and completes — nothing refunded. The twin, which counts a
    delivery that died as a failure, refunds the paid order."""
    shop, twin = _shop_and_twin(undo_shop, database_url, UNDO_ON_ANY_FAILURE)
    overrun, limit = "undo_it.charge_then_overrun", {"time_limit": TIME_LIMIT_SECONDS}
    task_ids = _published_on_both(shop, twin, overrun, "tl", 60, **limit)
    with shop.sweeping(), twin.sweeping():
        ended = [
            wait_for(
                lambda s=s, t=t: (r := s.execution(t)) is not None and r.terminal and r,
                30,
                "the execution to end",
            )
            for s, t in zip((shop, twin), task_ids, strict=True)
        ]
    assert [record.state.value for record in ended] == ["COMPLETED", "FAILED"]
    assert len(shop.gateway.notes_of("overrunning", task_ids[0])) == 1
    assert len(shop.gateway.gateway.payments) == 2
    assert _refunded_orders(shop) == ["tl-twin"], "only the twin refunds"


def test_a_soft_time_limit_the_body_lets_through_fails_it_and_refunds_once(
    undo_shop: Callable[..., UndoShop], database_url: str
) -> None:
    """The soft limit lands between calls (the charge settled, the body sleeping): it is
    the application's exception, as Celery means it, so the execution ends ``FAILED``
    and its undo refunds the charge once. A hard limit (above) kills the process at an
    unknown point and is continued instead (design: what fails an execution). The
    twin, whose failures skip the undos, leaves the failed order charged."""
    shop, twin = _shop_and_twin(undo_shop, database_url, FAILURE_SKIPS_UNDO)
    overrun, limit = "undo_it.charge_then_overrun", {"soft_time_limit": TIME_LIMIT_SECONDS}
    task_ids = _published_on_both(shop, twin, overrun, "soft", 60, **limit)
    for s, task_id in zip((shop, twin), task_ids, strict=True):
        s.wait_state(task_id, "FAILED", timeout=30)
        s.wait_backend(task_id, "FAILURE")
    assert type(shop.app.AsyncResult(task_ids[0]).result).__name__ == "SoftTimeLimitExceeded"
    assert len(shop.gateway.gateway.payments) == 2
    assert _refunded_orders(shop) == ["soft"], "the twin stays charged"


# --- a fence never starts undo ----------------------------------------------------------------


def _freeze_past_the_lease(shop: UndoShop, order: str) -> tuple[str, int]:
    """Publish ``charge_then_freeze(order)``; SIGSTOP the child waiting at its gate (after
    the charge and its undo's declaration); the task id and the frozen pid."""
    task_id = shop.publish("undo_it.charge_then_freeze", order)
    gate = f"freeze:{order}"
    [pid] = wait_for(lambda: shop.gateway.gate_waiters(gate), 20, f"the body at {gate}")
    shop.stop(pid)
    return task_id, pid


def test_a_fenced_holder_whose_body_fails_never_starts_undo(
    undo_shop: Callable[..., UndoShop], database_url: str
) -> None:
    """P5, with a real worker: the frozen child's lease expires, the sweep re-drives the
    order, the worker's other child takes it over and completes it (the charge replayed).
    The frozen child, continued, fails: fenced, so no ``COMPENSATING``, its undo (a plain
    refund, which nothing else would stop) never runs, and the paid order stays paid.
    The twin lets a fenced holder start its undo: the paid order is refunded."""
    shop, twin = undo_shop(database_url), undo_shop()
    workers = [
        shop.start_worker(concurrency=2, ready=False),
        twin.start_worker(concurrency=2, sabotage=(FENCED_HOLDER_STARTS_UNDO,), ready=False),
    ]
    for worker in workers:
        UndoShop.wait_ready(worker)
    frozen = [_freeze_past_the_lease(s, order) for s, order in ((shop, "zf"), (twin, "zf-twin"))]
    try:
        with shop.sweeping(), twin.sweeping():
            for s, (task_id, _) in zip((shop, twin), frozen, strict=True):
                s.wait_state(task_id, "COMPLETED", timeout=20)
    finally:
        for s, order, (_, pid) in zip((shop, twin), ("zf", "zf-twin"), frozen, strict=True):
            s.gateway.open_gate(f"freeze:{order}")
            s.cont(pid)
    for worker, (task_id, _) in zip(workers, frozen, strict=True):
        fenced = f"execution.fenced execution_id={task_id} task=undo_it.charge_then_freeze token=1"
        worker.wait_until(lambda f=fenced, w=worker: f in w.output(), 10, message=fenced)
    task_id = frozen[0][0]
    record = shop.execution(task_id)
    assert record is not None and record.state.value == "COMPLETED"
    assert read_started(shop.agboss.store, shop.agboss.engine_settings, task_id) is None
    assert shop.gateway.notes_of("undo-start", task_id) == [], "no undo ran"
    assert _refunds_of(shop, "zf") == [], "the paid order stays paid"
    shop.wait_backend(task_id, "SUCCESS")
    twin_record = twin.execution(frozen[1][0])
    assert twin_record is not None and twin_record.state.value == "COMPLETED"
    assert len(_refunds_of(twin, "zf-twin")) == 1, "the twin refunded a paid order"
