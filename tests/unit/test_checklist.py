"""gateway_checklist against FakeGateway at each support level (design: PS6) and against broken
adapters."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from celery_agboss.adapters.common import AnotherRequestsAnswerError
from celery_agboss.core.outbound import Completed, NotSent, Unknown
from celery_agboss.testing import (
    FakeGateway,
    GatewayCapabilities,
    GatewayCheckStatus,
    VirtualClock,
    gateway_checklist,
)

PASSED, FAILED, SKIPPED = (
    GatewayCheckStatus.PASSED,
    GatewayCheckStatus.FAILED,
    GatewayCheckStatus.SKIPPED,
)
REQUIREMENTS = ["G1", "G2", "G3", "G4", "G5"]


def _statuses(**expected: GatewayCheckStatus) -> dict[str, GatewayCheckStatus]:
    return {requirement: expected.get(requirement, PASSED) for requirement in REQUIREMENTS}


def _check(capabilities: GatewayCapabilities) -> tuple[FakeGateway, Any]:
    clock = VirtualClock()
    gateway = FakeGateway(clock, capabilities)
    return gateway, gateway_checklist(gateway.charge, gateway.lookup, clock)


# PS6's three levels: full (G1–G5), no lookup (keys only), no keys (neither).
SUPPORT_LEVELS = {
    "full": (GatewayCapabilities.FULL, _statuses()),
    "no lookup": (GatewayCapabilities.NO_LOOKUP, _statuses(G2=FAILED)),
    "no keys": (
        GatewayCapabilities.NO_KEYS,
        _statuses(G1=FAILED, G2=FAILED, G3=FAILED, G4=FAILED, G5=FAILED),
    ),
}


@pytest.mark.parametrize("level", list(SUPPORT_LEVELS))
def test_the_checklist_sees_each_support_level_of_ps6(level: str) -> None:
    capabilities, expected = SUPPORT_LEVELS[level]
    _, report = _check(capabilities)
    assert [r.requirement for r in report.results] == REQUIREMENTS
    assert report.statuses() == expected, str(report)
    assert report.passed is (level == "full")


@pytest.mark.parametrize(
    ("switch", "value", "failed"),
    [
        ("first_response_on_repeat", False, "G4"),
        ("conflict_on_mismatch", False, "G5"),
        ("key_retention", 3600.0, "G3"),
        ("lookup_by_key", False, "G2"),
    ],
)
def test_one_missing_capability_fails_exactly_its_requirement(
    switch: str, value: object, failed: str
) -> None:
    _, report = _check(dataclasses.replace(GatewayCapabilities.FULL, **{switch: value}))  # type: ignore[arg-type]
    assert report.statuses() == _statuses(**{failed: FAILED}), str(report)


def test_without_a_lookup_g2_fails_because_reconciliation_cannot_work() -> None:
    clock = VirtualClock()
    gateway = FakeGateway(clock, GatewayCapabilities(lookup_by_key=False))
    report = gateway_checklist(send=gateway.charge, clock=clock)
    g2 = report.result("G2")
    assert g2.status is FAILED
    assert "reconciliation cannot work" in g2.evidence


def test_a_lookup_that_raises_fails_g2_with_the_error_as_evidence() -> None:
    clock = VirtualClock()
    gateway = FakeGateway(clock, GatewayCapabilities.NO_LOOKUP)
    g2 = gateway_checklist(gateway.charge, gateway.lookup, clock).result("G2")
    assert g2.status is FAILED
    assert "LOOKUP_UNSUPPORTED" in g2.evidence or "cannot look a payment up" in g2.evidence
    assert "reconciliation cannot work" in g2.evidence


def test_a_lookup_that_cannot_find_a_payment_it_made_fails_g2() -> None:
    gateway = FakeGateway()
    g2 = gateway_checklist(gateway.charge, lambda key: None).result("G2")
    assert g2.status is FAILED
    assert "found nothing" in g2.evidence and "reconciliation cannot work" in g2.evidence


def test_a_lookup_that_finds_another_payment_fails_g2() -> None:
    gateway = FakeGateway()
    other = gateway.charge(5, "someone-else")
    g2 = gateway_checklist(gateway.charge, lambda key: other).result("G2")
    assert g2.status is FAILED and other["id"] in g2.evidence


def test_a_lookup_that_finds_a_payment_for_a_key_never_sent_fails_g2() -> None:
    gateway = FakeGateway()

    def lookup(key: str) -> Any:
        return gateway.lookup(key) or gateway.payments[0]  # "something close enough"

    g2 = gateway_checklist(gateway.charge, lookup).result("G2")
    assert g2.status is FAILED and "never sent" in g2.evidence


def test_without_a_clock_g3_is_skipped_and_says_why() -> None:
    gateway = FakeGateway()
    report = gateway_checklist(gateway.charge, gateway.lookup)
    g3 = report.result("G3")
    assert g3.status is SKIPPED and "no clock" in g3.evidence and "86400" in g3.evidence
    assert report.passed  # a skip is not a failure
    assert report.statuses() == _statuses(G3=SKIPPED)


def test_g3_repeats_just_inside_the_required_retention() -> None:
    clock = VirtualClock()
    gateway = FakeGateway(clock, dataclasses.replace(GatewayCapabilities.FULL, key_retention=7200))
    report = gateway_checklist(gateway.charge, gateway.lookup, clock, required_retention=7200)
    assert report.result("G3").status is PASSED
    assert clock.offset_seconds == pytest.approx(7199)
    stricter = gateway_checklist(gateway.charge, gateway.lookup, clock, required_retention=7201)
    assert stricter.result("G3").status is FAILED


def test_a_send_that_raises_fails_every_probe_with_the_error_as_evidence() -> None:
    def send(amount: int, key: str) -> Any:
        raise ConnectionError("sandbox unreachable")

    report = gateway_checklist(send, lambda key: None, VirtualClock())
    assert report.statuses() == _statuses(G1=FAILED, G2=FAILED, G3=FAILED, G4=FAILED, G5=FAILED)
    assert all("ConnectionError: sandbox unreachable" in r.evidence for r in report.results)
    assert not report.passed


def test_a_gateway_that_refuses_a_repeat_has_no_key() -> None:
    seen: set[str] = set()

    def send(amount: int, key: str) -> Any:  # "duplicate transaction", with no replay
        if key in seen:
            raise RuntimeError("duplicate transaction")
        seen.add(key)
        return {"id": f"tx-{key}"}

    report = gateway_checklist(send)
    assert report.result("G1").status is FAILED
    assert "the repeat" in report.result("G1").evidence
    assert report.result("G5").status is PASSED  # refusing everything refuses this too


def test_every_probe_key_carries_the_prefix_and_the_default_prefix_is_new_each_run() -> None:
    gateway = FakeGateway()
    report = gateway_checklist(gateway.charge, gateway.lookup, key_prefix="sandbox-run-7")
    assert report.key_prefix == "sandbox-run-7"
    assert gateway.requests and all(
        (r.idempotency_key or "").startswith("sandbox-run-7:") for r in gateway.requests
    )
    first = gateway_checklist(gateway.charge, gateway.lookup)
    second = gateway_checklist(gateway.charge, gateway.lookup)
    assert first.key_prefix != second.key_prefix
    assert first.passed and second.passed  # fresh keys: no run sees another's


def test_receipts_that_are_objects_are_compared_by_their_id_attribute() -> None:
    @dataclasses.dataclass(frozen=True)
    class Charge:
        id: str
        amount: int

    gateway = FakeGateway()

    def send(amount: int, key: str) -> Charge:
        return Charge(gateway.charge(amount, key)["id"], amount)

    def lookup(key: str) -> Charge | None:
        found = gateway.lookup(key)
        return None if found is None else Charge(found["id"], found["amount"])

    assert gateway_checklist(send, lookup).statuses() == _statuses(G3=SKIPPED)


def test_the_report_reads_as_one_line_per_requirement() -> None:
    _, report = _check(GatewayCapabilities.NO_LOOKUP)
    lines = str(report).splitlines()
    assert [line.split()[0] for line in lines] == REQUIREMENTS
    assert lines[1].startswith("G2 FAILED:")
    with pytest.raises(KeyError):
        report.result("G6")


def test_a_required_retention_must_be_positive() -> None:
    with pytest.raises(ValueError):
        gateway_checklist(FakeGateway().charge, required_retention=0)


# --- the adapter takes only its own payment (given its reconcile) (design: OWN) ------------


def _adopting_reconcile(gateway: FakeGateway) -> Any:
    """A reconcile that takes whatever the key made, whatever the request's amount."""

    def reconcile(amount: int, key: str) -> Any:
        found = gateway.lookup(key)
        return NotSent() if found is None else Completed(found)

    return reconcile


def _comparing_reconcile(gateway: FakeGateway) -> Any:
    def reconcile(amount: int, key: str) -> Any:
        found = gateway.lookup(key)
        if found is None:
            return NotSent()
        if found["amount"] != amount:
            return Unknown(f"amount {found['amount']}, not {amount}")
        return Completed(found)

    return reconcile


def test_without_a_reconcile_the_report_is_g1_to_g5() -> None:
    gateway = FakeGateway()
    report = gateway_checklist(gateway.charge, gateway.lookup)
    assert [r.requirement for r in report.results] == REQUIREMENTS


def test_own_passes_when_reconcile_refuses_a_payment_of_another_amount() -> None:
    gateway = FakeGateway()
    report = gateway_checklist(
        gateway.charge, gateway.lookup, reconcile=_comparing_reconcile(gateway)
    )
    own = report.result("OWN")
    assert (own.status, report.results[5].requirement) == (PASSED, "OWN")  # the sixth probe
    assert "answered Unknown: amount 100, not 200" in own.evidence


def test_own_fails_when_reconcile_takes_the_key_s_payment_for_any_request() -> None:
    gateway = FakeGateway()
    report = gateway_checklist(
        gateway.charge, gateway.lookup, reconcile=_adopting_reconcile(gateway)
    )
    own = report.result("OWN")
    assert own.status is FAILED and "marked paid with another order's payment" in own.evidence
    assert not report.passed


def test_own_after_not_sent_depends_on_the_resend_being_refused() -> None:
    """No lookup (reconcile answers NotSent): the resend of another amount under the key
    must be refused; a gateway that replays the first payment to it fails OWN."""
    refusing = FakeGateway(capabilities=GatewayCapabilities.NO_LOOKUP)
    report = gateway_checklist(refusing.charge, reconcile=lambda amount, key: NotSent())
    assert report.result("OWN").status is PASSED, str(report)
    replaying = FakeGateway(
        capabilities=dataclasses.replace(GatewayCapabilities.NO_LOOKUP, conflict_on_mismatch=False)
    )
    report = gateway_checklist(replaying.charge, reconcile=lambda amount, key: NotSent())
    assert report.result("OWN").status is FAILED, str(report)


def test_g5_fails_when_only_the_adapter_refused_the_gateway_s_replay() -> None:
    gateway = FakeGateway(
        capabilities=dataclasses.replace(GatewayCapabilities.FULL, conflict_on_mismatch=False)
    )

    def send(amount: int, key: str) -> Any:
        receipt = gateway.charge(amount, key)
        if receipt["amount"] != amount:
            raise AnotherRequestsAnswerError("answered another request's payment")
        return receipt

    g5 = gateway_checklist(send, gateway.lookup).result("G5")
    assert g5.status is FAILED and "the gateway did not" in g5.evidence
