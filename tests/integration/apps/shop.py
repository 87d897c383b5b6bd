"""A small shop for the integration tests: payment tasks and their unprotected twins.

``make_app(config)`` builds the Celery app; the worker subprocess runs
``celery -A tests.integration.apps.shop:app`` with the config in ``AGBOSS_IT_CONFIG``
(JSON), and the test process builds its own app from the same config to publish and
to read the store. Tasks are not shared between apps (``shared=False``), so every
test's app is its own. The gateway is the test process's ``FakeGateway`` behind
``tests.integration.gateway_http``; each request carries this process's pid.
"""

from __future__ import annotations

import functools
import importlib
import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from datetime import timedelta
from typing import Any
from urllib.parse import quote

from celery import Celery, signals
from sqlalchemy import text

from celery_agboss import AGBoss, Completed, NotSent, OutboundCall, PaymentTask, Unknown
from celery_agboss.core import sabotage
from celery_agboss.core.outbound import CallContext, Lookup
from celery_agboss.errors import OutboundCallOutcomeUnknownError
from celery_agboss.testing.celery_app import throwaway_app_config
from tests.integration.apps.body_publish_tasks import add_body_publish_tasks

CONFIG_ENV = "AGBOSS_IT_CONFIG"
HTTP_TIMEOUT_SECONDS = 30.0


class GatewayDeclined(Exception):
    """The gateway answered that it processed nothing (a definite failure)."""


class GatewayAnswerLost(Exception):
    """No answer: the gateway may or may not have charged."""


def _http(base: str, method: str, path: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        base + path,
        data=data,
        method=method,
        headers={"Content-Type": "application/json", "X-Worker-Pid": str(os.getpid())},
    )
    try:
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_SECONDS) as response:
            raw = response.read()
    except urllib.error.HTTPError as exc:
        payload = json.loads(exc.read() or b"{}")
        if exc.code == 402:
            raise GatewayDeclined(payload.get("error")) from None
        raise GatewayAnswerLost(f"HTTP {exc.code}: {payload.get('error')}") from None
    except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
        raise GatewayAnswerLost(str(exc)) from None
    return json.loads(raw) if raw else None


def gateway_note(gateway: str, event: str, task_id: str | None, **fields: Any) -> None:
    """Tell the test where a body is: the fake gateway's ``/note`` keeps it for the test."""
    _http(gateway, "POST", "/note", {"event": event, "task_id": task_id, **fields})


def charge_at_gateway(gateway: str) -> Callable[[CallContext], Any]:
    """The ``send`` of a charge (``{"amount", "order"}``): ``POST /charge`` with its key."""

    def send(call: CallContext) -> Any:
        body = {"amount": call.request["amount"], "idempotency_key": call.idempotency_key}
        return _http(gateway, "POST", "/charge", {**body, "reference": call.request["order"]})

    return send


def lookup_at_gateway(gateway: str) -> Callable[[CallContext, Lookup], Any]:
    """The ``reconcile`` of the apps' outbound calls: the gateway's receipt for the key
    (``Completed``), ``NotSent`` when it holds none, ``Unknown`` when it does not answer."""

    def reconcile(call: CallContext, lookup: Lookup) -> Any:
        key = quote(lookup.idempotency_key, safe="")
        try:
            found = _http(gateway, "GET", f"/lookup?key={key}")
        except GatewayAnswerLost as exc:
            return Unknown(f"lookup failed: {exc}")
        return NotSent() if found is None else Completed(found)

    return reconcile


PSEUDONYM_KEY = "integration-tests-pseudonym-key"


def base_app(config: dict[str, Any], name: str) -> Celery:
    """The app every integration app starts from, in the test process and in its workers:
    ``make_test_app``'s settings (``throwaway_app_config``, what the ``agboss_app``
    fixture gives users) moved onto the test's real broker, result backend and store,
    with the speed-ups of tests/integration/harness.py; ``AGBoss`` on it."""
    app = Celery(f"{name}_{config['queue']}", broker=config["broker_url"])
    transport_options: dict[str, Any] = {}
    if config["broker_url"].startswith("redis"):
        transport_options = {
            "visibility_timeout": config.get("visibility_timeout", 60),
            "unacked_restore_interval": 1,
            "unacked_restore_throttle": 1,
        }
    app.conf.update(
        {
            **throwaway_app_config(config["database_url"], config["queue"]),
            "broker_url": config["broker_url"],
            "result_backend": config["backend_url"],
            "broker_transport_options": transport_options,
            "worker_hijack_root_logger": True,  # a worker's log is what a test reads
            "result_extended": True,
            "agboss_pseudonym_key": PSEUDONYM_KEY,
            "agboss_lease_ttl": config.get("lease_ttl", 5),
            "agboss_retry_delay": config.get("retry_delay", 1),
            "agboss_max_recovery_attempts": config.get("max_recovery_attempts", 10),
            "agboss_requested_grace": config.get("requested_grace", 300),
            "agboss_attempt_timeout": config.get("attempt_timeout", 120),
        }
    )
    if config.get("tenant"):  # two stores sharing keys on purpose (docs/keys.md)
        app.conf.agboss_tenant = config["tenant"]
    AGBoss(app)
    return app


def app_from_environment(config_env: str, make_app: Callable[[dict[str, Any]], Celery]) -> Any:
    """A worker's app (``-A <module>:app``): ``make_app`` of the config the test put in
    ``config_env`` (JSON), with the protections it switched off; None when unset (the
    test process, or another app's worker importing this module)."""
    raw = os.environ.get(config_env)
    if not raw:
        return None
    # The Celery layer's sabotage names are registered where they are defined.
    for module in ("celery_agboss.delivery.lifecycle", "celery_agboss.delivery.time_limits"):
        importlib.import_module(module)
    sabotage.activate_from_environment()
    return make_app(json.loads(raw))


def overrun_on_first_delivery(task: Any, seconds: float, note: Callable[..., None]) -> None:
    """On the execution's first delivery only: note ``overrunning``, then run on for
    ``seconds`` (past the hard time limit a test set)."""
    record = AGBoss.of(task.app).executions.read_execution(task.request.id)
    if record is not None and record.deliveries == 1:
        note("overrunning", task.request.id)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            time.sleep(0.1)


def _declined(exc: BaseException) -> bool:
    return isinstance(exc, GatewayDeclined)


def gateway_call(
    name: str, gateway: str, send: Callable[[CallContext], Any], **options: Any
) -> OutboundCall:
    """An outbound call to the test's gateway as every app here makes one, so that they
    all reconcile and fail alike: its lookup by key reconciles, a decline (402) is a
    definite failure, keys are kept a day; ``options`` are further ``OutboundCall``
    fields."""
    return OutboundCall(
        name=name,
        send=send,
        reconcile=lookup_at_gateway(gateway),
        is_definite_failure=_declined,
        key_retention=timedelta(hours=24),
        **options,
    )


GatewayApp = tuple[Celery, AGBoss, str, Callable[..., None]]
SHOP_APP_NAME = "agboss_it"


def gateway_app(
    config: dict[str, Any], name: str = SHOP_APP_NAME, *, shop_tasks: bool = False
) -> GatewayApp:
    """``base_app`` with what its tasks reach the test's gateway by: the app, its
    ``AGBoss``, the gateway's URL and ``gateway_note`` bound to that URL. With
    ``shop_tasks`` the app is the shop's (its ``it.*`` tasks and ``it.charge``), which
    the apps that extend the shop add their own tasks to."""
    gateway = config["gateway_url"]
    app = base_app(config, name)
    parts: GatewayApp = (app, AGBoss.of(app), gateway, functools.partial(gateway_note, gateway))
    if shop_tasks:
        _add_shop_tasks(config, *parts)
    return parts


def make_app(config: dict[str, Any]) -> Celery:
    return gateway_app(config, shop_tasks=True)[0]


def shop_charge(task: Any, order_id: str, amount: int = 1000) -> Any:
    """``it.charge`` of the order from a task of an app with the shop's tasks: one
    payment per order, whichever task charges it."""
    charge_call = AGBoss.of(task.app).registry["it.charge"]
    return task.outbound(
        charge_call, {"amount": amount, "order": order_id}, business_key=f"order:{order_id}"
    )


def gateway_gate(gateway: str, name: str) -> None:
    """Block in the fake gateway's ``/gate`` until the test opens the gate ``name``."""
    _http(gateway, "POST", "/gate", {"name": name})


def _add_shop_tasks(
    config: dict[str, Any], app: Celery, agboss: AGBoss, gateway: str, note: Callable[..., None]
) -> None:
    """The shop's tasks, their unprotected twins and ``it.charge`` (registered) on ``app``."""
    gate = functools.partial(gateway_gate, gateway)
    charge_call = gateway_call(
        "it.charge",
        gateway,
        charge_at_gateway(gateway),
        # The fake gateway's lookup by key is consistent: a test may say its "not found"
        # proves absence (a cancel then settles the intent FAILED instead of asking a person).
        lookup_proves_absence=bool(config.get("lookup_proves_absence", False)),
        transaction_id=lambda receipt: receipt["id"],  # checks an operator's --completed
    )
    agboss.register(charge_call)
    _add_charge_tasks(app, note, gate)
    _add_retry_and_pause_tasks(app, note)
    _add_chain_tasks(app, note)
    _add_fenced_effect_tasks(app, gate)
    _add_unprotected_twins(app, gateway, note, gate)
    if config.get("connect_before_fork"):
        _note_parent_backend(app, agboss, note)
    add_body_publish_tasks(app, charge_call, note, gate)
    for gateway_name, gateway_url in (config.get("sdk_gateways") or {}).items():
        _sdk_charge_task(app, agboss, gateway_name, gateway_url)


def _add_charge_tasks(app: Celery, note: Callable[..., None], gate: Callable[[str], None]) -> None:
    """Charges that a test kills, stalls or overruns around the call to the gateway."""

    @app.task(base=PaymentTask, bind=True, shared=False, name="it.charge_order")
    def charge_order(self: Any, order_id: str, amount: int = 1000, gate_name: str | None = None):  # type: ignore[no-untyped-def]
        redelivered = bool((self.request.delivery_info or {}).get("redelivered"))
        note("body-start", self.request.id, redelivered=redelivered)
        if gate_name:
            gate(gate_name)
        receipt = shop_charge(self, order_id, amount)
        note("body-end", self.request.id, outcome=str(self.last_outcome))
        return {"payment": receipt["id"], "order": order_id}

    @app.task(base=PaymentTask, bind=True, shared=False, name="it.slow_charge")
    def slow_charge(self: Any, order_id: str, seconds: float, amount: int = 1000):  # type: ignore[no-untyped-def]
        note("body-start", self.request.id)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            time.sleep(0.1)
        receipt = shop_charge(self, order_id, amount)
        note("body-end", self.request.id)
        return {"payment": receipt["id"], "order": order_id}

    @app.task(base=PaymentTask, bind=True, shared=False, name="it.charge_then_overrun")
    def charge_then_overrun(self: Any, order_id: str, seconds: float, amount: int = 1000):  # type: ignore[no-untyped-def]
        """Charges, then (on its first delivery only) overruns its hard time limit."""
        note("body-start", self.request.id)
        receipt = shop_charge(self, order_id, amount)
        overrun_on_first_delivery(self, seconds, note)
        note("body-end", self.request.id)
        return {"payment": receipt["id"], "order": order_id}

    @app.task(base=PaymentTask, bind=True, shared=False, name="it.insistent_charge")
    def insistent_charge(self: Any, order_id: str, amount: int = 1000):  # type: ignore[no-untyped-def]
        """Catches an unknown outcome and calls again in the same delivery (design: R23)."""
        note("body-start", self.request.id)
        try:
            receipt = shop_charge(self, order_id, amount)
        except OutboundCallOutcomeUnknownError:
            note("charge-again", self.request.id)
            receipt = shop_charge(self, order_id, amount)
        note("body-end", self.request.id)
        return {"payment": receipt["id"], "order": order_id}


def _add_retry_and_pause_tasks(app: Celery, note: Callable[..., None]) -> None:
    """Charges whose execution outlives a delivery: a retry, a countdown, a pause."""

    @app.task(base=PaymentTask, bind=True, shared=False, name="it.retrying_charge")
    def retrying_charge(self: Any, order_id: str, amount: int = 1000):  # type: ignore[no-untyped-def]
        note("body-start", self.request.id, retries=self.request.retries)
        if self.request.retries == 0:
            retry = self.retry(countdown=0, throw=False)
            # Hold the lease until the retry message has been delivered and deferred.
            deadline = time.monotonic() + 20
            executions = AGBoss.of(app).executions
            while time.monotonic() < deadline:
                record = executions.read_execution(self.request.id)
                if record is not None and record.wake_requested:
                    break
                time.sleep(0.1)
            note("retry-deferred-seen", self.request.id)
            raise retry
        receipt = shop_charge(self, order_id, amount)
        note("body-end", self.request.id)
        return {"payment": receipt["id"], "order": order_id}

    @app.task(base=PaymentTask, bind=True, shared=False, name="it.waiting_charge")
    def waiting_charge(self: Any, order_id: str, wait: float, amount: int = 1000):  # type: ignore[no-untyped-def]
        note("body-start", self.request.id, retries=self.request.retries)
        if self.request.retries == 0:
            raise self.retry(countdown=wait)
        receipt = shop_charge(self, order_id, amount)
        note("body-end", self.request.id)
        return {"payment": receipt["id"], "order": order_id}

    @app.task(base=PaymentTask, bind=True, shared=False, name="it.approved_charge")
    def approved_charge(self: Any, order_id: str, amount: int = 1000):  # type: ignore[no-untyped-def]
        note("body-start", self.request.id)
        answer = self.pause("approve", {"order": order_id})
        if not answer.get("approved"):
            return {"declined": order_id}
        receipt = shop_charge(self, order_id, amount)
        return {"payment": receipt["id"], "order": order_id, "by": answer.get("by")}


def _add_chain_tasks(app: Celery, note: Callable[..., None]) -> None:
    """What a charge is chained to: the next step, or an errback after a paid failure."""

    @app.task(bind=True, shared=False, name="it.refund_on_error")
    def refund_on_error(self: Any, *args: Any, **kwargs: Any):  # type: ignore[no-untyped-def]
        """An errback a shop would attach: it refunds the order it is told failed."""
        note("refund", self.request.id)

    @app.task(base=PaymentTask, bind=True, shared=False, name="it.failing_charge")
    def failing_charge(self: Any, order_id: str, amount: int = 1000):  # type: ignore[no-untyped-def]
        note("body-start", self.request.id)
        shop_charge(self, order_id, amount)
        raise ValueError(f"order {order_id} cannot be fulfilled")

    @app.task(base=PaymentTask, bind=True, shared=False, name="it.ship")
    def ship(self: Any, charged: dict[str, Any]):  # type: ignore[no-untyped-def]
        note("ship", self.request.id, payment=charged["payment"])
        return {"shipped": charged["order"]}

    @app.task(bind=True, shared=False, name="it.plain_ship")
    def plain_ship(self: Any, charged: dict[str, Any]):  # type: ignore[no-untyped-def]
        note("ship", self.request.id, payment=charged["payment"])
        return {"shipped": charged["order"]}


def _add_fenced_effect_tasks(app: Celery, gate: Callable[[str], None]) -> None:
    """Fenced effects that show which process and connection wrote them (design: trap 12)."""

    @app.task(base=PaymentTask, bind=True, shared=False, name="it.store_pids")
    def store_pids(self: Any, gate_name: str | None = None):  # type: ignore[no-untyped-def]
        """Which process, on which PostgreSQL backend, wrote this execution's effect
        (design: trap 12)."""
        if gate_name:
            gate(gate_name)

        def backend(conn: Any) -> dict[str, int]:
            pid = conn.execute(text("select pg_backend_pid()")).scalar()
            return {"pid": os.getpid(), "backend": int(pid)}

        return self.fenced_effect("pids", backend)

    @app.task(base=PaymentTask, bind=True, shared=False, name="it.bump_counter")
    def bump_counter(self: Any, times: int = 3, hold_seconds: float = 0.03):  # type: ignore[no-untyped-def]
        """Read-modify-write one row in fenced effects (trap 12, SQLite's BEGIN IMMEDIATE)."""

        def bump(conn: Any) -> int:
            value = int(conn.execute(text("select value from it_counter where id = 1")).scalar())
            time.sleep(hold_seconds)  # widen the window between the read and the write
            conn.execute(text("update it_counter set value = :v where id = 1"), {"v": value + 1})
            return value + 1

        return [self.fenced_effect(f"bump-{n}", bump) for n in range(times)]


def _add_unprotected_twins(
    app: Celery, gateway: str, note: Callable[..., None], gate: Callable[[str], None]
) -> None:
    """What plain Celery does: the same charges without AGBoss and without a key."""

    def plain_charge_body(
        task: Any, order_id: str, amount: int, gate_name: str | None, seconds: float
    ) -> Any:
        note("body-start", task.request.id)
        if gate_name:
            gate(gate_name)
        time.sleep(seconds)
        body = {"amount": amount, "idempotency_key": None, "reference": order_id}
        receipt = _http(gateway, "POST", "/charge", body)
        note("body-end", task.request.id)
        return {"payment": receipt["id"], "order": order_id}

    @app.task(bind=True, shared=False, name="it.plain_waiting_charge", acks_late=True)
    def plain_waiting_charge(self: Any, order_id: str, wait: float):  # type: ignore[no-untyped-def]
        if self.request.retries == 0:
            raise self.retry(countdown=wait)
        return plain_charge_body(self, order_id, 1000, None, 0.0)

    @app.task(
        bind=True,
        shared=False,
        name="it.plain_charge",
        acks_late=True,
        reject_on_worker_lost=True,
    )
    def plain_charge(  # type: ignore[no-untyped-def]
        self: Any,
        order_id: str,
        amount: int = 1000,
        gate_name: str | None = None,
        seconds: float = 0.0,
    ):
        return plain_charge_body(self, order_id, amount, gate_name, seconds)

    @app.task(bind=True, shared=False, name="it.plain_charge_acks_late", acks_late=True)
    def plain_charge_acks_late(self: Any, order_id: str, amount: int = 1000):  # type: ignore[no-untyped-def]
        return plain_charge_body(self, order_id, amount, None, 0.0)


def _note_parent_backend(app: Celery, agboss: AGBoss, note: Callable[..., None]) -> None:
    """Trap 12: the worker's main process holds a pooled store connection before the
    pool forks; it notes which PostgreSQL backend that is."""

    def connect_in_the_parent(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is not app:
            return
        with agboss.store.engine.connect() as conn:
            pid = conn.execute(text("select pg_backend_pid()")).scalar()
        note("parent-backend", None, backend=int(str(pid)))

    signals.worker_init.connect(connect_in_the_parent, weak=False)


def _sdk_charge_task(app: Celery, agboss: AGBoss, gateway_name: str, gateway_url: str) -> None:
    """``it.sdk_charge.<gateway>``: a charge through that gateway's adapter and official
    SDK, against the fake server at ``gateway_url`` (tests.adapters.<gateway>_support)."""
    support = importlib.import_module(f"tests.adapters.{gateway_name}_support")
    # The SDK's HTTP timeout well above how long a test holds an answer before it kills
    # the child waiting for it: the child must die waiting, not time out first.
    adapter = support.adapter_for(gateway_url, timeout=60, attempt_timeout=120)
    for call in adapter.calls:
        agboss.register(call)

    @app.task(base=PaymentTask, bind=True, shared=False, name=f"it.sdk_charge.{gateway_name}")
    def sdk_charge(self: Any, order_id: str, amount: int = 1000):  # type: ignore[no-untyped-def]
        request = support.charge_request(order_id, amount)
        receipt = self.outbound(adapter.charge, request, business_key=f"order:{order_id}")
        return {"payment": receipt["id"], "order": order_id}

    @app.task(base=PaymentTask, bind=True, shared=False, name=f"it.sdk_pay_order.{gateway_name}")
    def sdk_pay_order(self: Any, order_id: str, amount: int):  # type: ignore[no-untyped-def]
        """The README's shop on this gateway: charge the order, then mark it paid in the
        shop's own table (``PAID_ORDERS_DDL``, created by the test) with that payment."""
        request = support.charge_request(order_id, amount)
        receipt = self.outbound(adapter.charge, request, business_key=f"order:{order_id}")
        self.fenced_effect(
            "mark-paid",
            lambda conn: mark_paid(conn, order_id, amount, receipt),
            business_key=f"order:{order_id}",
        )
        return {"payment": receipt["id"], "order": order_id}


PAID_ORDERS_DDL = (
    "CREATE TABLE it_paid_orders (order_id text PRIMARY KEY, amount integer NOT NULL, "
    "payment text NOT NULL, receipt text NOT NULL)"
)


def mark_paid(conn: Any, order_id: str, amount: int, receipt: dict[str, Any]) -> None:
    """The shop's own write: this order, the amount it asked, the payment it was told of."""
    conn.execute(
        text(
            "INSERT INTO it_paid_orders (order_id, amount, payment, receipt) "
            "VALUES (:order, :amount, :payment, :receipt)"
        ),
        {
            "order": order_id,
            "amount": amount,
            "payment": str(receipt["id"]),
            "receipt": json.dumps(receipt, sort_keys=True),
        },
    )


app = app_from_environment(CONFIG_ENV, make_app)
