"""Two clicks on one order, as a user deploys the README and follows the docs.

``shop.py`` is README.md's block with what a user adds by following docs/undo.md (its
saga, verbatim: charge, declare the refund, reserve the stock) and
docs/outbound-calls.md (its primary/backup snippet, verbatim, in a task): a refund call,
a card call whose 402 is a decline, and a warehouse client. The README's commands run
it (migrate, a worker, beat) from the installed wheel; the gateway counts at its own
records. The speed-ups are the deployment suite's ``AGBOSS_*`` variables (a 5 s lease,
a 2 s sweep).

- A saga clicked twice, failing for one click: A charges and waits for the warehouse;
  B replays A's charge, reserves the stock and completes (the order is paid); then the
  warehouse tells A the order is out of stock. A fails and its undo keeps the charge
  B completed on: one charge, no refund.
- A primary/backup body clicked twice: A's primary card is declined and A pays with
  the backup; B replays the decline and the backup's receipt: one payment, the primary
  charged (declined) once.
"""

from __future__ import annotations

import json
import re
import textwrap
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from celery_agboss.testing.gateway_server import GatewayCall, Reply
from celery_agboss.testing.gateway_types import FakeGatewayError, FakeGatewayFault
from tests.deployment import readme
from tests.deployment.conftest import DeployFactory
from tests.deployment.deployment import Deployment
from tests.deployment.gateway import RecordingGatewayServer
from tests.support.processes import wait_until

pytestmark = [pytest.mark.worker, pytest.mark.slow, pytest.mark.redis]

DOCS = Path(__file__).resolve().parents[2] / "docs"
SETTLE_SECONDS = 60.0

USER_ADDITIONS = """

# --- What the user adds, following docs/undo.md and docs/outbound-calls.md ----------

from celery_agboss.task import undo_function
from payments import warehouse


class OutOfStock(Exception):
    pass


class CardDeclined(Exception):
    pass


def reserve_stock(order_id):
    if not warehouse.reserve(order_id):
        raise OutOfStock(order_id)


def send_refund(call):
    return gateway.refund(call.request["payment"], idempotency_key=call.idempotency_key)


refund = OutboundCall(name="gateway.refund", send=send_refund, reconcile=reconcile_charge,
                      key_retention=timedelta(hours=24))


def send_card(call):
    try:
        return gateway.charge(call.request["amount"], idempotency_key=call.idempotency_key)
    except gateway.Declined as exc:  # the client's 402, the decline: nothing was processed
        raise CardDeclined(str(exc)) from None


def declined(exc):
    return isinstance(exc, CardDeclined)


primary_card, backup_card = (
    OutboundCall(name=name, send=send_card, reconcile=reconcile_charge,
                 is_definite_failure=declined, key_retention=timedelta(hours=24))
    for name in ("gateway.primary", "gateway.backup")
)

"""


_INDENTED_FENCE = re.compile(
    r"^(?P<indent>[ \t]*)```python[ \t]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.M | re.S
)


def _docs_block(name: str, containing: str) -> str:
    """The first python block of ``docs/<name>`` holding ``containing`` (a block inside a
    list item is indented with it: dedented here, as a user copies it)."""
    text = (DOCS / name).read_text(encoding="utf-8")
    for match in _INDENTED_FENCE.finditer(text):
        block = textwrap.dedent(match.group("body"))
        if containing in block:
            return block
    raise readme.ReadmeError(f"docs/{name} has no python block with {containing!r}")


def shop_with_the_docs() -> str:
    """README's shop.py, then the user's additions and the two docs' snippets."""
    saga = _docs_block("undo.md", "def place_order")
    cards = _docs_block("outbound-calls.md", "backup_card")
    pay_order = (
        "\n@app.task(base=PaymentTask, bind=True)\n"
        "def pay_order(self, order_id):\n"
        '    request = {"amount": 1000, "order": order_id}\n'
        '    order = f"order:{order_id}"\n'
        + textwrap.indent(cards, "    ")
        + "    return receipt\n"
    )
    return readme.shop_source() + USER_ADDITIONS + saga + pay_order


class Warehouse:
    """``POST /warehouse/reserve``: the first reservation of an order waits for the
    test's word and is refused (out of stock); every later one is granted."""

    def __init__(self, server: RecordingGatewayServer) -> None:
        self.asked: list[str] = []
        self.answer = threading.Event()
        self._lock = threading.Lock()
        server.route("POST", "/warehouse/reserve", self.reserve)
        server.route("POST", "/refund", self._refund(server))

    def reserve(self, call: GatewayCall) -> Reply:
        order = str(call.body["order"])
        with self._lock:
            first = order not in self.asked
            self.asked.append(order)
        if first:
            self.answer.wait(SETTLE_SECONDS)
        return Reply(200, {"reserved": not first})

    @staticmethod
    def _refund(server: RecordingGatewayServer) -> Callable[[GatewayCall], Reply]:
        def refund(call: GatewayCall) -> Reply:
            try:
                receipt = server.gateway.refund(
                    str(call.body["payment"]), call.body.get("idempotency_key")
                )
            except FakeGatewayError as exc:
                return server.error_reply(exc)
            return Reply(200, receipt)

        return refund


def _publish(deployment: Deployment, task: str, order: int) -> str:
    code = f"from shop import {task}\nprint('task-id', {task}.delay({order}).id)\n"
    output = deployment.run([str(deployment.venv.python), "-c", code], "publish")
    for line in output.splitlines():
        if line.startswith("task-id "):
            return line.split(" ", 1)[1].strip()
    raise AssertionError(f"the publisher printed no task id:\n{output}")


def _state(deployment: Deployment, task_id: str) -> str:
    record = deployment.execution(task_id)
    return "not recorded" if record is None else record.state.value


def _wait_state(deployment: Deployment, task_id: str, *states: str) -> None:
    wait_until(
        lambda: _state(deployment, task_id) in states,
        SETTLE_SECONDS,
        interval=0.25,
        message=lambda: f"{task_id} to be {'/'.join(states)} (is {_state(deployment, task_id)})",
    )


@pytest.fixture
def running(
    deploy: DeployFactory, database_url: str, redis_url_factory: object
) -> Iterator[tuple[Deployment, Warehouse]]:
    """The shop with the docs' code, migrated, its worker and beat started as the README
    says, on a Redis database of the test's own."""
    deployment = deploy(redis_url_factory(), database_url)  # type: ignore[operator]
    (deployment.app_dir / "shop.py").write_text(shop_with_the_docs(), encoding="utf-8")
    warehouse = Warehouse(deployment.gateway)
    deployment.migrate()
    worker, beat = deployment.start_worker(), deployment.start_beat()
    deployment.wait_ready(worker)
    deployment.wait_beat(beat)
    try:
        yield deployment, warehouse
    finally:
        warehouse.answer.set()


def test_a_saga_clicked_twice_that_fails_for_one_click_charges_once_and_the_order_is_paid(
    running: tuple[Deployment, Warehouse],
) -> None:
    deployment, warehouse = running
    first = _publish(deployment, "place_order", 7)
    wait_until(lambda: warehouse.asked, SETTLE_SECONDS, message="the first click's reservation")
    second = _publish(deployment, "place_order", 7)
    _wait_state(deployment, second, "COMPLETED", "FAILED")
    warehouse.answer.set()  # the first click's reservation: out of stock
    _wait_state(deployment, first, "FAILED", "WAITING_OPERATOR")
    fake = deployment.gateway.gateway
    assert _state(deployment, second) == "COMPLETED", "the order is paid"
    assert len(fake.payments) == 1 and fake.payments[0]["status"] == "succeeded"
    assert fake.refunds == [], "the paid order's charge was not refunded"
    failed = deployment.execution(first)
    assert failed is not None and failed.state.value == "FAILED"
    assert f"kept for {second}" in (failed.reason or ""), failed.reason


def test_a_primary_and_backup_body_clicked_twice_pays_once(
    running: tuple[Deployment, Warehouse],
) -> None:
    deployment, _ = running
    fake = deployment.gateway.gateway
    fake.inject_fault(FakeGatewayFault.DECLINE, operation="charge")  # the first card
    first = _publish(deployment, "pay_order", 8)
    _wait_state(deployment, first, "COMPLETED", "FAILED", "WAITING_OPERATOR")
    second = _publish(deployment, "pay_order", 8)
    _wait_state(deployment, second, "COMPLETED", "FAILED", "WAITING_OPERATOR")
    assert {_state(deployment, first), _state(deployment, second)} == {"COMPLETED"}
    primary = [r for r in fake.requests if "gateway.primary" in (r.idempotency_key or "")]
    assert len(primary) == 1, "the primary card was declined once and never charged again"
    assert len(fake.payments) == 1, json.dumps(fake.payments, default=str)
