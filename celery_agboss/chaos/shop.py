"""The shop the explorer generates: README.md's example, with a decline and its own table.

The app module is written into the run directory with a ``chaos_config.json`` next to it
(mode 0600: it holds the store URL). Everything a run must not share with anything else
is per run: the Celery queue, the sweep queue, the control and event exchanges, the
tenant (so business keys, hence idempotency keys, are the run's own) and the orders
table. The gateway URL is the explorer's own server: the module refuses any host but
127.0.0.1, so a chaos shop cannot reach a real gateway.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from celery_agboss.testing.gateway_server import DECLINED_CARD

APP_MODULE = "chaos_shop"
CONFIG_FILE = "chaos_config.json"
CALL_NAME = "chaos.charge"
DECLINE_EVERY = 9  # order ids 4, 13, 22, ... pay with a card the gateway declines
CLIENT_TIMEOUT_SECONDS = 20.0
AMOUNT_BASE = 1000  # order N is charged AMOUNT_BASE + N minor units: see amount_of
CURRENCY = "usd"
"""What every order is charged in, beside ``amount_of``: the explorer's gateway charges
in its default currency (its ``/charge`` takes none), and the verdict holds each
payment to it, so a payment in any other currency is seen."""

SPEEDUPS: Mapping[str, float] = {
    # Defaults 30 s / 30 s / 300 s / 5 s: a dead worker's charge is picked up within
    # seconds instead of minutes, so a run sees many recoveries.
    "agboss_lease_ttl": 5.0,
    "agboss_sweep_interval": 2.0,
    "agboss_requested_grace": 3.0,
    "agboss_retry_delay": 1.0,
}


def amount_of(order: int) -> int:
    """What the shop charges for ``order``: the one home of the amount, read by the
    generated module (through its config) and by the verdict, so that a charge of any
    other amount is seen."""
    return AMOUNT_BASE + order


def declined(order: int) -> bool:
    """Whether ``order`` pays with the gateway's declined test card."""
    return order % DECLINE_EVERY == 4


@dataclass(frozen=True)
class ShopConfig:
    run_id: str
    broker_url: str
    database_url: str
    gateway_url: str
    pseudonym_key: str
    speedups: Mapping[str, float]

    @property
    def tenant(self) -> str:
        return f"chaos-{self.run_id}"

    @property
    def queue(self) -> str:
        return f"chaos.{self.run_id}"

    @property
    def sweep_queue(self) -> str:
        return f"chaos.{self.run_id}.sweep"

    @property
    def control_exchange(self) -> str:
        return f"chaos.{self.run_id}.control"

    @property
    def event_exchange(self) -> str:
        return f"chaos.{self.run_id}.events"

    @property
    def orders_table(self) -> str:
        return f"chaos_orders_{self.run_id}"

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(
            tenant=self.tenant,
            queue=self.queue,
            sweep_queue=self.sweep_queue,
            control_exchange=self.control_exchange,
            event_exchange=self.event_exchange,
            orders_table=self.orders_table,
            declined_card=DECLINED_CARD,
            decline_every=DECLINE_EVERY,
            amount_base=AMOUNT_BASE,
            call_name=CALL_NAME,
            client_timeout=CLIENT_TIMEOUT_SECONDS,
            speedups=dict(self.speedups),
        )
        return data


def orders_table_ddl(config: ShopConfig) -> str:
    return (
        f"CREATE TABLE {config.orders_table} "
        "(order_id text PRIMARY KEY, status text NOT NULL, payment text)"
    )


APP_SOURCE = '''\
"""A shop for the chaos explorer (generated; see celery_agboss/chaos/shop.py)."""

import json
import os
import pathlib
import urllib.error
import urllib.parse
import urllib.request
from datetime import timedelta

from celery import Celery
from sqlalchemy import text

from celery_agboss import AGBoss, Completed, NotSent, OutboundCall, PaymentTask

CONFIG = json.loads(pathlib.Path(__file__).with_name("chaos_config.json").read_text())
GATEWAY_URL = CONFIG["gateway_url"]
if urllib.parse.urlsplit(GATEWAY_URL).hostname != "127.0.0.1":
    raise RuntimeError("a chaos shop only ever talks to the explorer's fake gateway on 127.0.0.1")

app = Celery("chaos_shop", broker=CONFIG["broker_url"])
app.conf.agboss_database_url = CONFIG["database_url"]
app.conf.agboss_pseudonym_key = CONFIG["pseudonym_key"]
app.conf.agboss_tenant = CONFIG["tenant"]
app.conf.agboss_sweep_queue = CONFIG["sweep_queue"]
for name, value in CONFIG["speedups"].items():
    app.conf[name] = value
# The run's own queue and exchanges: on a shared broker it consumes nothing else.
app.conf.task_default_queue = CONFIG["queue"]
app.conf.control_exchange = CONFIG["control_exchange"]
app.conf.event_exchange = CONFIG["event_exchange"]
AGBoss(app)


class GatewayRefused(Exception):
    def __init__(self, status, kind, message=""):
        super().__init__(f"{status} {kind}: {message}")
        self.status = status
        self.kind = kind

    @property
    def definite(self):  # documented "nothing processed" answers only
        return self.kind in ("DECLINED", "NOT_PROCESSED")


class CardDeclined(GatewayRefused):
    pass


def _call(method, path, body=None):
    request = urllib.request.Request(
        GATEWAY_URL + path,
        data=None if body is None else json.dumps(body).encode(),
        method=method,
        headers={"Content-Type": "application/json", "X-Worker-Pid": str(os.getpid())},
    )
    try:
        with urllib.request.urlopen(request, timeout=CONFIG["client_timeout"]) as response:
            return json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        try:
            error = json.loads(exc.read() or b"{}")
        except ValueError:
            error = {}
        kind = error.get("error", "HTTP_%d" % exc.code)
        cls = CardDeclined if kind == "DECLINED" else GatewayRefused
        raise cls(exc.code, kind, error.get("message", "")) from None


def card_for(order_id):
    declined = order_id % CONFIG["decline_every"] == 4
    return CONFIG["declined_card"] if declined else "tok_visa"


def send_charge(call):
    body = dict(call.request, idempotency_key=call.idempotency_key)
    body["metadata"] = {"attempt": call.attempt}
    return _call("POST", "/charge", body)


def reconcile_charge(call, lookup):
    found = _call("GET", "/lookup?" + urllib.parse.urlencode({"key": lookup.idempotency_key}))
    return Completed(found) if found else NotSent()


def is_definite_failure(exc):
    return isinstance(exc, GatewayRefused) and exc.definite


charge = OutboundCall(
    name=CONFIG["call_name"],
    send=send_charge,
    reconcile=reconcile_charge,
    is_definite_failure=is_definite_failure,
    key_retention=timedelta(hours=24),
)


def mark(conn, order_id, status, payment):
    conn.execute(
        text(
            "INSERT INTO %s (order_id, status, payment) VALUES (:o, :s, :p)"
            % CONFIG["orders_table"]
        ),
        {"o": str(order_id), "s": status, "p": payment},
    )


@app.task(base=PaymentTask, bind=True, max_retries=50)
def charge_order(self, order_id):
    key = f"order:{order_id}"
    amount = CONFIG["amount_base"] + order_id  # the explorer's amount_of(order_id)
    request = {"amount": amount, "reference": key, "card": card_for(order_id)}
    try:
        receipt = self.outbound(charge, request, business_key=key)
    except CardDeclined:
        self.fenced_effect(
            "mark-declined", lambda conn: mark(conn, order_id, "declined", None), business_key=key
        )
        return {"order": order_id, "declined": True}
    except GatewayRefused:  # nothing was processed: try again, under the same key
        raise self.retry(countdown=1)
    self.fenced_effect(
        "mark-paid", lambda conn: mark(conn, order_id, "paid", receipt["id"]), business_key=key
    )
    return {"order": order_id, "payment": receipt["id"]}
'''


def write_app(directory: Path, config: ShopConfig) -> Path:
    """The app module and its config in ``directory``; the module's path."""
    directory.mkdir(parents=True, exist_ok=True)
    config_path = directory / CONFIG_FILE
    fd = os.open(config_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        json.dump(config.as_json(), out, indent=2)
    module = directory / f"{APP_MODULE}.py"
    module.write_text(APP_SOURCE, encoding="utf-8")
    return module


__all__ = [
    "AMOUNT_BASE",
    "APP_MODULE",
    "CURRENCY",
    "SPEEDUPS",
    "ShopConfig",
    "amount_of",
    "declined",
    "orders_table_ddl",
    "write_app",
]
