"""The checklist's RECONCILE probe (design: reconcile) against adapters a user writes.

Each adapter below is what a team writes for its own gateway (here ``FakeGateway``):
``send`` and ``lookup`` are right, and only ``reconcile`` differs. A reconcile that
answers ``NotSent`` about a payment the gateway shows has it sent again after every lost
answer, a second charge once the gateway no longer replays the key; one that answers
``Completed`` for a key never sent marks an order paid with no money taken. Both must
fail the checklist, saying what is wrong and what to answer instead; a reconcile that
answers ``Unknown`` about a payment it could see moves no money twice and is WARNED
(every lost answer waits for an operator), not failed. Money at the gateway in a
delivery for the same reconcile: tests/adapters/test_checklist_reconcile_command.py.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from celery_agboss.core.outbound import Completed, NotSent, Unknown
from celery_agboss.testing import (
    FakeGateway,
    GatewayCapabilities,
    GatewayCheckStatus,
    gateway_checklist,
)
from celery_agboss.testing.checklist import GatewayChecklistReport

PASSED, FAILED, WARNED = (
    GatewayCheckStatus.PASSED,
    GatewayCheckStatus.FAILED,
    GatewayCheckStatus.WARNED,
)


class ShopGatewayAdapter:
    """A user's adapter done right: reconcile answers what the gateway shows under the key,
    the payment only when it is this request's (amount and currency)."""

    currency = "usd"

    def __init__(self, gateway: FakeGateway | None = None) -> None:
        self.gateway = gateway or FakeGateway()

    def send(self, amount: int, idempotency_key: str) -> Any:
        return self.gateway.charge(
            amount, idempotency_key, currency=self.currency, reference=idempotency_key
        )

    def lookup(self, idempotency_key: str) -> Any:
        return self.gateway.lookup(idempotency_key)

    def reconcile(self, amount: int, idempotency_key: str) -> Any:
        found = self.gateway.lookup(idempotency_key)
        if found is None:
            return NotSent()
        if (found["amount"], found["currency"]) != (amount, self.currency):
            return Unknown(f"payment {found['id']} is {found['amount']} {found['currency']}")
        return Completed(found)


class AlwaysNotSent(ShopGatewayAdapter):
    def reconcile(self, amount: int, idempotency_key: str) -> Any:
        return NotSent()


class AlwaysUnknown(ShopGatewayAdapter):
    def reconcile(self, amount: int, idempotency_key: str) -> Any:
        return Unknown("our reconcile never looks")


class PhantomPayment(ShopGatewayAdapter):
    """Right about keys that were sent; a key the gateway never saw is 'paid'."""

    def reconcile(self, amount: int, idempotency_key: str) -> Any:
        if self.gateway.lookup(idempotency_key) is None:
            return Completed({"id": "ch_assumed", "amount": amount, "status": "succeeded"})
        return super().reconcile(amount, idempotency_key)


class DeclinedIsNotSent(ShopGatewayAdapter):
    """A declined payment moved no money: NotSent, and the resend under the key replays the
    decline or is the one charge. Right, and the checklist never fails it (its probes'
    payments are not declined, so this branch is not probed)."""

    def reconcile(self, amount: int, idempotency_key: str) -> Any:
        found = self.gateway.lookup(idempotency_key)
        if found is not None and found["status"] == "declined":
            return NotSent()
        return super().reconcile(amount, idempotency_key)


class IgnoresTheAmount(ShopGatewayAdapter):
    def reconcile(self, amount: int, idempotency_key: str) -> Any:
        found = self.gateway.lookup(idempotency_key)
        return NotSent() if found is None else Completed(found)


def checked(adapter: ShopGatewayAdapter, *, with_lookup: bool = True) -> GatewayChecklistReport:
    """The checklist as a user runs it on the adapter, given its reconcile."""
    lookup = adapter.lookup if with_lookup else None
    return gateway_checklist(adapter.send, lookup, reconcile=adapter.reconcile)


def test_a_correct_reconcile_passes_every_probe() -> None:
    report = checked(ShopGatewayAdapter())
    assert [r.requirement for r in report.results][5:] == ["OWN", "RECONCILE"]
    assert report.passed and report.result("RECONCILE").status is PASSED, str(report)
    assert "answered Completed with payment" in report.result("RECONCILE").evidence


def test_a_reconcile_always_answering_not_sent_fails_and_says_what_to_answer() -> None:
    adapter = AlwaysNotSent()
    report = checked(adapter)
    result = report.result("RECONCILE")
    assert result.status is FAILED and not report.passed, str(report)
    assert "answered NotSent" in result.evidence and "finds it" in result.evidence
    assert "second charge" in result.evidence
    assert "must answer Completed(the payment)" in result.evidence
    assert report.statuses() | {"RECONCILE": PASSED} == checked(ShopGatewayAdapter()).statuses()


def test_a_reconcile_always_answering_unknown_is_warned_not_failed() -> None:
    report = checked(AlwaysUnknown())
    result = report.result("RECONCILE")
    assert result.status is WARNED, str(report)
    assert report.passed, "nothing moves twice: a warning, not a failure"
    assert "every lost answer waits for an operator" in result.evidence
    assert "our reconcile never looks" in result.evidence
    assert str(report).splitlines()[-1].startswith("RECONCILE WARNED: ")


def test_a_reconcile_that_finds_a_payment_for_a_key_never_sent_fails() -> None:
    report = checked(PhantomPayment())
    result = report.result("RECONCILE")
    assert result.status is FAILED, str(report)
    assert "'ch_assumed'" in result.evidence and "a key never sent" in result.evidence
    assert "marked paid with no money taken" in result.evidence
    assert report.result("OWN").status is PASSED, "only RECONCILE asks about a key never sent"


def test_not_sent_for_a_declined_payment_passes() -> None:
    gateway = FakeGateway()
    adapter = DeclinedIsNotSent(gateway)
    gateway.charge(100, "declined-key", card_declines=True, saves_declines=True)
    assert isinstance(adapter.reconcile(100, "declined-key"), NotSent)
    assert checked(adapter).passed
    assert gateway.payments_for("declined-key") == [], "the decline moved no money"


def test_a_reconcile_ignoring_the_amount_fails_own_saying_to_compare() -> None:
    report = checked(IgnoresTheAmount())
    own = report.result("OWN")
    assert own.status is FAILED, str(report)
    assert "compare the amount and currency" in own.evidence


def test_not_sent_without_a_lookup_passes_where_the_key_replays_the_payment() -> None:
    """A replay-only gateway's reconcile (Adyen's): nothing looks the payment up, and the
    resend under the key answers it again; the evidence says what bounds that."""
    adapter = AlwaysNotSent(FakeGateway(capabilities=GatewayCapabilities.NO_LOOKUP))
    result = checked(adapter).result("RECONCILE")
    assert result.status is PASSED, result.evidence
    assert "the gateway's replay" in result.evidence and "key_retention" in result.evidence


def test_not_sent_where_the_resend_is_a_new_payment_fails() -> None:
    gateway = FakeGateway(capabilities=GatewayCapabilities.NO_KEYS)
    result = checked(AlwaysNotSent(gateway), with_lookup=False).result("RECONCILE")
    assert result.status is FAILED and "a second charge" in result.evidence, result.evidence
    made = [p for p in gateway.payments if p["reference"].endswith(":reconcile")]
    assert len(made) == 2, "the probe's resend charged again"


def test_not_sent_where_the_resend_raises_fails_with_the_error() -> None:
    gateway = FakeGateway(capabilities=GatewayCapabilities.NO_LOOKUP)
    adapter = AlwaysNotSent(gateway)
    sent: set[str] = set()

    def send(amount: int, key: str) -> Any:
        if key.endswith(":reconcile") and key in sent:
            raise ConnectionError("sandbox refused the repeat")
        sent.add(key)
        return adapter.send(amount, key)

    result = gateway_checklist(send, reconcile=adapter.reconcile).result("RECONCILE")
    assert result.status is FAILED, result.evidence
    assert "ConnectionError: sandbox refused the repeat" in result.evidence


def test_unknown_without_a_lookup_passes() -> None:
    adapter = AlwaysUnknown(FakeGateway(capabilities=GatewayCapabilities.NO_LOOKUP))
    result = checked(adapter, with_lookup=False).result("RECONCILE")
    assert result.status is PASSED and "an operator decides" in result.evidence


def test_completed_with_another_payment_fails() -> None:
    adapter = ShopGatewayAdapter()
    other = adapter.gateway.charge(100, "someone-else")

    def reconcile(amount: int, key: str) -> Any:
        return Completed(other) if adapter.gateway.lookup(key) else NotSent()

    result = gateway_checklist(adapter.send, adapter.lookup, reconcile=reconcile)
    assert result.result("RECONCILE").status is FAILED
    assert other["id"] in result.result("RECONCILE").evidence


@pytest.mark.parametrize(
    ("answer", "says"),
    [
        (ValueError("no such key"), "raised ValueError: no such key"),
        ({"status": "succeeded"}, "not Completed, NotSent or Unknown"),
    ],
)
def test_a_reconcile_that_raises_or_answers_something_else_fails(answer: Any, says: str) -> None:
    adapter = ShopGatewayAdapter()

    def reconcile(amount: int, key: str) -> Any:
        if isinstance(answer, Exception):
            raise answer
        return answer

    report = gateway_checklist(adapter.send, adapter.lookup, reconcile=reconcile)
    assert report.result("RECONCILE").status is FAILED
    assert says in report.result("RECONCILE").evidence


def test_receipts_compared_by_the_reader_given() -> None:
    @dataclasses.dataclass(frozen=True)
    class Charge:
        ref: str

    adapter = ShopGatewayAdapter()

    def send(amount: int, key: str) -> Charge:
        return Charge(adapter.send(amount, key)["id"])

    def reconcile(amount: int, key: str) -> Any:
        found = adapter.gateway.lookup(key)
        return NotSent() if found is None else Completed(Charge(found["id"]))

    def lookup(key: str) -> Charge | None:
        found = adapter.gateway.lookup(key)
        return None if found is None else Charge(found["id"])

    report = gateway_checklist(
        send, lookup, reconcile=reconcile, payment_id=lambda charge: charge.ref
    )
    assert report.result("RECONCILE").status is PASSED, str(report)
