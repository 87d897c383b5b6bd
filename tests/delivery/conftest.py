"""What one delivery of a ``PaymentTask`` does, in a real worker, on both stores.

``shop`` is a Celery app with ``AGBoss`` on a throwaway store (a SQLite file, or a
PostgreSQL clone of a migrated template), Celery's in-memory broker and results, and
a ``FakeGateway`` on a virtual clock that also moves the database clock. Tests declare
their own tasks on it and run them in ``shop.worker()``, a real worker in a thread of
this process (``celery_agboss.testing.celery_app.running_worker``). The speed-ups these
tests rely on, which a deployment does not use: the in-memory broker, a 0.2 s retry
after an unknown outcome, no sweep beat (a test runs the sweep itself), and the virtual
clock for waits longer than a test should take (a lease's lapse among them).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from celery import signals as celery_signals

from celery_agboss import AGBoss, Completed, NotSent, OutboundCall, PaymentTask
from celery_agboss.core.compensation import UndoStep
from celery_agboss.core.executions import ExecutionRecord
from celery_agboss.core.outbound import CallContext, Lookup
from celery_agboss.core.store_protocol import IntentRecord
from celery_agboss.sweep import SweepReport, run_sweep
from celery_agboss.task import undo_function
from celery_agboss.testing.celery_app import (
    TEST_LEASE_TTL_SECONDS,
    close_test_app,
    make_test_app,
    running_worker,
)
from celery_agboss.testing.clock import VirtualClock
from celery_agboss.testing.gateway import FakeGateway
from celery_agboss.testing.gateway_types import GatewayRequest, is_definite_failure
from tests.support.processes import wait_until
from tests.support.stores import STORE_BACKENDS, fresh_store_url


@dataclass
class PaymentShop:
    """An app, its store, a gateway, and the calls its tasks make."""

    app: Celery
    clock: VirtualClock
    gateway: FakeGateway
    calls: dict[str, OutboundCall] = field(default_factory=dict)

    @property
    def agboss(self) -> AGBoss:
        return AGBoss.of(self.app)

    def call(self, name: str = "shop.charge", **options: Any) -> OutboundCall:
        """An outbound call charging ``request["amount"]`` at the fake gateway, reconciled
        by a lookup of its key (a decline is the only definite failure)."""
        if name in self.calls:
            return self.calls[name]
        gateway = self.gateway

        def send(call: CallContext) -> Any:
            return gateway.charge(
                call.request["amount"], call.idempotency_key, reference=call.request.get("order")
            )

        made = OutboundCall(
            name=name,
            send=send,
            reconcile=self._reconcile_by_lookup,
            key_retention=timedelta(hours=24),
            is_definite_failure=is_definite_failure,
            transaction_id=lambda result: result.get("id"),
            **options,
        )
        self.calls[name] = self.agboss.register(made)
        return made

    def refund_call(self, name: str = "shop.refund", *, refusable: bool = False) -> OutboundCall:
        """An outbound call refunding ``request["payment"]`` at the fake gateway (what an
        undo sends), reconciled by a lookup of its key. ``refusable``: the gateway may
        refuse it definitively (a decline: nothing moved), so an undo that sends it can
        fail and be re-driven; it is then reconciled by a resend under its key."""
        if name in self.calls:
            return self.calls[name]
        gateway = self.gateway

        def send(call: CallContext) -> Any:
            return gateway.refund(call.request["payment"], call.idempotency_key)

        def resend(call: CallContext, lookup: Lookup) -> Any:
            return NotSent()

        made = OutboundCall(
            name=name,
            send=send,
            reconcile=resend if refusable else self._reconcile_by_lookup,
            key_retention=timedelta(hours=24),
            **({"is_definite_failure": is_definite_failure} if refusable else {}),
        )
        self.calls[name] = self.agboss.register(made)
        return made

    def looked_up_call(self, name: str, send: Callable[[CallContext], Any]) -> OutboundCall:
        """A test's own outbound call ``send``, reconciled by a lookup of its key at the
        fake gateway (so a lost answer is found, never sent twice), registered on the app."""
        made = OutboundCall(
            name=name,
            send=send,
            reconcile=self._reconcile_by_lookup,
            key_retention=timedelta(hours=24),
        )
        registered: OutboundCall = self.agboss.register(made)
        return registered

    def _reconcile_by_lookup(self, call: CallContext, lookup: Lookup) -> Any:
        found = self.gateway.lookup(lookup.idempotency_key)
        return NotSent() if found is None else Completed(found)

    def task(self, **options: Any) -> Callable[[Callable[..., Any]], Any]:
        """``@shop.task()``: a bound ``PaymentTask`` of this app, named after the function."""

        def declare(fn: Callable[..., Any]) -> Any:
            return self.app.task(
                base=PaymentTask, bind=True, shared=False, name=f"shop.{fn.__name__}", **options
            )(fn)

        return declare

    @contextmanager
    def worker(self, **options: Any) -> Iterator[Any]:
        with running_worker(self.app, **options) as worker:
            try:
                yield worker
            finally:
                self.gateway.release()

    def deliver(self, task: Any, *args: Any, states: tuple[str, ...], timeout: float = 20) -> str:
        """Publish ``task(*args)`` to the running worker and wait for one of ``states``;
        the task id."""
        task_id = str(task.delay(*args).id)
        self.wait_state(task_id, *states, timeout=timeout)
        return task_id

    def run(self, task: Any, *args: Any, states: tuple[str, ...], timeout: float = 20) -> str:
        """``deliver`` in a worker of its own, which stops before the test reads what the
        delivery left."""
        with self.worker():
            return self.deliver(task, *args, states=states, timeout=timeout)

    def revoke_at(
        self, task_id: str, reached: threading.Event, go_on: threading.Event, gate: float = 20
    ) -> None:
        """Revoke ``task_id`` (no ``terminate``: the body keeps running) once its body
        reached ``reached``, and let it go on only once the revoke is recorded, so the
        body's next step meets the cancel."""
        assert reached.wait(gate), "the body to reach its gate"
        self.app.control.revoke(task_id)
        wait_until(
            lambda: self.execution(task_id).cancel_requested,
            10,
            message="the revoke to be recorded",
        )
        go_on.set()

    def refund_undo(self, refund: OutboundCall) -> None:
        """The undo function ``refund-charge(payment)``: it refunds ``payment`` through
        ``refund`` (keyed ``<step key>:compensation``)."""

        @undo_function(self.app, "refund-charge")
        def refund_charge(task: Any, undo: UndoStep, payment: str) -> None:
            task.outbound(refund, {"payment": payment})

    def pay_noting_each_run(self) -> tuple[Any, list[str]]:
        """The task ``shop.pay(order)``, charging 1000 under the order as its key, and
        the orders its body ran for, in order."""
        charge = self.call()
        ran: list[str] = []

        @self.task()
        def pay(task: Any, order: str) -> Any:
            ran.append(order)
            return task.outbound(charge, {"amount": 1000, "order": order}, business_key=order)

        return pay, ran

    def producer(self) -> tuple[Celery, str]:
        """A plain Celery app on this shop's broker (another app, no AGBoss) and the queue
        the shop's worker consumes; the caller closes it."""
        producer = Celery("producer-app", broker=self.app.conf.broker_url, set_as_current=False)
        return producer, self.app.conf.task_default_queue

    def ship_task(self) -> Any:
        """The task ``shop.ship(order)``: a 500 shipping charge through the call
        ``shop.shipping``, under a key of its own run (no business key)."""
        shipping = self.call("shop.shipping")

        @self.task()
        def ship(task: Any, order: str) -> Any:
            return task.outbound(shipping, {"amount": 500, "order": order})

        return ship

    def refund_task(self, refund: OutboundCall) -> Any:
        """The task ``shop.refund_payment(payment)``: an undo declared as a Celery
        signature, refunding ``payment`` through ``refund`` under ``refund:<payment>``."""

        @self.task()
        def refund_payment(task: Any, payment: str) -> Any:
            return task.outbound(refund, {"payment": payment}, business_key=f"refund:{payment}")

        return refund_payment

    def pay_failing_after_its_charge(
        self, undo: str | Callable[[str], Any], name: str = "pay"
    ) -> Any:
        """A task ``shop.<name>`` that charges the order and declares its undo
        (``_charged_declaring``), then fails ("out of stock"): its failure runs the undo."""
        charge = self.call()

        def body(task: Any, order: str) -> Any:
            _charged_declaring(task, charge, order, undo)
            raise LookupError("out of stock")

        body.__name__ = name
        return self.task()(body)

    def pay_revoked_after_its_charge(
        self, undo: str | Callable[[str], Any]
    ) -> Callable[[str], str]:
        """A task ``pay`` that charges the order, declares its undo
        (``_charged_declaring``) and waits before its next step. The
        function returned publishes it for an order and revokes it at that wait
        (``revoke_at``), so its next step, a fenced effect, meets the cancel and the
        cancel runs the undo; the task id."""
        charge = self.call()
        charged, go_on = threading.Event(), threading.Event()

        @self.task()
        def pay(task: Any, order: str) -> Any:
            receipt = _charged_declaring(task, charge, order, undo)
            charged.set()
            assert go_on.wait(20)
            task.fenced_effect("mark-paid", lambda conn: None)  # stops here: the cancel
            return receipt

        def publish_and_revoke(order: str) -> str:
            task_id = str(pay.delay(order).id)
            self.revoke_at(task_id, charged, go_on)
            return task_id

        return publish_and_revoke

    # --- what tests read -----------------------------------------------------------

    def times_sent(self, call: str) -> int:
        """How many requests reached the gateway under ``call``'s keys (each key names its
        call), whether they moved money or not."""
        return sum(1 for r in self.gateway.requests if call in (r.idempotency_key or ""))

    def requests_of(self, operation: str) -> list[GatewayRequest]:
        """The requests of ``operation`` (``"charge"``, ``"refund"``) that reached the
        gateway, whichever call sent them."""
        return [r for r in self.gateway.requests if r.operation == operation]

    def refunded(self) -> list[tuple[str, int]]:
        """Each refund the gateway made, as (payment, amount), sorted."""
        return sorted((r["payment"], r["amount"]) for r in self.gateway.refunds)

    def net_paid(self) -> int:
        """What the customer paid in all: charged, less refunded."""
        charged = sum(p["amount"] for p in self.gateway.payments)
        return charged - sum(r["amount"] for r in self.gateway.refunds)

    def execution(self, execution_id: str) -> ExecutionRecord:
        record = self.agboss.executions.read_execution(execution_id)
        assert record is not None, f"no execution {execution_id}"
        return record

    def wait_state(self, execution_id: str, *states: str, timeout: float = 20) -> ExecutionRecord:
        def reached() -> ExecutionRecord | None:
            record = self.agboss.executions.read_execution(execution_id)
            return record if record is not None and record.state.value in states else None

        def now() -> object:
            return getattr(self.agboss.executions.read_execution(execution_id), "state", None)

        found: ExecutionRecord = wait_until(
            reached,
            timeout,
            message=lambda: f"{execution_id} to be {'/'.join(states)} (is {now()})",
        )
        return found

    def intents(self, execution_id: str) -> list[IntentRecord]:
        with self.agboss.store.read_transaction() as tx:
            return tx.list_intents(execution_id)

    def sweep(self, **options: Any) -> SweepReport:
        return run_sweep(self.agboss, **options)

    def redrive_after_crash(self, task_id: str) -> None:
        """The crashed delivery's lease is left to expire (the virtual clock moves past
        it), and the sweep re-drives the execution, as a beat would, until a new holder
        has it."""
        crashed = self.agboss.store.read_lease(task_id)
        assert crashed is not None
        ttl = self.agboss.settings.lease_ttl_seconds

        def taken_over() -> bool:
            lease = self.agboss.store.read_lease(task_id)
            if lease is not None and lease.token != crashed.token:
                return True
            if lease is not None and lease.live:
                self.clock.advance(ttl + 1)
            self.sweep()
            return False

        wait_until(taken_over, 15, interval=0.2, message="a new holder of the crashed execution")

    def new_id(self) -> str:
        return f"exec-{uuid.uuid4().hex[:12]}"


def _charged_declaring(
    task: Any, charge: OutboundCall, order: str, undo: str | Callable[[str], Any]
) -> Any:
    """``task`` charges ``order`` 1000 under ``order:<order>`` and declares its undo: a
    registered undo's name, given the payment, or ``undo(payment)``, an undo task's
    signature. The receipt."""
    receipt = task.outbound(charge, {"amount": 1000}, business_key=f"order:{order}")
    if isinstance(undo, str):
        task.undo_with(undo, payment=receipt["id"])
    else:
        task.undo_with(undo(receipt["id"]))
    return receipt


def assert_waits_for_an_operator(record: ExecutionRecord, starts: str = "", *names: str) -> None:
    """A person must decide: ``WAITING_OPERATOR``, with a reason that starts with
    ``starts`` and names each of ``names``."""
    assert record.state.value == "WAITING_OPERATOR", (record.state, record.reason)
    reason = record.reason or ""
    assert reason.startswith(starts), reason
    for name in names:
        assert name in reason, (name, reason)


@pytest.fixture(params=STORE_BACKENDS)
def delivery_store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return fresh_store_url(request, tmp_path, "delivery-migrated")


@pytest.fixture
def shop_config() -> dict[str, Any]:
    """Settings a test adds to its app (override it in a module)."""
    return {}


SHOP_LEASE_TTL_S = 30
"""The shop's lease, as docs/testing.md advises where no test needs one to lapse in real
time (the virtual clock moves past it): SQLite's write-lock bound is then 7.5 s. At the
kit's 5 s it is 1.25 s, which pauses of a loaded CI machine exceeded: a settle or a
verdict rolled back, the execution rightly left for a reconcile, the test's next step
met what it did not stage. A module's ``shop_config`` may set its own."""


def lease_lapses_in_real_time() -> dict[str, Any]:
    """The ``shop_config`` of a module whose tests wait for a lease to lapse in real time
    (a delivery a store outage stopped, delivered again once its lease lapsed): the
    kit's 5 s lease."""
    return {"agboss_lease_ttl": TEST_LEASE_TTL_SECONDS}


@pytest.fixture
def shop(delivery_store_url: str, shop_config: dict[str, Any]) -> Iterator[PaymentShop]:
    clock = VirtualClock()
    config = {"agboss_lease_ttl": SHOP_LEASE_TTL_S, **shop_config}
    app = make_test_app(delivery_store_url, clock_offset_source=clock.offset_ms, config=config)
    gateway = FakeGateway(clock=clock, hold_timeout=20)
    try:
        yield PaymentShop(app=app, clock=clock, gateway=gateway)
    finally:
        gateway.close()
        close_test_app(app)


@pytest.fixture
def published() -> Iterator[list[str]]:
    """Task ids that reached the broker (``after_task_publish``)."""
    ids: list[str] = []

    def on_publish(sender: Any = None, headers: Any = None, **_: Any) -> None:
        ids.append(str((headers or {}).get("id")))

    celery_signals.after_task_publish.connect(on_publish, weak=False)
    try:
        yield ids
    finally:
        celery_signals.after_task_publish.disconnect(on_publish)
