"""The RECONCILE probe (design: reconcile) as a team meets it: ``celery -A proj agboss
checklist`` run on its own adapter, each shipped adapter through its SDK, and why a
reconcile that always answers ``NotSent`` must fail: the same reconcile in a delivery
charges the customer twice.

The user's adapter is Stripe's, served by ``FakeGatewayServer``, with only ``reconcile``
rewritten; the probes of the function itself are tests/unit/test_checklist_reconcile.py.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from celery.bin.base import CLIContext
from click.testing import CliRunner, Result

from celery_agboss.cli import EXIT_REFUSED, agboss
from celery_agboss.core.outbound import NotSent, Unknown
from celery_agboss.testing.checklist import GatewayCheckStatus, gateway_checklist
from celery_agboss.testing.gateway import FakeGateway
from celery_agboss.testing.gateway_server import FakeGatewayServer, documented_capabilities
from tests.adapters.checklist_targets import URL_ENV, app
from tests.adapters.conftest import ServeFn
from tests.adapters.own_payment_support import GATEWAYS, support
from tests.engine.helpers import Shop

THIS = "tests.adapters.test_checklist_reconcile_command"


class RewrittenReconcile:
    """Stripe's adapter with the reconcile a user wrote in its place."""

    def __init__(self, answer: NotSent | Unknown) -> None:
        self.inner = support("stripe").adapter_for(os.environ[URL_ENV])
        self.name, self.answer = self.inner.name, answer

    def send(self, amount: int, idempotency_key: str) -> Any:
        return self.inner.send(amount, idempotency_key)

    def lookup(self, idempotency_key: str) -> Any:
        return self.inner.lookup(idempotency_key)

    def reconcile(self, amount: int, idempotency_key: str) -> Any:
        return self.answer


def reconcile_always_not_sent() -> RewrittenReconcile:
    return RewrittenReconcile(NotSent())


def reconcile_always_unknown() -> RewrittenReconcile:
    return RewrittenReconcile(Unknown("we never look"))


@pytest.fixture
def stripe_fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeGatewayServer]:
    gateway = FakeGateway(capabilities=documented_capabilities("stripe"))
    with FakeGatewayServer(gateway, dialect="stripe") as server:
        monkeypatch.setenv(URL_ENV, server.url)
        yield server


def run(target: str, *args: str) -> Result:
    return CliRunner().invoke(
        agboss,
        ["checklist", "--adapter", f"{THIS}:{target}", *args],
        obj=CLIContext(app=app, no_color=True, workdir=None),
    )


def test_the_command_fails_a_reconcile_that_always_answers_not_sent(
    stripe_fake: FakeGatewayServer,
) -> None:
    result = run("reconcile_always_not_sent")
    assert result.exit_code == EXIT_REFUSED, result.output
    line = next(x for x in result.output.splitlines() if x.startswith("RECONCILE "))
    assert line.startswith("RECONCILE FAILED: ") and "answered NotSent" in line
    assert "second charge" in line and "must answer Completed(the payment)" in line
    assert result.output.splitlines()[-1].endswith("checklist FAILED")


def test_the_command_warns_of_a_reconcile_that_always_answers_unknown(
    stripe_fake: FakeGatewayServer,
) -> None:
    result = run("reconcile_always_unknown", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    reconcile = next(r for r in report["results"] if r["requirement"] == "RECONCILE")
    assert reconcile["status"] == "WARNED" and report["passed"] is True
    assert "every lost answer waits for an operator" in reconcile["evidence"]
    text = run("reconcile_always_unknown").output.splitlines()[-1]
    assert text.endswith(
        "checklist passed, G3 not probed (no gateway clock), RECONCILE warned (read its line)"
    )


@pytest.mark.parametrize("gateway", GATEWAYS)
def test_each_shipped_adapter_passes_reconcile_as_its_gateway_documents(
    gateway: str, served: ServeFn
) -> None:
    adapter = support(gateway).adapter_for(served(gateway).url)
    report = gateway_checklist(adapter.send, adapter.lookup, reconcile=adapter.reconcile)
    for requirement in ("OWN", "RECONCILE"):
        assert report.result(requirement).status is GatewayCheckStatus.PASSED, str(report)


@pytest.mark.parametrize(("reconcile", "payments"), [("replay", 2), ("lookup", 1)])
def test_a_reconcile_always_answering_not_sent_charges_twice_in_a_delivery(
    shop: Shop, reconcile: str, payments: int
) -> None:
    """Why RECONCILE fails it: the answer of a charge is lost, and the retry comes after
    the gateway forgot the key (a day later: a worker pool down, a parked execution
    redriven). The call declares ``lookup_proves_absence`` (its gateway looks a payment
    up by key), so no key-age bound holds the resend; a reconcile that asks the lookup
    finds the payment instead."""
    call = shop.charge_call("shop.charge", reconcile=reconcile, lookup_proves_absence=True)
    request = {"amount": 4200, "currency": "usd"}
    shop.lose_the_answer("order-7", call, request)
    shop.clock.advance(timedelta(days=1, minutes=1).total_seconds())
    with shop.start("order-7") as retry:
        retry.outbound(call, request)
    assert [p["amount"] for p in shop.gateway.payments] == [4200] * payments
